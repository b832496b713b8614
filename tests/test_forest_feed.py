"""The isolation forest fed by stage 1 (scale-out): each telemetry partition accumulates its own
entities' window values (``FeatureFeed``) and the detect stage's forest scores them
(``IsolationForestDetector.offer``). It must score exactly what the forest that accumulates
every step's rows itself scores, window by window, entity by entity."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from detectors.base import StepContext
from detectors.isolation_forest import (
    FeatureFeed,
    IsolationForestConfig,
    IsolationForestDetector,
)
from detectors.windows import WindowEngine
from rocewatch.config import Config
from rocewatch.core.stats import Stats
from rocewatch.sim import Simulator, build_topology
from rocewatch.sim.scenarios import default_scenario
from tests.support.restart import restart_part

CFG = IsolationForestConfig(baseline_s=4.0, retrain_every_s=3.0)
PARTS = 4


def scores(det: IsolationForestDetector) -> dict[tuple[str, str, str], float]:
    out = {}
    for kind, k in det.kinds.items():
        for i, s in zip(k.last_idx.tolist(), k.last_scores.tolist(), strict=True):
            out[(kind, *k.acc.entities[i])] = round(float(s), 12)
    return out


@pytest.mark.slow
def test_forest_fed_by_partitions_scores_what_the_whole_stream_scores() -> None:
    sim_cfg = default_scenario(nodes=4, duration_s=16.0, seed=11)
    sim = Simulator(sim_cfg)
    frames = list(sim.ticks())
    topology = build_topology(sim_cfg)
    wcfg = Config().window
    whole = WindowEngine(wcfg, Stats())
    parts = [WindowEngine(wcfg, Stats()) for _ in range(PARTS)]
    for f in frames:
        whole.add(f)
        p = (f["device"].hash(seed=3) % PARTS).to_numpy()
        for i, e in enumerate(parts):
            e.add(f.filter(pl.Series(p == i)))
    until = int(pl.concat(frames)["ts"].max()) - whole.lateness_ns()

    # stage 1: every partition's closed steps into its feed; a checkpoint midway (its state
    # through the product's codec, into a feed built anew)
    feeds = [FeatureFeed(CFG.feature_window_s) for _ in range(PARTS)]
    sent: list[tuple[int, pl.DataFrame]] = []
    for i, e in enumerate(parts):
        steps = e.close_until(until)
        half = len(steps) // 2
        for s in steps[:half]:
            feeds[i].add(s)
        got = feeds[i].take(steps[half - 1].end)
        if got is not None:
            sent.append((i, got))
        feeds[i] = restart_part(feeds[i], FeatureFeed(CFG.feature_window_s))
        for s in steps[half:]:
            feeds[i].add(s)
        got = feeds[i].take(e.closed_ns, idle=True)
        if got is not None:
            sent.append((i, got))
    assert sent
    # one row per entity and window: far fewer than the series' rows per step
    rows = sum(f.height for _, f in sent)
    assert rows * 5 < sum(f.height for f in frames)

    own = IsolationForestDetector(topology, CFG)
    fed = IsolationForestDetector(topology, CFG)
    fed.feed_from_stage1()
    for p, f in sent:
        assert fed.offer(p, f) == 0
    compared = 0
    last = 0
    for step in whole.close_until(until):
        last = step.end
        whole.enter(step)
        ctx = StepContext(whole, topology, step.start, step.end, firing=lambda: [])
        a, b = own.evaluate(ctx), fed.evaluate(ctx)
        assert [x.labels for x in a] == [x.labels for x in b]
        assert own.windows == fed.windows and own.fits == fed.fits
        if own.model is not None:
            sa, sb = scores(own), scores(fed)
            assert sa == sb
            compared += bool(sa)
    assert own.fits >= 2 and compared >= 8
    # every window offered was used, but the last: the stream ends inside it, and replay does
    # not score it either (not before its end)
    assert all(end > last for end in fed.fed) and len(fed.fed) <= 1
    # a window sent again once scored (a restart) is dropped; one that comes first after it
    # was scored is late: counted, not used
    p, f = sent[0]
    assert fed.offer(p, f) == 0
    assert fed.offer(PARTS, f) == f.filter(pl.col("end") <= fed.fed_done).height > 0


def test_feed_splits_windows_on_their_boundaries() -> None:
    sim_cfg = default_scenario(nodes=2, duration_s=4.0, seed=2)
    frames = list(Simulator(sim_cfg).ticks())
    e = WindowEngine(Config().window, Stats())
    for f in frames:
        e.add(f)
    feed = FeatureFeed(1.0)
    steps = e.close_until(int(pl.concat(frames)["ts"].max()) - e.lateness_ns())
    for s in steps:
        feed.add(s)
    out = feed.take(steps[-1].end)
    assert out is not None
    ends = sorted(set(out["end"].to_list()))
    assert all(x % 1_000_000_000 == 0 for x in ends)
    assert np.all(np.diff(ends) == 1_000_000_000)
    # NICs and switch ports, once per window each
    assert set(out["kind"]) == {"nic", "port"}
    assert out.select("end", "kind", "device", "port").is_duplicated().sum() == 0


def test_a_partition_that_resumes_inside_the_window_it_went_idle_in_sends_it_whole() -> None:
    """Idle, a partition sends its open window's values so far; if records come back inside
    that window, the copy sent when the window is done holds all of it, as a partition that
    never went idle sends (and it replaces the partial copy in the detect stage's forest)."""
    sim_cfg = default_scenario(nodes=2, duration_s=4.0, seed=5)
    frames = list(Simulator(sim_cfg).ticks())
    e = WindowEngine(Config().window, Stats())
    for f in frames:
        e.add(f)
    steps = e.close_until(int(pl.concat(frames)["ts"].max()) - e.lateness_ns())
    w = 1_000_000_000
    # the steps of the second window, split in the middle, and the first of the third
    start = (steps[0].start // w + 1) * w
    end = start + w
    mid = [s for s in steps if start <= s.start < end]
    after = next(s for s in steps if s.start >= end)
    assert len(mid) >= 6
    whole, idle = FeatureFeed(1.0), FeatureFeed(1.0)
    for s in [*mid, after]:
        whole.add(s)
    ref = whole.take(after.end)
    assert ref is not None and set(ref["end"]) == {end}

    half = len(mid) // 2
    for s in mid[:half]:
        idle.add(s)
    partial = idle.take(mid[half - 1].end, idle=True)
    assert partial is not None and set(partial["end"]) == {end}
    assert not partial.equals(ref)  # half the window's values
    idle = restart_part(idle, FeatureFeed(1.0))  # a checkpoint while idle
    for s in [*mid[half:], after]:
        idle.add(s)
    again = idle.take(after.end)
    assert again is not None
    assert again.equals(ref)

    topology = build_topology(sim_cfg)
    fed = IsolationForestDetector(topology, CFG)
    fed.feed_from_stage1()
    assert fed.offer(0, partial) == 0 and fed.offer(0, again) == 0
    assert fed.fed[end][0].equals(ref)
