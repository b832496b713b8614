"""The physical layer of each cable direction over one tick: its pre-FEC BER (each
direction's healthy baseline, a bad cable's climbing to its peak), what FEC corrected and could
not, the FCS and symbol errors that follow, and a flapping link's carrier transitions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rocewatch.sim.fabric import LINE_GBPS, Fabric
from rocewatch.sim.faultplan import FaultPlan
from rocewatch.sim.faultplan import overlap as _ov


@dataclass
class LinkErrors:
    """One tick's physical-layer counts: per cable direction, per cable, per NIC."""

    corrected: np.ndarray  # (D,) FEC-corrected bits
    uncorrectable: np.ndarray  # (D,) FEC-uncorrectable codewords
    fcs: np.ndarray  # (D,) FCS errors
    symbol: np.ndarray  # (D,) symbol errors
    carrier: np.ndarray  # (cables,) carrier transitions
    link_down: np.ndarray  # (E,) link-down events at the NIC


def physical_layer(
    rng: np.random.Generator,
    fab: Fabric,
    plan: FaultPlan,
    base_ber: np.ndarray,
    down_dir: np.ndarray,
    t0: float,
    t1: float,
    T: float,
) -> LinkErrors:
    """The tick [t0, t1)'s (``T`` s) physical layer; ``base_ber`` each direction's healthy
    BER, ``down_dir`` the share of the tick each direction's link was down."""
    E, S = fab.n_nics, fab.n_spines
    per_tick = T / 0.1  # rates are per 100 ms
    ber = base_ber.copy()
    carrier = np.zeros(fab.n_cables)
    link_down = np.zeros(E)
    for f0, f1, e, peak_ber, flaps in plan.flaky_nic:
        f = _ov(f0, f1, t0, t1)
        if f > 0 and peak_ber > 0:
            pair = np.array([2 * e, 2 * e + 1])
            ber[pair] = (
                f * ramp(rng, base_ber[pair], peak_ber, (t0 + t1) / 2 - f0, f1 - f0)
                + (1 - f) * ber[pair]
            )
        starts = sum(1 for s, _ in flaps if t0 <= s < t1)
        ends = sum(1 for s, n in flaps if t0 <= s + n < t1)
        carrier[e] += starts + ends
        link_down[e] += starts
    for f0, f1, lf, sp, peak_ber, flaps in plan.flaky_up:
        f = _ov(f0, f1, t0, t1)
        c = E + lf * S + sp
        if f > 0 and peak_ber > 0:
            pair = np.array([2 * c, 2 * c + 1])
            ber[pair] = (
                f * ramp(rng, base_ber[pair], peak_ber, (t0 + t1) / 2 - f0, f1 - f0)
                + (1 - f) * ber[pair]
            )
        carrier[c] += sum(1 for s, _ in flaps if t0 <= s < t1)
        carrier[c] += sum(1 for s, n in flaps if t0 <= s + n < t1)
    up = 1 - down_dir
    corrected = rng.poisson(ber * fab.link_gbps * 1e9 * T * up)
    lam_unc = 20.0 * (ber / 1e-4) ** 3 * up * (per_tick * fab.link_gbps / LINE_GBPS)
    uncorrectable = rng.poisson(lam_unc)
    fcs = rng.poisson(0.9 * lam_unc)
    symbol = rng.poisson(3.0 * lam_unc)
    return LinkErrors(corrected, uncorrectable, fcs, symbol, carrier, link_down)


def ramp(
    rng: np.random.Generator, base: np.ndarray, peak: float, since: float, length: float
) -> np.ndarray:
    """A bad cable's BER: from the link's baseline up to ``peak`` (log scale) over the first
    2 s (or 30% of the fault), then around the peak."""
    r = min(1.0, max(0.0, since / max(min(2.0, 0.3 * length), 1e-3)))
    return base * (peak / base) ** r * rng.lognormal(0.0, 0.2, len(base))


__all__ = ["LinkErrors", "physical_layer", "ramp"]
