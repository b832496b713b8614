"""The window engine: event-time steps closed by a watermark, rates per step, sliding windows.

Samples are buffered until the watermark (the slowest input's newest time, less the allowed
lateness) passes the end of their step; then the closed samples are sorted, turned into rates
and aggregated per series and step. So the result depends only on which samples arrived, not on
how Kafka partitions or files interleaved them. A sample older than a closed step is late: it is
counted and dropped (but NCCL job telemetry, which has a lateness of its own:
detectors/job_lane.py).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import polars as pl

from detectors import job_lane
from detectors.rates import RateEngine, series_ids
from rocewatch.core.errors import ConfigError
from rocewatch.core.keys import KEYS
from rocewatch.core.model import SERIES_KEY
from rocewatch.core.state import StateMismatch
from rocewatch.core.stats import Stats

AGG_SCHEMA: dict[str, pl.DataType] = {
    "device": pl.String(),
    "port": pl.String(),
    "qual": pl.String(),
    "metric": pl.String(),
    "delta": pl.Float64(),  # summed counter increase (null for gauges)
    "dt": pl.Float64(),  # summed interval seconds (null for gauges)
    "last": pl.Float64(),  # latest reading (rate for counters)
    "max": pl.Float64(),
    "min": pl.Float64(),
    "ts": pl.Int64(),  # newest sample time that contributed
    "n": pl.UInt32(),
}
_EMPTY = pl.DataFrame(schema=AGG_SCHEMA)
log = logging.getLogger(__name__)
_EPOCHS = itertools.count(1)


@dataclass(frozen=True)
class WindowConfig:
    step_s: float = 0.1
    lateness_s: float = 0.5
    # NCCL job telemetry arrives a dump interval (plus a poll) late: its late samples wait
    # this long in a lane of their own instead of being dropped (detectors/job_lane.py); no
    # more than lateness_s turns the lane off
    job_lateness_s: float = 3.0
    history_s: float = 1.0  # the longest sliding window any detector reads
    max_steps_per_close: int = 100_000  # a longer silence is skipped, not replayed step by step
    # the most series one engine keeps (in scale-out: per telemetry partition). Telemetry
    # naming ever new series (a buggy agent, a counter name with a timestamp in it) would
    # otherwise grow every per-series table, the checkpoint and the detectors' state without
    # end. Samples of series beyond it are dropped and counted (``series_over_limit``).
    max_series: int = 2_000_000
    # a source's sample stamped further ahead of its newest accepted time (or, live, of the wall
    # clock) than this, or further behind, is set aside and counted (detectors/clock_guard.py)
    max_ahead_s: float = 30.0
    max_behind_s: float = 600.0

    def __post_init__(self) -> None:
        ms = self.max_series
        if isinstance(ms, bool) or not isinstance(ms, int) or ms < 1:
            raise ConfigError(f"window.max_series: {ms!r} must be a whole number >= 1")
        if not self.max_ahead_s > 0 or not self.max_behind_s > 0:
            raise ConfigError("window.max_ahead_s and window.max_behind_s must be > 0")
        if not self.job_lateness_s >= 0:
            raise ConfigError(f"window.job_lateness_s: {self.job_lateness_s!r} must be >= 0")


class Step:
    """One closed step: aggregated rows per series, split by metric (``by_metric``).

    ``frame`` (all metrics in one frame) is built on demand, for rollups and checkpoints.
    """

    __slots__ = ("_by_metric", "_frame", "_windows", "end", "positions", "start")

    def __init__(
        self,
        start: int,
        end: int,
        frame: pl.DataFrame | None = None,
        by_metric: dict[str, pl.DataFrame] | None = None,
        positions: tuple[int, dict[str, np.ndarray]] | None = None,
    ) -> None:
        self.start = start
        # (series table epoch, each metric's rows' positions in that table): lets a detector
        # find its own per-series slot without hashing the key strings (a cache, not pickled)
        self.positions = positions
        self.end = end
        self._frame = frame
        self._by_metric = by_metric
        # sliding windows that end at this step, by (engine, metric, steps): several detectors
        # (or one detector's detection and restoration times) read the same window
        self._windows: dict[tuple[int, str, int], pl.DataFrame] = {}
        if frame is None and by_metric is None:
            self._frame = _EMPTY

    @property
    def frame(self) -> pl.DataFrame:
        if self._frame is None:
            parts = list((self._by_metric or {}).values())
            self._frame = pl.concat(parts, how="vertical") if parts else _EMPTY
        return self._frame

    @property
    def by_metric(self) -> dict[str, pl.DataFrame]:
        if self._by_metric is None:
            f = self.frame
            if f.height == 0:
                self._by_metric = {}
            else:
                self._by_metric = {
                    str(k[0]): v for k, v in f.partition_by("metric", as_dict=True).items()
                }
        return self._by_metric

    def get(self, metric: str) -> pl.DataFrame:
        return self.by_metric.get(metric, _EMPTY)

    def __getstate__(self) -> tuple[int, int, pl.DataFrame]:
        return (self.start, self.end, self.frame)  # the per-metric split is a cache

    def __setstate__(self, state: tuple[int, int, pl.DataFrame]) -> None:
        self.start, self.end, self._frame = state
        self._by_metric = None
        self.positions = None
        self._windows = {}


def sorted_lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """``values[i]`` where ``keys[i] == q`` (``keys`` sorted, non-empty), -1 where absent, for
    every ``q`` in ``query``.

    A binary search of random keys misses the cache at every level; queries in sorted order
    walk the table once, so unsorted queries are sorted first (about six times faster at 50k);
    a few sorted runs are searched as they are.
    """
    n = len(query)
    if n > 1 and int(np.count_nonzero(query[1:] < query[:-1])) > 16:
        order = np.argsort(query)
        at = np.empty(n, dtype=np.int64)
        at[order] = np.searchsorted(keys, query[order])
    else:
        at = np.searchsorted(keys, query)
    at = np.minimum(at, len(keys) - 1)
    return np.where(keys[at] == query, values[at], -1)


class SeriesTable:
    """Every series seen: its key (strings, one row each in one contiguous frame) and a small
    metric code, found from the 64-bit series id by a vectorised binary search.

    A cache: a checkpoint does not carry it (it is rebuilt from the samples that follow).
    """

    def __init__(self) -> None:
        # positions are valid only in this table: a restored or second table has a new epoch
        self.epoch = next(_EPOCHS)
        self.keys = pl.DataFrame(schema={k: pl.String() for k in SERIES_KEY})
        self.metric_code = np.empty(0, dtype=np.int32)
        self.metrics: list[str] = []
        self._codes: dict[str, int] = {}
        # the key as codes, one column per SERIES_KEY string, into that column's value table
        # (``key_values``): what crosses a topic in place of the strings (rocewatch.runtime.steps)
        self.key_codes = np.empty((0, len(SERIES_KEY)), dtype=np.uint32)
        self.key_values: list[list[str]] = [[] for _ in SERIES_KEY]
        self._key_index: list[dict[str, int]] = [{} for _ in SERIES_KEY]
        self._sids = np.empty(0, dtype=np.uint64)
        self._sorted = np.empty(0, dtype=np.uint64)
        self._order = np.empty(0, dtype=np.int64)
        # the last batch's ids and positions (positions never change, so it stays valid)
        self._last: tuple[np.ndarray, np.ndarray] | None = None
        self._last_keys: tuple[np.ndarray, pl.DataFrame] | None = None
        # the engine's last (step, metric, position) sort keys and their order
        self.last_order: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self._sids)

    def keys_at(self, pos: np.ndarray) -> pl.DataFrame:
        """The series keys at ``pos``; the same positions as last time give the same frame
        (frames are immutable), so steady steps gather no strings."""
        last = self._last_keys
        if last is not None and np.array_equal(last[0], pos):
            return last[1]
        keys = self.keys[pos]
        self._last_keys = (pos, keys)
        return keys

    def __getstate__(self) -> dict[str, object]:
        return {}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__()  # type: ignore[misc]

    def _lookup(self, sid: np.ndarray) -> np.ndarray:
        if len(self._sorted) == 0:
            return np.full(len(sid), -1, dtype=np.int64)
        return sorted_lookup(self._sorted, self._order, sid)

    def ids(self, step: Step) -> np.ndarray | None:
        """The series id of every row of ``step.frame``, where this table made the step."""
        pos = self.step_positions(step)
        return None if pos is None or not len(pos) else self._sids[pos]

    def step_positions(self, step: Step) -> np.ndarray | None:
        """This table's position of every row of ``step.frame``, where this table made the
        step (else None)."""
        known = step.positions
        if known is None or known[0] != self.epoch or len(step.by_metric) != len(known[1]):
            return None
        parts = [known[1][m] for m in step.by_metric]  # the frame's rows: its parts in order
        pos = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        return pos if len(pos) == step.frame.height else None

    def metric_ids(self, step: Step, metric: str) -> np.ndarray | None:
        """The series id of every row of ``step.by_metric[metric]``, where this table made the
        step (else None)."""
        pos = self.metric_positions(step, metric)
        return None if pos is None else self._sids[pos]

    def metric_positions(self, step: Step, metric: str) -> np.ndarray | None:
        """This table's position of every row of ``step.by_metric[metric]``, where this table
        made the step (else None)."""
        known = step.positions
        if known is None or known[0] != self.epoch:
            return None
        pos = known[1].get(metric)
        return pos if pos is not None and len(pos) == step.by_metric[metric].height else None

    def sids_at(self, pos: np.ndarray) -> np.ndarray:
        return self._sids[pos]

    def positions(self, sid: np.ndarray, samples: pl.DataFrame, row: np.ndarray) -> np.ndarray:
        """The table position of every series id; new ones take their key from ``samples``
        at ``row``."""
        last = self._last
        if last is not None and np.array_equal(last[0], sid):
            return last[1]  # the same series as the last batch (the usual step)
        pos = self._positions(sid, samples, row)
        self._last = (sid, pos)
        return pos

    def _positions(self, sid: np.ndarray, samples: pl.DataFrame, row: np.ndarray) -> np.ndarray:
        pos = self._lookup(sid)
        missing = np.flatnonzero(pos < 0)
        if len(missing):
            new_sid, first = np.unique(sid[missing], return_index=True)
            rows = row[missing[first]]
            new = KEYS.decode(samples.select(SERIES_KEY)[pl.Series(rows, dtype=pl.UInt32)])
            # a Python step per distinct string, not per series: a fabric's first step brings
            # tens of thousands of series but only hundreds of devices, ports and metrics
            codes = _code_strings(new.get_column("metric"), self._codes, self.metrics)
            self.keys = pl.concat([self.keys, new], how="vertical").rechunk()
            key_codes = np.empty((new.height, len(SERIES_KEY)), dtype=np.uint32)
            for j, (c, index, values) in enumerate(
                zip(SERIES_KEY, self._key_index, self.key_values, strict=True)
            ):
                key_codes[:, j] = _code_strings(new.get_column(c), index, values)
            self.key_codes = np.concatenate([self.key_codes, key_codes])
            self.metric_code = np.concatenate([self.metric_code, codes.astype(np.int32)])
            self._sids = np.concatenate([self._sids, new_sid])
            self._order = np.argsort(self._sids, kind="stable").astype(np.int64)
            self._sorted = self._sids[self._order]
            pos = self._lookup(sid)
        return pos


def _code_strings(col: pl.Series, index: dict[Any, int], values: list[Any]) -> np.ndarray:
    """The code of each string of ``col`` in ``index`` (string -> its place in ``values``),
    adding the ones not there yet in order of first appearance (a null is a value too)."""
    uniq = col.unique(maintain_order=True)
    distinct = uniq.to_list()
    for v in distinct:
        if v not in index:
            index[v] = len(values)
            values.append(v)
    table = pl.DataFrame({"v": uniq, "c": pl.Series([index[v] for v in distinct], dtype=pl.UInt32)})
    return (
        pl.DataFrame({"v": col})
        .join(table, on="v", how="left", nulls_equal=True, maintain_order="left")
        .get_column("c")
        .to_numpy()
    )


def window_by_group_by(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """A sliding window of per-step aggregates (``AGG_SCHEMA`` frames), combined per series by
    a Polars group-by: the general path, which the engine's fast paths must agree with."""
    return (
        pl.concat(parts, how="vertical")
        .sort("ts")
        .group_by(SERIES_KEY)
        .agg(
            pl.col("delta").sum(),
            pl.col("dt").sum(),
            pl.col("last").last(),
            pl.col("max").max(),
            pl.col("min").min(),
            pl.col("ts").max(),
            pl.col("n").sum(),
        )
        .select(list(AGG_SCHEMA))
    )


