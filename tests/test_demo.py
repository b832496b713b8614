"""`rocewatch demo` (README command a): storm origin found, only its node drained, dry-run."""

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # an 8-node, 20 s demo in its own process


def test_demo_prints_origin_and_dry_run_drain_of_that_node_only(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    out = tmp_path / "out"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "rocewatch.cli",
            "demo",
            "--nodes",
            "8",  # the three faults of its 20 s (storm, flaky cable, PCIe) as at 16 nodes
            "--duration",
            "20",
            "--db",
            str(db),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    origin = re.search(r"^PFCStorm\s+critical\s+origin\s+(gpu-\d+)/(mlx5_\d)", r.stdout, re.M)
    assert origin, r.stdout
    node = origin.group(1)
    drains = re.findall(r"^\S+\s+drain\s+(gpu-\d+)\s+slurm\s+dry-run", r.stdout, re.M)
    truth = json.loads((out / "truth.json").read_text())
    storm = next(f for f in truth["faults"] if f["alertname"] == "PFCStorm")
    assert (node, origin.group(2)) == (storm["labels"]["node"], storm["labels"]["nic"])
    culprits = {f["culprit_node"] for f in truth["faults"] if f.get("culprit_node")}
    victims = {v["node"] for f in truth["faults"] for v in f.get("victims", []) if "node" in v}
    # the storm origin's node is drained; every drain is a fault's culprit, never a victim
    assert node in drains and set(drains) <= culprits and not set(drains) & (victims - culprits)
    assert "demo" in r.stderr and "100.0%" in r.stderr  # progress was shown
    # what a user asked for, not the libraries' chatter (Alembic's steps are -v detail)
    assert "alembic" not in r.stderr, r.stderr[:2000]
    # the SQLite file holds the same alerts and the decision
    con = sqlite3.connect(db)
    # (inhibited alerts are stored too, with inhibited_by, as replay stores them)
    n_alerts = con.execute("select count(*) from alerts where inhibited_by is null").fetchone()[0]
    acts = con.execute("select node, outcome from actions where action = 'drain'").fetchall()
    changes = con.execute("select device, port, field, old_value, new_value from config_changes")
    stored_changes = changes.fetchall()
    con.close()
    alerts = [json.loads(x) for x in (out / "alerts.jsonl").read_text().splitlines()]
    assert n_alerts == len(alerts) > 1
    assert sorted(a for a, o in acts if o == "dry-run") == sorted(drains)
    # the demo's configuration change (PFC moved to priority 4 on the leaf port facing the
    # storm's origin two minutes before it): stored, and named on the storm's alert
    (port,) = [(d, p) for d, p, f, o, n in stored_changes if (f, o, n) == ("pfc", "3", "4")]
    (alert,) = [
        a
        for a in alerts
        if a["labels"]["alertname"] == "PFCStorm" and a["labels"]["role"] == "origin"
    ]
    assert alert["annotations"]["config_changes"] == (
        f"pfc on {port[0]}/{port[1]} changed 3 -> 4, 2 min before this PFCStorm"
    )
    assert any(a["labels"]["alertname"] == "RoCEConfigMismatch" for a in alerts)
