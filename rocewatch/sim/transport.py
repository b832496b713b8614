"""RoCE transport and congestion control at the NICs over one tick: the retransmission and
reordering counters (healthy rates, adaptive routing's reordering, a transport fault's extra
errors, a storm origin's ACK timeouts), the ECN marks each NIC receives, the CNPs it sends and
handles (DCQCN), a storm origin's pause-storm warnings and the driver's ``out_of_buffer``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rocewatch.sim.faultplan import TRANSPORT_FAULT_RATES, FaultPlan
from rocewatch.sim.faultplan import overlap as _ov
from rocewatch.sim.noise import Noise

if TYPE_CHECKING:
    from rocewatch.sim.physics import Baseline

STORM_ORIGIN_TIMEOUTS = 3.0  # local ACK timeouts per interval at a storm's origin (30/s)


@dataclass
class NicTransport:
    """One tick's transport counts per NIC."""

    counts: np.ndarray  # (5, E) out_of_sequence, packet_seq_err, ack timeouts, rnr, implied
    ecn: np.ndarray  # (E,) ECN-marked packets received
    cnp: np.ndarray  # (E,) CNPs sent
    handled: np.ndarray  # (E,) CNPs handled
    warn: np.ndarray  # (E,) pause-storm warnings
    oob_lam: np.ndarray  # (E,) mean out_of_buffer over the tick


def nic_transport(
    rng: np.random.Generator,
    storm_rng: np.random.Generator,
    base: Baseline,
    plan: FaultPlan,
    noise: Noise,
    a: np.ndarray,
    pkts: np.ndarray,
    marks: np.ndarray,
    quiet: list[tuple[int, float]],
    incast_now: list[tuple[int, np.ndarray, float, float]],
    pcie_int: list[tuple[int, float, float]],
    thermal_int: list[tuple[int, float, float]],
    t0: float,
    t1: float,
    T: float,
) -> NicTransport:
    """Tick [t0, t1)'s (``T`` s) transport at the NICs: ``a`` each NIC's job activity,
    ``pkts``/``marks`` per cable direction, ``quiet`` the storm origins (NIC, share of the
    tick), ``incast_now``/``pcie_int``/``thermal_int`` the faults acting in the tick."""
    E = len(a)
    per_tick = T / 0.1  # rates below are per 100 ms
    rxp = pkts[1 : 2 * E : 2]
    lam = np.stack(
        [
            rxp * 2e-6,
            rxp * 2e-9,
            np.full(E, 2e-4 * per_tick),
            np.full(E, 1e-5 * per_tick),
            rxp * 3e-9,
        ]
    )
    if noise.ar_base is not None:
        # adaptive routing sprays a flow over the spines: some packets arrive out of order
        lam[0] += rxp * noise.ar_base * noise.ar_factor(t0, t1)
    for f0, f1, e, scale in plan.transport:
        f = _ov(f0, f1, t0, t1)
        if f > 0:
            lam[:, e] += f * scale * (0.3 + 0.7 * a[e]) * TRANSPORT_FAULT_RATES * per_tick
    oos, seq, ack, rnr, imp = rng.poisson(lam)
    for x, f in quiet:
        # the origin processes no ACK while its receive path is stalled: its requests
        # time out (a few queue pairs, each at its retransmission timeout)
        ack[x] += storm_rng.poisson(f * STORM_ORIGIN_TIMEOUTS * per_tick)
    ecn = marks[1 : 2 * E : 2]
    cnp = np.minimum(np.rint(ecn * rng.uniform(0.4, 0.6, E)), T / 50e-6 * 16)
    handled = np.bincount(base.group, weights=cnp, minlength=base.n_groups)[base.group]
    handled = handled / base.group_size[base.group] * rng.uniform(0.9, 1.1, E)
    for y, snd, _fill, _f in incast_now:
        if len(snd):
            handled[snd] += cnp[y] / len(snd)
    warn = np.zeros(E)
    for _s0, _s1, x, _job, _hops, wt in plan.storms:
        warn[x] += np.count_nonzero((wt >= t0) & (wt < t1))
    oob_lam = np.full(E, 0.02)
    for e, inten, sev in pcie_int:
        oob_lam[e] += 500 * inten * sev
    for e, inten, short in thermal_int:
        oob_lam[e] += 500 * inten * short / 0.45
    return NicTransport(np.stack([oos, seq, ack, rnr, imp]), ecn, cnp, handled, warn, oob_lam)


__all__ = ["STORM_ORIGIN_TIMEOUTS", "NicTransport", "nic_transport"]
