"""A default run's reads: every tick, every device reads its counters once, at its own
jitter of a few ms into the tick (the cumulative value interpolated within the interval, so
rates computed from ``ts`` are exact); counter clears restart their columns from the moment
they happen; silent nodes and agent gaps send nothing; ``out_of_order`` of the NIC snapshots
arrive 1-2 ticks late (never > 300 ms).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from rocewatch.sim.counters import NIC_GAUGES, NS, U64
from rocewatch.sim.readings import Late, Tick

if TYPE_CHECKING:
    from rocewatch.sim.simulator import Simulator


def steps(sim: Simulator) -> Iterator[Tick]:
    """The raw readings, tick by tick (what ``ticks`` and the file writers format)."""
    cfg, fab, plan, base = sim.cfg, sim.fabric, sim.plan, sim.baseline
    rng = np.random.default_rng([cfg.seed, 2])
    sim.physics.restart()
    T, T_ns = cfg.interval_s, sim.interval_ns
    E = fab.n_nics
    sw_cum = sim.sw_init.copy()
    nic_cum = sim.nic_init.copy()
    x_cum = sim.nic_x_init.copy()
    sw_off = np.zeros_like(sw_cum)
    nic_off = np.zeros_like(nic_cum)
    x_off = np.zeros_like(x_cum)
    max_delay = min(2, int((0.3 - 0.01) / T))
    pending: list[tuple[int, Late]] = []
    gauges_static = np.zeros((len(NIC_GAUGES), E))
    gauges_static[0] = fab.link_gbps * 1000
    gauges_static[2] = fab.pcie_max_gts
    gauges_static[3] = fab.pcie_max_width
    gauges_static[4] = fab.pcie_max_width
    for k in range(sim.n_ticks):
        t0 = k * T
        sw_inc, sw_g, nic_inc, x_inc, pcie_now = sim.physics.interval(rng, k)
        j_sw = base.sw_jit + rng.uniform(-0.0002, 0.0002, len(base.sw_jit)) * (T > 0.01)
        j_nic = base.nic_jit + rng.uniform(-0.0001, 0.0001, E) * (T > 0.01)
        fs, fn = j_sw[fab.port_switch] / T, j_nic / T
        sw_r = sw_cum + np.floor(sw_inc * fs).astype(U64) - sw_off
        nic_r = nic_cum + np.floor(nic_inc * fn).astype(U64) - nic_off
        x_r = x_cum + np.floor(x_inc * fn).astype(U64) - x_off
        for tc, what, cols in plan.clears:
            if not t0 <= tc < t0 + T:
                continue
            c = (tc - t0) / T
            if what == "switch":
                sw_off[:, cols] = sw_cum[:, cols] + np.floor(sw_inc[:, cols] * c).astype(U64)
                after = cols[fs[cols] >= c]
                sw_r[:, after] = (
                    sw_cum[:, after]
                    + np.floor(sw_inc[:, after] * fs[after]).astype(U64)
                    - sw_off[:, after]
                )
            else:
                nic_off[:, cols] = nic_cum[:, cols] + np.floor(nic_inc[:, cols] * c).astype(U64)
                x_off[:, cols] = x_cum[:, cols] + np.floor(x_inc[:, cols] * c).astype(U64)
                if fn[cols[0]] >= c:
                    nic_r[:, cols] = (
                        nic_cum[:, cols]
                        + np.floor(nic_inc[:, cols] * fn[cols]).astype(U64)
                        - nic_off[:, cols]
                    )
                    x_r[:, cols] = (
                        x_cum[:, cols]
                        + np.floor(x_inc[:, cols] * fn[cols]).astype(U64)
                        - x_off[:, cols]
                    )
        sw_cum += sw_inc
        nic_cum += nic_inc
        x_cum += x_inc
        base_ns = cfg.start_ns + k * T_ns
        sw_ts = base_ns + np.rint(j_sw * NS).astype(np.int64)
        nic_ts = base_ns + np.rint(j_nic * NS).astype(np.int64)
        nic_g = gauges_static.copy()
        nic_g[1] = pcie_now[0]
        nic_g[3] = pcie_now[1]
        # who talks: silent nodes, agent gaps, late snapshots
        emit = ~plan.nic_silent
        for g0, g1, node in plan.gaps:
            if g0 <= t0 + j_nic[node * fab.n_rails] < g1:
                emit[node * fab.n_rails : (node + 1) * fab.n_rails] = False
        late_now = [x for due, x in pending if due == k]
        pending = [(due, x) for due, x in pending if due != k]
        if max_delay >= 1 and cfg.out_of_order > 0:
            delay = np.where(rng.random(E) < cfg.out_of_order, rng.integers(1, max_delay + 1, E), 0)
            delay[~emit] = 0
            if k + 1 < sim.n_ticks:
                for d in range(1, max_delay + 1):
                    idx = np.flatnonzero(delay == d)
                    if len(idx):
                        pending.append(
                            (
                                min(k + d, sim.n_ticks - 1),
                                Late(idx, nic_ts[idx], nic_r[:, idx], x_r[:, idx], nic_g[:, idx]),
                            )
                        )
                        emit[idx] = False
        if k == sim.n_ticks - 1:
            late_now += [x for _, x in pending]
        yield Tick(k, sw_ts, sw_r, sw_g, nic_ts, nic_r, x_r, nic_g, np.flatnonzero(emit), late_now)


__all__ = ["steps"]