class WindowEngine:
    def __init__(self, config: WindowConfig | None = None, stats: Stats | None = None) -> None:
        self.config = config or WindowConfig()
        self.stats = stats or Stats()
        self.step_ns = round(self.config.step_s * 1e9)
        self.rates = RateEngine(stats=self.stats)
        self.series = SeriesTable()
        # buffered samples, one frame per ``add``, with each frame's oldest and newest time
        self.pending: list[tuple[pl.DataFrame, int, int]] = []
        self.closed_ns: int | None = None  # every step ending at or before this is closed
        self.history: deque[Step] = deque(
            maxlen=max(2, int(self.config.history_s / self.config.step_s))
        )
        self._limit_logged = -float("inf")  # when the series limit was last logged
        # late job (NCCL) samples' own lane, with its own lateness (detectors/job_lane.py)
        self.job_lane = job_lane.lane_for(self)

    # the record types its state holds (rocewatch.core.state)
    STATE_TYPES: ClassVar[tuple[type, ...]] = (Step,)

    def state(self) -> dict[str, object]:
        """What it holds, as data: each counter's last reading, the buffered samples, the
        steps the sliding windows still read, and where it has closed. The series table is a
        cache (rebuilt from the samples that follow)."""
        return {
            "step_ns": self.step_ns,
            "rates": self.rates.state,
            # buffered samples with coded keys (rocewatch.core.keys) keep their strings: codes
            # mean something only in the process that made them
            "pending": [(KEYS.decode(f), lo, hi) for f, lo, hi in self.pending],
            "closed_ns": self.closed_ns,
            "history": list(self.history),
            "job_lane": self.job_lane.state() if self.job_lane is not None else None,
        }

    def restore(self, data: dict[str, Any]) -> None:
        """Lay ``state()`` of an earlier run over this engine, built from today's
        configuration. ``StateMismatch`` when the step length changed: its steps and buffered
        samples do not fit this engine's (the caller starts afresh)."""
        if data.get("step_ns") != self.step_ns:
            raise StateMismatch(
                f"window.step_s changed ({data.get('step_ns')} ns, now {self.step_ns} ns)"
            )
        self.rates.state = data["rates"]
        self.pending = [(f, int(lo), int(hi)) for f, lo, hi in data["pending"]]
        self.closed_ns = data["closed_ns"]
        self.history = deque(data["history"], maxlen=self.history.maxlen)
        if self.job_lane is not None and data.get("job_lane"):
            self.job_lane.restore(data["job_lane"])

    # --- input -----------------------------------------------------------------------------------
    def add(self, samples: pl.DataFrame) -> None:
        """Buffer samples (SAMPLE_SCHEMA, or with the key coded: ``wire.coded_frames``)."""
        if samples.height == 0:
            return
        ts_col = samples.get_column("ts")
        if ts_col.null_count():
            self._add_with_nulls(samples)
            return
        ts = ts_col.to_numpy()
        if self.closed_ns is not None and int(ts.min()) < self.closed_ns:
            on_time = ts >= self.closed_ns
            n_late = int(len(ts) - on_time.sum())
            if self.job_lane is not None:  # late job telemetry waits in its own lane
                late = samples.filter(pl.Series(~on_time))
                jobs = job_lane.job_rows(late)
                if n_jobs := int(jobs.sum()):
                    self.job_lane.add(late.filter(jobs))  # (it counts what is too late for it)
                    n_late -= n_jobs
            if n_late:
                self.stats.inc("late_samples", n_late)
            samples = samples.filter(pl.Series(on_time))
            ts = ts[on_time]
        if samples.height:
            self.pending.append((samples, int(ts.min()), int(ts.max())))

    def _add_with_nulls(self, samples: pl.DataFrame) -> None:
        # the general path (Polars comparisons) for frames whose times are not all known
        if self.closed_ns is not None:
            late = samples.filter(pl.col("ts") < self.closed_ns)
            if late.height:
                self.stats.inc("late_samples", late.height)
                samples = samples.filter(pl.col("ts") >= self.closed_ns)
        if samples.height:
            ts = samples.get_column("ts")
            self.pending.append((samples, int(ts.min()), int(ts.max())))  # type: ignore[arg-type]

    def lateness_ns(self) -> int:
        return int(self.config.lateness_s * 1e9)

    # --- closing ---------------------------------------------------------------------------------
    def keep_history(self, seconds: float) -> None:
        """Keep only the steps the longest sliding window needs (memory, checkpoint size)."""
        n = self.steps_in(seconds) + 1
        if n != self.history.maxlen:
            self.history = deque(self.history, maxlen=n)

    def enter(self, step: Step) -> None:
        """Make ``step`` the newest one the sliding windows see (call in time order)."""
        self.history.append(step)

    def close_until(self, watermark_ns: int) -> list[Step]:
        """Close every step that ends at or before ``watermark_ns``; return them in time order.

        The caller evaluates them one by one, calling ``enter`` before each.
        """
        boundary = (watermark_ns // self.step_ns) * self.step_ns
        if not self.pending and self.closed_ns is None:
            return []
        if self.closed_ns is not None and boundary <= self.closed_ns:
            return []
        if self.pending and self.closed_ns is None:
            first = min(lo for _, lo, _ in self.pending)
            self.closed_ns = (first // self.step_ns) * self.step_ns
            if boundary <= self.closed_ns:
                return []
        assert self.closed_ns is not None
        # whole frames move without a copy; only a frame that straddles the boundary is split
        parts: list[pl.DataFrame] = []
        rest: list[tuple[pl.DataFrame, int, int]] = []
        for frame, lo, hi in self.pending:
            if hi < boundary:
                parts.append(frame)
            elif lo >= boundary:
                rest.append((frame, lo, hi))
            elif frame.get_column("ts").null_count() == 0:
                ts = frame.get_column("ts").to_numpy()
                early = ts < boundary
                parts.append(frame.filter(pl.Series(early)))
                rest.append((frame.filter(pl.Series(~early)), int(ts[~early].min()), hi))
            else:
                t = pl.col("ts")
                parts.append(frame.filter(t < boundary))
                later = frame.filter(t >= boundary)
                rest.append((later, int(later["ts"].min()), hi))  # type: ignore[arg-type]
        self.pending = rest
        ready = KEYS.concat(parts) if parts else None
        steps, positions, frames = (
            self._aggregate(ready) if ready is not None and ready.height else ({}, {}, {})
        )
        out: list[Step] = []
        n_steps = (boundary - self.closed_ns) // self.step_ns
        if n_steps <= self.config.max_steps_per_close:
            indices = range(self.closed_ns // self.step_ns, boundary // self.step_ns)
        else:  # a long silence (or a clock jump): only the steps that hold data
            indices = range(0)
            self.stats.inc("skipped_empty_steps", int(n_steps - len(steps)))
        for idx in sorted(set(indices) | set(steps)):
            out.append(
                Step(
                    idx * self.step_ns,
                    (idx + 1) * self.step_ns,
                    frame=frames.get(idx),  # all its metrics: one slice, no concatenation
                    by_metric=steps.get(idx, {}),
                    positions=(self.series.epoch, positions.get(idx, {})),
                )
            )
        self.closed_ns = boundary
        if self.job_lane is not None and out:
            extra = self.job_lane.lateness_ns() - self.lateness_ns()
            lane = self.job_lane.close_until(watermark_ns - extra)
            job_lane.merge(out, lane, extra, self.series.epoch)
        return out

    def finish(self) -> list[Step]:
        """Close everything still pending (end of a replay)."""
        out: list[Step] = []
        if self.pending:
            last = max(hi for _, _, hi in self.pending)
            out = self.close_until(last + self.step_ns)
        lane = self.job_lane.finish() if self.job_lane is not None else []
        if any(js.by_metric for js in lane):
            if not out:  # one more step carries them
                at = self.closed_ns if self.closed_ns is not None else lane[-1].start
                self.closed_ns = at + self.step_ns
                out = [Step(at, at + self.step_ns)]
            job_lane.merge(out, lane, 0, self.series.epoch)
        return out

    def _aggregate(
        self, ready: pl.DataFrame
    ) -> tuple[
        dict[int, dict[str, pl.DataFrame]],
        dict[int, dict[str, np.ndarray]],
        dict[int, pl.DataFrame],
    ]:
        """Rates per series and step, split by step and metric.

        Only integer and float columns are sorted and reduced (numpy, one pass); the series
        key (strings) is gathered once per aggregated row from the series table, and each
        (step, metric) part is a zero-copy slice of one frame.
        """
        sid = series_ids(ready)
        ok = self._admit(sid)
        if ok is not None:
            self._over_limit(int(len(ok) - ok.sum()))
            ready, sid = ready.filter(pl.Series(ok)), sid[ok]
        r = self.rates.apply_arrays(ready, sid)
        if len(r["ts"]) == 0:
            return {}, {}, {}
        ts = r["ts"]
        pos = self.series.positions(r["sid"], ready, r["i"])
        code = self.series.metric_code[pos].astype(np.int64)
        step = ts // self.step_ns
        s0 = int(step.min())
        unique = False  # every (step, series) has one row: nothing to reduce
        if int(step.max()) - s0 < (1 << 19):
            key = ((step - s0) << 44) | (code << 28) | pos
            last = self.series.last_order
            if last is not None and np.array_equal(last[0], key):
                order, unique = last[1], True  # the same rows as the last batch's, in its order
            else:
                # rows come sorted by series, then time: a stable sort keeps that order within
                # a group; the quick sort gives the same order when no two rows share a key
                order = np.argsort(key)
                k = key[order]
                unique = len(k) < 2 or not bool((k[1:] == k[:-1]).any())
                if not unique:
                    order = np.argsort(key, kind="stable")
                self.series.last_order = (key, order) if unique else None
        else:  # a batch spanning a very long time (a clock jump): the general sort
            order = np.lexsort((ts, pos, code, step))
        step_o, code_o, pos_o = step[order], code[order], pos[order]
        value = r["value"][order]
        cols: dict[str, np.ndarray]
        if unique:
            starts = np.arange(len(order))
            # one row per group: its sums are its own delta and dt (NaN for gauges, whose dt
            # is NaN too), its last, max and min its value
            cols = {
                "delta": r["delta"][order],
                "dt": r["dt"][order],
                "last": value,
                "max": value,
                "min": value,
                "ts": ts[order],
                "n": np.ones(len(order), dtype=np.uint32),
            }
        else:
            starts = np.flatnonzero(
                np.r_[
                    True,
                    (step_o[1:] != step_o[:-1])
                    | (code_o[1:] != code_o[:-1])
                    | (pos_o[1:] != pos_o[:-1]),
                ]
            )
            ends = np.r_[starts[1:] - 1, len(order) - 1]
            delta = np.add.reduceat(np.nan_to_num(r["delta"][order]), starts)
            dt = np.add.reduceat(np.nan_to_num(r["dt"][order]), starts)
            gauge = dt == 0  # gauges have no delta: keep it null rather than 0
            cols = {
                "delta": np.where(gauge, np.nan, delta),
                "dt": np.where(gauge, np.nan, dt),
                "last": value[ends],
                "max": np.fmax.reduceat(value, starts),
                "min": np.fmin.reduceat(value, starts),
                "ts": ts[order][ends],
                "n": np.diff(np.r_[starts, len(order)]).astype(np.uint32),
            }
        agg = pl.concat(
            [
                self.series.keys_at(pos_o[starts]),
                pl.DataFrame(cols).with_columns(
                    pl.col("delta").fill_nan(None),
                    pl.col("dt").fill_nan(None),
                ),
            ],
            how="horizontal",
        )
        # parts: runs of the same (step, metric) in the sorted rows
        group_step = step_o[starts]
        group_code = code_o[starts]
        cut = np.flatnonzero(
            np.r_[True, (group_step[1:] != group_step[:-1]) | (group_code[1:] != group_code[:-1])]
        )
        bounds = np.r_[cut, len(starts)]
        names = self.series.metrics
        group_pos = pos_o[starts]
        out: dict[int, dict[str, pl.DataFrame]] = {}
        positions: dict[int, dict[str, np.ndarray]] = {}
        rows: dict[int, list[int]] = {}  # each step's rows: one run of the sorted rows
        for j in range(len(cut)):
            a, b = int(bounds[j]), int(bounds[j + 1])
            part = agg.slice(a, b - a)
            step_idx, name = int(group_step[a]), names[int(group_code[a])]
            out.setdefault(step_idx, {})[name] = part
            positions.setdefault(step_idx, {})[name] = group_pos[a:b]
            rows.setdefault(step_idx, [a, b])[1] = b
        frames = {i: agg.slice(a, b - a) for i, (a, b) in rows.items()}
        return out, positions, frames

    def _admit(self, sid: np.ndarray) -> np.ndarray | None:
        """The rows (by series id) that may enter, with at most ``max_series`` series: None
        when all may. Far below the limit (the series table and the rate state together, plus
        this batch, cannot exceed it) nothing is searched. Near it, a ledger of the series
        admitted decides: known series enter, and of the new ones as many as there is room
        for, in order of first appearance."""
        cap = self.config.max_series
        ledger = self.__dict__.get("_ledger")
        if ledger is None:
            if len(self.series) + len(self.rates) + len(sid) <= cap:
                return None
            # built once, when the limit comes near: every series either table holds (the
            # rate state has counters whose first reading made no row yet)
            ledger = np.union1d(self.series.sids_at(np.arange(len(self.series))), self.rates.sids)
        found = np.zeros(len(sid), dtype=bool)
        if len(ledger):
            at = np.minimum(np.searchsorted(ledger, sid), len(ledger) - 1)
            found = ledger[at] == sid
        ok: np.ndarray | None = None
        if not found.all():
            new_sid, first = np.unique(sid[~found], return_index=True)
            room = max(cap - len(ledger), 0)
            take = new_sid
            if len(new_sid) > room:
                take = np.sort(new_sid[np.argsort(first, kind="stable")][:room])
                ok = found | np.isin(sid, take)
            ledger = np.union1d(ledger, take)
        self._ledger = ledger
        return ok

    def _over_limit(self, n: int) -> None:
        self.stats.inc("series_over_limit", n)
        now = time.monotonic()
        if now - self._limit_logged >= 60.0:
            self._limit_logged = now
            log.warning(
                "series limit reached (window.max_series %d): samples of new series are "
                "dropped and counted (series_over_limit)",
                self.config.max_series,
            )

    # --- sliding windows -------------------------------------------------------------------------
    def window(self, metric: str, seconds: float) -> pl.DataFrame:
        """Aggregate ``metric`` per series over the last ``seconds`` of closed steps."""
        h = self.history
        if not h:
            return _EMPTY
        n = min(self.steps_in(seconds), len(h))
        cache = h[-1]._windows
        key = (id(self), metric, n)  # a step entered into two engines may have two pasts
        hit = cache.get(key)
        if hit is None:
            hit = cache[key] = self._window(metric, n)
        return hit

    def _window(self, metric: str, n: int) -> pl.DataFrame:
        h = self.history
        steps = [h[i] for i in range(max(0, len(h) - n), len(h)) if metric in h[i].by_metric]
        parts = [st.by_metric[metric] for st in steps]
        if not parts:
            return _EMPTY
        if len(parts) == 1:
            return parts[0].select(list(AGG_SCHEMA))
        known = [st.positions for st in steps]
        # two parts only: a sum of more floats could round otherwise than Polars' sum does
        if len(parts) == 2 and all(
            k is not None and k[0] == self.series.epoch and metric in k[1] for k in known
        ):
            pos = [k[1][metric] for k in known]  # type: ignore[index]
            return self._window_by_position(parts, pos)
        return window_by_group_by(parts)

    def _window_by_position(self, parts: list[pl.DataFrame], pos: list[np.ndarray]) -> pl.DataFrame:
        """The sliding window of ``parts`` (steps in time order) grouped by the rows' series
        positions in NumPy: the same values as the Polars group-by (a series' rows follow in
        time order, so ``last`` is the newest; a sum skips nulls and is 0 when all are null),
        rows in series-table order."""
        p = np.concatenate(pos)
        order = np.argsort(p, kind="stable")
        p = p[order]
        starts = np.flatnonzero(np.r_[True, p[1:] != p[:-1]])
        ends = np.r_[starts[1:] - 1, len(p) - 1]
        cat = pl.concat(parts, how="vertical", rechunk=False)

        def col(name: str) -> np.ndarray:
            c = cat.get_column(name)
            if c.null_count() and name in ("delta", "dt"):
                c = c.fill_null(0)
            return c.to_numpy()[order]

        return pl.concat(
            [
                self.series.keys[p[starts]],
                pl.DataFrame(
                    {
                        "delta": np.add.reduceat(col("delta"), starts),
                        "dt": np.add.reduceat(col("dt"), starts),
                        "last": col("last")[ends],
                        "max": np.fmax.reduceat(col("max"), starts),
                        "min": np.fmin.reduceat(col("min"), starts),
                        "ts": np.maximum.reduceat(col("ts"), starts),
                        "n": np.add.reduceat(col("n"), starts),
                    },
                    schema={k: v for k, v in AGG_SCHEMA.items() if k not in SERIES_KEY},
                ),
            ],
            how="horizontal",
        )

    def steps_in(self, seconds: float) -> int:
        return max(1, round(seconds / self.config.step_s))

    def current(self) -> Step | None:
        return self.history[-1] if self.history else None
