"""`rocewatch evaluate`: score the detectors on labelled simulated scenarios.

Runs a suite of simulated fabrics (several seeds and sizes, healthy all-reduce and MoE traffic,
two tenants, counter clears and agent gaps, overlapping faults, a storm from a node without an
agent) through the same pipeline as replay, in process, and matches every alert against the
simulator's ground truth (``Simulator.truth()``):

- An alert is a true positive (TP) for a fault when its alertname is the fault's ``alertname``
  or in its ``also``, its labels contain every key/value of one of the fault's ``match`` sets,
  and its ``startsAt`` lies within [onset - 1 s, end + 5 s].
- A ``role=victim`` alert whose labels match an entry of a fault's ``victims`` list in that
  window is neutral (neither TP nor FP); a victim alert never counts as a TP.
- FabricIncident alerts are scored apart (they explain withheld drains, they detect nothing).
- Every other alert is a false positive (FP) for its own alertname.

Per kind (the alertname of a truth fault): precision over the alerts of that alertname, recall
over the faults of that kind (found by any alertname it accepts), F1, and the time to detect
(first matching ``startsAt`` - onset) as median and p95 over the detected faults. A kind with no
detector is scored like any other: recall 0. A drain whose outcome does not start with
``refused`` of a node that is no fault's ``culprit_node`` in its run is a wrong-node drain.

>>> t = {"start_ns": 0, "faults": [{"id": "PfcStorm-1", "alertname": "PFCStorm", "also": [],
...       "match": [{"node": "gpu-001", "nic": "mlx5_0"}], "onset_ns": 5 * S, "end_ns": 8 * S,
...       "culprit_node": "gpu-001", "victims": []}]}
>>> a = Alert({"alertname": "PFCStorm", "node": "gpu-001", "nic": "mlx5_0"}, {}, 5_200_000_000)
>>> r = score_run(t, [a], [])
>>> r.detected, r.ttd_s
({'PfcStorm-1': True}, {'PfcStorm-1': 0.2})
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rocewatch.model import Action, Alert

if TYPE_CHECKING:
    from rocewatch.config import Config
    from rocewatch.sim.simulator import SimConfig

log = logging.getLogger(__name__)

S = 1_000_000_000
EARLY_NS = 1 * S  # an alert may start this long before the onset (sampling jitter, windows)
LATE_NS = 5 * S  # ... and this long after the end (slow windows, hysteresis)
INCIDENT = "FabricIncident"
MAX_LISTED = 50  # FPs and misses listed per run in the JSON

# What the literature and the field reach (DESIGN.md "Detection"), printed beside the figures.
SONIC_DETECT_S = 0.2
MINDER_PRECISION = 0.90
MINDER_F1 = 0.89
PUBLISHED_DETECT_S = (3.6, 30.0)
ANCHORS: dict[str, Any] = {
    "sonic_pfc_watchdog_detect_s": SONIC_DETECT_S,
    "minder_precision": MINDER_PRECISION,
    "minder_f1": MINDER_F1,
    "published_detect_s": list(PUBLISHED_DETECT_S),
}


# --- matching --------------------------------------------------------------------------------


def labels_match(labels: Mapping[str, str], sets: Iterable[Mapping[str, Any]]) -> bool:
    """True when ``labels`` hold every key/value of at least one of ``sets``."""
    return any(all(labels.get(k) == str(v) for k, v in m.items()) for m in sets)


def in_window(alert: Alert, fault: Mapping[str, Any]) -> bool:
    return int(fault["onset_ns"]) - EARLY_NS <= alert.starts_at <= int(fault["end_ns"]) + LATE_NS


def hits(alert: Alert, fault: Mapping[str, Any]) -> bool:
    """Whether ``alert`` is a true positive for ``fault`` (module docstring)."""
    if alert.labels.get("role") == "victim":
        return False
    names = {fault.get("alertname"), *fault.get("also", ())}
    if alert.name not in names or not in_window(alert, fault):
        return False
    return labels_match(alert.labels, fault.get("match") or [fault.get("labels", {})])


def is_known_victim(alert: Alert, fault: Mapping[str, Any]) -> bool:
    return (
        alert.labels.get("role") == "victim"
        and alert.name == fault.get("alertname")
        and in_window(alert, fault)
        and labels_match(alert.labels, fault.get("victims", ()))
    )


@dataclass
class RunScore:
    """How one run's alerts and actions compare with its truth."""

    faults: dict[str, str] = field(default_factory=dict)  # fault id -> kind (truth alertname)
    detected: dict[str, bool] = field(default_factory=dict)
    ttd_s: dict[str, float] = field(default_factory=dict)  # detected faults only
    tp: dict[str, int] = field(default_factory=dict)  # alertname -> TP alerts
    fp: dict[str, int] = field(default_factory=dict)  # alertname -> FP alerts
    neutral: int = 0  # victims in a fault's victims list
    incidents: int = 0
    incidents_outside_faults: int = 0  # FabricIncidents that overlap no fault window
    alerts: int = 0
    drains: int = 0
    wrong_drains: list[dict[str, Any]] = field(default_factory=list)
    false_positives: list[dict[str, Any]] = field(default_factory=list)


