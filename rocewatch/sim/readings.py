"""What the devices read, as arrays before any formatting: a default run's ``Tick`` (every
device once per tick, a few ms in, with late NIC snapshots), a cadenced run's ``Readings``
(rows in the order they arrive), and the ``Late`` snapshots a tick delivers.

Their array rows follow ``rocewatch/sim/counters.py``'s metric tuples.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Late:
    """NIC snapshots read at an earlier tick, delivered now."""

    nics: np.ndarray
    ts: np.ndarray
    c: np.ndarray
    x: np.ndarray
    g: np.ndarray


@dataclass
class Tick:
    """Everything every device read at one sampling instant (arrays, before any formatting)."""

    k: int
    sw_ts: np.ndarray  # (switches,) int64 read time of each switch
    sw_c: np.ndarray  # (len(SW_COUNTERS), ports) uint64
    sw_g: np.ndarray  # (len(SW_GAUGES), ports) float64
    nic_ts: np.ndarray  # (nics,) int64
    nic_c: np.ndarray  # (len(NIC_COUNTERS), nics) uint64
    nic_x: np.ndarray  # (len(NIC_EXTRA), nics) uint64
    nic_g: np.ndarray  # (len(NIC_GAUGES), nics) float64
    emit: np.ndarray  # indices of the NICs whose snapshot arrives now, in order
    late: list[Late] = field(default_factory=list)


@dataclass
class Readings:
    """What the devices read during one physics tick, rows in the order they arrive.

    Switch counter rows (one per port of each switch poll, polls in time order), queue gauge
    rows (``gauges_with_counters``: the very rows of the counters, read in the same poll), and
    NIC snapshots (on time in time order, then late ones read in earlier ticks).
    """

    k: int
    sw_port: np.ndarray  # (n,) port of each switch counter row
    sw_ts: np.ndarray  # (n,) int64
    sw_c: np.ndarray  # (len(SW_COUNTERS), n) uint64
    g_port: np.ndarray  # (m,) port of each queue gauge row
    g_ts: np.ndarray  # (m,) int64
    sw_g: np.ndarray  # (len(SW_GAUGES), m) float64
    nic: np.ndarray  # (q,) NIC of each snapshot
    nic_ts: np.ndarray  # (q,) int64
    nic_c: np.ndarray  # (len(NIC_COUNTERS), q) uint64
    nic_x: np.ndarray  # (len(NIC_EXTRA), q) uint64
    nic_g: np.ndarray  # (len(NIC_GAUGES), q) float64
    gauges_with_counters: bool

    @classmethod
    def from_tick(cls, t: Tick, port_switch: np.ndarray) -> Readings:
        """A default run's tick: every switch polled once (polls in time order), the NICs
        whose snapshots arrive now."""
        order = np.argsort(t.sw_ts, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        rows = np.argsort(rank[port_switch], kind="stable")
        ts = t.sw_ts[port_switch[rows]]
        emit = t.emit[np.argsort(t.nic_ts[t.emit], kind="stable")]
        nics = [emit, *(x.nics for x in t.late)]
        return cls(
            t.k,
            rows,
            ts,
            t.sw_c[:, rows],
            rows,
            ts,
            t.sw_g[:, rows],
            np.concatenate(nics),
            np.concatenate([t.nic_ts[emit], *(x.ts for x in t.late)]),
            np.concatenate([t.nic_c[:, emit], *(x.c for x in t.late)], axis=1),
            np.concatenate([t.nic_x[:, emit], *(x.x for x in t.late)], axis=1),
            np.concatenate([t.nic_g[:, emit], *(x.g for x in t.late)], axis=1),
            True,
        )


__all__ = ["Late", "Readings", "Tick"]
