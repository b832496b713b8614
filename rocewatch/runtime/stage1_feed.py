"""Detectors fed by stage 1 (the registry's ``stage1_feed``, the isolation forest's
``FeatureFeed``): in the scale-out path they take their window values from the aggregate
stage's steps messages, since the steps do not carry their own metrics."""

from __future__ import annotations

import polars as pl

from detectors.registry import DETECTORS
from rocewatch.core.stats import Stats
from rocewatch.pipeline import Pipeline


def feed_from_stage1(pipeline: Pipeline) -> None:
    """Switch ``pipeline``'s stage-1-fed detectors to take their windows by ``offer``."""
    for det in pipeline.detectors:
        if DETECTORS[det.name].stage1_feed:
            det.feed_from_stage1()  # type: ignore[attr-defined]


def offer(pipeline: Pipeline, partition: int, frame: pl.DataFrame, stats: Stats) -> None:
    """A partition's window values to the stage-1-fed detectors (which drop a window sent
    again after a restart: ``IsolationForestDetector.offer``); late rows are counted."""
    for det in pipeline.detectors:
        if DETECTORS[det.name].stage1_feed and getattr(det, "fed", None) is not None:
            late = det.offer(partition, frame)  # type: ignore[attr-defined]
            if late:
                stats.inc("late_forest_rows", late, detail=f"partition {partition}")