def score_run(
    truth: Mapping[str, Any], alerts: Sequence[Alert], actions: Sequence[Action]
) -> RunScore:
    """Match one run's alerts and actions to its ground truth (rules in the module docstring)."""
    faults = [f for f in truth.get("faults", []) if f.get("alertname")]
    start = int(truth.get("start_ns", 0))
    r = RunScore(alerts=len(alerts))
    for f in faults:
        r.faults[f["id"]] = f["alertname"]
        r.detected[f["id"]] = False
    first: dict[str, int] = {}
    for a in sorted(alerts, key=lambda x: (x.starts_at, x.fingerprint)):
        if a.name == INCIDENT:
            r.incidents += 1
            if not any(
                int(f["onset_ns"]) - EARLY_NS <= (a.ends_at or a.starts_at)
                and a.starts_at <= int(f["end_ns"]) + LATE_NS
                for f in faults
            ):
                r.incidents_outside_faults += 1
            continue
        if any(is_known_victim(a, f) for f in faults):
            r.neutral += 1
            continue
        matched = [f for f in faults if hits(a, f)]
        if matched:
            r.tp[a.name] = r.tp.get(a.name, 0) + 1
            for f in matched:
                r.detected[f["id"]] = True
                first.setdefault(f["id"], a.starts_at)
            continue
        r.fp[a.name] = r.fp.get(a.name, 0) + 1
        if len(r.false_positives) < MAX_LISTED:
            r.false_positives.append(
                {
                    "alertname": a.name,
                    "labels": {k: v for k, v in a.labels.items() if k != "alertname"},
                    "starts_s": round((a.starts_at - start) / S, 3),
                    "near": _near_not_fault(a, truth.get("not_faults", [])),
                }
            )
    for f in faults:
        if f["id"] in first:
            r.ttd_s[f["id"]] = round((first[f["id"]] - int(f["onset_ns"])) / S, 6)
    culprits = {f.get("culprit_node") for f in faults if f.get("culprit_node")}
    for x in actions:
        if x.action != "drain" or x.outcome.startswith("refused"):
            continue
        r.drains += 1
        if x.node not in culprits:
            r.wrong_drains.append(
                {"node": x.node, "reason": x.reason, "outcome": x.outcome, "time_ns": x.time}
            )
    return r


def _near_not_fault(a: Alert, not_faults: Iterable[Mapping[str, Any]]) -> str | None:
    """The id of a counter clear, agent gap or agentless node the FP alert sits on, if any:
    the likeliest reason it fired."""
    for nf in not_faults:
        labels = nf.get("labels")
        if not labels or not labels_match(a.labels, [labels]):
            continue
        if "onset_ns" not in nf and "at_ns" not in nf:  # always there (a node with no agent)
            return str(nf.get("id"))
        t0 = int(nf.get("onset_ns", nf.get("at_ns", 0)))
        t1 = int(nf.get("end_ns", t0))
        if t0 - EARLY_NS <= a.starts_at <= t1 + LATE_NS:
            return str(nf.get("id"))
    return None


