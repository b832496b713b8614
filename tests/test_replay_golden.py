"""Golden replay cases (tests/golden/<case>/case.yaml), replayed by one parametrised test.

Each case names a simulator scenario; expectations are checked against the simulator's own
ground truth (truth.json), never against numbers copied from an earlier run.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pytest
import yaml

from rocewatch.core.model import parse_rfc3339
from rocewatch.replay import replay

if TYPE_CHECKING:
    from tests.conftest import SimCache  # the session's recordings fixture

pytestmark = pytest.mark.slow  # each case simulates and replays a scenario (once per run)

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "case.yaml").exists())


def corrupt(scenario: Path, seed: int) -> None:
    """Mix garbage into the recording the way broken collectors and disks do."""
    rng = random.Random(seed)
    sw = scenario / "switch.jsonl"
    lines = sw.read_bytes().splitlines(keepends=True)
    bad = [
        b"{not json at all\n",
        lines[10][: len(lines[10]) // 2] + b"\n",  # truncated mid-record
        b'{"name":"f","timestamp":1795946401000000000,"tags":{"source":"rogue-switch:9339",'
        b'"interface_name":"Ethernet1"},"values":{"/interfaces/interface/state/counters/'
        b'in-errors":"5"}}\n',
        b'{"name":"f","timestamp":1795946401000000000,"tags":{"source":"leaf-r0-p0:9339",'
        b'"interface_name":"Ethernet1/1"},"values":{"/vendor/secret/path":"5"}}\n',
        b"\x00\xff\xfe binary junk\n",
    ]
    for b in bad * 20:
        lines.insert(rng.randrange(len(lines)), b)
    sw.write_bytes(b"".join(lines))
    nic = scenario / "nic.jsonl"
    nl = nic.read_bytes().splitlines(keepends=True)
    nl.insert(len(nl) // 2, b'{"timestamp": 1, "node": \n')
    nic.write_bytes(b"".join(nl))


@pytest.mark.parametrize("name", CASES)
def test_golden_case(name: str, tmp_path: Path, recordings: SimCache) -> None:
    case = yaml.safe_load((GOLDEN / name / "case.yaml").read_text())
    key = (case["scenario"], case["nodes"], case["duration_s"], case["seed"])
    clean = recordings.scenario(*key)
    scenario = clean
    if case.get("config_faults"):
        # the recording's configuration rewritten with the simulator's configuration faults
        from rocewatch.sim.roce_config import parse_fault, write_roce_config
        from rocewatch.sim.scenarios import SCENARIOS

        scenario = tmp_path / "config"
        scenario.mkdir()
        for f in clean.iterdir():
            if f.name not in ("nic_config.jsonl", "switch_config.jsonl", "config_truth.json"):
                (scenario / f.name).symlink_to(f)
        cfg = SCENARIOS[case["scenario"]](
            nodes=case["nodes"], duration_s=case["duration_s"], seed=case["seed"]
        )
        write_roce_config(scenario, cfg, [parse_fault(f) for f in case["config_faults"]])
        out = tmp_path / "out"
        res = replay(scenario, out)
    elif case.get("corrupt"):
        scenario = tmp_path / "corrupt"
        subprocess.run(["cp", "-r", str(clean), str(scenario)], check=True)
        corrupt(scenario, case["seed"])
        out = tmp_path / "out"
        res = replay(scenario, out)
    else:
        # the clean recording's replay is made once per run: four cases judge the same one
        out, res = recordings.replay(*key)
    # the files are what users read
    alerts = [orjson.loads(x) for x in (out / "alerts.jsonl").read_bytes().splitlines()]
    actions = [orjson.loads(x) for x in (out / "actions.jsonl").read_bytes().splitlines()]
    assert alerts == res.alerts and actions == res.actions
    for a in alerts:
        assert set(a) >= {"status", "fingerprint", "labels", "annotations", "startsAt", "endsAt"}
        assert a["labels"]["severity"] in ("critical", "warning", "info")
        assert a["annotations"]["evidence"]
        if a["status"] == "firing":
            assert a["endsAt"] == "0001-01-01T00:00:00Z"
    truth = json.loads((clean / "truth.json").read_text())
    expect = case["expect"]

    if "alerts" in expect:
        assert len(alerts) == expect["alerts"], [a["labels"] for a in alerts][:5]
    if "actions" in expect:
        assert len(actions) == expect["actions"]

    storms = [f for f in truth["faults"] if f["alertname"] == "PFCStorm"]
    if expect.get("storm_origins_found"):
        assert storms, "the case needs a storm in its ground truth"
        origins = [
            a
            for a in alerts
            if a["labels"]["alertname"] == "PFCStorm" and a["labels"]["role"] == "origin"
        ]
        for f in storms:
            hits = [
                a for a in origins if all(a["labels"].get(k) == v for k, v in f["labels"].items())
            ]
            assert hits, f"storm origin {f['labels']} not found"
            ttd = (min(parse_rfc3339(h["startsAt"]) for h in hits) - f["onset_ns"]) / 1e9
            assert 0 <= ttd <= expect["max_ttd_s"], ttd
        # nothing else is blamed as an origin
        assert len(origins) == len(storms), [o["labels"] for o in origins]
        victims = {tuple(sorted(v.items())) for f in storms for v in f["victims"]}
        for a in alerts:
            if a["labels"].get("role") == "victim":
                ent = {
                    k: a["labels"][k] for k in ("switch", "port", "node", "nic") if k in a["labels"]
                }
                assert tuple(sorted(ent.items())) in victims, f"not a victim in truth: {ent}"

    def hits_fault(a: dict, f: dict) -> bool:
        """The ground truth's match rule: name, labels (either end of a cable) and time."""
        name = a["labels"]["alertname"]
        if name != f["alertname"] and name not in f.get("also", []):
            return False
        sets = f.get("match") or [f["labels"]]
        if not any(all(a["labels"].get(k) == v for k, v in m.items()) for m in sets):
            return False
        ends = parse_rfc3339(a["endsAt"]) or truth["end_ns"]
        return parse_rfc3339(a["startsAt"]) <= f["end_ns"] and ends >= f["onset_ns"]

    # found: [Name, ...]: every fault that Name should report (its alertname or `also`) has a
    # matching alert within max_ttd_s (a number, or a mapping per name) of its onset
    for name in expect.get("found", []):
        faults = [f for f in truth["faults"] if name in (f["alertname"], *f.get("also", []))]
        assert faults, f"the case needs a fault that {name} reports"
        limit = expect["max_ttd_s"]
        limit = limit[name] if isinstance(limit, dict) else limit
        for f in faults:
            hits = [a for a in alerts if a["labels"]["alertname"] == name and hits_fault(a, f)]
            assert hits, f"{name}: {f['id']} {f['labels']} not found"
            ttd = (min(parse_rfc3339(h["startsAt"]) for h in hits) - f["onset_ns"]) / 1e9
            assert 0 <= ttd <= limit, (name, f["id"], ttd)
    # no_false: [Name, ...]: every alert of those names matches some fault
    for name in expect.get("no_false", []):
        for a in alerts:
            if a["labels"]["alertname"] == name:
                assert any(hits_fault(a, f) for f in truth["faults"]), f"false alert {a['labels']}"
    if expect.get("drains") == "culprits_only":
        culprits = {f["culprit_node"] for f in truth["faults"] if f.get("culprit_node")}
        drained = [
            a["node"]
            for a in actions
            if a["action"] == "drain" and not a["outcome"].startswith("refused")
        ]
        storm_culprits = {f["culprit_node"] for f in storms if f.get("culprit_node")}
        assert storm_culprits <= set(drained), "the storm's origin should be drained (dry-run)"
        assert set(drained) <= culprits
        # nothing executed: every drain decided is a dry-run, or withheld by a policy rule
        assert all(
            a["executed"] is False
            and (a["outcome"] == "dry-run" or a["outcome"].startswith("refused"))
            for a in actions
        )
    if expect.get("config_mismatch") == "exact":
        from rocewatch.core.topology import Topology
        from rocewatch.roce.score import score

        faults = json.loads((scenario / "config_truth.json").read_text())["config_faults"]
        s = score(Topology.load(scenario / "topology.yaml"), faults, alerts)
        assert s["exact"] and s["expected"] >= len(faults), s
    if expect.get("same_as_clean"):
        _, ref = recordings.replay(*key)
        assert alerts == ref.alerts and actions == ref.actions
        for k in expect["skipped"]:
            assert res.stats.get(k, 0) > 0, (k, res.stats)


def test_cli_replay_unusable_input_is_one_line(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "rocewatch.cli", "replay"]
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "topology.yaml").write_text(
        "switches: [{name: leaf-0}]\n"
        "nodes: [{name: gpu-1, nics: [{nic: mlx5_0, switch_port: ghost/Ethernet1}]}]\n"
    )
    (tmp_path / "s" / "switch.jsonl").write_text("")
    # both commands at once: each costs an interpreter's start, and they share nothing
    missing, invalid = (
        subprocess.Popen(
            [*cli, str(tmp_path / where), "--out", str(tmp_path / f"o-{where}")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for where in ("missing", "s")
    )
    _, err = missing.communicate(timeout=60)
    assert missing.returncode == 2 and err.count("\n") == 1 and "not a scenario" in err
    _, err = invalid.communicate(timeout=60)
    assert invalid.returncode == 2
    assert "invalid topology" in err.splitlines()[0]
    assert "undefined switch 'ghost'" in err
    assert "Traceback" not in err
