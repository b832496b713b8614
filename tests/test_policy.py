"""The drain policy (actions.policy) and the executors behind it (actions.executors)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from actions import DrainPolicy, DryRunExecutor, PolicyConfig, SlurmConfig, SlurmExecutor
from actions.executors import DRAINED_BY_OTHER, parse_show_node
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import Action, Alert
from rocewatch.core.topology import Topology

T0 = 1_795_946_400_000_000_000  # 2026-11-29T10:00:00Z
S = 1_000_000_000
MS = 1_000_000
N_NODES = 20


def topology() -> Topology:
    """20 nodes, each with one NIC on rail 0 (leaf-r0) and one on rail 1 (leaf-r1)."""
    return Topology.from_dict(
        {
            "fabric": "test",
            "switches": [
                {"name": "leaf-r0", "role": "leaf", "rail": 0},
                {"name": "leaf-r1", "role": "leaf", "rail": 1},
                {"name": "spine-0", "role": "spine"},
            ],
            "nodes": [
                {
                    "name": f"gpu-{i:02d}",
                    "scheduler": "slurm",
                    "nics": [
                        {"nic": "mlx5_0", "switch_port": f"leaf-r0/Ethernet{i}"},
                        {"nic": "mlx5_1", "switch_port": f"leaf-r1/Ethernet{i}"},
                    ],
                }
                for i in range(N_NODES)
            ],
            "jobs": [
                {"name": "llm-a", "nodes": [f"gpu-{i:02d}" for i in range(8)]},
                {"name": "llm-b", "nodes": [f"gpu-{i:02d}" for i in range(8, 12)]},
            ],
        }
    )


TOPO = topology()


def storm(node: str, t: int, role: str = "origin", nic: str = "mlx5_0", ends: int = 0) -> Alert:
    return Alert(
        labels={
            "alertname": "PFCStorm",
            "severity": "critical",
            "node": node,
            "nic": nic,
            "priority": "3",
            "role": role,
        },
        annotations={"summary": f"PFC storm at {node}/{nic}"},
        starts_at=t,
        ends_at=ends,
    )


def flaky(node: str, t: int, nic: str = "mlx5_0") -> Alert:
    """A flaky cable at ``node``'s NIC: a culprit the share caps hold (a storm's origin is not)."""
    return Alert(
        labels={"alertname": "FlakyLink", "severity": "warning", "node": node, "nic": nic},
        annotations={"summary": f"flaky cable at {node}/{nic}"},
        starts_at=t,
    )


def resolved(a: Alert, t: int) -> Alert:
    return replace(a, ends_at=t)


class Recorder:
    """A scheduler stand-in that answers with scripted outcomes and records every call."""

    def __init__(self, drain: list[str] | None = None, resume: list[str] | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self._drain = drain or []
        self._resume = resume or []

    def drain(self, node: str, scheduler: str, reason: str) -> str:
        self.calls.append(("drain", node))
        return self._drain.pop(0) if self._drain else "done"

    def resume(self, node: str, scheduler: str) -> str:
        self.calls.append(("resume", node))
        return self._resume.pop(0) if self._resume else "done"


def run(
    p: DrainPolicy, start: int, end: int, step: int = 100 * MS
) -> tuple[list[Action], list[Alert]]:
    acts: list[Action] = []
    incs: list[Alert] = []
    t = start
    while t <= end:
        a, i = p.tick(t)
        acts += a
        incs += i
        t += step
    return acts, incs


def drains(acts: list[Action]) -> list[Action]:
    """Drains that happened (or would have, in dry-run): not refusals."""
    return [a for a in acts if a.action == "drain" and not a.outcome.startswith("refused")]


def test_single_origin_drained_once_after_hold_down() -> None:
    ex = DryRunExecutor()
    p = DrainPolicy(PolicyConfig(), TOPO, ex)
    a = storm("gpu-03", T0 + 200 * MS)
    p.on_alert(a, T0 + 200 * MS)
    assert p.tick(T0 + 2 * S) == ([], [])  # hold-down: 200 ms + 2 s not reached
    acts, incs = p.tick(T0 + 2200 * MS)
    assert incs == []
    assert [x.to_json() for x in acts] == [
        {
            "time": "2026-11-29T10:00:02.200Z",
            "action": "drain",
            "node": "gpu-03",
            "scheduler": "slurm",
            "reason": "rocewatch: PFCStorm origin mlx5_0",
            "alert_fingerprint": a.fingerprint,
            "executed": False,
            "outcome": "dry-run",
        }
    ]
    # The same event re-fed, and a new firing of the same alert: the node is already ours.
    p.on_alert(a, T0 + 3 * S)
    p.on_alert(storm("gpu-03", T0 + 5 * S), T0 + 5 * S)
    again, _ = run(p, T0 + 3 * S, T0 + 20 * S, step=S)
    assert again == []
    assert ex.calls == []  # dry-run mode never touches an executor
    assert p.drained() == {"gpu-03": "drained"}


def test_alert_resolved_within_hold_down_is_not_drained() -> None:
    p = DrainPolicy(PolicyConfig(), TOPO)
    a = storm("gpu-03", T0)
    p.on_alert(a, T0)
    p.on_alert(resolved(a, T0 + S), T0 + S)
    assert run(p, T0, T0 + 10 * S) == ([], [])


def test_victims_and_nodeless_alerts_are_never_drained() -> None:
    p = DrainPolicy(PolicyConfig(blast_radius_nodes=100), TOPO)
    alerts = [storm(f"gpu-{i:02d}", T0 + i * MS, role="victim") for i in range(10)]
    alerts += [
        storm("gpu-10", T0, role=""),  # a storm not known to be the origin
        Alert(
            {
                "alertname": "FlakyLink",
                "severity": "warning",
                "node": "gpu-11",
                "nic": "mlx5_0",
                "role": "victim",
            },
            {},
            T0,
        ),
        Alert(
            {
                "alertname": "FlakyLink",
                "severity": "warning",
                "switch": "leaf-r0",
                "port": "Ethernet12",
            },
            {},
            T0,
        ),
        Alert(
            {
                "alertname": "PFCStorm",
                "severity": "critical",
                "switch": "leaf-r0",
                "port": "Ethernet13",
                "priority": "3",
                "role": "origin",
            },
            {},
            T0,
        ),
        Alert({"alertname": "Straggler", "severity": "warning", "node": "gpu-14"}, {}, T0),
        storm("gpu-99", T0),  # not in the topology
    ]
    for a in alerts:
        p.on_alert(a, T0)
    assert run(p, T0, T0 + 30 * S) == ([], [])


def test_flaky_link_and_pcie_name_their_node() -> None:
    p = DrainPolicy(PolicyConfig(), TOPO)
    flaky = Alert(
        {
            "alertname": "FlakyLink",
            "severity": "warning",
            "node": "gpu-12",
            "nic": "mlx5_1",
            "switch": "leaf-r1",
            "port": "Ethernet12",
        },
        {},
        T0,
    )
    p.on_alert(flaky, T0)
    acts, _ = run(p, T0, T0 + 3 * S)
    assert [(a.node, a.reason, a.outcome) for a in acts] == [
        ("gpu-12", "rocewatch: FlakyLink mlx5_1", "dry-run")
    ]


def test_mass_storm_drains_nobody_and_raises_one_incident() -> None:
    p = DrainPolicy(PolicyConfig(), TOPO)
    origins = [storm(f"gpu-{i:02d}", T0 + i * 80 * MS, nic=f"mlx5_{i % 2}") for i in range(12)]
    acts: list[Action] = []
    incs: list[Alert] = []
    for i, a in enumerate(origins):
        p.on_alert(a, a.starts_at)
        x, y = p.tick(T0 + i * 80 * MS)
        acts += x
        incs += y
    x, y = run(p, T0 + S, T0 + 60 * S)
    acts += x
    incs += y
    assert drains(acts) == []
    assert sorted(a.node for a in acts) == [f"gpu-{i:02d}" for i in range(12)]
    assert {a.outcome for a in acts} == {"refused: blast_radius"}
    assert len({(i.fingerprint, i.starts_at) for i in incs}) == 1
    inc = incs[-1]
    assert inc.labels == {"alertname": "FabricIncident", "severity": "critical", "scope": "fabric"}
    assert inc.status == "firing"
    assert inc.annotations["nodes"] == ", ".join(f"gpu-{i:02d}" for i in range(12))
    assert "blast radius 3" in inc.annotations["description"]

    for a in origins:
        p.on_alert(resolved(a, T0 + 70 * S), T0 + 70 * S)
    x, y = p.tick(T0 + 70 * S)
    assert x == []
    assert [(i.fingerprint, i.status, i.ends_at) for i in y] == [
        (inc.fingerprint, "resolved", T0 + 70 * S)
    ]
    assert run(p, T0 + 71 * S, T0 + 2000 * S, step=10 * S) == ([], [])


def test_storm_on_one_leaf_is_scoped_to_the_switch() -> None:
    p = DrainPolicy(PolicyConfig(), TOPO)
    for i in range(5):
        p.on_alert(storm(f"gpu-{i + 12:02d}", T0 + i * 10 * MS), T0)
    acts, incs = run(p, T0, T0 + 3 * S)
    assert drains(acts) == []
    assert {i.labels["scope"] for i in incs} == {"switch:leaf-r0"}


def test_refire_within_cooldown_refused_then_drained_after_it() -> None:
    cfg = PolicyConfig(resume_after_healthy_s=60)
    p = DrainPolicy(cfg, TOPO)
    first = storm("gpu-03", T0)
    p.on_alert(first, T0)
    acts, _ = run(p, T0, T0 + 9 * S, step=S)
    p.on_alert(resolved(first, T0 + 10 * S), T0 + 10 * S)
    acts += run(p, T0 + 10 * S, T0 + 100 * S, step=S)[0]
    assert [(a.action, a.time, a.outcome) for a in acts] == [
        ("drain", T0 + 2 * S, "dry-run"),
        ("resume", T0 + 70 * S, "dry-run"),
    ]
    assert acts[1].alert_fingerprint == first.fingerprint

    second = storm("gpu-03", T0 + 200 * S)  # the same node faults again, 200 s after the drain
    p.on_alert(second, T0 + 200 * S)
    acts, _ = run(p, T0 + 200 * S, T0 + 700 * S, step=S)
    assert [(a.time, a.outcome) for a in acts] == [
        (T0 + 202 * S, "refused: cooldown"),  # recorded once, not on every tick
        (T0 + 602 * S, "dry-run"),  # still firing when the cooldown ran out
    ]
    assert "gpu-03 was drained 200s ago (cooldown 600s)" in acts[0].reason


def test_second_node_of_a_job_within_job_cooldown_refused() -> None:
    p = DrainPolicy(PolicyConfig(job_cooldown_s=600, max_fabric_share=1, max_rail_share=1), TOPO)
    p.on_alert(storm("gpu-00", T0), T0)
    p.on_alert(storm("gpu-01", T0 + 60 * S), T0 + 60 * S)
    p.on_alert(storm("gpu-08", T0 + 60 * S), T0 + 60 * S)  # another job: unaffected
    acts, _ = run(p, T0, T0 + 100 * S, step=S)
    assert [(a.node, a.outcome) for a in acts] == [
        ("gpu-00", "dry-run"),
        ("gpu-01", "refused: job_cooldown"),
        ("gpu-08", "dry-run"),
    ]
    assert "job llm-a had a node drained 60s ago" in acts[1].reason


def test_job_share_cap_withholds_and_raises_job_incident() -> None:
    cfg = PolicyConfig(max_rail_share=1, max_fabric_share=1, resume_after_healthy_s=60)
    p = DrainPolicy(cfg, TOPO)
    a0, a1, a2 = (flaky(f"gpu-{i:02d}", T0 + i * 10 * S) for i in range(3))
    for a in (a0, a1, a2):
        p.on_alert(a, a.starts_at)
    acts, incs = run(p, T0, T0 + 30 * S, step=S)
    # llm-a has 8 nodes; 25 % of them is 2.
    assert [(a.node, a.outcome) for a in acts] == [
        ("gpu-00", "dry-run"),
        ("gpu-01", "dry-run"),
        ("gpu-02", "refused: max_job_share"),
    ]
    assert "job llm-a already has 2 of 8 nodes out (gpu-00, gpu-01)" in acts[2].reason
    assert [(i.labels["scope"], i.status, i.annotations["nodes"]) for i in incs] == [
        ("job:llm-a", "firing", "gpu-02")
    ]
    # gpu-00 heals and is resumed; gpu-02 still fires, so it now fits under the cap.
    p.on_alert(resolved(a0, T0 + 40 * S), T0 + 40 * S)
    acts, incs = run(p, T0 + 31 * S, T0 + 120 * S, step=S)
    assert [(a.action, a.node, a.time, a.outcome) for a in acts] == [
        ("resume", "gpu-00", T0 + 100 * S, "dry-run"),
        ("drain", "gpu-02", T0 + 100 * S, "dry-run"),
    ]
    assert [(i.labels["scope"], i.status) for i in incs] == [("job:llm-a", "resolved")]


def test_rail_share_cap_with_default_config() -> None:
    p = DrainPolicy(PolicyConfig(), TOPO)
    for k, node in enumerate(["gpu-12", "gpu-13", "gpu-14"]):
        p.on_alert(flaky(node, T0 + k * 10 * S, nic="mlx5_1"), T0 + k * 10 * S)
    acts, incs = run(p, T0, T0 + 30 * S, step=S)
    # Every node hangs off both rails: 10 % of 20 nodes is 2.
    assert [a.outcome for a in acts] == ["dry-run", "dry-run", "refused: max_rail_share"]
    assert incs[0].labels["scope"] == "rail:1"


def _rail_fabric() -> Topology:
    """16 nodes per rail (one leaf per rail, rails 0 and 1), two jobs of 8 nodes."""
    names = [f"gpu-{i:03d}" for i in range(1, 17)]
    return Topology.from_dict(
        {
            "switches": [{"name": f"leaf-r{r}", "role": "leaf", "rail": r} for r in (0, 1)]
            + [{"name": "spine-0", "role": "spine"}],
            "nodes": [
                {
                    "name": n,
                    "nics": [
                        {"nic": f"mlx5_{r}", "rail": r, "switch_port": f"leaf-r{r}/Ethernet{i}"}
                        for r in (0, 1)
                    ],
                }
                for i, n in enumerate(names, 1)
            ],
            "jobs": [
                {"name": "llm-a", "nodes": names[:8]},
                {"name": "llm-b", "nodes": names[8:]},
            ],
        }
    )


def test_two_independent_storm_origins_on_a_16_node_rail_are_both_drained() -> None:
    """Two unrelated NIC storms on two leaves, seconds apart: 10 % of a 16-node rail allows one
    node out, but a storm's origin pauses every job behind it, so the second is drained too.
    The cap still holds a second culprit of another kind."""
    topo = _rail_fabric()
    p = DrainPolicy(PolicyConfig(), topo)
    p.on_alert(storm("gpu-003", T0, nic="mlx5_1"), T0)
    p.on_alert(storm("gpu-011", T0 + 3 * S, nic="mlx5_0"), T0 + 3 * S)
    acts, incs = run(p, T0, T0 + 10 * S)
    assert [(a.node, a.outcome) for a in acts] == [("gpu-003", "dry-run"), ("gpu-011", "dry-run")]
    assert incs == []
    # a flaky cable elsewhere now: the rail's share is taken twice over, so it waits
    p.on_alert(flaky("gpu-007", T0 + 20 * S, nic="mlx5_0"), T0 + 20 * S)
    acts, _ = run(p, T0 + 20 * S, T0 + 30 * S)
    assert [(a.node, a.outcome) for a in acts] == [("gpu-007", "refused: max_rail_share")]
    assert "withheld by max_rail_share" in acts[0].reason


def test_a_mass_storm_drains_none_and_every_refusal_names_its_guard() -> None:
    """A third of the nodes storm at once: the fabric, not the nodes. No origin is drained,
    and every refusal says which guard withheld it."""
    topo = _rail_fabric()
    p = DrainPolicy(PolicyConfig(), topo)
    nodes = [f"gpu-{i:03d}" for i in (1, 3, 5, 8, 10, 12)]  # 6 of 16
    for k, node in enumerate(nodes):
        t = T0 + k * 150 * MS
        p.on_alert(storm(node, t, nic=f"mlx5_{k % 2}"), t)
    acts, incs = run(p, T0, T0 + 30 * S)
    assert drains(acts) == []
    assert sorted(a.node for a in acts) == sorted(nodes)  # each refused once
    for a in acts:
        assert a.outcome == "refused: blast_radius", a
        assert "withheld by blast_radius:" in a.reason and "blast radius 3" in a.reason
    assert [i.labels["scope"] for i in incs if i.status == "firing"] == ["fabric"]


def test_rate_limit_per_scheduler() -> None:
    cfg = PolicyConfig(max_drains_per_hour=1, max_rail_share=1, max_fabric_share=1)
    p = DrainPolicy(cfg, TOPO)
    p.on_alert(storm("gpu-12", T0), T0)
    p.on_alert(storm("gpu-13", T0 + 10 * S), T0 + 10 * S)
    acts, _ = run(p, T0, T0 + 3700 * S, step=10 * S)
    assert [(a.node, a.outcome, a.time) for a in acts] == [
        ("gpu-12", "dry-run", T0 + 10 * S),
        ("gpu-13", "refused: max_drains_per_hour", T0 + 20 * S),
        ("gpu-13", "dry-run", T0 + 3610 * S),  # an hour after the first
    ]


def test_maintenance_window_withholds_drains() -> None:
    p = DrainPolicy(PolicyConfig(maintenance=((T0, T0 + 60 * S),)), TOPO)
    p.on_alert(storm("gpu-12", T0 + S), T0 + S)
    acts, _ = run(p, T0, T0 + 90 * S, step=S)
    assert [(a.outcome, a.time) for a in acts] == [
        ("refused: maintenance", T0 + 3 * S),
        ("dry-run", T0 + 60 * S),
    ]


def test_approval_mode_waits_for_approve() -> None:
    ex = Recorder()
    p = DrainPolicy(PolicyConfig(mode="approval"), TOPO, ex)
    a = storm("gpu-12", T0)
    p.on_alert(a, T0)
    acts, _ = run(p, T0, T0 + 10 * S, step=S)
    assert [(x.outcome, x.executed) for x in acts] == [("pending-approval", False)]
    assert p.pending() == ["gpu-12"] and ex.calls == []
    assert run(p, T0 + 11 * S, T0 + 20 * S, step=S) == ([], [])
    assert not p.approve("gpu-13")
    assert p.approve("gpu-12")
    acts, _ = p.tick(T0 + 21 * S)
    assert [(x.time, x.outcome, x.executed) for x in acts] == [(T0 + 21 * S, "done", True)]
    assert ex.calls == [("drain", "gpu-12")]
    assert p.pending() == []


def test_approval_rejected_or_expired() -> None:
    ex = Recorder()
    p = DrainPolicy(PolicyConfig(mode="approval", resume_after_healthy_s=60), TOPO, ex)
    a, b = storm("gpu-12", T0), storm("gpu-13", T0 + 20 * S)
    p.on_alert(a, T0)
    p.on_alert(b, T0 + 20 * S)
    run(p, T0, T0 + 30 * S, step=S)
    assert p.pending() == ["gpu-12", "gpu-13"]
    assert p.reject("gpu-12")
    p.on_alert(resolved(b, T0 + 40 * S), T0 + 40 * S)
    acts, _ = run(p, T0 + 31 * S, T0 + 200 * S, step=S)
    assert [(x.node, x.outcome) for x in acts] == [
        ("gpu-12", "refused: rejected"),
        ("gpu-13", "refused: approval_expired"),
    ]
    assert ex.calls == []


def test_resume_after_healthy_period_only_for_nodes_we_drained() -> None:
    ex = Recorder()
    p = DrainPolicy(PolicyConfig(mode="auto"), TOPO, ex)
    ours = storm("gpu-12", T0)
    victim = storm("gpu-13", T0, role="victim")
    p.on_alert(ours, T0)
    p.on_alert(victim, T0)
    acts, _ = run(p, T0, T0 + 10 * S, step=S)
    assert [(x.action, x.node, x.outcome, x.executed) for x in acts] == [
        ("drain", "gpu-12", "done", True)
    ]
    p.on_alert(resolved(ours, T0 + 20 * S), T0 + 20 * S)
    p.on_alert(resolved(victim, T0 + 20 * S), T0 + 20 * S)
    # It fires again 100 s later, briefly: the healthy period starts over from its end.
    again = storm("gpu-12", T0 + 120 * S)
    p.on_alert(again, T0 + 120 * S)
    p.on_alert(resolved(again, T0 + 121 * S), T0 + 121 * S)
    acts, _ = run(p, T0 + 11 * S, T0 + 1000 * S, step=S)
    assert [(x.action, x.node, x.time, x.outcome) for x in acts] == [
        ("resume", "gpu-12", T0 + 421 * S, "done")
    ]
    assert acts[0].alert_fingerprint == ours.fingerprint
    assert ex.calls == [("drain", "gpu-12"), ("resume", "gpu-12")]


def test_failed_drain_is_retried_and_foreign_drain_left_alone() -> None:
    ex = Recorder(drain=["failed: slurmctld unreachable", "done", "refused: drained-by-other"])
    p = DrainPolicy(PolicyConfig(mode="auto", max_rail_share=1, max_fabric_share=1), TOPO, ex)
    a = storm("gpu-12", T0)
    b = storm("gpu-13", T0 + 100 * S)
    p.on_alert(a, T0)
    p.on_alert(b, T0 + 100 * S)
    acts, _ = run(p, T0, T0 + 200 * S, step=S)
    assert [(x.node, x.time, x.outcome, x.executed) for x in acts] == [
        ("gpu-12", T0 + 2 * S, "failed: slurmctld unreachable", False),
        ("gpu-12", T0 + 32 * S, "done", True),
        ("gpu-13", T0 + 102 * S, "refused: drained-by-other", False),
    ]
    p.on_alert(resolved(a, T0 + 201 * S), T0 + 201 * S)
    p.on_alert(resolved(b, T0 + 201 * S), T0 + 201 * S)
    acts, _ = run(p, T0 + 201 * S, T0 + 600 * S, step=S)
    assert [(x.action, x.node) for x in acts] == [("resume", "gpu-12")]  # never gpu-13


def test_drain_gives_up_after_max_attempts_or_when_the_alert_resolves() -> None:
    ex = Recorder(drain=["failed: timeout"] * 10)
    p = DrainPolicy(PolicyConfig(mode="auto", max_rail_share=1, max_fabric_share=1), TOPO, ex)
    a, b = storm("gpu-12", T0), storm("gpu-13", T0)
    p.on_alert(a, T0)
    p.on_alert(b, T0)
    run(p, T0, T0 + 10 * S, step=S)
    p.on_alert(resolved(b, T0 + 20 * S), T0 + 20 * S)  # gpu-13 heals after one failed try
    acts, _ = run(p, T0 + 11 * S, T0 + 1000 * S, step=S)
    # gpu-12: retried after 30 s and 60 s more, then left alone; neither is ever resumed.
    assert [(x.node, x.time) for x in acts] == [("gpu-12", T0 + 32 * S), ("gpu-12", T0 + 92 * S)]
    assert ex.calls == [("drain", "gpu-12"), ("drain", "gpu-13")] + [("drain", "gpu-12")] * 2
    assert p.drained() == {}


def test_state_round_trip_prevents_double_drain() -> None:
    p = DrainPolicy(PolicyConfig(mode="auto"), TOPO, Recorder())
    a = storm("gpu-12", T0)
    waiting = storm("gpu-08", T0 + 5 * S)
    p.on_alert(a, T0)
    acts, _ = run(p, T0, T0 + 5 * S, step=S)
    assert len(acts) == 1
    p.on_alert(waiting, T0 + 5 * S)  # still in its hold-down when the service stops
    saved = json.loads(json.dumps(p.state()))

    ex = Recorder()
    q = DrainPolicy(PolicyConfig(mode="auto"), TOPO, ex)
    q.restore(saved)
    assert q.state() == saved
    q.on_alert(a, T0 + 6 * S)  # the alert pipeline re-sends what is firing after a restart
    q.on_alert(waiting, T0 + 6 * S)
    acts, _ = run(q, T0 + 6 * S, T0 + 20 * S, step=S)
    assert [(x.node, x.outcome) for x in acts] == [("gpu-08", "done")]
    assert ex.calls == [("drain", "gpu-08")]
    # The restored policy still owns gpu-12, so it resumes it once healthy.
    q.on_alert(resolved(a, T0 + 30 * S), T0 + 30 * S)
    acts, _ = run(q, T0 + 21 * S, T0 + 400 * S, step=S)
    assert [(x.action, x.node) for x in acts] == [("resume", "gpu-12")]


def test_restore_rejects_unknown_state() -> None:
    p = DrainPolicy(PolicyConfig(), TOPO)
    with pytest.raises(ConfigError):
        p.restore({"version": 99})


def test_config_validation() -> None:
    PolicyConfig().validate()
    for bad in (
        PolicyConfig(mode="yolo"),
        PolicyConfig(drain_on=("FabricIncident",)),
        PolicyConfig(max_job_share=0),
        PolicyConfig(blast_radius_nodes=0),
        PolicyConfig(maintenance=((5, 1),)),
    ):
        with pytest.raises(ConfigError):
            bad.validate()
    cfg = PolicyConfig.from_dict(
        {"mode": "auto", "maintenance": [[1, 2]], "drain_on": ["FlakyLink"]}
    )
    assert cfg.maintenance == ((1, 2),) and cfg.drain_on == ("FlakyLink",)
    with pytest.raises(ConfigError, match="unknown settings hold_down"):
        PolicyConfig.from_dict({"hold_down": 2})
    with pytest.raises(ConfigError):
        DrainPolicy(PolicyConfig(mode="yolo"), TOPO)


# --- SlurmExecutor against a scripted scontrol --------------------------------------------------

FAKE_SCONTROL = """\
import json, sys
state_file, log_file = sys.argv[1], sys.argv[2]
args = sys.argv[3:]
nodes = json.load(open(state_file))
open(log_file, "a").write(json.dumps(args) + "\\n")
if args[:3] == ["show", "node", "-o"]:
    n = nodes.get(args[3])
    if n is None:
        print(f"Node {args[3]} not found", file=sys.stderr)
        sys.exit(1)
    reason = f" Reason={n['reason']} [root@2026-11-29T10:00:00]" if n["reason"] else ""
    print(f"NodeName={args[3]} Arch=x86_64 CPUTot=64 State={n['state']} Weight=1{reason}")
