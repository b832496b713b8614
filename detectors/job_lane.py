"""Job telemetry's own lateness: the window engine's second lane for NCCL samples.

NCCL Inspector dumps what its kernels did every dump interval, and the collector reads the
dumps every poll interval, so a rank's samples reach the detect path up to a dump plus a poll
interval after their telemetry time, while the node agent on the same host sends its NIC
counters at once. The window engine closes a step once the watermark (the newest time less
``window.lateness_s``, 0.5 s) passes it: the NCCL samples would come after their step closed
and be dropped as late. Raising ``lateness_s`` for everything would delay every fabric alert
by the dump interval.

So a late sample of a job metric (``nccl_*``; docs/nccl.md) that the engine would drop is
handed to this lane instead: a window engine of its own, sharing the main engine's series
table, whose steps close ``window.job_lateness_s`` behind the newest time. Each of its steps,
aggregated on the samples' own telemetry time, rides on the first main step closed at or after
its end plus the extra lateness (or the newest one closed with it): its rows are added to that
step's, so the NCCL detectors (which read the newest step and keep their own history by the
rows' times) see them a job lateness after the fact, and the fabric's steps close as before.
Only samples the main lane would have dropped take this path: on-time NCCL samples (replay,
a collector with no delay) stay in the main lane, and nothing is looked at on the hot path.
A sample later than the job lateness too is dropped and counted (``late_samples``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from rocewatch.core.keys import KEYS

if TYPE_CHECKING:
    from detectors.windows import Step, WindowEngine

JOB_PREFIX = "nccl_"  # the job (NCCL) metrics of rocewatch/core/model.py (scope ``rank``)


def job_rows(late: pl.DataFrame) -> pl.Series:
    """Which rows of a frame of late samples are job telemetry (``JOB_PREFIX``)."""
    col = late.get_column("metric")
    metric = KEYS.column("metric", col) if col.dtype != pl.String else col
    return metric.str.starts_with(JOB_PREFIX).fill_null(False)


def merge(main: list[Step], lane: list[Step], extra_ns: int, epoch: int) -> None:
    """Lay each job step's rows over the first main step that ends at or after its end plus
    ``extra_ns`` (else the newest): in place, as the steps are about to be evaluated."""
    from detectors.windows import Step

    if not main or not lane:
        return
    rides: dict[int, list[Step]] = {}
    for js in lane:
        if not js.by_metric:
            continue
        at = next((i for i, m in enumerate(main) if m.end >= js.end + extra_ns), len(main) - 1)
        rides.setdefault(at, []).append(js)
    for i, extra in rides.items():
        m = main[i]
        by = dict(m.by_metric)
        pos = dict(m.positions[1]) if m.positions is not None else None
        for js in extra:
            jpos = js.positions[1] if js.positions is not None else None
            for metric, f in js.by_metric.items():
                by[metric] = pl.concat([by[metric], f]) if metric in by else f
                if pos is not None and jpos is not None and metric in jpos:
                    old = pos.get(metric)
                    pos[metric] = (
                        jpos[metric] if old is None else np.concatenate([old, jpos[metric]])
                    )
                elif pos is not None:
                    pos = None  # positions unknown for some rows: detectors hash them
        main[i] = Step(
            m.start, m.end, by_metric=by, positions=(epoch, pos) if pos is not None else None
        )


def lane_for(engine: WindowEngine) -> WindowEngine | None:
    """The job lane of an engine whose ``job_lateness_s`` exceeds its ``lateness_s``."""
    import dataclasses

    from detectors.windows import WindowEngine

    cfg = engine.config
    if cfg.job_lateness_s <= cfg.lateness_s:
        return None
    lane = WindowEngine(
        dataclasses.replace(cfg, lateness_s=cfg.job_lateness_s, job_lateness_s=0.0),
        engine.stats,
    )
    lane.series = engine.series  # one table: the steps' series positions stay valid
    return lane
