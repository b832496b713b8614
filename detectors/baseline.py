"""What the congestion detectors (queue_buildup, ecn_congestion) share to judge an entity against
its own past and its peers at any sampling cadence: stable slots for (device, port, qual) keys,
a per-entity quantile sketch that forgets slowly, each gauge's observed sampling interval, peer
groups from the topology, and the run of recent samples a "held for N seconds" test reads.

Every per-entity number lives in a NumPy array indexed by slot, so a step updates all the
entities it carries without a Python step per row; only the few entities above a threshold
(``Run``) cost Python work.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import polars as pl

from detectors.slots import SlotTable
from detectors.windows import Step
from rocewatch.core.topology import NicEnd, PortEnd, Topology

NS = 1_000_000_000
# a series that goes this many intervals without a sample missed one (plus jitter of a fifth
# of an interval): its run of readings is broken, not merely late (as detectors/state.py)
MISSED = 2.5


def grow(a: np.ndarray, n: int, fill: float | int) -> np.ndarray:
    """``a`` extended to ``n`` rows (first axis) with ``fill``."""
    if len(a) >= n:
        return a
    extra = np.full((n - len(a), *a.shape[1:]), fill, dtype=a.dtype)
    return np.concatenate([a, extra])


class KeySlots(SlotTable[tuple[str, str, str]]):
    """Stable small integers for (device, port, qual) keys, assigned to a frame's rows at once
    (``detectors.slots.SlotTable``; a null queue counts as ``""``).

    >>> s = KeySlots()
    >>> f = pl.DataFrame({"device": ["a", "b", "a"], "port": ["x", "x", "x"], "qual": "3"})
    >>> s.rows(f).tolist(), s.keys
    ([0, 1, 0], [('a', 'x', '3'), ('b', 'x', '3')])
    """

    COLUMNS = ("device", "port", "qual")

    def rows(self, frame: pl.DataFrame) -> np.ndarray:
        """The slot of every row of ``frame`` (columns ``device``, ``port``, ``qual``)."""
        return self.frame_slots(frame.select("device", "port", pl.col("qual").fill_null("")))

    def rows_at(self, step: Step, metric: str, frame: pl.DataFrame) -> np.ndarray:
        """Like ``rows`` for ``step.get(metric)``, through the step's series positions."""
        known = step.positions
        pos = known[1].get(metric) if known is not None else None
        if known is None or pos is None or len(pos) != frame.height:
            return self.rows(frame)
        return self.at_positions(
            (known[0], pos), lambda miss: self.rows(frame[pl.Series(miss, dtype=pl.UInt32)])
        )


