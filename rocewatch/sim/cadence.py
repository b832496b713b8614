"""A cadenced run's reads: the physics stays on ``interval_s`` ticks while every device reads
on its own schedule (each from its own phase, each reading up to ``jitter`` of its interval
late, ``sample_loss`` of them never arriving), counters interpolated to their true read time,
gauges as they are in that tick (see ``SimConfig``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rocewatch.core.errors import ConfigError
from rocewatch.sim.counters import NIC_GAUGES, NS, U64, read_counters
from rocewatch.sim.fabric import Fabric
from rocewatch.sim.faultplan import FaultPlan
from rocewatch.sim.readings import Readings

if TYPE_CHECKING:
    from rocewatch.sim.config import SimConfig
    from rocewatch.sim.simulator import Simulator


@dataclass
class Schedule:
    """When one source's devices read, over the whole run: flat arrays in time order."""

    interval_s: float
    t: np.ndarray  # seconds after the start
    dev: np.ndarray  # the device (NIC or switch index)
    lost: np.ndarray  # bool: the reading never arrives
    bounds: np.ndarray  # (n_ticks + 1,): the first reading of each physics tick

    @classmethod
    def draw(
        cls,
        rng: np.random.Generator,
        n_dev: int,
        interval_s: float,
        jitter: float,
        loss: float,
        run_s: float,
        tick_s: float,
        n_ticks: int,
    ) -> Schedule:
        """Each device from its own phase, every reading up to ``jitter`` intervals late."""
        phase = rng.uniform(0.0, interval_s, n_dev)
        n = np.maximum(np.ceil((run_s - phase) / interval_s), 0).astype(np.int64)
        dev = np.repeat(np.arange(n_dev), n)
        kth = np.arange(len(dev)) - np.repeat(np.cumsum(n) - n, n)
        t = phase[dev] + kth * interval_s + rng.uniform(0.0, jitter * interval_s, len(dev))
        lost = rng.random(len(dev)) < loss
        keep = t < run_s
        t, dev, lost = t[keep], dev[keep], lost[keep]
        order = np.argsort(t, kind="stable")
        t, dev, lost = t[order], dev[order], lost[order]
        bounds = np.searchsorted(t, np.arange(n_ticks + 1) * tick_s, side="left")
        return cls(interval_s, t, dev, lost, bounds)


