"""The window engine: event-time steps closed by a watermark, rates per step, sliding windows.

Samples are buffered until the watermark (the slowest input's newest time, less the allowed
lateness) passes the end of their step; then the closed samples are sorted, turned into rates
and aggregated per series and step. So the result depends only on which samples arrived, not on
how Kafka partitions or files interleaved them. A sample older than a closed step is late: it is
counted and dropped.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import polars as pl

from detectors.rates import RateEngine
from rocewatch.model import SERIES_KEY
from rocewatch.stats import Stats

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


@dataclass(frozen=True)
class WindowConfig:
    step_s: float = 0.1
    lateness_s: float = 0.5
    history_s: float = 1.0  # the longest sliding window any detector reads
    max_steps_per_close: int = 100_000  # a longer silence is skipped, not replayed step by step


class Step:
    """One closed step: aggregated rows per series (``frame``), split by metric on demand."""

    __slots__ = ("_by_metric", "end", "frame", "start")

    def __init__(self, start: int, end: int, frame: pl.DataFrame | None = None) -> None:
        self.start = start
        self.end = end
        self.frame = frame if frame is not None else _EMPTY
        self._by_metric: dict[str, pl.DataFrame] | None = None

    @property
    def by_metric(self) -> dict[str, pl.DataFrame]:
        if self._by_metric is None:
            if self.frame.height == 0:
                self._by_metric = {}
            else:
                self._by_metric = {
                    str(k[0]): v for k, v in self.frame.partition_by("metric", as_dict=True).items()
                }
        return self._by_metric

    def get(self, metric: str) -> pl.DataFrame:
        return self.by_metric.get(metric, _EMPTY)

    def __getstate__(self) -> tuple[int, int, pl.DataFrame]:
        return (self.start, self.end, self.frame)  # the per-metric split is a cache

    def __setstate__(self, state: tuple[int, int, pl.DataFrame]) -> None:
        self.start, self.end, self.frame = state
        self._by_metric = None


class WindowEngine:
    def __init__(self, config: WindowConfig | None = None, stats: Stats | None = None) -> None:
        self.config = config or WindowConfig()
        self.stats = stats or Stats()
        self.step_ns = round(self.config.step_s * 1e9)
        self.rates = RateEngine(stats=self.stats)
        self.pending: list[pl.DataFrame] = []
        self.closed_ns: int | None = None  # every step ending at or before this is closed
        self.history: deque[Step] = deque(
            maxlen=max(2, int(self.config.history_s / self.config.step_s))
        )

    # --- input -----------------------------------------------------------------------------------
    def add(self, samples: pl.DataFrame) -> None:
        if samples.height == 0:
            return
        if self.closed_ns is not None:
            late = samples.filter(pl.col("ts") < self.closed_ns)
            if late.height:
                self.stats.inc("late_samples", late.height)
                samples = samples.filter(pl.col("ts") >= self.closed_ns)
        if samples.height:
            self.pending.append(samples)

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
        buf = pl.concat(self.pending, how="vertical") if self.pending else None
        if buf is not None and self.closed_ns is None:
            first = int(buf["ts"].min())  # type: ignore[arg-type]
            self.closed_ns = (first // self.step_ns) * self.step_ns
            if boundary <= self.closed_ns:
                return []
        assert self.closed_ns is not None
        if buf is not None:
            ready = buf.filter(pl.col("ts") < boundary)
            rest = buf.filter(pl.col("ts") >= boundary)
            self.pending = [rest] if rest.height else []
        else:
            ready = None
        steps = self._aggregate(ready) if ready is not None and ready.height else {}
        out: list[Step] = []
        n_steps = (boundary - self.closed_ns) // self.step_ns
        if n_steps <= self.config.max_steps_per_close:
            indices = range(self.closed_ns // self.step_ns, boundary // self.step_ns)
        else:  # a long silence (or a clock jump): only the steps that hold data
            indices = range(0)
            self.stats.inc("skipped_empty_steps", int(n_steps - len(steps)))
        for idx in sorted(set(indices) | set(steps)):
            out.append(Step(idx * self.step_ns, (idx + 1) * self.step_ns, steps.get(idx)))
        self.closed_ns = boundary
        return out

    def finish(self) -> list[Step]:
        """Close everything still pending (end of a replay)."""
        if not self.pending:
            return []
        last = max(int(f["ts"].max()) for f in self.pending)  # type: ignore[arg-type]
        return self.close_until(last + self.step_ns)

    def _aggregate(self, ready: pl.DataFrame) -> dict[int, pl.DataFrame]:
        r = self.rates.apply(ready)
        if r.height == 0:
            return {}
        agg = (
            r.with_columns((pl.col("ts") // self.step_ns).alias("step"))
            .sort(["sid", "ts"])
            .group_by(["step", "sid"])
            .agg(
                pl.col("device").first(),
                pl.col("port").first(),
                pl.col("qual").first(),
                pl.col("metric").first(),
                pl.col("delta").sum().alias("delta"),
                pl.col("dt").sum().alias("dt"),
                pl.col("value").last().alias("last"),
                pl.col("value").max().alias("max"),
                pl.col("value").min().alias("min"),
                pl.col("ts").max().alias("ts"),
                pl.len().cast(pl.UInt32).alias("n"),
            )
        )
        # gauges have no delta: keep it null rather than 0
        agg = agg.with_columns(
            pl.when(pl.col("dt") == 0).then(None).otherwise(pl.col("delta")).alias("delta"),
            pl.when(pl.col("dt") == 0).then(None).otherwise(pl.col("dt")).alias("dt"),
        )
        agg = agg.select("step", *AGG_SCHEMA)
        return {
            int(k[0]): part  # type: ignore[call-overload]
            for k, part in agg.partition_by("step", as_dict=True, include_key=False).items()
        }

    # --- sliding windows -------------------------------------------------------------------------
    def window(self, metric: str, seconds: float) -> pl.DataFrame:
        """Aggregate ``metric`` per series over the last ``seconds`` of closed steps."""
        n = self.steps_in(seconds)
        h = self.history
        parts = [
            h[i].by_metric[metric]
            for i in range(max(0, len(h) - n), len(h))
            if metric in h[i].by_metric
        ]
        if not parts:
            return _EMPTY
        if len(parts) == 1:
            return parts[0].select(list(AGG_SCHEMA))
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

    def steps_in(self, seconds: float) -> int:
        return max(1, round(seconds / self.config.step_s))

    def current(self) -> Step | None:
        return self.history[-1] if self.history else None
