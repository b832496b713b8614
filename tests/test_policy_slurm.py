"""The drain policy's must-show cases, acting on a real slurmctld (scripts/services.sh).

Every drain goes through the real ``scontrol`` (wrapped to log its arguments, so a second
``update`` would show), and ``scontrol show node`` is the judge of what happened.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from actions import DrainPolicy, PolicyConfig, SlurmConfig, SlurmExecutor
from actions.executors import parse_show_node
from actions.operator import apply_pending
from rocewatch.core.model import Action, Alert
from rocewatch.core.topology import Topology
from storage.store import Store

SLURM_NODES = [n for n in os.environ.get("ROCEWATCH_TEST_SLURM_NODES", "").split(",") if n]
pytestmark = pytest.mark.slurm  # the two nodes above (tests/support/tiers.py checks they exist)
A, B = [*SLURM_NODES, "", ""][:2]
S = 1_000_000_000
MS = 1_000_000
T0 = 1_795_946_400 * S


def show(node: str) -> tuple[bool, str]:
    out = subprocess.run(
        ["scontrol", "show", "node", "-o", node], capture_output=True, text=True, check=True
    ).stdout
    n = parse_show_node(out)
    assert n is not None
    return n.drained, n.reason


def resume_all() -> None:
    for node in (A, B):
        subprocess.run(
            ["scontrol", "update", f"NodeName={node}", "State=RESUME"],
            capture_output=True,
            check=False,
        )


@pytest.fixture
def scontrol(tmp_path: Path) -> Iterator[tuple[SlurmExecutor, Path]]:
    """The real scontrol behind a wrapper that logs each call's arguments."""
    log = tmp_path / "scontrol.log"
    log.touch()
    wrapper = tmp_path / "scontrol"
    wrapper.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{log}"\nexec "{shutil.which("scontrol")}" "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    resume_all()
    assert not show(A)[0] and not show(B)[0]
    try:
        yield SlurmExecutor(SlurmConfig(scontrol=str(wrapper))), log
    finally:
        resume_all()


def updates(log: Path) -> list[str]:
    return [x for x in log.read_text().splitlines() if x.startswith("update")]


def topology(extra: int = 0, jobs: list[dict[str, object]] | None = None) -> Topology:
    names = [A, B] + [f"gpu-{i:02d}" for i in range(extra)]
    return Topology.from_dict(
        {
            "switches": [{"name": "leaf-0"}],
            "nodes": [
                {"name": n, "scheduler": "slurm", "nics": [{"nic": "mlx5_0"}]} for n in names
            ],
            "jobs": jobs or [],
        }
    )


def storm(node: str, t: int) -> Alert:
    return Alert(
        {"alertname": "PFCStorm", "severity": "critical", "node": node, "nic": "mlx5_0",
         "priority": "3", "role": "origin"},
        {"summary": f"PFC storm at {node}"},
        t,
    )  # fmt: skip


def ticks(p: DrainPolicy, start: int, end: int, step: int = 100 * MS) -> list[Action]:
    acts: list[Action] = []
    t = start
    while t <= end:
        acts += p.tick(t)[0]
        t += step
    return acts


# Generous share caps: these tests are about the rule named in each, not the caps.
OPEN = {"max_job_share": 1.0, "max_rail_share": 1.0, "max_fabric_share": 1.0}


def test_single_storm_origin_drained_after_hold_down_then_resumed(
    scontrol: tuple[SlurmExecutor, Path],
) -> None:
    ex, log = scontrol
    cfg = PolicyConfig(mode="auto", resume_after_healthy_s=5, **OPEN)
    p = DrainPolicy(cfg, topology(extra=8), ex)
    a = storm(A, T0)
    p.on_alert(a, T0)
    assert ticks(p, T0, T0 + 1900 * MS) == []  # the hold-down (2 s) runs
    assert show(A) == (False, "")
    acts = ticks(p, T0 + 2 * S, T0 + 3 * S)
    assert [(x.action, x.node, x.outcome, x.executed) for x in acts] == [("drain", A, "done", True)]
    assert show(A) == (True, "rocewatch: PFCStorm origin mlx5_0")  # scontrol show node says so
    assert show(B)[0] is False
    p.on_alert(Alert(a.labels, a.annotations, a.starts_at, ends_at=T0 + 10 * S), T0 + 10 * S)
    acts = ticks(p, T0 + 10 * S, T0 + 20 * S, step=S)
    assert [(x.action, x.node, x.outcome) for x in acts] == [("resume", A, "done")]
    assert show(A)[0] is False
    assert len(updates(log)) == 2