class Cadence:
    """Every source's schedule over the run (``schedules``: ``nic``, ``switch`` and, if the
    gauges have their own interval, ``gauge``), drawn from ``rng``."""

    def __init__(self, cfg: SimConfig, fab: Fabric, rng: np.random.Generator) -> None:
        n_ticks = cfg.n_ticks
        self.schedules: dict[str, Schedule] = {}
        jit = 0.2 if cfg.jitter is None else cfg.jitter
        tick = cfg.interval_s

        def draw(n: int, every: float | None) -> Schedule:
            return Schedule.draw(
                rng, n, every or tick, jit, cfg.sample_loss, cfg.duration_s, tick, n_ticks
            )

        self.schedules["nic"] = draw(fab.n_nics, cfg.nic_interval_s)
        self.schedules["switch"] = draw(len(fab.switches), cfg.switch_interval_s)
        if cfg.gauge_interval_s is not None:
            self.schedules["gauge"] = draw(len(fab.switches), cfg.gauge_interval_s)
        ps = np.argsort(fab.port_switch, kind="stable")
        self._ports_sorted = ps
        self._ports_start = np.searchsorted(fab.port_switch[ps], np.arange(len(fab.switches)))
        self._ports_count = np.bincount(fab.port_switch, minlength=len(fab.switches))

    def poll_rows(self, dev: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The port rows of switch polls (every port of each switch, in port order)."""
        cnt = self._ports_count[dev]
        first = np.repeat(self._ports_start[dev], cnt)
        within = np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        return self._ports_sorted[first + within], np.repeat(t, cnt)


def lost(
    cfg: SimConfig, fab: Fabric, schedules: dict[str, Schedule], plan: FaultPlan
) -> dict[str, dict[str, list[int]]]:
    """The readings lost on the way (cadenced runs): per source (``nic``, ``switch``,
    ``gauge``) and device (``node/nic`` or the switch), their read times in ns."""
    out: dict[str, dict[str, list[int]]] = {}
    for src, sch in schedules.items():
        keep = sch.lost.copy()
        if src == "nic":
            keep &= ~plan.silenced(sch.dev, sch.t)
        by: dict[str, list[int]] = {}
        for d, t in zip(sch.dev[keep].tolist(), sch.t[keep].tolist(), strict=True):
            name = "{node}/{nic}".format(**fab.nic_labels(d)) if src == "nic" else fab.switches[d]
            by.setdefault(name, []).append(cfg.start_ns + round(t * NS))
        out[src] = by
    return out


def readings(sim: Simulator) -> Iterator[Readings]:
    """A cadenced run's readings, physics tick by physics tick (see ``SimConfig``)."""
    cfg, fab, plan = sim.cfg, sim.fabric, sim.plan
    cad = sim.cadence
    if cad is None or not cfg.cadenced:
        raise ConfigError("readings() needs a cadenced run (set a source's interval)")
    rng = np.random.default_rng([cfg.seed, 2])  # the physics, as in a default run
    sim.physics.restart()
    late_rng = np.random.default_rng([cfg.seed, 4])
    T = cfg.interval_s
    sw_cum = sim.sw_init.copy()
    nic_cum = sim.nic_init.copy()
    x_cum = sim.nic_x_init.copy()
    sw_off = np.zeros_like(sw_cum)
    nic_off = np.zeros_like(nic_cum)
    x_off = np.zeros_like(x_cum)
    max_delay = min(2, int((0.3 - 0.01) / T))
    pending: list[tuple[int, tuple[np.ndarray, ...]]] = []
    g_static = np.zeros((len(NIC_GAUGES), 1))
    g_static[:, 0] = (
        fab.link_gbps * 1000,
        fab.pcie_max_gts,
        fab.pcie_max_gts,
        fab.pcie_max_width,
        fab.pcie_max_width,
    )
    nsch, ssch = cad.schedules["nic"], cad.schedules["switch"]
    gsch = cad.schedules.get("gauge")
    for k in range(sim.n_ticks):
        t0 = k * T
        sw_inc, sw_g, nic_inc, x_inc, _ = sim.physics.interval(rng, k)
        clears = [(tc, what, cols) for tc, what, cols in plan.clears if t0 <= tc < t0 + T]
        nclears = [((tc - t0) / T, cols) for tc, what, cols in clears if what == "nic"]
        sclears = [((tc - t0) / T, cols) for tc, what, cols in clears if what == "switch"]

        # --- NIC snapshots
        i0, i1 = int(nsch.bounds[k]), int(nsch.bounds[k + 1])
        e, tt = nsch.dev[i0:i1], nsch.t[i0:i1]
        fr = np.clip((tt - t0) / T, 0.0, 1.0)
        nc = read_counters(nic_cum, nic_inc, nic_off, e, fr, nclears)
        nx = read_counters(x_cum, x_inc, x_off, e, fr, nclears)
        ng = np.repeat(g_static, len(e), axis=1)
        for f0, f1, pe, _c, gts, width in plan.pcie:
            hit = (e == pe) & (tt >= f0) & (tt < f1)
            ng[1, hit], ng[3, hit] = gts, width
        ok = ~(nsch.lost[i0:i1] | plan.silenced(e, tt))
        ts = cfg.start_ns + np.rint(tt * NS).astype(np.int64)
        delay = np.zeros(len(e), dtype=np.int64)
        if max_delay >= 1 and cfg.out_of_order > 0 and len(e):
            delay = np.where(
                late_rng.random(len(e)) < cfg.out_of_order,
                late_rng.integers(1, max_delay + 1, len(e)),
                0,
            )
        if k == sim.n_ticks - 1:
            delay[:] = 0
        now = ok & (delay == 0)
        parts: list[tuple[np.ndarray, ...]] = [
            (e[now], ts[now], nc[:, now], nx[:, now], ng[:, now])
        ]
        for d in range(1, max_delay + 1):
            sel = ok & (delay == d)
            if sel.any():
                pending.append(
                    (
                        min(k + d, sim.n_ticks - 1),
                        (e[sel], ts[sel], nc[:, sel], nx[:, sel], ng[:, sel]),
                    )
                )
        parts += [x for due, x in pending if due == k]
        pending = [(due, x) for due, x in pending if due != k]

        # --- switch polls: every port of the switch, counters (and gauges) at once
        j0, j1 = int(ssch.bounds[k]), int(ssch.bounds[k + 1])
        keep = ~ssch.lost[j0:j1]
        sw_dev, sw_t = ssch.dev[j0:j1][keep], ssch.t[j0:j1][keep]
        rows, row_t = cad.poll_rows(sw_dev, sw_t)
        frac = np.clip((row_t - t0) / T, 0.0, 1.0)
        sc = read_counters(sw_cum, sw_inc, sw_off, rows, frac, sclears)
        sw_ts = cfg.start_ns + np.rint(row_t * NS).astype(np.int64)
        if gsch is None:
            g_rows, g_ts = rows, sw_ts
        else:
            h0, h1 = int(gsch.bounds[k]), int(gsch.bounds[k + 1])
            gk = ~gsch.lost[h0:h1]
            g_rows, g_t = cad.poll_rows(gsch.dev[h0:h1][gk], gsch.t[h0:h1][gk])
            g_ts = cfg.start_ns + np.rint(g_t * NS).astype(np.int64)
        # counters past a clear count from it
        for tc, what, cols in clears:
            off = sw_off if what == "switch" else nic_off
            cum, inc = (sw_cum, sw_inc) if what == "switch" else (nic_cum, nic_inc)
            c = (tc - t0) / T
            off[:, cols] = cum[:, cols] + np.floor(inc[:, cols] * c).astype(U64)
            if what == "nic":
                x_off[:, cols] = x_cum[:, cols] + np.floor(x_inc[:, cols] * c).astype(U64)
        sw_cum += sw_inc
        nic_cum += nic_inc
        x_cum += x_inc
        yield Readings(
            k,
            rows,
            sw_ts,
            sc,
            g_rows,
            g_ts,
            sw_g[:, g_rows],
            np.concatenate([p[0] for p in parts]),
            np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts], axis=1),
            np.concatenate([p[3] for p in parts], axis=1),
            np.concatenate([p[4] for p in parts], axis=1),
            gsch is None,
        )


__all__ = ["Cadence", "Schedule", "lost", "readings"]
