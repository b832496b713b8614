"""The workload's rhythm and the healthy noise a fabric makes without any fault: how much of
each tick a job communicates (``activity``), DCQCN marking bursts on switch queues and
adaptive routing's reordering (``Noise``), each drawn up front from its own stream.

>>> import numpy as np
>>> a = activity(np.random.default_rng(1), "allreduce", 20, 0.1)
>>> a.shape, bool(0.3 < a.mean() < 0.9)
((20,), True)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from rocewatch.sim.config import SimConfig
    from rocewatch.sim.fabric import Fabric


def activity(rng: np.random.Generator, traffic: str, n_ticks: int, T: float) -> np.ndarray:
    """Share of each tick a job spends communicating.

    all-reduce: iterations of ~0.5 s with ~60% of the time in NCCL collectives; MoE: ~0.12 s
    layers whose all-to-all dispatch/combine bursts take ~35% of the time.
    """
    period, duty = (0.5, 0.6) if traffic == "allreduce" else (0.12, 0.35)
    run = n_ticks * T
    n = int(run / (period * 0.9)) + 4
    per = period * rng.uniform(0.95, 1.05) * rng.uniform(0.97, 1.03, n)
    starts = np.concatenate([[-rng.uniform(0, period)], per[:-1]]).cumsum()
    comm = per * np.clip(duty + 0.04 * rng.standard_normal(n), 0.2, 0.9)
    sub = 50
    t = (np.arange(n_ticks * sub) + 0.5) * (T / sub)
    idx = np.searchsorted(starts, t, side="right") - 1
    pos = t - starts[idx]
    active = pos >= per[idx] - comm[idx]
    return active.reshape(n_ticks, sub).mean(axis=1)


class Noise:
    """Healthy noise drawn up front from its own stream (runs without it draw nothing):
    DCQCN marking bursts of 2-10 % on switch egress queues, lasting 0.2-3 s, and per-NIC
    reordering from adaptive routing with bursts (1-5 s, 3-10x) about once a minute."""

    def __init__(self, cfg: SimConfig, fab: Fabric, rng: np.random.Generator) -> None:
        self.n_nics = fab.n_nics
        run = cfg.duration_s
        dirs = fab.port_out_dir
        n = rng.poisson(cfg.ecn_bursts_per_min / 60.0 * run, len(dirs))
        bd = np.repeat(dirs, n)
        b0 = rng.uniform(0.0, run, len(bd))
        b1 = b0 + 10.0 ** rng.uniform(np.log10(0.2), np.log10(3.0), len(bd))
        self.ecn_bursts = (b0, b1, bd, rng.uniform(0.02, 0.10, len(bd)))
        self.ar_base: np.ndarray | None = None
        if cfg.ar_reorder > 0:
            E = fab.n_nics
            self.ar_base = cfg.ar_reorder * 10.0 ** rng.uniform(-0.5, 0.5, E)
            m = rng.poisson(run / 60.0, E)
            ne = np.repeat(np.arange(E), m)
            a0 = rng.uniform(0.0, run, len(ne))
            a1 = a0 + rng.uniform(1.0, 5.0, len(ne))
            self.ar_bursts = (a0, a1, ne, rng.uniform(3, 10, len(ne)))

    def ar_factor(self, t0: float, t1: float) -> np.ndarray:
        """Each NIC's reordering factor over [t0, t1): its burst's 3-10x, else 1."""
        out = np.ones(self.n_nics)
        a0, a1, ne, x = self.ar_bursts
        on = (a0 < t1) & (a1 > t0)
        if on.any():
            np.maximum.at(out, ne[on], x[on])
        return out


__all__ = ["Noise", "activity"]
