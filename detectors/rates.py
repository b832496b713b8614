"""Cumulative counters -> per-interval deltas and rates, per series, vectorised.

A counter that goes backwards is a reset (device reboot, counter clear) unless it was near the
top of the 64-bit range, in which case it wrapped. Duplicate samples (same series and time) and
samples older than the series' last one are dropped and counted; gaps simply make a longer
interval, flagged when longer than ``max_gap_s``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from rocewatch.core.keys import KEYS, mix, string_hashes
from rocewatch.core.model import SERIES_KEY
from rocewatch.core.stats import Stats

RATE_SCHEMA: dict[str, pl.DataType] = {
    "ts": pl.Int64(),
    "device": pl.String(),
    "port": pl.String(),
    "qual": pl.String(),
    "metric": pl.String(),
    "value": pl.Float64(),  # rate per second for counters, the reading for gauges
    "delta": pl.Float64(),  # counter increase over the interval; null for gauges
    "dt": pl.Float64(),  # interval length in seconds (null for gauges)
    "reset": pl.Boolean(),
    "sid": pl.UInt64(),  # series id (hash of device, port, qual, metric)
}
RATE_SCHEMA_NUMERIC = ["value", "delta", "dt", "reset", "sid"]
# what the window engine reads: the series key stays behind, ``i`` points at each row's sample
NARROW_SCHEMA: dict[str, pl.DataType] = {
    "ts": pl.Int64(),
    "i": pl.UInt32(),
    **{k: RATE_SCHEMA[k] for k in RATE_SCHEMA_NUMERIC},
}
_NARROW_NP: dict[str, type] = {
    "ts": np.int64,
    "i": np.uint32,
    "value": np.float64,
    "delta": np.float64,
    "dt": np.float64,
    "reset": np.bool_,
    "sid": np.uint64,
}
_STATE_SCHEMA: dict[str, pl.DataType] = {
    "sid": pl.UInt64(),  # hash of the series key (device, port, qual, metric)
    "last_ts": pl.Int64(),
    "last_raw": pl.UInt64(),
}
_WRAP_FLOOR = np.uint64(3 << 62)  # a predecessor above 0.75 * 2^64 may have wrapped
_WRAP_MAX_DELTA = np.uint64(1 << 62)


def series_ids(samples: pl.DataFrame) -> np.ndarray:
    """The 64-bit series id of every row: the series key's four strings (``SERIES_KEY``, in that
    order) hashed one column at a time by Polars, then combined in NumPy (``keys.mix``). A
    frame whose key is coded (``rocewatch.core.keys``) carries the same ids in its ``sid`` column.

    Hashing four narrow columns costs about a third of hashing their struct. The rate state in a
    checkpoint is keyed by these ids, so a checkpoint written with another id function (before
    this one) restores as unknown series: each counter restarts once (one interval without a
    rate), as after a counter clear."""
    if "sid" in samples.columns:
        return samples.get_column("sid").to_numpy()
    return mix([string_hashes(samples.get_column(k)) for k in SERIES_KEY])


@dataclass(frozen=True)
class RateConfig:
    max_gap_s: float = 30.0


class RateEngine:
    """Keeps the last reading of every counter series and turns new readings into deltas."""

    def __init__(self, config: RateConfig | None = None, stats: Stats | None = None) -> None:
        self.config = config or RateConfig()
        self.stats = stats or Stats()
        self._sid = np.empty(0, dtype=np.uint64)
        self._ts = np.empty(0, dtype=np.int64)
        self._raw = np.empty(0, dtype=np.uint64)

    def apply(self, samples: pl.DataFrame) -> pl.DataFrame:
        """Samples (SAMPLE_SCHEMA, any order) -> rows of RATE_SCHEMA, sorted by series and time."""
        r = self.apply_narrow(samples)
        keys = KEYS.decode(samples.select(SERIES_KEY)[r.get_column("i")])
        return pl.concat([r.select("ts"), keys, r.select(RATE_SCHEMA_NUMERIC)], how="horizontal")

    def apply_narrow(self, samples: pl.DataFrame) -> pl.DataFrame:
        """Like ``apply``, but without the series key: column ``i`` is each row's index in
        ``samples`` (the caller gathers the strings it needs, once). Counters come sorted by
        series and time, then gauges likewise."""
        return pl.DataFrame(self.apply_arrays(samples), schema=NARROW_SCHEMA).with_columns(
            pl.col("delta", "dt").fill_nan(None)  # gauges
        )

    def apply_arrays(
        self, samples: pl.DataFrame, sid: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """``apply_narrow`` as NumPy arrays (the columns of NARROW_SCHEMA; delta and dt are NaN
        for gauges), for callers that go on in NumPy (``sid``: the rows' series ids, if the
        caller has them)."""
        if samples.height == 0:
            return _empty_arrays()
        if sid is None:
            sid = series_ids(samples)
        ts = samples.get_column("ts").to_numpy()
        raw_col = samples.get_column("raw")
        n_null = raw_col.null_count()
        if n_null == 0:
            counter_rows = None  # every row is a counter
        else:
            is_counter = raw_col.is_not_null().to_numpy()
            counter_rows = np.flatnonzero(is_counter)
            gauge_rows = np.flatnonzero(~is_counter)
        value = samples.get_column("value").to_numpy()
        parts: list[dict[str, np.ndarray]] = []
        if counter_rows is None or len(counter_rows):
            raw = raw_col.fill_null(0).to_numpy() if n_null else raw_col.to_numpy()
            if counter_rows is None:
                rows = np.arange(len(sid), dtype=np.uint32)
                parts.append(self._counters(sid, ts, raw, rows))
            else:
                rows = counter_rows.astype(np.uint32)
                parts.append(self._counters(sid[rows], ts[rows], raw[rows], rows))
        if counter_rows is not None and len(gauge_rows):
            g_sid, g_ts = sid[gauge_rows], ts[gauge_rows]
            o = _series_time_order(g_sid, g_ts)
            nan = np.full(len(o), np.nan)
            parts.append(
                {
                    "ts": g_ts[o],
                    "i": gauge_rows[o].astype(np.uint32),
                    "value": value[gauge_rows][o],
                    "delta": nan,
                    "dt": nan,
                    "reset": np.zeros(len(o), dtype=bool),
                    "sid": g_sid[o],
                }
            )
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts]) for k in NARROW_SCHEMA}

    # --- state: the newest reading of every counter series, sorted by series id -----------------
    def __len__(self) -> int:
        return len(self._sid)

    @property
    def sids(self) -> np.ndarray:
        """The counter series ids with a reading kept, sorted."""
        return self._sid

    @property
    def state(self) -> pl.DataFrame:
        return pl.DataFrame(
            {"sid": self._sid, "last_ts": self._ts, "last_raw": self._raw}, schema=_STATE_SCHEMA
        )

    @state.setter
    def state(self, frame: pl.DataFrame) -> None:
        frame = frame.sort("sid")
        self._sid = frame.get_column("sid").to_numpy().astype(np.uint64)
        self._ts = frame.get_column("last_ts").to_numpy().astype(np.int64)
        self._raw = frame.get_column("last_raw").to_numpy().astype(np.uint64)

    def _counters(
        self, sid: np.ndarray, ts: np.ndarray, raw: np.ndarray, row: np.ndarray
    ) -> dict[str, np.ndarray]:
        # One 64-bit id per series; only integer arrays are sorted and searched (numpy). A
        # checkpoint restored under another Polars version (other hashes) just restarts each
        # series' rate.
        order = _series_time_order(sid, ts)
        sid, ts, raw, row = sid[order], ts[order], raw[order], row[order]
        dup = np.r_[False, (sid[1:] == sid[:-1]) & (ts[1:] == ts[:-1])]
        if dup.any():
            self.stats.inc("duplicate_samples", int(dup.sum()))
            keep = ~dup
            sid, ts, raw, row = sid[keep], ts[keep], raw[keep], row[keep]
        n = len(self._sid)
        if n and len(sid) == n and np.array_equal(sid, self._sid):
            # the usual step: every known series once, nothing new; no search needed
            if bool((ts > self._ts).all()):  # and every reading newer than the last
                prev_ts, prev_raw = self._ts, self._raw
                self._ts, self._raw = ts.copy(), raw.copy()
                return self._deltas(sid, ts, raw, row, prev_ts, prev_raw)
            at = np.arange(n)
            found = np.ones(n, dtype=bool)
        else:
            at = np.minimum(np.searchsorted(self._sid, sid), max(n - 1, 0))
            found = (self._sid[at] == sid) if n else np.zeros(len(sid), dtype=bool)
        # drop readings older than (or as old as) what this series already consumed
        fresh = ~found | (ts > np.where(found, self._ts[at] if n else 0, 0))
        if not fresh.all():
            self.stats.inc("stale_samples", int((~fresh).sum()))
            sid, ts, raw, row, at, found = (x[fresh] for x in (sid, ts, raw, row, at, found))
        if len(sid) == 0:
            return _empty_arrays()
        first = np.r_[True, sid[1:] != sid[:-1]]
        last = np.r_[sid[1:] != sid[:-1], True]
        prev_ts = np.r_[0, ts[:-1]]
        prev_raw = np.r_[np.uint64(0), raw[:-1]].astype(np.uint64)
        if n:
            prev_ts = np.where(first, self._ts[at], prev_ts)
            prev_raw = np.where(first, self._raw[at], prev_raw)
        has_prev = ~first | found
        # the newest reading of each series becomes its state
        known = last & found
        self._ts[at[known]] = ts[known]
        self._raw[at[known]] = raw[known]
        new = last & ~found
        if new.any():
            all_sid = np.concatenate([self._sid, sid[new]])
            o = np.argsort(all_sid, kind="stable")
            self._sid = all_sid[o]
            self._ts = np.concatenate([self._ts, ts[new]])[o]
            self._raw = np.concatenate([self._raw, raw[new]])[o]
        if not has_prev.all():
            sid, ts, raw, row = sid[has_prev], ts[has_prev], raw[has_prev], row[has_prev]
            prev_ts, prev_raw = prev_ts[has_prev], prev_raw[has_prev]
        if len(sid) == 0:
            return _empty_arrays()
        return self._deltas(sid, ts, raw, row, prev_ts, prev_raw)

    def _deltas(
        self,
        sid: np.ndarray,
        ts: np.ndarray,
        raw: np.ndarray,
        row: np.ndarray,
        prev_ts: np.ndarray,
        prev_raw: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """Rows with a predecessor -> their deltas and rates (resets, wraps, gaps counted)."""
        cur, prev = raw, prev_raw
        with np.errstate(over="ignore"):
            diff = cur - prev  # uint64: wraps modulo 2^64, exact
        back = cur < prev
        wrapped = back & (prev >= _WRAP_FLOOR) & (diff < _WRAP_MAX_DELTA)
        reset = back & ~wrapped
        delta = np.where(reset, cur, diff).astype(np.float64)
        n_reset = int(reset.sum())
        if n_reset:
            self.stats.inc("counter_resets", n_reset)
        if wrapped.any():
            self.stats.inc("counter_wraps", int(wrapped.sum()))
        dt_s = (ts - prev_ts) / 1e9
        gaps = int((dt_s > self.config.max_gap_s).sum())
        if gaps:
            self.stats.inc("series_gaps", gaps)
        return {
            "ts": ts,
            "i": row,
            "value": delta / dt_s,
            "delta": delta,
            "dt": dt_s,
            "reset": reset,
            "sid": sid,
        }


def _series_time_order(sid: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """The order that sorts rows by series id, then time (ties keep their order).

    Usually every series has one row per batch: one quick sort of the ids, then; the stable
    two-key sort only when some series repeats.
    """
    order = np.argsort(sid)
    s = sid[order]
    if len(s) > 1 and bool((s[1:] == s[:-1]).any()):
        return np.lexsort((ts, sid))
    return order


def _empty_arrays() -> dict[str, np.ndarray]:
    return {k: np.empty(0, dtype=t) for k, t in _NARROW_NP.items()}
