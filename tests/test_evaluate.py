"""`rocewatch evaluate`: the quick suite end to end, and the matching rules on hand-made cases."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rocewatch.core.model import Action, Alert
from rocewatch.evaluate import Case, aggregate, percentile, run_case, score_run

S = 1_000_000_000
T0 = 1_795_946_400 * S
CONTRACT_KEYS = {"precision", "recall", "f1", "ttd_median_s", "ttd_p95_s"}
FAULT_KINDS = {"PFCStorm", "FlakyLink", "PCIeDowngrade", "ECNCongestion", "TransportErrors"}


@pytest.mark.slow  # five simulated runs through the CLI: ~15 s
def test_quick_suite_through_the_cli(tmp_path: Path) -> None:
    out = tmp_path / "ev"
    r = subprocess.run(
        [sys.executable, "-m", "rocewatch.cli", "evaluate", "--quick", "--json", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert {"kinds", "wrong_drains", "healthy_alerts"} <= set(rep)
    assert isinstance(rep["wrong_drains"], int) and isinstance(rep["healthy_alerts"], int)
    # every kind the suite injects is scored, detector or not
    assert set(rep["kinds"]) >= FAULT_KINDS
    for kind, k in rep["kinds"].items():
        assert set(k) >= CONTRACT_KEYS, kind
        assert 0.0 <= k["recall"] <= 1.0
        for key in ("precision", "f1", "ttd_median_s", "ttd_p95_s"):
            assert k[key] is None or isinstance(k[key], float | int), (kind, key)
    # every fault of every kind found, and nothing alerted that is not one (the quick suite's
    # scenarios are the default suite's, at 100 ms: a regression in any detector shows here)
    for kind in FAULT_KINDS:
        k = rep["kinds"][kind]
        assert k["faults"] >= 1, kind
        assert (k["recall"], k["precision"]) == (1.0, 1.0), (kind, k)
    assert rep["healthy_alerts"] == 0
    storm = rep["kinds"]["PFCStorm"]
    assert storm["faults"] >= 3  # default, overlap and the agentless origin
    assert storm["ttd_median_s"] is not None and storm["ttd_median_s"] <= 1.0
    assert rep["wrong_drains"] == 0
    # each simulated RoCE configuration fault gives exactly its RoCEConfigMismatch alerts
    rc = rep["roce_config"]
    assert rc["exact"] == rc["of"] == 6 and rc["false_alerts"] == 0, rc
    # one progress line per scenario on stderr
    assert sum(1 for line in r.stderr.splitlines() if line.startswith("[")) == len(rep["runs"])
    # files
    assert json.loads((out / "evaluation.json").read_text())["kinds"] == rep["kinds"]
    md = (out / "evaluation.md").read_text()
    assert "| kind |" in md and "PFCStorm" in md
    png = (out / "evaluation.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


# --- matching on hand-made truth ------------------------------------------------------------


def _alert(name: str, at_s: float, **labels: str) -> Alert:
    return Alert({"alertname": name, **labels}, {}, starts_at=T0 + round(at_s * S))


def _drain(node: str, outcome: str = "dry-run") -> Action:
    return Action(T0, "drain", node, "slurm", "rocewatch: test", "fp", False, outcome)


def _truth() -> dict[str, Any]:
    storm_port = {"switch": "leaf-r1-p0", "port": "Ethernet1/3"}
    return {
        "start_ns": T0,
        "faults": [
            {
                "id": "PfcStorm-1",
                "kind": "PfcStorm",
                "alertname": "PFCStorm",
                "also": [],
                "labels": {"node": "gpu-003", "nic": "mlx5_1"},
                "match": [{"node": "gpu-003", "nic": "mlx5_1"}],
                "onset_ns": T0 + 5 * S,
                "end_ns": T0 + 8 * S,
                "culprit_node": "gpu-003",
                "victims": [storm_port, {"node": "gpu-004", "nic": "mlx5_1"}],
            },
            {
                "id": "PcieDowngrade-1",
                "kind": "PcieDowngrade",
                "alertname": "PCIeDowngrade",
                "also": ["Straggler"],
                "labels": {"node": "gpu-009", "nic": "mlx5_0"},
                "match": [{"node": "gpu-009", "nic": "mlx5_0"}, {"node": "gpu-009"}],
                "onset_ns": T0 + 10 * S,
                "end_ns": T0 + 20 * S,
                "culprit_node": "gpu-009",
                "victims": [],
            },
            {
                "id": "TransportErrors-1",
                "kind": "TransportErrors",
                "alertname": "TransportErrors",
                "also": [],
                "labels": {"node": "gpu-012", "nic": "mlx5_2"},
                "match": [{"node": "gpu-012", "nic": "mlx5_2"}],
                "onset_ns": T0 + 22 * S,
                "end_ns": T0 + 26 * S,
                "culprit_node": "gpu-012",
                "victims": [],
            },
        ],
        "not_faults": [
            {"id": "CounterClear-1", "kind": "CounterClear", "at_ns": T0 + 15 * S,
             "labels": {"switch": "leaf-r0-p0"}},
        ],
    }  # fmt: skip


def test_matching_tp_fp_fn_victims_and_ttd() -> None:
    alerts = [
        # storm: the origin at +0.2 s, then again (a second instance is one more TP)
        _alert("PFCStorm", 5.2, node="gpu-003", nic="mlx5_1", role="origin"),
        _alert("PFCStorm", 7.0, node="gpu-003", nic="mlx5_1", role="origin"),
        # victims in the list: neutral; one not in it: FP; a victim is never a TP
        _alert("PFCStorm", 5.3, switch="leaf-r1-p0", port="Ethernet1/3", role="victim"),
        _alert("PFCStorm", 5.5, node="gpu-004", nic="mlx5_1", role="victim"),
        _alert("PFCStorm", 5.5, node="gpu-005", nic="mlx5_1", role="victim"),
        # the wrong origin: FP
        _alert("PFCStorm", 5.4, node="gpu-004", nic="mlx5_1", role="origin"),
        # PCIe: first found by Straggler (an `also` name) on the node label set, then by name
        _alert("Straggler", 12.5, node="gpu-009"),
        _alert("PCIeDowngrade", 13.0, node="gpu-009", nic="mlx5_0"),
        # right entity, too late (end + 5 s is 25 s): FP
        _alert("PCIeDowngrade", 25.5, node="gpu-009", nic="mlx5_0"),
        # right entity, too early (onset - 1 s is 9 s): FP; just inside: TP
        _alert("PCIeDowngrade", 8.9, node="gpu-009", nic="mlx5_1"),
        _alert("Straggler", 9.0, node="gpu-009", nic="mlx5_3"),
        # on a counter clear: FP, tagged with the likely cause
        _alert("FlakyLink", 15.1, switch="leaf-r0-p0", port="Ethernet1/1"),
        # scored apart
        _alert("FabricIncident", 5.6, scope="job:llm-train-a"),
    ]
    actions = [
        _drain("gpu-003"),
        _drain("gpu-009", "refused: max_rail_share"),
        _drain("gpu-004"),  # a victim drained: wrong
        _drain("gpu-005", "refused: blast_radius"),  # refused: not a drain
    ]
    r = score_run(_truth(), alerts, actions)
    assert r.detected == {"PfcStorm-1": True, "PcieDowngrade-1": True, "TransportErrors-1": False}
    assert r.ttd_s["PfcStorm-1"] == pytest.approx(0.2)
    assert r.ttd_s["PcieDowngrade-1"] == pytest.approx(-1.0)  # the Straggler at onset - 1 s
    assert r.tp == {"PFCStorm": 2, "Straggler": 2, "PCIeDowngrade": 1}
    assert r.fp == {"PFCStorm": 2, "PCIeDowngrade": 2, "FlakyLink": 1}
    assert r.neutral == 2 and r.incidents == 1 and r.incidents_outside_faults == 0
    assert r.drains == 2 and [d["node"] for d in r.wrong_drains] == ["gpu-004"]
    near = {fp["alertname"]: fp["near"] for fp in r.false_positives}
    assert near["FlakyLink"] == "CounterClear-1"

    agg = aggregate([r])
    k = agg["kinds"]
    assert set(k) == {"PFCStorm", "PCIeDowngrade", "TransportErrors"}
    assert k["PFCStorm"]["precision"] == 0.5 and k["PFCStorm"]["recall"] == 1.0
    assert k["PFCStorm"]["f1"] == pytest.approx(2 * 0.5 / 1.5, abs=1e-4)
    assert k["PCIeDowngrade"]["precision"] == pytest.approx(1 / 3, abs=1e-4)
    assert k["PCIeDowngrade"]["ttd_median_s"] == -1.0
    # no detector fired for it: recall 0, precision undefined, F1 0, no TTD
    assert k["TransportErrors"] == {
        "precision": None,
        "recall": 0.0,
        "f1": 0.0,
        "ttd_median_s": None,
        "ttd_p95_s": None,
        "faults": 1,
        "detected": 0,
        "tp_alerts": 0,
        "fp_alerts": 0,
        "ttd_s": [],
    }
    assert agg["alertnames"]["Straggler"] == {"tp_alerts": 2, "fp_alerts": 0, "precision": 1.0}
    assert agg["overall"]["faults"] == 3 and agg["overall"]["detected"] == 2


def test_ttd_median_and_p95_over_runs() -> None:
    truth = _truth()
    truth["faults"] = truth["faults"][:1]
    scores = [
        score_run(truth, [_alert("PFCStorm", 5 + d, node="gpu-003", nic="mlx5_1")], [])
        for d in (0.1, 0.2, 0.3, 0.4, 2.0)
    ]
    scores.append(score_run(truth, [], []))  # a missed storm: recall, not TTD
    k = aggregate(scores)["kinds"]["PFCStorm"]
    assert k["recall"] == pytest.approx(5 / 6, abs=1e-4)
    assert k["ttd_median_s"] == pytest.approx(0.3)
    assert k["ttd_p95_s"] == pytest.approx(float(np.percentile([0.1, 0.2, 0.3, 0.4, 2.0], 95)))
    assert percentile([], 50) is None
    xs = [3.0, 1.0, 2.0, 10.0]
    for q in (0, 25, 50, 90, 95, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_a_run_is_deterministic_for_its_seed() -> None:
    case = Case("default", 4, 4, 3)
    a, b = run_case(case), run_case(case)
    assert dataclasses.asdict(a.score) == dataclasses.asdict(b.score)
    assert a.truth == b.truth
