"""Priority flow control over one tick: the pauses a healthy fabric sees (more at the switch
side and under MoE's bursts), a PFC storm's pauses spreading hop by hop from its origin and the
senders it stalls, and the pushback of a NIC that drains too slowly (PCIe downgrade, thermal
straggler) or of an incast's receiver. Where each storm's hops go is ``faults.storm_hops``.

``pf`` arrays hold each cable direction's share of the tick its sender was paused.
"""

from __future__ import annotations

import numpy as np

from rocewatch.sim.fabric import Fabric
from rocewatch.sim.faultplan import FaultPlan
from rocewatch.sim.faultplan import overlap as _ov


def storm_stall(
    fab: Fabric, plan: FaultPlan, t0: float, t1: float
) -> tuple[np.ndarray, list[tuple[int, float]]]:
    """How much each NIC still sends while storms pause its job's ring (1: unhindered), and
    the storm origins in the tick (NIC, share of the interval): they send nothing at all."""
    E = fab.n_nics
    stall = np.ones(E)
    quiet: list[tuple[int, float]] = []  # storm origins: (NIC, share of the interval)
    for s0, s1, x, job, hops, _w in plan.storms:
        f = _ov(s0 + hops[1][0], s1 + hops[1][0], t0, t1)
        if f > 0 and job >= 0:
            stall[fab.nic_job == job] *= 1 - 0.98 * f
        f = _ov(s0, s1, t0, t1)
        if f > 0:
            quiet.append((x, f))
    for s0, s1, mine, in_jobs, hops in plan.sw_storms:
        st = np.ones(E)
        st[in_jobs] = 1 - 0.98 * _ov(s0 + hops[1][0], s1 + hops[1][0], t0, t1)
        st[mine] = np.minimum(st[mine], 1 - 0.98 * _ov(s0, s1, t0, t1))
        stall *= st
    return stall, quiet


def healthy_pauses(
    rng: np.random.Generator, moe: np.ndarray, switch_rx: np.ndarray, load: np.ndarray
) -> np.ndarray:
    """The background pauses on each direction at its ``load``: brief, more where a switch
    receives (``switch_rx``) and under MoE traffic (``moe``), whose bursts now and then pause
    a queue for a third to more than half of the tick."""
    D = len(load)
    mean = np.where(switch_rx, 0.006, 0.002) * np.where(moe, 3.0, 1.0)
    pf = np.where(
        rng.random(D) < 0.35 * load,
        np.minimum(rng.exponential(1.0, D) * mean, np.where(moe, 0.15, 0.05)),
        0.0,
    )
    spike = moe & (rng.random(D) < 0.02 * load)
    pf = np.where(spike, rng.uniform(0.3, 0.6, D), pf)
    return pf


def storm_pauses(
    rng: np.random.Generator, plan: FaultPlan, pf: np.ndarray, t0: float, t1: float
) -> np.ndarray:
    """Storms' pauses, written into ``pf``: every direction a storm's hop reaches is paused for
    (nearly) all of the share of the tick the hop covers; returns that share per direction."""
    D = len(pf)
    stuck = np.zeros(D)  # share of the interval each direction is held by a storm
    for s0, s1, _x, _job, hops, _w in plan.storms:
        for delay, dirs in hops:
            f = _ov(s0 + delay, s1 + delay, t0, t1)
            if f > 0 and len(dirs):
                pf[dirs] = f * rng.uniform(0.996, 1.0, len(dirs)) + (1 - f) * pf[dirs]
                stuck[dirs] = np.maximum(stuck[dirs], f)
    for s0, s1, _mine, _in_jobs, hops in plan.sw_storms:
        for delay, dirs in hops:
            f = _ov(s0 + delay, s1 + delay, t0, t1)
            if f > 0 and len(dirs):
                pf[dirs] = f * rng.uniform(0.996, 1.0, len(dirs)) + (1 - f) * pf[dirs]
                stuck[dirs] = np.maximum(stuck[dirs], f)
    return stuck


def fault_pauses(
    rng: np.random.Generator,
    fab: Fabric,
    group: np.ndarray,
    pf: np.ndarray,
    pcie_int: list[tuple[int, float, float]],
    thermal_int: list[tuple[int, float, float]],
    incast_now: list[tuple[int, np.ndarray, float, float]],
) -> None:
    """Pushback, written into ``pf``: a PCIe-downgraded NIC pauses its leaf port (and its ring
    peers on the leaf are paused a little), a thermal straggler pauses for its shortfall, an
    incast's senders are paused by their congested leaf."""
    for e, inten, sev in pcie_int:
        pf[2 * e + 1] = max(pf[2 * e + 1], inten * sev * rng.uniform(0.2, 0.4))
        peers = np.flatnonzero((group == group[e]) & (fab.nic_leaf == fab.nic_leaf[e]))
        peers = peers[peers != e]
        pf[2 * peers] = np.maximum(pf[2 * peers], inten * sev * rng.uniform(0.05, 0.15, len(peers)))
    for e, inten, short in thermal_int:
        # a NIC that drains slower than its link delivers pauses for its shortfall
        pf[2 * e + 1] = max(pf[2 * e + 1], inten * short * rng.uniform(0.8, 1.2))
    for _y, snd, _fill, f in incast_now:
        pf[2 * snd] = np.maximum(pf[2 * snd], f * rng.uniform(0.02, 0.12, len(snd)))


__all__ = ["fault_pauses", "healthy_pauses", "storm_pauses", "storm_stall"]