elif args[0] == "update":
    kv = dict(a.split("=", 1) for a in args[1:])
    n = nodes[kv["NodeName"]]
    if kv["State"] == "DRAIN":
        n["state"], n["reason"] = "IDLE+DRAIN", kv["Reason"]
    else:
        n["state"], n["reason"] = "IDLE", ""
    json.dump(nodes, open(state_file, "w"))
"""


@pytest.fixture
def scontrol(tmp_path: Path) -> tuple[SlurmExecutor, Path, Path]:
    state, log = tmp_path / "nodes.json", tmp_path / "calls.jsonl"
    state.write_text(
        json.dumps(
            {
                "gpu-01": {"state": "IDLE", "reason": ""},
                "gpu-02": {"state": "MIXED+DRAIN", "reason": "bad DIMM, ticket 42"},
            }
        )
    )
    (tmp_path / "fake_scontrol.py").write_text(FAKE_SCONTROL)
    exe = tmp_path / "scontrol"
    exe.write_text(
        f'#!/bin/sh\nexec "{sys.executable}" "{tmp_path}/fake_scontrol.py" "{state}" "{log}" "$@"\n'
    )
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return SlurmExecutor(SlurmConfig(scontrol=str(exe), timeout_s=30)), state, log


def test_slurm_drain_and_resume(scontrol: tuple[SlurmExecutor, Path, Path]) -> None:
    ex, state, log = scontrol
    assert ex.drain("gpu-01", "slurm", "rocewatch: PFCStorm origin mlx5_3") == "done"
    assert json.loads(state.read_text())["gpu-01"] == {
        "state": "IDLE+DRAIN",
        "reason": "rocewatch: PFCStorm origin mlx5_3",
    }
    calls = [json.loads(x) for x in log.read_text().splitlines()]
    assert calls[-1] == [
        "update",
        "NodeName=gpu-01",
        "State=DRAIN",
        "Reason=rocewatch: PFCStorm origin mlx5_3",
    ]
    assert ex.drain("gpu-01", "slurm", "rocewatch: PFCStorm origin mlx5_3") == "done"  # retry
    assert ex.resume("gpu-01", "slurm") == "done"
    assert json.loads(state.read_text())["gpu-01"]["state"] == "IDLE"


def test_slurm_leaves_other_drains_alone(scontrol: tuple[SlurmExecutor, Path, Path]) -> None:
    ex, state, log = scontrol
    before = state.read_text()
    assert ex.drain("gpu-02", "slurm", "rocewatch: FlakyLink mlx5_0") == "refused: drained-by-other"
    assert ex.resume("gpu-02", "slurm") == "refused: drained-by-other"
    assert state.read_text() == before
    assert not any('"update"' in x for x in log.read_text().splitlines())
    assert ex.drain("gpu-77", "slurm", "rocewatch: x") == "failed: Node gpu-77 not found"
    assert ex.drain("gpu-01", "kubernetes", "rocewatch: x").startswith("refused:")


def test_slurm_missing_binary_fails_softly() -> None:
    ex = SlurmExecutor(SlurmConfig(scontrol=os.devnull + "/no-such-scontrol"))
    assert ex.drain("gpu-01", "slurm", "rocewatch: x").startswith("failed:")


def test_parse_show_node() -> None:
    n = parse_show_node(
        "NodeName=gpu-1 Arch=x86_64 State=IDLE+DRAIN ThreadsPerCore=1 "
        "Reason=rocewatch: PFCStorm origin mlx5_3 [root@2026-11-29T10:00:02]"
    )
    assert n is not None and n.drained and n.ours
    assert n.reason == "rocewatch: PFCStorm origin mlx5_3"
    idle = parse_show_node("NodeName=gpu-1 State=IDLE Reason=(null)")
    assert idle is not None and not idle.drained and idle.reason == ""


def test_slurm_executor_against_slurmctld(slurm_nodes: tuple[str, str]) -> None:
    """Against a real slurmctld (SLURM_CONF in the environment); the nodes need no slurmd."""
    ours, theirs = slurm_nodes

    def show(node: str) -> tuple[bool, str]:
        out = subprocess.run(
            ["scontrol", "show", "node", "-o", node], capture_output=True, text=True, check=True
        ).stdout
        n = parse_show_node(out)
        assert n is not None
        return n.drained, n.reason

    def update(*args: str) -> None:
        subprocess.run(["scontrol", "update", *args], capture_output=True, check=False)

    for node in (ours, theirs):
        update(f"NodeName={node}", "State=RESUME")
    update(f"NodeName={theirs}", "State=DRAIN", "Reason=bad DIMM, ticket 42")
    ex = SlurmExecutor()
    try:
        assert ex.drain(ours, "slurm", "rocewatch: PFCStorm origin mlx5_3") == "done"
        assert show(ours) == (True, "rocewatch: PFCStorm origin mlx5_3")
        assert ex.drain(ours, "slurm", "rocewatch: PFCStorm origin mlx5_3") == "done"
        assert ex.drain(theirs, "slurm", "rocewatch: FlakyLink mlx5_0") == DRAINED_BY_OTHER
        assert ex.resume(theirs, "slurm") == DRAINED_BY_OTHER
        assert show(theirs) == (True, "bad DIMM, ticket 42")
        assert ex.resume(ours, "slurm") == "done"
        assert show(ours)[0] is False
    finally:
        update(f"NodeName={theirs}", "State=RESUME")


def test_a_domains_policy_caps_its_share_of_the_rail_and_of_the_hourly_drains() -> None:
    """The detect stage split by fabric domain runs a policy per domain: each sees only its own
    domain's drains, so it holds its own nodes to the caps (half the nodes: half the room)."""
    doc = topology().to_dict()
    for i, n in enumerate(doc["nodes"]):
        n["domain"] = "pod-a" if i < N_NODES // 2 else "pod-b"
    topo = Topology.from_dict(doc)
    p = DrainPolicy(PolicyConfig(), topo)
    p.domain = "pod-a"
    for k, node in enumerate(["gpu-00", "gpu-01"]):
        p.on_alert(flaky(node, T0 + k * 10 * S), T0 + k * 10 * S)
    acts, incs = run(p, T0, T0 + 30 * S, step=S)
    # 10 % of the fabric's 20 nodes on rail 0 would allow 2; pod-a holds 10 of them: 1
    assert [(a.node, a.outcome) for a in acts] == [
        ("gpu-00", "dry-run"),
        ("gpu-01", "refused: max_rail_share"),
    ]
    assert "rail 0 in domain 'pod-a' already has 1 of 10 nodes out (gpu-00)" in acts[1].reason
    # its incident is its domain's: the other domain's policy may raise one of the same scope
    assert [(i.labels["scope"], i.labels["domain"]) for i in incs] == [("rail:0", "pod-a")]
    assert p._hourly_limit() == PolicyConfig().max_drains_per_hour // 2
    p.domain = None  # the whole fabric (one detect stage): the caps as configured
    assert p._hourly_limit() == PolicyConfig().max_drains_per_hour