# --- aggregation -----------------------------------------------------------------------------


def percentile(xs: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method); None for no values."""
    if not xs:
        return None
    v = sorted(xs)
    pos = (len(v) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _ratio(a: int, b: int) -> float | None:
    return a / b if b else None


def _f1(p: float | None, r: float) -> float | None:
    if r == 0:
        return 0.0
    if p is None:
        return None
    return 2 * p * r / (p + r) if p + r else 0.0


def _round(x: float | None, n: int = 4) -> float | None:
    return None if x is None else round(x, n)


def aggregate(scores: Sequence[RunScore]) -> dict[str, Any]:
    """Per-kind and per-alertname figures over all runs."""
    kinds: dict[str, dict[str, Any]] = {}
    for s in scores:
        for fid, kind in s.faults.items():
            k = kinds.setdefault(kind, {"faults": 0, "detected": 0, "ttd": []})
            k["faults"] += 1
            if s.detected[fid]:
                k["detected"] += 1
                k["ttd"].append(s.ttd_s[fid])
    tp: dict[str, int] = {}
    fp: dict[str, int] = {}
    for s in scores:
        for n, c in s.tp.items():
            tp[n] = tp.get(n, 0) + c
        for n, c in s.fp.items():
            fp[n] = fp.get(n, 0) + c
    out: dict[str, Any] = {}
    for kind in sorted(kinds):
        k = kinds[kind]
        t, f = tp.get(kind, 0), fp.get(kind, 0)
        p = _ratio(t, t + f)
        rec = k["detected"] / k["faults"]
        ttd = sorted(k["ttd"])
        out[kind] = {
            "precision": _round(p),
            "recall": _round(rec),
            "f1": _round(_f1(p, rec)),
            "ttd_median_s": _round(percentile(ttd, 50), 3),
            "ttd_p95_s": _round(percentile(ttd, 95), 3),
            "faults": k["faults"],
            "detected": k["detected"],
            "tp_alerts": t,
            "fp_alerts": f,
            "ttd_s": [round(x, 3) for x in ttd],
        }
    names = {}
    for n in sorted(set(tp) | set(fp)):
        t, f = tp.get(n, 0), fp.get(n, 0)
        names[n] = {"tp_alerts": t, "fp_alerts": f, "precision": _round(_ratio(t, t + f))}
    all_t, all_f = sum(tp.values()), sum(fp.values())
    n_faults = sum(k["faults"] for k in kinds.values())
    n_det = sum(k["detected"] for k in kinds.values())
    p_all = _ratio(all_t, all_t + all_f)
    r_all = n_det / n_faults if n_faults else 0.0
    overall = {
        "precision": _round(p_all),
        "recall": _round(r_all),
        "f1": _round(_f1(p_all, r_all)),
        "faults": n_faults,
        "detected": n_det,
        "tp_alerts": all_t,
        "fp_alerts": all_f,
        "neutral_victim_alerts": sum(s.neutral for s in scores),
    }
    return {"kinds": out, "alertnames": names, "overall": overall}


# --- the suite -------------------------------------------------------------------------------


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


def overlap_scenario(nodes: int = 16, duration_s: float = 30, seed: int = 1) -> SimConfig:
    """Five faults that overlap in time on different entities (laid out for 30 s): a storm
    5-13 s, a flaky cable 7-19 s, transport errors 10-18 s, an incast 12-20 s and a PCIe
    downgrade from 15 s; the simulator draws the entities apart (other job, other rails)."""
    from rocewatch.sim.faults import EcnIncast, FlakyLink, PcieDowngrade, PfcStorm, TransportErrors
    from rocewatch.sim.scenarios import laid_out

    return laid_out(
        "overlap",
        nodes,
        duration_s,
        seed,
        lambda at: (
            PfcStorm(onset_s=at(5.0), duration_s=at(8.0)),
            FlakyLink(onset_s=at(7.0), duration_s=at(12.0)),
            TransportErrors(onset_s=at(10.0), duration_s=at(8.0)),
            EcnIncast(onset_s=at(12.0), duration_s=at(8.0)),
            PcieDowngrade(onset_s=at(15.0)),
        ),
    )


def mixed_tenants_scenario(nodes: int = 16, duration_s: float = 30, seed: int = 1) -> SimConfig:
    """Two tenants on one fabric, team-a training with all-reduce, team-b with MoE all-to-all;
    a storm in team-a's job (laid out for 30 s: 6-10 s) and a flaky cable in team-b's (14-24 s)."""
    from rocewatch.sim.fabric import JobSpec, node_name
    from rocewatch.sim.faults import FlakyLink, PfcStorm
    from rocewatch.sim.scenarios import laid_out

    names = [node_name(i) for i in range(nodes)]
    half = nodes // 2
    return laid_out(
        "mixed_tenants",
        nodes,
        duration_s,
        seed,
        lambda at: (
            PfcStorm(onset_s=at(6), duration_s=at(4), node=names[1]),
            FlakyLink(onset_s=at(14), duration_s=at(10), node=names[-2]),
        ),
        jobs=(
            JobSpec("llm-train-a", "team-a", tuple(names[:half]), traffic="allreduce"),
            JobSpec("moe-train-b", "team-b", tuple(names[half:]), traffic="moe"),
        ),
    )


def subtle_scenario(nodes: int = 16, duration_s: float = 30, seed: int = 1) -> SimConfig:
    """Weaker versions of every fault (laid out for 30 s): a 0.6 s storm at 4 s, a cable at
    1e-5 peak BER that never flaps (8-18 s), a Gen4 -> Gen3 PCIe downgrade from 12 s (8 GT/s),
    incast from 3 senders (19-24 s), transport errors at a fifth of the default rate (24-29 s)."""
    from rocewatch.sim.faults import EcnIncast, FlakyLink, PcieDowngrade, PfcStorm, TransportErrors
    from rocewatch.sim.scenarios import laid_out

    return laid_out(
        "subtle",
        nodes,
        duration_s,
        seed,
        lambda at: (
            PfcStorm(onset_s=at(4.0), duration_s=0.6),
            FlakyLink(onset_s=at(8.0), duration_s=at(10.0), peak_ber=1e-5, flaps=0),
            PcieDowngrade(onset_s=at(12.0), speed_gts=8.0),
            EcnIncast(onset_s=at(19.0), duration_s=at(5.0), senders=3),
            TransportErrors(onset_s=at(24.0), duration_s=at(5.0), scale=0.2),
        ),
    )


def two_storms_scenario(nodes: int = 16, duration_s: float = 30, seed: int = 1) -> SimConfig:
    """Two PFC storms at once, one in each tenant's job (laid out for 30 s: 5-11 s and 7-13 s):
    two origins, each paused fabric's victims kept apart."""
    from rocewatch.sim.faults import PfcStorm
    from rocewatch.sim.scenarios import laid_out

    return laid_out(
        "two_storms",
        nodes,
        duration_s,
        seed,
        lambda at: (
            PfcStorm(onset_s=at(5), duration_s=at(6)),
            PfcStorm(onset_s=at(7), duration_s=at(6)),
        ),
    )


