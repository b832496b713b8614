"""What each detector reads: the scale-out aggregate stage sends the detect stage only the
metrics some enabled detector declares (``Detector.reads``, ``metrics_read``), so a detector
that reads an undeclared metric would see nothing of it in scale-out while replay gave it all.

Checked on the golden scenarios (every detector raises in at least one of them): each detector,
while it evaluates, asks the step and the window engine only for metrics it declares; and replay
fed only the declared metrics raises exactly the alerts of a full replay."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import pytest

from detectors.isolation_forest import IsolationForestConfig
from detectors.registry import DETECTORS, metrics_read
from detectors.windows import Step, WindowEngine
from rocewatch.config import Config
from rocewatch.pipeline import Pipeline
from rocewatch.replay import ReplayResult, replay

if TYPE_CHECKING:
    from tests.conftest import SimCache  # the session's recordings fixture

# the forest learns for 8 s instead of 120 s, so it scores (and may fire) within the scenarios
CONFIG = Config(
    detectors={"isolation_forest": IsolationForestConfig(baseline_s=8.0, retrain_every_s=0.0)}
)
# (scenario, seed) as in tests/golden: between them every rule detector raises
CASES = (("default", 5), ("dark_storm", 2), ("uplink_flaky", 3), ("moe", 4))


@pytest.fixture(scope="module")
def scenarios(recordings: SimCache) -> dict[str, Path]:
    """The golden recordings (simulated once per run, shared with tests/test_replay_golden.py)."""
    return {name: recordings.scenario(name, 8, 20.0, seed) for name, seed in CASES}


class _Reads(dict):  # type: ignore[type-arg]
    """A step's per-metric split that notes every metric asked for while ``sink`` is set."""

    sink: set[str] | None = None

    def _note(self, metric: object) -> None:
        if _Reads.sink is not None:
            _Reads.sink.add(str(metric))

    def get(self, metric: Any, default: Any = None) -> Any:
        self._note(metric)
        return super().get(metric, default)

    def __getitem__(self, metric: Any) -> Any:
        self._note(metric)
        return super().__getitem__(metric)

    def __contains__(self, metric: object) -> bool:
        self._note(metric)
        return super().__contains__(metric)

    def __iter__(self) -> Iterator[Any]:
        self._note("*every metric*")
        return super().__iter__()

    def items(self) -> Any:
        self._note("*every metric*")
        return super().items()

    def values(self) -> Any:
        self._note("*every metric*")
        return super().values()


@dataclasses.dataclass
class FullReplays:
    results: dict[str, ReplayResult]  # per scenario, every metric fed
    reads: dict[str, set[str]]  # per detector name, every metric it asked for meanwhile


