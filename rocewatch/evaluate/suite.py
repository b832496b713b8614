"""The default suite: named simulated scenarios run in process through the pipeline, scored.

Every source every 100 ms; several seeds and sizes, healthy all-reduce and MoE traffic, two
tenants, counter clears and agent gaps, overlapping faults, a storm from a node without an
agent. The scenarios are the simulator's (``rocewatch.sim.scenarios.SCENARIOS``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rocewatch.core.model import Alert
from rocewatch.evaluate.scoring import (
    ANCHORS,
    EARLY_NS,
    INCIDENT,
    LATE_NS,
    RunScore,
    S,
    aggregate,
    score_run,
)

if TYPE_CHECKING:
    from rocewatch.config import Config


@dataclass(frozen=True)
class Case:
    """One run of the suite: a named scenario at one size and seed."""

    scenario: str
    nodes: int
    duration_s: float
    seed: int
    healthy: bool = False  # a no-fault run whose every alert is a false alarm

    @property
    def name(self) -> str:
        return f"{self.scenario}/n{self.nodes}/{self.duration_s:g}s/seed{self.seed}"


QUICK_SUITE: tuple[Case, ...] = (
    Case("default", 16, 20, 1),
    Case("overlap", 16, 16, 2),
    Case("dark_storm", 16, 10, 1),
    Case("healthy", 16, 10, 1, healthy=True),
    Case("moe", 16, 10, 1, healthy=True),
)

FULL_SUITE: tuple[Case, ...] = (
    Case("default", 16, 30, 1),
    Case("default", 16, 30, 2),
    Case("default", 16, 30, 3),
    Case("default", 32, 30, 4),
    Case("default", 64, 40, 7),
    Case("overlap", 16, 30, 1),
    Case("overlap", 32, 30, 2),
    Case("mixed_tenants", 16, 30, 1),
    Case("mixed_tenants", 32, 30, 2),
    Case("dark_storm", 16, 20, 1),
    Case("dark_storm", 32, 20, 2),
    Case("uplink_flaky", 16, 30, 1),
    Case("two_storms", 16, 30, 1),
    Case("subtle", 16, 30, 1),
    Case("subtle", 32, 30, 5),
    Case("healthy", 16, 30, 1, healthy=True),
    Case("healthy", 64, 20, 2, healthy=True),
    Case("moe", 16, 30, 1, healthy=True),
    Case("moe", 32, 30, 2, healthy=True),
)


@dataclass
class RunResult:
    case: Case
    truth: dict[str, Any]
    score: RunScore
    seconds: float
    samples: int


def run_case(case: Case, config: Config | None = None) -> RunResult:
    """Simulate ``case``, drive the pipeline as the demo does (advancing every 5 ticks), score."""
    from rocewatch.config import Config
    from rocewatch.pipeline import Pipeline
    from rocewatch.sim.scenarios import SCENARIOS
    from rocewatch.sim.simulator import Simulator

    cfg = SCENARIOS[case.scenario](nodes=case.nodes, duration_s=case.duration_s, seed=case.seed)
    t0 = time.perf_counter()
    sim = Simulator(cfg)
    pipeline = Pipeline(sim.topology, config or Config(), rollup_s=None)
    lateness = pipeline.engine.lateness_ns()
    newest = 0
    for i, frame in enumerate(sim.ticks()):
        pipeline.ingest(frame)
        if frame.height:
            newest = max(newest, int(frame["ts"].max()))  # type: ignore[arg-type]
        if i % 5 == 4:
            pipeline.advance(newest - lateness)
    pipeline.finish()
    truth = sim.truth()
    inhibited: list[Alert] = getattr(pipeline, "inhibited_alerts", list)()
    score = score_run(truth, pipeline.all_alerts(), pipeline.actions, inhibited)
    return RunResult(case, truth, score, time.perf_counter() - t0, pipeline.samples_in)


def evaluate(
    cases: Sequence[Case],
    config: Config | None = None,
    progress: Callable[[int, RunResult], None] | None = None,
) -> dict[str, Any]:
    """Run ``cases`` and return the report (the ``evaluation.json`` document)."""
    t0 = time.perf_counter()
    results = []
    for i, case in enumerate(cases):
        res = run_case(case, config)
        results.append(res)
        if progress is not None:
            progress(i, res)
    return report(results, time.perf_counter() - t0)


def report(results: Sequence[RunResult], seconds: float) -> dict[str, Any]:
    agg = aggregate([r.score for r in results])
    healthy = [r for r in results if r.case.healthy]
    healthy_by: dict[str, int] = {}
    for r in healthy:
        for n, c in r.score.fp.items():
            healthy_by[n] = healthy_by.get(n, 0) + c
        if r.score.incidents:
            healthy_by[INCIDENT] = healthy_by.get(INCIDENT, 0) + r.score.incidents
    runs = []
    for r in results:
        s, start = r.score, int(r.truth["start_ns"])
        runs.append(
            {
                "name": r.case.name,
                **dataclasses.asdict(r.case),
                "faults": [
                    {
                        "id": fid,
                        "kind": kind,
                        "detected": s.detected[fid],
                        "ttd_s": s.ttd_s.get(fid),
                        "entity": next(f["labels"] for f in r.truth["faults"] if f["id"] == fid),
                        "onset_s": next(
                            round((f["onset_ns"] - start) / S, 3)
                            for f in r.truth["faults"]
                            if f["id"] == fid
                        ),
                    }
                    for fid, kind in s.faults.items()
                ],
                "alerts": s.alerts,
                "tp_alerts": sum(s.tp.values()),
                "fp_alerts": sum(s.fp.values()),
                "neutral_victim_alerts": s.neutral,
                "fabric_incidents": s.incidents,
                "drains": s.drains,
                "wrong_drains": s.wrong_drains,
                "false_positives": s.false_positives,
                "samples": r.samples,
                "seconds": round(r.seconds, 2),
            }
        )
    return {
        "kinds": agg["kinds"],
        "wrong_drains": sum(len(r.score.wrong_drains) for r in results),
        "healthy_alerts": sum(r.score.alerts for r in healthy),
        "healthy_alerts_by_alertname": dict(sorted(healthy_by.items())),
        "alertnames": agg["alertnames"],
        "overall": agg["overall"],
        "fabric_incidents": {
            "total": sum(r.score.incidents for r in results),
            "outside_fault_windows": sum(r.score.incidents_outside_faults for r in results),
            "in_healthy_runs": sum(r.score.incidents for r in healthy),
        },
        "drains": sum(r.score.drains for r in results),
        "anchors": ANCHORS,
        "rules": {
            "window_s": [-EARLY_NS / S, LATE_NS / S],
            "tp": "alertname is the fault's alertname or in 'also', labels contain one 'match' "
            "set, startsAt within [onset - 1 s, end + 5 s]",
            "neutral": "role=victim alerts in a fault's 'victims' list within the window",
            "precision": "over the alerts of the kind's own alertname",
            "recall": "over the faults of the kind, found by any alertname it accepts",
        },
        "runs": runs,
        "runtime_s": round(seconds, 1),
    }