@dataclass
class Sketch:
    """Per-slot histograms of a positive quantity on a log scale, forgetting with time constant
    ``tau_s``: each entity's quantiles over roughly its last ``tau_s`` of clean samples.

    A sample counts for the time it stands for (its interval), so a series read every 0.1 s and
    one read every 10 s learn the same baseline from the same behaviour. Values below ``lo``
    share the lowest bin (an idle queue's zeros); bins are ``1 / per_decade`` decades wide, so a
    quantile is known within a factor ``10 ** (1 / per_decade)`` (reported as the bin's upper
    edge: on the safe side for a "many times its baseline" test). Forgetting costs nothing per
    sample: newer samples weigh exponentially more (``exp(t / tau)``), rescaled now and then.

    >>> s = Sketch(lo=1e-4, decades=4)
    >>> s.grow(1)
    >>> for i in range(100):
    ...     s.add(np.array([0]), np.array([0.01 if i % 10 else 0.5]), np.array([1.0]), i * NS)
    >>> float(s.quantile(np.array([0]), 0.5)[0]), int(s.samples[0]), float(s.learned_s[0])
    (0.01, 100, 100.0)
    """

    PARAMS: ClassVar[tuple[str, ...]] = ("tau_s",)  # a restored one takes today's
    lo: float
    decades: float
    per_decade: int = 10
    tau_s: float = 600.0
    hist: np.ndarray = field(init=False)
    learned_s: np.ndarray = field(init=False)  # seconds of samples learned (not forgotten)
    samples: np.ndarray = field(init=False)
    t_ref: int | None = None

    def __post_init__(self) -> None:
        self.bins = 1 + math.ceil(self.decades * self.per_decade)
        self.hist = np.zeros((0, self.bins))
        self.learned_s = np.zeros(0)
        self.samples = np.zeros(0, dtype=np.int64)
        k = np.arange(self.bins)
        self.upper = self.lo * 10.0 ** (k / self.per_decade)

    def grow(self, n: int) -> None:
        self.hist = grow(self.hist, n, 0.0)
        self.learned_s = grow(self.learned_s, n, 0.0)
        self.samples = grow(self.samples, n, 0)

    def bin_of(self, v: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            b = np.ceil(np.log10(np.maximum(v, 1e-300) / self.lo) * self.per_decade)
        return np.clip(np.nan_to_num(b, nan=0.0), 0, self.bins - 1).astype(np.int64)

    def add(
        self,
        slots: np.ndarray,
        values: np.ndarray,
        weight_s: np.ndarray,
        ts: int,
        distinct: bool = True,
    ) -> None:
        """Learn ``values`` (for ``slots``: distinct unless told), each standing for
        ``weight_s``."""
        if len(slots) == 0:
            return
        if self.t_ref is None:
            self.t_ref = ts
        age = (ts - self.t_ref) / (self.tau_s * NS)
        if age > 30.0:  # keep the weights finite: rescale everything to a new reference
            self.hist *= math.exp(-age)
            self.t_ref, age = ts, 0.0
        if distinct:  # a step's readings: one per slot, fancy indexing (ten times faster)
            self.hist[slots, self.bin_of(values)] += weight_s * math.exp(age)
            self.learned_s[slots] += weight_s
            self.samples[slots] += 1
            return
        np.add.at(self.hist, (slots, self.bin_of(values)), weight_s * math.exp(age))
        np.add.at(self.learned_s, slots, weight_s)
        np.add.at(self.samples, slots, 1)

    def quantile(self, slots: np.ndarray, q: float | np.ndarray) -> np.ndarray:
        """The ``q`` quantile (one, or one per slot) of each slot's samples (NaN for a slot
        with none)."""
        return self.quantile_of(self.hist[slots], q)

    def share_above(self, slots: np.ndarray, level: np.ndarray) -> np.ndarray:
        """The share of each slot's samples (by weight) that were at least ``level`` (counting
        only bins wholly at or above it: a slight underestimate)."""
        return self.share_above_of(self.hist[slots], level)

    def counts(self, slots: np.ndarray) -> np.ndarray:
        """Each slot's histogram scaled to its number of samples (for pooling slots)."""
        h = self.hist[slots]
        tot = h.sum(axis=1, keepdims=True)
        scale = np.divide(self.samples[slots][:, None], tot, out=np.zeros_like(tot), where=tot > 0)
        return h * scale

    def quantile_of(self, h: np.ndarray, q: float | np.ndarray) -> np.ndarray:
        """``quantile`` of histogram rows ``h`` (this sketch's bins)."""
        if len(h) == 0:
            return np.zeros(0)
        c = np.cumsum(h, axis=1)
        tot = c[:, -1]
        k = np.argmax(c >= np.reshape(q * tot, (-1, 1)), axis=1)
        return np.where(tot > 0, self.upper[k], np.nan)

    def share_above_of(self, h: np.ndarray, level: np.ndarray) -> np.ndarray:
        """``share_above`` of histogram rows ``h`` (this sketch's bins)."""
        if len(h) == 0:
            return np.zeros(0)
        lower = np.r_[0.0, self.upper[:-1]]
        tot = h.sum(axis=1)
        above = (h * (lower[None, :] >= np.reshape(level, (-1, 1)))).sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(tot > 0, above / tot, 0.0)


class Intervals:
    """Each gauge series' observed sampling interval: the median of its last few gaps (a missed
    sample's double gap, or jitter, does not move it), per slot, in seconds."""

    KEEP = 5

    def __init__(self) -> None:
        self.last_ts = np.zeros(0, dtype=np.int64)
        self.gaps = np.zeros((0, self.KEEP))
        self.count = np.zeros(0, dtype=np.int64)
        self.interval = np.zeros(0)  # seconds; 0 = not known yet

    def grow(self, n: int) -> None:
        self.last_ts = grow(self.last_ts, n, 0)
        self.gaps = grow(self.gaps, n, np.nan)
        self.count = grow(self.count, n, 0)
        self.interval = grow(self.interval, n, 0.0)

    def update(self, slots: np.ndarray, ts: np.ndarray, n: np.ndarray) -> np.ndarray:
        """Record readings (``n`` of them in the step, the newest at ``ts``); return each row's
        gap since the slot's previous step with readings, in seconds (NaN for a first one)."""
        prev = self.last_ts[slots]
        gap = np.where(prev > 0, (ts - prev) / NS, np.nan)
        ok = np.isfinite(gap) & (gap > 0)
        s = slots[ok]
        if len(s):
            per = gap[ok] / np.maximum(n[ok], 1)
            self.gaps[s, self.count[s] % self.KEEP] = per
            self.count[s] += 1
            self.interval[s] = np.nanmedian(self.gaps[s], axis=1)
        self.last_ts[slots] = np.maximum(prev, ts)
        return gap


class Run:
    """One entity's recent readings while they stay above a candidate threshold: what "it held
    at least X for N seconds" is read from. Each reading covers ``[begin, end]`` (a counter's
    interval, or the instant of a gauge). A reading that arrives more than ``MISSED``
    intervals after the previous one starts a new run: the entity may have drained unseen."""

    __slots__ = ("readings",)

    def __init__(self) -> None:
        self.readings: deque[tuple[int, int, float]] = deque(maxlen=512)

    def push(
        self, begin: int, end: int, value: float, interval_ns: int, keep_ns: int, keep: int = 2
    ) -> None:
        """Add a reading; keep what a window of ``keep_ns`` and ``keep`` readings reads."""
        r = self.readings
        if r and begin - r[-1][1] > MISSED * interval_ns + NS // 100:
            r.clear()
        r.append((begin, end, value))
        # drop readings no window needs: beyond the last ``keep``, the oldest one a window
        # reads ends at or before its start
        while len(r) > keep and r[1][1] <= end - keep_ns:
            r.popleft()

    def held(self, threshold: float) -> tuple[int, int, float]:
        """(duration in ns, readings, lowest value) of the newest readings all >= ``threshold``.

        The duration counts from the *end* of the first of them: a counter reading over its
        interval may owe its share to a burst in part of it (a 1.5 s burst can lift two 1 s
        readings), so only the later readings are known to have held throughout."""
        r = self.readings
        n, low, first = 0, math.inf, 0
        for _b, e, v in reversed(r):
            if not v >= threshold:
                break
            n, low, first = n + 1, min(low, v), e
        if n == 0:
            return 0, 0, math.nan
        return r[-1][1] - first, n, low


# --- peers --------------------------------------------------------------------------------------


def port_kind(topology: Topology, switch: str, port: str) -> str:
    """'host' for a port cabled to a NIC, 'fabric' for one cabled to a switch, else 'other'."""
    peer = topology.peer_of_port(switch, port)
    if isinstance(peer, NicEnd):
        return "host"
    if isinstance(peer, PortEnd):
        return "fabric"
    return "other"


def queue_groups(topology: Topology, key: tuple[str, str, str]) -> tuple[Hashable, Hashable]:
    """A switch queue's peer groups: (role, rail, port kind, queue), and all queues of that
    name on switches of that role where the first has too few members."""
    dev, port, q = key
    sw = topology.switches.get(dev)
    role = sw.role if sw is not None else "?"
    rail = sw.rail if sw is not None else None
    return ("q", role, rail, port_kind(topology, dev, port), q), ("q", role, q)


def nic_groups(topology: Topology, key: tuple[str, str, str]) -> tuple[Hashable, Hashable]:
    """A NIC's peer groups: the NICs of its rail, and every NIC."""
    return ("n", topology.nic_rail(key[0], key[1])), ("n",)


class Groups:
    """Peer group ids per slot (a fine group and a coarse one), and each group's members."""

    def __init__(self) -> None:
        self.ids: dict[Hashable, int] = {}
        self.fine = np.zeros(0, dtype=np.int64)
        self.coarse = np.zeros(0, dtype=np.int64)
        self.members: dict[int, np.ndarray] = {}
        self.dirty = False

    def assign(
        self,
        slots: np.ndarray,
        keys: list[tuple[str, str, str]],
        of: Callable[[tuple[str, str, str]], tuple[Hashable, Hashable]],
    ) -> None:
        """Give ``slots`` (entities not grouped yet: fine id < 0) their groups."""
        n = len(keys)
        self.fine, self.coarse = grow(self.fine, n, -1), grow(self.coarse, n, -1)
        for s in slots.tolist():
            if self.fine[s] >= 0:
                continue
            f, c = of(keys[s])
            self.fine[s] = self.ids.setdefault(f, len(self.ids))
            self.coarse[s] = self.ids.setdefault(c, len(self.ids))
            self.dirty = True

    def of(self, group: int) -> np.ndarray:
        """The slots of ``group``."""
        if self.dirty:
            self.members = {}
            both = np.concatenate([self.fine, self.coarse])
            slots = np.concatenate([np.arange(len(self.fine))] * 2)
            ok = both >= 0
            order = np.argsort(both[ok], kind="stable")
            g, s = both[ok][order], slots[ok][order]
            cuts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]]) if len(g) else np.zeros(0, int)
            for a, b in zip(cuts, np.r_[cuts[1:], len(g)], strict=True):
                self.members[int(g[a])] = s[a:b]
            self.dirty = False
        return self.members.get(group, np.zeros(0, dtype=np.int64))


def peer_median(
    groups: Groups, slot: int, values: np.ndarray, valid: np.ndarray, min_peers: int
) -> tuple[float, int, str]:
    """The median of ``values`` over ``slot``'s peers (itself left out) where ``valid``: its
    fine group when it has ``min_peers`` such peers, else its coarse group; (NaN, 0, "") when
    neither has."""
    for level, g in (("same role/rail", groups.fine[slot]), ("fabric-wide", groups.coarse[slot])):
        m = groups.of(int(g))
        m = m[(m != slot) & valid[m]]
        if len(m) >= min_peers:
            return float(np.median(values[m])), len(m), level
    return math.nan, 0, ""
