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

from rocewatch.model import SERIES_KEY
from rocewatch.stats import Stats

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
_STATE_SCHEMA: dict[str, pl.DataType] = {
    "sid": pl.UInt64(),  # hash of the series key (device, port, qual, metric)
    "last_ts": pl.Int64(),
    "last_raw": pl.UInt64(),
}
_WRAP_FLOOR = np.uint64(3 << 62)  # a predecessor above 0.75 * 2^64 may have wrapped
_WRAP_MAX_DELTA = np.uint64(1 << 62)


@dataclass(frozen=True)
class RateConfig:
    max_gap_s: float = 30.0


class RateEngine:
    """Keeps the last reading of every counter series and turns new readings into deltas."""

    def __init__(self, config: RateConfig | None = None, stats: Stats | None = None) -> None:
        self.config = config or RateConfig()
        self.stats = stats or Stats()
        self.state = pl.DataFrame(schema=_STATE_SCHEMA)

    def apply(self, samples: pl.DataFrame) -> pl.DataFrame:
        """Samples (SAMPLE_SCHEMA, any order) -> rows of RATE_SCHEMA, sorted by series and time."""
        r = self.apply_narrow(samples)
        keys = samples.select(SERIES_KEY)[r.get_column("i")]
        return pl.concat([r.select("ts"), keys, r.select(RATE_SCHEMA_NUMERIC)], how="horizontal")

    def apply_narrow(self, samples: pl.DataFrame) -> pl.DataFrame:
        """Like ``apply``, but without the series key: column ``i`` is each row's index in
        ``samples`` (the caller gathers the strings it needs, once). Counters come sorted by
        series and time, then gauges likewise."""
        if samples.height == 0:
            return pl.DataFrame(schema=NARROW_SCHEMA)
        narrow = samples.select(
            pl.int_range(pl.len(), dtype=pl.UInt32).alias("i"),
            "ts",
            "value",
            "raw",
            pl.struct(SERIES_KEY).hash(seed=0).alias("sid"),
        )
        is_counter = pl.col("raw").is_not_null()
        gauges = narrow.filter(~is_counter).select(
            "ts",
            "i",
            "value",
            pl.lit(None, dtype=pl.Float64).alias("delta"),
            pl.lit(None, dtype=pl.Float64).alias("dt"),
            pl.lit(False).alias("reset"),
            "sid",
        )
        counters = narrow.filter(is_counter)
        if counters.height == 0:
            return gauges.sort(["sid", "ts"])
        return pl.concat([self._counters(counters), gauges.sort(["sid", "ts"])], how="vertical")

    def _counters(self, c: pl.DataFrame) -> pl.DataFrame:
        # One 64-bit id per series makes the joins and sorts below cheap; a checkpoint restored
        # under another Polars version (other hashes) just restarts each series' rate. Only
        # integer columns travel through the sort and joins.
        n_in = c.height
        c = c.select("i", "ts", "raw", "sid").sort(["sid", "ts"])
        dup = (pl.col("sid") == pl.col("sid").shift(1)) & (pl.col("ts") == pl.col("ts").shift(1))
        c = c.filter(~dup.fill_null(False))
        dups = n_in - c.height
        if dups:
            self.stats.inc("duplicate_samples", dups)
        if self.state.height:
            c = c.join(self.state, on="sid", how="left", maintain_order="left")
        else:
            c = c.with_columns(
                pl.lit(None, dtype=pl.Int64).alias("last_ts"),
                pl.lit(None, dtype=pl.UInt64).alias("last_raw"),
            )
        # drop readings older than (or as old as) what this series already consumed
        fresh = pl.col("last_ts").is_null() | (pl.col("ts") > pl.col("last_ts"))
        n_before = c.height
        c = c.filter(fresh)
        if c.height < n_before:
            self.stats.inc("stale_samples", n_before - c.height)
        first = pl.col("sid") != pl.col("sid").shift(1, fill_value=None)
        first = first.fill_null(True)
        last = (pl.col("sid") != pl.col("sid").shift(-1)).fill_null(True)
        c = c.with_columns(
            prev_ts=pl.when(first).then(pl.col("last_ts")).otherwise(pl.col("ts").shift(1)),
            prev_raw=pl.when(first).then(pl.col("last_raw")).otherwise(pl.col("raw").shift(1)),
            is_last=last,
        )
        newest = c.filter(pl.col("is_last")).select(
            "sid", pl.col("ts").alias("last_ts"), pl.col("raw").alias("last_raw")
        )
        if self.state.height:
            keep = self.state.filter(~pl.col("sid").is_in(newest["sid"].implode()))
            self.state = pl.concat([keep, newest], how="vertical")
        else:
            self.state = newest
        c = c.filter(pl.col("prev_ts").is_not_null())
        if c.height == 0:
            return pl.DataFrame(schema=NARROW_SCHEMA)
        cur = c["raw"].to_numpy()
        prev = c["prev_raw"].to_numpy()
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
        dt_s = (c["ts"] - c["prev_ts"]).to_numpy() / 1e9
        gaps = int((dt_s > self.config.max_gap_s).sum())
        if gaps:
            self.stats.inc("series_gaps", gaps)
        return pl.DataFrame(
            {
                "ts": c["ts"],
                "i": c["i"],
                "value": delta / dt_s,
                "delta": delta,
                "dt": dt_s,
                "reset": reset,
                "sid": c["sid"],
            },
            schema=NARROW_SCHEMA,
        )