# --- executors that fail in the worst ways: an exception, an scontrol that never answers -------


class Raising(Recorder):
    """An executor with a bug: its first ``n`` calls raise."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def drain(self, node: str, scheduler: str, reason: str) -> str:
        if self.n > 0:
            self.n -= 1
            self.calls.append(("drain", node))
            raise RuntimeError(f"lost the scheduler's session for {node}")
        return super().drain(node, scheduler, reason)

    def resume(self, node: str, scheduler: str) -> str:
        if self.n > 0:
            self.n -= 1
            self.calls.append(("resume", node))
            raise KeyError(node)
        return super().resume(node, scheduler)


def test_an_executor_that_raises_is_a_failed_action_retried_and_the_stream_goes_on() -> None:
    """An exception from the executor is recorded as ``failed: <type>: <message>`` (not
    executed), the same tick still drains the next node, and the drain is retried after
    retry_s; a resume that raises is retried too, and the node is not left drained."""
    ex = Raising(1)
    p = DrainPolicy(PolicyConfig(mode="auto", max_rail_share=1, max_fabric_share=1), TOPO, ex)
    a, b = storm("gpu-12", T0), storm("gpu-13", T0)
    p.on_alert(a, T0)
    p.on_alert(b, T0)
    acts, _ = run(p, T0, T0 + 40 * S, step=S)
    assert [(x.node, x.time, x.outcome, x.executed) for x in acts] == [
        (
            "gpu-12",
            T0 + 2 * S,
            "failed: RuntimeError: lost the scheduler's session for gpu-12",
            False,
        ),
        ("gpu-13", T0 + 2 * S, "done", True),  # the same tick: the policy went on
        ("gpu-12", T0 + 32 * S, "done", True),  # retried after retry_s (30 s)
    ]
    assert p.drained() == {"gpu-12": "drained", "gpu-13": "drained"}
    ex.n = 1  # the resume's first try raises
    p.on_alert(resolved(a, T0 + 41 * S), T0 + 41 * S)
    acts, _ = run(p, T0 + 41 * S, T0 + 700 * S, step=S)
    assert [(x.action, x.outcome) for x in acts] == [
        ("resume", "failed: KeyError: 'gpu-12'"),
        ("resume", "done"),
    ]
    assert acts[1].time - acts[0].time == 30 * S
    assert p.drained() == {"gpu-13": "drained"}


def test_an_scontrol_that_never_answers_times_out_and_the_drain_is_retried(
    scontrol: tuple[SlurmExecutor, Path, Path],
) -> None:
    """scontrol hanging (slurmctld unreachable and no timeout of its own): the call is killed
    after timeout_s, the policy records ``failed: ... timed out`` and goes on, and its retry
    drains the node once scontrol answers again."""
    import time as _time

    ex, state, _ = scontrol
    exe = Path(ex.config.scontrol)
    hang = state.with_suffix(".hang")
    # before the fake: a hang that is the killed process itself (exec), so nothing lingers
    exe.write_text(exe.read_text().replace("exec ", f'[ -e "{hang}" ] && exec sleep 60\nexec ', 1))
    hang.touch()
    ex = SlurmExecutor(replace(ex.config, timeout_s=0.5))
    p = DrainPolicy(PolicyConfig(mode="auto", max_rail_share=1, max_fabric_share=1), TOPO, ex)
    p.on_alert(storm("gpu-01", T0), T0)
    t0 = _time.monotonic()
    (failed,), _ = p.tick(T0 + 2 * S)
    took = _time.monotonic() - t0
    assert failed.outcome == "failed: scontrol show timed out after 0.5s" and not failed.executed
    assert took < 10, took  # one timeout, not the sleep's 60 s
    assert p.drained() == {"gpu-01": "draining"}
    assert json.loads(state.read_text())["gpu-01"]["state"] == "IDLE"
    hang.unlink()  # slurmctld answers again
    # (a generous timeout from here: this machine's Python start-up is no part of the test)
    ex.config = replace(ex.config, timeout_s=30)
    acts, _ = run(p, T0 + 3 * S, T0 + 40 * S, step=S)
    assert [(x.time, x.outcome, x.executed) for x in acts] == [(T0 + 32 * S, "done", True)]
    assert json.loads(state.read_text())["gpu-01"]["state"] == "IDLE+DRAIN"
