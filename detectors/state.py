"""Per-entity state shared by the detectors: stable entity slots, row lookups, and ``Sustain``,
the small state machine behind "held for N seconds, with hysteresis"."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import polars as pl

from detectors.slots import SlotTable

log = logging.getLogger(__name__)

Key = tuple[str, ...]  # ("queue", switch, port, queue) or ("nic", node, nic)
QKEY = ["device", "port", "qual"]
NKEY = ["device", "port"]
NS = 1_000_000_000


def over_idx(
    f: pl.DataFrame, threshold: float, column: str = "delta", rate: bool = True
) -> np.ndarray:
    """Indices of the rows of ``f`` whose ``column`` reaches ``threshold`` (per second of ``dt``
    when ``rate``), tested in numpy: microseconds where a Polars filter costs a hundred."""
    if f.height == 0:
        return np.zeros(0, dtype=np.int64)
    x = f[column].to_numpy()
    mask = x >= f["dt"].to_numpy() * threshold if rate else x >= threshold  # null (NaN): False
    return np.flatnonzero(mask)


def rows_at(f: pl.DataFrame, idx: np.ndarray) -> list[dict[str, Any]]:
    """The rows of ``f`` at ``idx`` as dicts (row by row when few: cheaper than a gather)."""
    if len(idx) > 64:
        return f[idx].rows(named=True)
    return [f.row(int(i), named=True) for i in idx]


def over(
    f: pl.DataFrame, threshold: float, column: str = "delta", rate: bool = True
) -> list[dict[str, Any]]:
    """The rows of ``f`` (as dicts) whose ``column`` reaches ``threshold`` (see ``over_idx``)."""
    return rows_at(f, over_idx(f, threshold, column, rate))


def matches(f: pl.DataFrame, keys: Sequence[tuple[str, ...]]) -> np.ndarray:
    """A mask of the rows of ``f`` whose (device, port[, qual]) is one of ``keys``.

    A few keys cost a numpy scan each; more, one hash of the frame's key columns and a set
    lookup (a 64-bit hash collision could add a row: about one in 10^15 at these sizes).
    """
    out = np.zeros(f.height, dtype=bool)
    if f.height == 0 or not keys:
        return out
    if len(keys) > 4:
        names = QKEY[: len(keys[0])]
        kf = pl.DataFrame(list(keys), schema=dict.fromkeys(names, pl.String()), orient="row")
        struct = pl.struct(names).hash(seed=EntitySlots.SEED)
        return np.isin(
            f.select(struct).to_series().to_numpy(), kf.select(struct).to_series().to_numpy()
        )
    devs, ports = f["device"].to_numpy(), f["port"].to_numpy()
    for key in keys:
        m = (devs == key[0]) & (ports == key[1])
        if len(key) > 2 and m.any():
            m &= f["qual"].to_numpy() == key[2]
        out |= m
    return out


def lookup(
    f: pl.DataFrame, keys: Sequence[tuple[str, ...]], column: str = "delta"
) -> dict[tuple[str, ...], float | None]:
    """``column`` of the rows of ``f`` that match ``keys`` ((device, port) or (device, port,
    qual)); ``column="rate"`` gives delta / dt. A few keys in a small frame cost a numpy scan
    each (any Polars join costs more); many keys or a large frame, one join."""
    if f.height == 0 or not keys:
        return {}
    names = QKEY[: len(keys[0])]
    vals = f["delta"] / f["dt"] if column == "rate" else f[column]
    if len(keys) > 16 or f.height > 20_000:
        kf = pl.DataFrame(list(keys), schema=dict.fromkeys(names, pl.String()), orient="row")
        j = kf.join(f.select(*names, vals.alias("_v")), on=names, how="inner")
        return {tuple(r[:-1]): r[-1] for r in j.iter_rows()}
    devs, ports = f["device"].to_numpy(), f["port"].to_numpy()
    quals = f["qual"] if len(names) == 3 else None
    out: dict[tuple[str, ...], float | None] = {}
    for key in keys:
        for i in np.flatnonzero((devs == key[0]) & (ports == key[1])):
            if quals is None or quals[int(i)] == key[2]:
                out[key] = vals[int(i)]
                break
    return out


def counter_timing(f: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each counter row's sampling interval and the span its rate covers (ns), for ``Row``: a
    step's row sums ``n`` samples' intervals in ``dt``, so one sample's interval is ``dt / n``
    and the rate held over all of ``dt``. 0 where ``dt`` is null (a gauge)."""
    if f.height == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    dt = np.nan_to_num(f.get_column("dt").to_numpy().astype(np.float64)) * NS
    n = np.maximum(f.get_column("n").to_numpy().astype(np.float64), 1.0)
    return (dt / n).astype(np.int64), dt.astype(np.int64)


