"""Incident records (storage/incidents.py): filed by the store as it writes alerts, actions and
operator commands, on SQLite and on the test PostgreSQL (ROCEWATCH_TEST_PG_URL)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocewatch.core.model import Action, Alert
from rocewatch.core.topology import Topology
from storage import Store
from storage.outbox import Outbox, incident_link

T0 = 1_795_946_400_000_000_000  # 2026-11-29T10:00:00Z
S = 1_000_000_000
MS = 1_000_000


def topo() -> Topology:
    """gpu-01 and gpu-02 under leaf-0, gpu-03 under leaf-1, both leaves under spine-0."""
    return Topology.from_dict(
        {
            "switches": [
                {"name": "leaf-0", "role": "leaf"},
                {"name": "leaf-1", "role": "leaf"},
                {"name": "spine-0", "role": "spine"},
            ],
            "links": [
                {"a": "leaf-0/Ethernet9", "b": "spine-0/Ethernet1"},
                {"a": "leaf-1/Ethernet9", "b": "spine-0/Ethernet2"},
            ],
            "nodes": [
                {"name": "gpu-01", "nics": [{"nic": "mlx5_0", "switch_port": "leaf-0/Ethernet1"}]},
                {"name": "gpu-02", "nics": [{"nic": "mlx5_0", "switch_port": "leaf-0/Ethernet2"}]},
                {"name": "gpu-03", "nics": [{"nic": "mlx5_0", "switch_port": "leaf-1/Ethernet1"}]},
            ],
            "jobs": [{"name": "llm-70b", "tenant": "team-a", "nodes": ["gpu-01", "gpu-02"]}],
        }
    )


# what the PFC storm detector and the grouping stage give (rocewatch/alerting/group.py)
def origin(ends: int = 0, starts: int = T0 + 1200 * MS) -> Alert:
    return Alert(
        {"alertname": "PFCStorm", "severity": "critical", "node": "gpu-01", "nic": "mlx5_0",
         "job": "llm-70b", "tenant": "team-a", "priority": "3", "role": "origin"},
        {"summary": "PFC storm on priority 3 originating at gpu-01/mlx5_0",
         "description": "gpu-01/mlx5_0 keeps sending PFC pause on priority 3 while not itself "
         "paused; 1 directly paused peer(s).",
         "evidence": "gpu-01/mlx5_0 prio 3 sent pause 99.8% of 0.20 s (threshold 99.0%); "
         "leaf-0/Ethernet1 prio 3 received pause 99.7% of 0.20 s (threshold 99.0%), queue 3 "
         "depth 22309922 B, 0 packets sent"},
        starts, ends,
    )  # fmt: skip


VICTIMS = ["gpu-02/mlx5_0", "gpu-03/mlx5_0", "leaf-0/Ethernet1", "leaf-1/Ethernet9",
           "spine-0/Ethernet1"]  # fmt: skip


def victims(ends: int = 0, starts: int = T0 + 1100 * MS) -> Alert:
    members = [
        {"node": "gpu-02", "nic": "mlx5_0", "job": "llm-70b", "tenant": "team-a"},
        {"node": "gpu-03", "nic": "mlx5_0"},
        {"switch": "leaf-0", "port": "Ethernet1"},
    ]
    return Alert(
        {"alertname": "PFCStorm", "severity": "warning", "switch": "leaf-0", "port": "Ethernet1",
         "priority": "3", "role": "victim", "origin": "gpu-01/mlx5_0"},
        {"summary": "PFC storm victims on priority 3: stalled by the storm from gpu-01/mlx5_0",
         "evidence": "leaf-0/Ethernet1 prio 3 received pause 99.7% of 0.20 s (threshold 99.0%)",
         "origin": "gpu-01/mlx5_0", "victims": ", ".join(VICTIMS),
         "members": json.dumps(members)},
        starts, ends,
    )  # fmt: skip


def drain(fp: str, outcome: str = "pending-approval", t: int = T0 + 3 * S) -> Action:
    return Action(t, "drain", "gpu-01", "slurm", "rocewatch: PFCStorm origin mlx5_0", fp, False,
                  outcome)  # fmt: skip


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'rocewatch.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
        s = Store(url)
        s.drop_schema()
        s.close()
    s = Store(url)
    s.create_schema()
    s.topology = topo()
    yield s
    s.close()


def counts(s: Store, iid: int) -> tuple[int, int, int]:
    inc = s.incident(iid)
    assert inc is not None
    return len(inc["nodes"]), len(inc["edges"]), len(inc["timeline"])


def test_a_storm_is_one_incident_with_its_pause_graph_and_timeline(store: Store) -> None:
    o, v = origin(), victims()
    store.write_alerts([v])  # the victims are often confirmed before their origin
    store.write_alerts([o])
    (inc,) = store.incidents()
    assert inc["kind"] == "storm" and inc["status"] == "open"
    assert inc["title"] == "PFC storm from gpu-01/mlx5_0 (priority 3)"
    assert inc["labels"]["role"] == "origin"  # named by its origin once it is known
    full = store.incident(inc["id"])
    assert full is not None
    nodes = {n["id"]: n for n in full["nodes"]}
    assert nodes["nic:gpu-01/mlx5_0"]["kind"] == "origin"
    assert nodes["nic:gpu-01/mlx5_0"]["share"] == pytest.approx(0.998)
    assert nodes["nic:gpu-01/mlx5_0"]["first_paused"] == o.starts_at
    assert nodes["switch:leaf-0"]["share"] == pytest.approx(0.997)
    assert nodes["switch:leaf-0"]["first_paused"] == v.starts_at
    assert nodes["switch:leaf-0"]["detail"]["ports"] == ["Ethernet1"]
    assert {k for k, n in nodes.items() if n["kind"] == "victim"} == {
        "nic:gpu-02/mlx5_0", "nic:gpu-03/mlx5_0", "switch:leaf-0", "switch:leaf-1",
        "switch:spine-0",
    }  # fmt: skip
    assert nodes["job:llm-70b"]["kind"] == "job" and nodes["job:llm-70b"]["subtitle"] == "team-a"
    pauses = {(e["source"], e["target"]) for e in full["edges"] if e["kind"] == "pauses"}
    assert pauses == {  # who paused whom, over the topology's cables
        ("nic:gpu-01/mlx5_0", "switch:leaf-0"),
        ("switch:leaf-0", "nic:gpu-02/mlx5_0"),
        ("switch:leaf-0", "switch:spine-0"),
        ("switch:spine-0", "switch:leaf-1"),
        ("switch:leaf-1", "nic:gpu-03/mlx5_0"),
    }
    runs = {(e["source"], e["target"]) for e in full["edges"] if e["kind"] == "runs"}
    assert runs == {("nic:gpu-01/mlx5_0", "job:llm-70b"), ("nic:gpu-02/mlx5_0", "job:llm-70b")}
    assert [(t["kind"], t["ref"]) for t in full["timeline"]] == [
        ("firing", v.fingerprint),
        ("firing", o.fingerprint),
    ]
    assert full["timeline"][1]["detail"]["alert"]["annotations"]["evidence"].startswith(
        "gpu-01/mlx5_0 prio 3 sent pause"
    )

    before = counts(store, inc["id"])
    store.write_alerts([o, v])  # written again (a sink's retry): nothing changes
    assert len(store.incidents()) == 1 and counts(store, inc["id"]) == before

    store.write_alerts([origin(ends=T0 + 6 * S), victims(ends=T0 + 7 * S)])
    (inc,) = store.incidents()
    assert inc["status"] == "resolved" and inc["ended_at"] == T0 + 7 * S
    full = store.incident(inc["id"])
    assert full is not None
    assert [t["kind"] for t in full["timeline"]] == ["firing", "firing", "resolved", "resolved"]
    assert store.incident_of_alert(o.fingerprint, o.starts_at) == inc["id"]


def test_actions_commands_and_inhibited_symptoms_join_the_timeline(store: Store) -> None:
    o = origin()
    store.write_alerts([o, victims()])
    store.write_actions([drain(o.fingerprint)])
    cid = store.add_command("approve", "gpu-01", "alice")
    store.finish_command(cid, "done", "drain of gpu-01 approved")
    symptom = Alert(
        {"alertname": "TransportErrors", "severity": "warning", "node": "gpu-02", "nic": "mlx5_0"},
        {"summary": "RoCE transport errors on gpu-02/mlx5_0", "inhibited_by": o.fingerprint},
        T0 + 2 * S,
    )
    store.write_alerts([symptom])
    store.add_command("undrain", "gpu-99", "bob")  # a node of no incident: filed nowhere
    (inc,) = store.incidents()  # the symptom has no incident of its own
    full = store.incident(inc["id"])
    assert full is not None
    kinds = [(t["kind"], t["summary"]) for t in full["timeline"]]
    assert ("inhibited", "RoCE transport errors on gpu-02/mlx5_0") in kinds
    assert ("action", "drain gpu-01: pending-approval") in kinds
    assert ("command", "approve gpu-01 by alice: done: drain of gpu-01 approved") in kinds
    assert sum(k == "command" for k, _ in kinds) == 1  # queued, then updated in place
    host = next(n for n in full["nodes"] if n["id"] == "host:gpu-01")
    assert host["kind"] == "host" and host["subtitle"] == "drain: pending-approval"
    edges = {(e["source"], e["target"]) for e in full["edges"]}
    assert ("host:gpu-01", "nic:gpu-01/mlx5_0") in edges
    # the approved drain's outcome replaces the waiting one on the host
    store.write_actions([drain(o.fingerprint, "done", T0 + 4 * S)])
    full = store.incident(inc["id"])
    assert full is not None
    assert next(n for n in full["nodes"] if n["id"] == "host:gpu-01")["subtitle"] == "drain: done"


def test_a_later_storm_from_the_same_origin_is_a_new_incident(store: Store) -> None:
    store.write_alerts([origin(ends=T0 + 5 * S)])
    # within a minute of its end: the same storm coming back
    store.write_alerts([origin(starts=T0 + 30 * S, ends=T0 + 40 * S)])
    store.write_alerts([origin(starts=T0 + 300 * S)])  # minutes later: another
    incs = store.incidents()
    assert [(i["status"], i["started_at"]) for i in incs] == [
        ("open", T0 + 300 * S),
        ("resolved", T0 + 1200 * MS),
    ]
    first = store.incident(incs[1]["id"])
    assert first is not None and [t["kind"] for t in first["timeline"]] == [
        "firing", "resolved", "firing", "resolved"
    ]  # fmt: skip


def test_flaky_link_and_straggler_incidents(store: Store) -> None:
    flaky = Alert(
        {"alertname": "FlakyLink", "severity": "critical", "node": "gpu-03", "nic": "mlx5_0",
         "switch": "leaf-1", "port": "Ethernet1", "job": "llm-70b"},
        {"summary": "Flaky cable", "cable": "gpu-03/mlx5_0 <-> leaf-1/Ethernet1",
         "strands": "gpu-03", "evidence": "3 FEC-uncorrectable blocks in 1 s"},
        T0,
    )  # fmt: skip
    pcie = Alert(
        {"alertname": "PCIeDowngrade", "severity": "warning", "node": "gpu-02", "nic": "mlx5_0"},
        {"summary": "gpu-02/mlx5_0 PCIe link below its maximum"},
        T0 + S,
    )
    slow = Alert(
        {"alertname": "Straggler", "severity": "warning", "node": "gpu-02", "nic": "mlx5_0",
         "job": "llm-70b", "tenant": "team-a"},
        {"summary": "gpu-02/mlx5_0 is persistently slower than its peers in llm-70b"},
        T0 + 2 * S,
    )  # fmt: skip
    store.write_alerts([flaky, pcie, slow])
    by_kind = {i["kind"]: i for i in store.incidents()}
    assert set(by_kind) == {"flaky_link", "straggler"}  # the PCIe downgrade joins the straggler
    assert by_kind["flaky_link"]["title"] == "Flaky link gpu-03/mlx5_0 <-> leaf-1/Ethernet1"
    assert by_kind["straggler"]["title"] == "Straggler gpu-02/mlx5_0 in llm-70b"
    f = store.incident(by_kind["flaky_link"]["id"])
    assert f is not None
    assert {(e["source"], e["target"], e["kind"]) for e in f["edges"]} >= {
        ("nic:gpu-03/mlx5_0", "port:leaf-1/Ethernet1", "cable"),
        ("host:gpu-03", "nic:gpu-03/mlx5_0", "hosts"),
    }
    st = store.incident(by_kind["straggler"]["id"])
    assert st is not None
    assert {n["id"] for n in st["nodes"]} == {"nic:gpu-02/mlx5_0", "job:llm-70b"}
    assert [t["ref"] for t in st["timeline"]] == [pcie.fingerprint, slow.fingerprint]


def test_without_the_topology_only_what_the_alerts_say(tmp_path: Path) -> None:
    with Store(f"sqlite:///{tmp_path}/bare.db") as s:
        s.create_schema()
        s.write_alerts([origin(), victims()])
        (inc,) = s.incidents()
        full = s.incident(inc["id"])
        assert full is not None
        pauses = {(e["source"], e["target"]) for e in full["edges"] if e["kind"] == "pauses"}
        assert pauses == {("nic:gpu-01/mlx5_0", "switch:leaf-0")}  # the one it paused directly
        assert {"nic:gpu-02/mlx5_0", "switch:spine-0"} <= {n["id"] for n in full["nodes"]}


def test_bad_members_annotation_is_skipped_not_fatal(store: Store) -> None:
    v = victims()
    v.annotations["members"] = "{not json"
    store.write_alerts([v])
    (inc,) = store.incidents()
    assert inc["kind"] == "storm"


def test_notifications_link_their_incident(store: Store) -> None:
    o = origin()
    plain = Outbox(store)
    plain.enqueue([o], ["ops"])
    (item,) = plain.claim("ops", 10, lease_s=60)
    assert item.alert["generatorURL"] == ""  # no API: nothing to link
    linked = Outbox(store, incident_url="https://rocewatch.example:9465/")
    linked.enqueue([origin(starts=T0 + 2 * S)], ["ops2"])
    (item,) = linked.claim("ops2", 10, lease_s=60)
    url = item.alert["generatorURL"]
    assert url == f"https://rocewatch.example:9465/incidents/alert/{o.fingerprint}/{T0 + 2 * S}"
    assert url == incident_link("https://rocewatch.example:9465", origin(starts=T0 + 2 * S))
    assert set(item.alert) == {  # the Alertmanager alert object, nothing renamed or dropped
        "status", "fingerprint", "labels", "annotations", "startsAt", "endsAt", "generatorURL"
    }  # fmt: skip


def test_overlong_names_are_cut_not_refused(store: Store) -> None:
    """Names as long as the alerts table takes make longer incident keys and node ids: they
    are cut, not refused (a write the database refused would hold the sink's batch)."""
    long = "x" * 128  # the alerts table's switch and port columns
    a = Alert(
        {"alertname": "PortAnomaly", "severity": "warning", "switch": long, "port": long},
        {"summary": "odd"},
        T0,
    )
    assert store.write_alerts([a]) == 1
    (inc,) = store.incidents()
    full = store.incident(inc["id"])
    assert full is not None and len(full["nodes"]) == 1