def _scenarios() -> dict[str, Callable[..., SimConfig]]:
    from rocewatch.sim.scenarios import SCENARIOS

    return {
        **SCENARIOS,
        "overlap": overlap_scenario,
        "mixed_tenants": mixed_tenants_scenario,
        "two_storms": two_storms_scenario,
        "subtle": subtle_scenario,
    }


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
    from rocewatch.sim.simulator import Simulator

    cfg = _scenarios()[case.scenario](nodes=case.nodes, duration_s=case.duration_s, seed=case.seed)
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
    score = score_run(truth, pipeline.all_alerts(), pipeline.actions)
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


# --- output ----------------------------------------------------------------------------------


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}"


def table_rows(rep: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["kind", "faults", "found", "precision", "recall", "F1", "TTD median s", "TTD p95 s"]
    header += ["TP", "FP"]
    rows = []
    for kind, k in rep["kinds"].items():
        rows.append(
            [
                kind,
                str(k["faults"]),
                str(k["detected"]),
                _fmt(k["precision"]),
                _fmt(k["recall"]),
                _fmt(k["f1"]),
                _fmt(k["ttd_median_s"]),
                _fmt(k["ttd_p95_s"]),
                str(k["tp_alerts"]),
                str(k["fp_alerts"]),
            ]
        )
    for name, n in rep["alertnames"].items():
        if name in rep["kinds"]:
            continue
        tp, fp = str(n["tp_alerts"]), str(n["fp_alerts"])
        rows.append([f"({name})", "", "", _fmt(n["precision"]), "", "", "", "", tp, fp])
    o = rep["overall"]
    rows.append(
        [
            "all",
            str(o["faults"]),
            str(o["detected"]),
            _fmt(o["precision"]),
            _fmt(o["recall"]),
            _fmt(o["f1"]),
            "",
            "",
            str(o["tp_alerts"]),
            str(o["fp_alerts"]),
        ]
    )
    return header, rows


def text_table(rep: Mapping[str, Any]) -> str:
    header, rows = table_rows(rep)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def summary_lines(rep: Mapping[str, Any]) -> list[str]:
    fi = rep["fabric_incidents"]
    healthy = rep["healthy_alerts_by_alertname"]
    by_name = f" ({', '.join(f'{k} {v}' for k, v in healthy.items())})" if healthy else ""
    return [
        f"wrong-node drains: {rep['wrong_drains']} (of {rep['drains']} drains not refused)",
        f"alerts on healthy runs (all-reduce, MoE): {rep['healthy_alerts']}{by_name}",
        f"storm victims left neutral: {rep['overall']['neutral_victim_alerts']}; "
        f"FabricIncidents: {fi['total']} ({fi['outside_fault_windows']} outside any fault window)",
        "anchors: SONiC PFC watchdog 0.2 s; Minder precision 0.90 / F1 0.89, detects in 3.6-30 s",
    ]


def markdown(rep: Mapping[str, Any]) -> str:
    header, rows = table_rows(rep)
    out = [
        f"# rocewatch evaluation ({rep.get('suite', '')} suite)",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    out += [""] + [f"- {x}" for x in summary_lines(rep)]
    out += [
        "",
        "Kinds are the alertnames of the injected faults; `(name)` rows are alertnames that only "
        "count as an alternative hit (`also`). Precision is over the alerts of the kind's own "
        "alertname; recall over its faults. TTD = first matching startsAt - onset.",
        "",
        "## Runs",
        "",
        "| run | faults found | alerts | TP | FP | victims | drains | wrong | seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rep["runs"]:
        found = sum(1 for f in r["faults"] if f["detected"])
        out.append(
            f"| {r['name']} | {found}/{len(r['faults'])} | {r['alerts']} | {r['tp_alerts']} | "
            f"{r['fp_alerts']} | {r['neutral_victim_alerts']} | {r['drains']} | "
            f"{len(r['wrong_drains'])} | {r['seconds']} |"
        )
    missed = [
        f"{r['name']}: {f['id']} on {'/'.join(map(str, f['entity'].values()))} at {f['onset_s']} s"
        for r in rep["runs"]
        for f in r["faults"]
        if not f["detected"]
    ]
    if missed:
        out += ["", "## Missed faults", ""] + [f"- {m}" for m in missed]
    fps = [
        f"{r['name']}: {fp['alertname']} {fp['labels']} at {fp['starts_s']} s"
        + (f" (near {fp['near']})" if fp["near"] else "")
        for r in rep["runs"]
        for fp in r["false_positives"]
    ]
    if fps:
        out += ["", "## False positives", ""] + [f"- {m}" for m in fps]
    return "\n".join(out) + "\n"


def plot(rep: Mapping[str, Any], path: Path) -> None:
    """Per-kind precision/recall/F1 bars and the time-to-detect distribution."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(rep["kinds"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.26
    bars_of = (("precision", "precision"), ("recall", "recall"), ("f1", "F1"))
    for j, (key, label) in enumerate(bars_of):
        vals = [rep["kinds"][k][key] for k in kinds]
        xs = [i + (j - 1) * width for i in range(len(kinds))]
        bars = ax1.bar(xs, [v or 0.0 for v in vals], width, label=label)
        for b, v in zip(bars, vals, strict=True):
            if v is None:
                ax1.text(b.get_x() + b.get_width() / 2, 0.02, "n/a", ha="center", fontsize=7)
    ax1.axhline(MINDER_PRECISION, color="grey", ls="--", lw=0.8, label="Minder P 0.90")
    ax1.axhline(MINDER_F1, color="grey", ls=":", lw=0.8, label="Minder F1 0.89")
    ax1.set_xticks(range(len(kinds)), kinds, rotation=20, fontsize=8)
    ax1.set_ylim(0, 1.25)
    ax1.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax1.set_title("per kind: precision, recall, F1")
    ax1.legend(fontsize=7, loc="upper center", ncol=5, frameon=False)

    data = [[max(x, 1e-3) for x in rep["kinds"][k]["ttd_s"]] for k in kinds]
    for i, d in enumerate(data):
        if d:
            ax2.boxplot([d], positions=[i], widths=0.5, showfliers=False)
            ax2.scatter([i] * len(d), d, s=12, alpha=0.6, zorder=3)
        else:
            ax2.text(i, 0.3, "not\ndetected", ha="center", fontsize=7)
    ax2.set_yscale("log")
    ax2.set_ylim(0.05, 60)
    ax2.axhline(SONIC_DETECT_S, color="grey", ls="--", lw=0.8)
    ax2.text(-0.4, 0.21, "SONiC 200 ms", fontsize=7, color="grey")
    lo, hi = PUBLISHED_DETECT_S
    ax2.axhspan(lo, hi, color="grey", alpha=0.12)
    ax2.text(-0.4, lo * 1.1, "published 3.6-30 s", fontsize=7, color="grey")
    ax2.set_xticks(range(len(kinds)), kinds, rotation=20, fontsize=8)
    ax2.set_xlim(-0.6, len(kinds) - 0.4)
    ax2.set_ylabel("time to detect (s)")
    ax2.set_title("time to detect (telemetry time)")
    fig.suptitle(
        f"rocewatch evaluation: {len(rep['runs'])} runs, wrong-node drains "
        f"{rep['wrong_drains']}, alerts on healthy runs {rep['healthy_alerts']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(rep: Mapping[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "evaluation.json").write_text(json.dumps(rep, indent=2) + "\n")
    (out / "evaluation.md").write_text(markdown(rep))
    plot(rep, out / "evaluation.png")


def run_evaluate(
    out: Path, as_json: bool, quick: bool, config_path: Path | None = None, verbose: bool = False
) -> int:
    """The `rocewatch evaluate` command."""
    from rocewatch.config import load_config

    if not verbose:  # the pipeline's per-decision log lines would bury the progress lines
        logging.getLogger().setLevel(logging.ERROR)
    config = load_config(config_path)
    cases = QUICK_SUITE if quick else FULL_SUITE

    def progress(i: int, r: RunResult) -> None:
        s = r.score
        found = sum(s.detected.values())
        print(
            f"[{i + 1}/{len(cases)}] {r.case.name}: {found}/{len(s.faults)} faults found, "
            f"{s.alerts} alerts ({sum(s.tp.values())} TP, {sum(s.fp.values())} FP, "
            f"{s.neutral} victims), {s.drains} drains ({len(s.wrong_drains)} wrong), "
            f"{r.seconds:.1f} s",
            file=sys.stderr,
            flush=True,
        )

    rep = {"suite": "quick" if quick else "full", **evaluate(cases, config, progress)}
    write_outputs(rep, out)
    if as_json:
        print(json.dumps(rep, indent=2))
    else:
        print(text_table(rep))
        print()
        print("\n".join(summary_lines(rep)))
        files = ", ".join(f"evaluation.{x}" for x in ("json", "md", "png"))
        print(f"\n{len(cases)} runs in {rep['runtime_s']} s; wrote {files} to {out}")
    return 0
