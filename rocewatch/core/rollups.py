"""The metric rollup frame: one row per series and time bucket, as the pipeline computes it,
the sink carries it and the store keeps it (``metric_rollups``). Its one definition."""

from __future__ import annotations

import polars as pl

ROLLUP_SCHEMA: dict[str, pl.DataType] = {
    "bucket_start_ns": pl.Int64(),
    "resolution_s": pl.Int64(),
    "device": pl.String(),
    "port": pl.String(),
    "qual": pl.String(),
    "metric": pl.String(),
    "mean": pl.Float64(),
    "max": pl.Float64(),
    "min": pl.Float64(),
    "last": pl.Float64(),
    "count": pl.Int64(),
}
ROLLUP_COLUMNS: list[str] = list(ROLLUP_SCHEMA)
ROLLUP_KEY: list[str] = ROLLUP_COLUMNS[:6]  # what names a bucket of a series (the upsert key)
ROLLUP_VALUES: list[str] = ROLLUP_COLUMNS[6:]  # its figures