# --- "held for sustain_s, with hysteresis", per entity ----------------------------------------

# A dip (or the silence after the stay condition last held) is judged against the entity's
# sampling interval: one missed sample plus jitter of a fifth of an interval is up to 2.2
# intervals without a row, and the median of a few jittered intervals may itself read short.
# Any duration shorter than that would read the silence between two samples of a slow series
# as the condition ending.
MISSED_SAMPLE_INTERVALS = 2.5
RECENT_INTERVALS = 5  # the interval an episode uses: the median of its rows' last few


@dataclass
class Episode:
    """One entity's condition, from the first step it held to the step it cleared."""

    since: int  # when the enter condition began to hold (a counter row: its interval's start)
    last_hot: int  # end of the last step the enter condition held
    last_warm: int  # end of the last step the stay condition held
    crit_since: int | None = None  # start of the run of steps at the critical level
    last_crit: int = 0
    ts: int = 0  # newest sample time that made it fire; 0 while pending
    severity: str = ""
    info: tuple[Any, ...] = ()  # what the detector needs to describe it, as of firing
    # the sampling intervals (ns) of its last few rows (a default: a checkpoint of an episode
    # written before it existed restores with none, rocewatch/core/checkpoint.py)
    intervals: tuple[int, ...] = ()
    # end of the last step a row said the enter condition (``last_cool``: level <= 0) or the
    # stay condition (``last_cold``: level COLD) did not hold: news, not a missed sample
    last_cool: int = 0
    last_cold: int = 0
    hot_rows: int = 0  # rows at the enter condition in this episode

    @property
    def interval(self) -> int:
        """The entity's observed sampling interval (ns): the (lower) median of its recent rows'
        (a row after a missed sample spans two intervals: one such gap does not stretch it);
        0 before any row."""
        iv = sorted(self.intervals)
        return iv[(len(iv) - 1) // 2] if iv else 0

    def slack(self) -> int:
        """How long (ns) a series at this interval may go without a row before it says the
        condition ended: one missed sample plus jitter."""
        return round(MISSED_SAMPLE_INTERVALS * self.interval)


COLD = -1  # a Row's level when the entity was sampled and its stay condition does not hold


@dataclass(frozen=True)
class Row:
    """One entity's condition at this step: ``level`` 0 = only the stay (exit) condition holds,
    1 = the enter condition holds, 2 = the critical enter condition holds; ``COLD`` (-1) = it
    was sampled and the stay condition does not hold (optional: worth sending only for
    entities with an episode, ``Sustain.episodes``).

    ``interval`` (ns) is the sampling interval of the series the row was read from: a counter's
    sample interval (the step's ``dt / n``: ``counter_timing``), a gauge's observed interval (the
    gap between its readings, which the detector follows); 0 = unknown, taken as one step.
    ``held`` (ns) is how long before ``ts`` the condition is known to have held: a counter rate
    measured over the sample's interval held over that interval (the step's ``dt``); a single
    gauge reading, 0.
    """

    key: Key
    level: int
    ts: int
    info: tuple[Any, ...]
    interval: int = 0
    held: int = 0


@dataclass
class Sustain:
    """Per-entity 'the condition held for ``sustain_s``', tolerating dips of ``gap_s`` before
    firing and clearing ``clear_s`` after the stay condition last held, every duration judged
    against the entity's observed sampling interval.

    The caller passes, each step, only the entities whose stay condition holds (a few rows);
    an entity that is absent did not meet it, or was not sampled in this step: a series sampled
    every second has a row in one 0.1 s step of ten. So an episode starts where its first row
    says the condition began (``ts - held``), and before firing tolerates ``gap_s`` plus 2.5
    intervals without a hot row (one missed sample and a fifth of an interval of jitter); once
    firing it clears ``clear_s`` plus 2.5 intervals after the stay condition last held. A fault
    that persists, at any cadence, is one episode until it ends. A row that says the condition
    did not hold (level 0 before firing, ``COLD`` after) is news, not a missed sample: from it
    on only ``gap_s`` / ``clear_s`` count, as they did at one step per sample. Severity only
    escalates within an episode. At most ``max_entities`` episodes are tracked (bounded
    state).

    >>> s, key = Sustain(sustain_s=2.0, gap_s=0.1, clear_s=0.5), ("nic", "gpu-1", "mlx5_0")
    >>> fired = []
    >>> for i in range(100):  # 0.1 s steps; one hot counter row per second for 6 s
    ...     start = i * NS // 10
    ...     rows = [Row(key, 1, start, (), NS, NS)] if i % 10 == 0 and 0 < i <= 60 else []
    ...     fired += [round(ep.ts / NS, 1) for _, ep in s.update(start, start + NS // 10, rows)]
    >>> fired[0], len(fired), key in s.episodes  # fired at 2 s, firing until 3 s after 6 s
    (2.0, 70, False)
    """

    # its configuration (a restored one takes today's: rocewatch.core.state.carry_params)
    PARAMS: ClassVar[tuple[str, ...]] = (
        "sustain_s",
        "gap_s",
        "clear_s",
        "max_entities",
        "min_rows",
    )
    sustain_s: float
    gap_s: float
    clear_s: float
    max_entities: int = 10_000
    episodes: dict[Key, Episode] = field(default_factory=dict)
    dropped: int = 0  # new episodes refused because max_entities were tracked
    # hot rows an episode needs before it fires, whatever they span: 2 keeps one slow
    # sample (the average of a 5 s burst) from firing alone
    min_rows: int = 1

    def update(self, start: int, end: int, rows: Iterable[Row]) -> list[tuple[Key, Episode]]:
        """Apply one step; return the firing episodes (``ts`` is their alert's startsAt)."""
        sustain = round(self.sustain_s * NS)
        gap = round(self.gap_s * NS)
        clear = round(self.clear_s * NS)
        step = max(1, end - start)
        for r in rows:
            ep = self.episodes.get(r.key)
            began = min(start, r.ts - max(0, r.held))
            if ep is None:
                if r.level < 1:
                    continue
                if len(self.episodes) >= self.max_entities:
                    if not self.dropped:
                        log.warning(
                            "tracking %d entities: new ones are ignored", len(self.episodes)
                        )
                    self.dropped += 1
                    continue
                ep = self.episodes[r.key] = Episode(since=began, last_hot=end, last_warm=end)
            iv = r.interval if r.interval > 0 else step
            ep.intervals = (*ep.intervals[1 - RECENT_INTERVALS :], iv)
            if r.level < 0:
                ep.last_cool = ep.last_cold = end
                continue
            ep.last_warm = end
            if r.level >= 1:
                ep.last_hot = end
                ep.hot_rows += 1
            else:
                ep.last_cool = end
            if r.level >= 2:
                if ep.crit_since is None or start - ep.last_crit > gap + ep.slack():
                    ep.crit_since = began
                ep.last_crit = end
            crit = r.level >= 2 and ep.crit_since is not None and end - ep.crit_since >= sustain
            if not ep.ts:
                held = end - ep.since
                # a critical run under way is waited for (up to sustain_s), so that one alert
                # fires at the right severity instead of a warning replaced a moment later
                waiting = r.level >= 2 and not crit and held < 2 * sustain
                enough = ep.hot_rows >= self.min_rows
                if r.level >= 1 and held >= sustain and enough and not waiting:
                    ep.ts, ep.info = r.ts, r.info
                    ep.severity = "critical" if crit else "warning"
            elif crit and ep.severity != "critical":
                ep.ts, ep.severity, ep.info = r.ts, "critical", r.info  # a new, critical alert
        for key in list(self.episodes):
            ep = self.episodes[key]
            slack = ep.slack() if ep.intervals else round(MISSED_SAMPLE_INTERVALS * step)
            if ep.ts:
                told = ep.last_cold > ep.last_warm
                if end - ep.last_warm >= clear + (0 if told else slack):
                    del self.episodes[key]
            else:
                told = ep.last_cool > ep.last_hot
                if end - ep.last_hot > gap + (0 if told else slack):
                    del self.episodes[key]
        return [(k, ep) for k, ep in self.episodes.items() if ep.ts]


# --- the detector -----------------------------------------------------------------------------


class EntitySlots(SlotTable[tuple[str, str]]):
    """Stable small integers for (device, port) entities, assigned to a frame's rows at once
    (``detectors.slots.SlotTable``).

    >>> s = EntitySlots()
    >>> f = pl.DataFrame({"device": ["a", "b", "a"], "port": ["x", "x", "x"]})
    >>> s.rows(f).tolist(), s.keys, s.index[("b", "x")]
    ([0, 1, 0], [('a', 'x'), ('b', 'x')], 1)
    """

    COLUMNS = ("device", "port")

    def rows(self, frame: pl.DataFrame) -> np.ndarray:
        """The slot of every row of ``frame`` (columns ``device``, ``port``)."""
        return self.frame_slots(frame)

    def rows_at(self, frame: pl.DataFrame, positions: tuple[int, np.ndarray] | None) -> np.ndarray:
        """Like ``rows``; where the window engine gave the rows' series positions
        ``(epoch, positions)``, each position's slot is remembered, so only rows of series not
        seen before are hashed. (A series maps to one entity: its device and port.)"""
        if positions is None:
            return self.rows(frame)
        return self.at_positions(
            positions, lambda miss: self.rows(frame[pl.Series(miss, dtype=pl.UInt32)])
        )