def test_storms_on_12_nodes_within_a_second_drain_nobody(
    scontrol: tuple[SlurmExecutor, Path],
) -> None:
    ex, log = scontrol
    p = DrainPolicy(PolicyConfig(mode="auto", **OPEN), topology(extra=10), ex)
    nodes = [A, B] + [f"gpu-{i:02d}" for i in range(10)]
    incidents: list[Alert] = []
    acts: list[Action] = []
    for i, n in enumerate(nodes):  # 12 storm origins within 12 x 80 ms < 1 s
        t = T0 + i * 80 * MS
        p.on_alert(storm(n, t), t)
        a, inc = p.tick(t)
        acts += a
        incidents += inc
    t = T0 + S
    while t <= T0 + 60 * S:
        a, inc = p.tick(t)
        acts += a
        incidents += inc
        t += 500 * MS
    assert sorted(x.node for x in acts) == sorted(nodes)
    assert {x.outcome for x in acts} == {"refused: blast_radius"}
    assert updates(log) == [] and show(A)[0] is False and show(B)[0] is False
    assert {i.labels["alertname"] for i in incidents} == {"FabricIncident"}
    assert "12 nodes became drain candidates" in incidents[-1].annotations["description"]


def test_second_fault_in_a_job_within_cooldown_refused_and_recorded(
    scontrol: tuple[SlurmExecutor, Path], tmp_path: Path
) -> None:
    ex, _ = scontrol
    url = os.environ.get("ROCEWATCH_TEST_PG_URL") or f"sqlite:///{tmp_path}/rw.db"
    store = Store(url)
    store.create_schema()
    cfg = PolicyConfig(mode="auto", job_cooldown_s=600, **OPEN)
    p = DrainPolicy(cfg, topology(extra=8, jobs=[{"name": "llm-7b", "nodes": [A, B]}]), ex)
    p.on_alert(storm(A, T0), T0)
    p.on_alert(storm(B, T0 + 60 * S), T0 + 60 * S)
    acts = ticks(p, T0, T0 + 100 * S, step=S)
    store.write_actions(acts)
    assert [(x.node, x.outcome) for x in acts] == [(A, "done"), (B, "refused: job_cooldown")]
    assert show(A)[0] is True and show(B)[0] is False
    stored = [
        x for x in store.actions() if x.alert_fingerprint in {a.alert_fingerprint for a in acts}
    ]
    refused = [x for x in stored if x.node == B]
    assert len(refused) == 1
    assert "job llm-7b had a node drained 60s ago (cooldown 600s)" in refused[0].reason
    assert refused[0].to_json()["outcome"] == "refused: job_cooldown"
    store.close()


def test_restart_mid_drain_does_not_drain_twice(scontrol: tuple[SlurmExecutor, Path]) -> None:
    ex, log = scontrol
    cfg = PolicyConfig(mode="auto", **OPEN)
    a = storm(A, T0)
    p = DrainPolicy(cfg, topology(extra=8), ex)
    p.on_alert(a, T0)
    p.tick(T0 + S)
    before = json.loads(json.dumps(p.state()))  # the last checkpoint: still in hold-down
    assert [x.outcome for x in ticks(p, T0 + 2 * S, T0 + 2 * S)] == ["done"]
    after = json.loads(json.dumps(p.state()))  # the checkpoint right after the drain
    assert len(updates(log)) == 1 and show(A)[0] is True

    # The service dies after scontrol drained the node but before its state was saved: it
    # restarts from the older checkpoint, the alert is re-sent, the drain is decided again...
    q = DrainPolicy(cfg, topology(extra=8), ex)
    q.restore(before)
    q.on_alert(a, T0 + 5 * S)
    acts = ticks(q, T0 + 5 * S, T0 + 10 * S, step=S)
    assert [(x.node, x.outcome) for x in acts] == [(A, "done")]
    # ... but Slurm was asked only once: the executor found rocewatch's own drain in place.
    assert len(updates(log)) == 1
    assert q.drained() == {A: "drained"}

    # Restarting from the checkpoint after the drain: nothing at all reaches Slurm.
    n_calls = len(log.read_text().splitlines())
    r = DrainPolicy(cfg, topology(extra=8), ex)
    r.restore(after)
    r.on_alert(a, T0 + 5 * S)
    assert ticks(r, T0 + 5 * S, T0 + 30 * S, step=S) == []
    assert len(log.read_text().splitlines()) == n_calls
    assert show(A) == (True, "rocewatch: PFCStorm origin mlx5_0")


def test_approval_mode_does_nothing_until_rocewatch_approve(
    scontrol: tuple[SlurmExecutor, Path], tmp_path: Path
) -> None:
    ex, log = scontrol
    db = f"sqlite:///{tmp_path}/rw.db"
    store = Store(db)
    store.create_schema()
    p = DrainPolicy(PolicyConfig(mode="approval", **OPEN), topology(extra=8), ex)
    p.on_alert(storm(B, T0), T0)
    acts = ticks(p, T0, T0 + 120 * S, step=S)
    store.write_actions(acts)
    assert [(x.node, x.outcome) for x in acts] == [(B, "pending-approval")]
    assert updates(log) == [] and show(B)[0] is False  # two minutes on: still nothing

    r = subprocess.run(
        [sys.executable, "-m", "rocewatch.cli", "approve", B, "--db", db, "--wait", "0"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert show(B)[0] is False  # queued: the service carries it out
    apply_pending(p, [store])  # what `rocewatch detect` does between polls
    acts = p.tick(p.now)[0]
    assert [(x.node, x.outcome) for x in acts] == [(B, "done")]
    assert show(B) == (True, "rocewatch: PFCStorm origin mlx5_0")
    assert store.commands()[0]["status"] == "done"
    store.close()