@pytest.fixture(scope="module")
def full(scenarios: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> FullReplays:
    """Each scenario replayed once with every metric, every detector's reads recorded while
    it ran: the first test judges the reads, the second compares a declared-only replay with
    these results (the recording only notes what is asked for; it changes no value, and if it
    did the two replays would differ and the second test would fail, not pass)."""
    out = tmp_path_factory.mktemp("full")
    with pytest.MonkeyPatch.context() as mp:
        seen = _record(mp)
        try:
            results = {n: replay(d, out / n, CONFIG) for n, d in scenarios.items()}
        finally:
            _Reads.sink = None
    return FullReplays(results, seen)


def _record(monkeypatch: pytest.MonkeyPatch) -> dict[str, set[str]]:
    """Per detector name, every metric it asks for (steps, sliding windows, whole frames) in
    pipelines made while ``monkeypatch`` holds."""
    seen: dict[str, set[str]] = {}
    by_metric = Step.by_metric.fget  # type: ignore[attr-defined]
    frame = Step.frame.fget  # type: ignore[attr-defined]

    def split(step: Step) -> dict[str, pl.DataFrame]:
        d = by_metric(step)
        return d if isinstance(d, _Reads) else _Reads(d)

    def whole(step: Step) -> pl.DataFrame:
        if _Reads.sink is not None:
            _Reads.sink.add("*the whole frame*")
        return frame(step)

    window = WindowEngine.window

    def read_window(self: WindowEngine, metric: str, seconds: float) -> pl.DataFrame:
        if _Reads.sink is not None:
            _Reads.sink.add(metric)
        sink, _Reads.sink = _Reads.sink, None  # the engine's own reads are not the detector's
        try:
            return window(self, metric, seconds)
        finally:
            _Reads.sink = sink

    monkeypatch.setattr(Step, "by_metric", property(split))
    monkeypatch.setattr(Step, "frame", property(whole))
    monkeypatch.setattr(WindowEngine, "window", read_window)
    init = Pipeline.__init__

    def wrapped(self: Pipeline, *a: Any, **kw: Any) -> None:
        init(self, *a, **kw)
        for det in self.detectors:
            det.evaluate = _noting(det.evaluate, seen.setdefault(det.name, set()))  # type: ignore[method-assign]

    monkeypatch.setattr(Pipeline, "__init__", wrapped)
    return seen


def _noting(evaluate: Callable[..., Any], into: set[str]) -> Callable[..., Any]:
    def run(ctx: Any) -> Any:
        _Reads.sink = into
        try:
            return evaluate(ctx)
        finally:
            _Reads.sink = None

    return run


@pytest.mark.slow
def test_every_detector_reads_only_the_metrics_it_declares(full: FullReplays) -> None:
    recorded = full.reads
    raised: set[str] = set()
    for res in full.results.values():
        raised |= {a["labels"]["alertname"] for a in res.alerts}
    # the scenarios make every rule detector raise, so each of them ran its whole path
    assert raised >= {
        "PFCStorm",
        "ECNCongestion",
        "QueueBuildup",
        "FlakyLink",
        "PCIeDowngrade",
        "Straggler",
    }, raised
    assert set(recorded) == set(DETECTORS)
    for det, seen in recorded.items():
        cls = DETECTORS[det].detector
        assert seen <= cls.reads, f"{det} reads {sorted(seen - cls.reads)} it does not declare"
        if cls.reads:
            assert seen, f"{det} read nothing: the recording missed its reads"


@pytest.mark.slow
def test_replay_of_the_declared_metrics_alone_raises_the_same_alerts(
    scenarios: dict[str, Path], full: FullReplays, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keep = metrics_read(CONFIG.detectors)
    ingest = Pipeline.ingest
    dropped = [0]

    def declared_only(self: Pipeline, samples: pl.DataFrame) -> None:
        kept = samples.filter(pl.col("metric").is_in(list(keep)))
        dropped[0] += samples.height - kept.height
        if kept.height:
            ingest(self, kept)

    monkeypatch.setattr(Pipeline, "ingest", declared_only)
    for name, d in scenarios.items():
        part = replay(d, tmp_path / f"{name}-declared", CONFIG)
        assert part.alerts == full.results[name].alerts, name
        assert part.actions == full.results[name].actions, name
    assert dropped[0] > 0  # the recordings carry metrics no detector reads


def test_disabled_detectors_take_their_metrics_out_of_the_steps() -> None:
    every = metrics_read({})
    forest_off = metrics_read(
        {"isolation_forest": dataclasses.replace(IsolationForestConfig(), enabled=False)}
    )
    only_forest = DETECTORS["isolation_forest"].detector.reads - frozenset().union(
        *(e.detector.reads for n, e in DETECTORS.items() if n != "isolation_forest")
    )
    assert only_forest and not (only_forest & forest_off)
    assert forest_off | only_forest == every


def test_a_forest_fed_by_stage_one_takes_its_own_metrics_out_of_the_steps() -> None:
    """In scale-out the aggregate stage computes the forest's window values: the steps carry
    only what the rule detectors read."""
    rules = frozenset().union(
        *(e.detector.reads for n, e in DETECTORS.items() if n != "isolation_forest")
    )
    assert metrics_read({}, fed=True) == rules < metrics_read({})
