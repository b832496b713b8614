"""Job telemetry's own lateness (detectors/job_lane.py): NCCL samples that reach the detect
path a dump interval after their telemetry time are evaluated on that time instead of being
dropped, and the fabric's steps close exactly when they would without them."""

from __future__ import annotations

import dataclasses

import polars as pl

from detectors.windows import WindowConfig, WindowEngine
from rocewatch import wire
from rocewatch.config import Config
from rocewatch.core.keys import KEYS
from rocewatch.core.model import conform
from rocewatch.pipeline import Pipeline
from tests.support.nccl_edges import T0, S, samples, topology

DELAY = 2  # seconds: a 1 s Inspector dump plus a 1 s collector poll


def fabric(sec: int) -> pl.DataFrame:
    """Second ``sec``'s fabric telemetry: one queue depth of each leaf, ten times a second."""
    rows = [
        (T0 + sec * S + k * S // 10, f"leaf-{i}", "Ethernet1", "3", "queue_depth_bytes", 1e3)
        for k in range(10)
        for i in range(2)
    ]
    return conform(
        pl.DataFrame(rows, schema=["ts", "device", "port", "qual", "metric", "value"], orient="row")
    )


def stream(
    engine_or_pipe: WindowEngine | Pipeline,
    seconds: int,
    slow_from: int = 99,
    delay: int = DELAY,
    coded: bool = False,
) -> list[tuple[int, int, list[tuple[str, int]]]]:
    """Live order: each second's fabric telemetry at once, the job's ``delay`` seconds later;
    the watermark advanced after every arrival. Each closed step: (its end, when it closed, its
    NCCL rows (metric, ts))."""
    out = []
    for sec in range(seconds + delay + 1):
        batch = [fabric(sec)] if sec < seconds else []
        if 0 <= sec - delay < seconds:
            job = sec - delay
            batch.append(samples(job, {(1, 2): 3.0} if job >= slow_from else {}))
        if isinstance(engine_or_pipe, Pipeline):
            for f in batch:
                engine_or_pipe.ingest(f)
            engine_or_pipe.advance(T0 + (sec + 1) * S - engine_or_pipe.engine.lateness_ns())
            continue
        eng = engine_or_pipe
        for f in batch:  # (as the Kafka readers hand them over: keys coded, ``coded``)
            eng.add(wire.coded_frames([wire.parse(wire.encode(f))]) if coded else f)
        for st in eng.close_until(T0 + (sec + 1) * S - eng.lateness_ns()):
            frame = KEYS.decode(st.frame)
            nccl = frame.filter(pl.col("metric").str.starts_with("nccl_"))
            out.append((st.end, sec, sorted(zip(nccl["metric"], nccl["ts"], strict=True))))
    return out


def test_late_job_samples_are_kept_on_their_own_time_and_fabric_steps_are_not_delayed() -> None:
    lane = WindowEngine(WindowConfig(step_s=0.5))
    plain = WindowEngine(WindowConfig(step_s=0.5, job_lateness_s=0.0))
    with_lane, without = stream(lane, 8), stream(plain, 8)
    # the fabric's steps: the same steps, closed at the same arrival, with or without the lane
    assert [(e, at) for e, at, _ in with_lane] == [(e, at) for e, at, _ in without]
    # without the lane every NCCL sample came after its step closed: dropped, counted
    assert not any(rows for *_, rows in without)
    assert plain.stats.get("late_samples") == 8 * 8
    # with it none is lost, each on its own telemetry time, a job lateness after it
    got = [(end, m, ts) for end, _, rows in with_lane for m, ts in rows]
    assert len(got) == 8 * 8 and lane.stats.get("late_samples") == 0
    want = sorted(
        (m, ts) for s in range(8) for m, ts in samples(s, {}).select("metric", "ts").rows()
    )
    assert sorted((m, ts) for _, m, ts in got) == want
    for end, _, ts in got:
        assert 0 < end - ts <= 3 * S + S // 2
    # later than the job lateness too: dropped and counted
    lane.add(samples(-5, {}))
    assert lane.stats.get("late_samples") == 8
    # the Kafka readers' coded frames take the same lane
    coded = WindowEngine(WindowConfig(step_s=0.5))
    assert stream(coded, 8, coded=True) == with_lane


def test_slow_edge_from_late_job_telemetry_fires_on_its_telemetry_time() -> None:
    """Through the pipeline: CoMMA exports 2 s late still make the SlowEdge, with the startsAt
    the same exports give on time; without the lane they are dropped and nothing fires."""
    topo = topology()

    def run(cfg: Config, delay: bool) -> tuple[Pipeline, list[int]]:
        p = Pipeline(topo, cfg, rollup_s=None)
        stream(p, 14, slow_from=4, delay=DELAY if delay else 0)
        p.finish()
        return p, [a.starts_at for a in p.all_alerts() if a.name == "SlowEdge"]

    cfg = dataclasses.replace(Config(), window=WindowConfig(step_s=1.0))
    _, on_time = run(cfg, delay=False)
    late_p, late = run(cfg, delay=True)
    assert on_time and late == on_time
    assert late_p.stats.get("late_samples") == 0
    off = dataclasses.replace(Config(), window=WindowConfig(step_s=1.0, job_lateness_s=0.0))
    off_p, none = run(off, delay=True)
    assert none == [] and off_p.stats.get("late_samples") > 0
