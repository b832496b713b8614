"""RoCE configuration in the stream (rocewatch/roce/watch.py, detectors/roce_config_mismatch.py):
snapshots on telemetry time become change events, a failing check becomes a RoCEConfigMismatch
alert naming both ends, and every alert carries the changes seen on its entities shortly before.

The scenario: a 5 s simulated PFC storm from gpu-001/mlx5_0 (onset 2 s) on a two-node fabric,
with configuration snapshots written beside it in the recorded formats: the fabric's correct
configuration 5 min before the telemetry, PFC moved from priority 3 to 4 on the leaf 118 s
before it (two minutes before the storm starts), and gpu-002's NIC switched to PCP trust 1 s
into the run and back to DSCP at 3 s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from rocewatch.config import Config
from rocewatch.core.roce import ConfigChange, RoceEnd, diff_ends
from rocewatch.core.topology import Topology
from rocewatch.pipeline import Pipeline
from rocewatch.replay import ReplayResult, replay
from rocewatch.roce.watch import ConfigWatch, load_recorded
from rocewatch.sources import merged, scenario_sources
from tests.support.restart import restart_pipeline

S = 1_000_000_000
LEAF = "leaf-r0-p0"
ONSET_S = 2.0


def _lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines() if x.strip()]


def _write(path: Path, docs: list[dict[str, Any]]) -> None:
    path.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in docs))


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rocewatch.sim import write_scenario
    from rocewatch.sim.fabric import Fabric
    from rocewatch.sim.faults import PfcStorm
    from rocewatch.sim.roce_config import ConfigFault, switch_events
    from rocewatch.sim.simulator import SimConfig

    d = tmp_path_factory.mktemp("roce-watch")
    cfg = SimConfig(
        nodes=2,
        nics_per_node=1,
        spines=1,
        duration_s=5.0,
        seed=1,
        out_of_order=0.0,
        wrap_counter=False,
        faults=(PfcStorm(onset_s=ONSET_S, duration_s=3.0, node="gpu-001", nic="mlx5_0"),),
    )
    write_scenario(cfg, d)
    t0 = cfg.start_ns
    # the NICs' snapshots: correct 5 min before; gpu-002 on PCP trust at 1 s, fixed at 3 s
    nics = _lines(d / "nic_config.jsonl")
    out = [n | {"timestamp": t0 - 300 * S} for n in nics]
    (n2,) = [n for n in nics if n["node"] == "gpu-002"]
    pcp = json.loads(json.dumps(n2))
    pcp["dcb"]["apptrust"] = {"order": ["pcp"]}
    out += [pcp | {"timestamp": t0 + 1 * S}, n2 | {"timestamp": t0 + 3 * S}]
    _write(d / "nic_config.jsonl", out)
    # the switches: correct 5 min before; PFC on priority 4 on the leaf 2 min before the storm
    fab = Fabric(cfg)
    events = switch_events(fab, t0 - 300 * S, [], fab.priority)
    wrong = switch_events(
        fab, t0 + int((ONSET_S - 120) * S), [ConfigFault("pfc_wrong_priority", LEAF)], fab.priority
    )
    events += [
        e
        for e in wrong
        if e["tags"]["source"].startswith(LEAF)
        and any(k.startswith("/PORT_QOS_MAP/") for k in e["values"])
    ]
    _write(d / "switch_config.jsonl", events)
    return d


@pytest.fixture(scope="module")
def replayed(scenario: Path, tmp_path_factory: pytest.TempPathFactory) -> ReplayResult:
    return replay(scenario, tmp_path_factory.mktemp("out"))


def by_name(res: ReplayResult, name: str) -> list[dict[str, Any]]:
    return [a for a in res.alerts if a["labels"]["alertname"] == name]


# a 5 s simulated replay (about 1 s, shared by the module's replay tests)
@pytest.mark.slow
def test_a_pfc_change_on_the_leaf_is_one_change_event_per_port(replayed: ReplayResult) -> None:
    pfc = [c for c in replayed.config_changes if c["field"] == "pfc"]
    assert {c["device"] for c in pfc} == {LEAF}
    assert {c["port"] for c in pfc} == {"Ethernet1/1", "Ethernet1/2", "Ethernet2/1"}
    assert {(c["old"], c["new"], c["time"]) for c in pfc} == {
        ("3", "4", "2026-11-29T09:58:02.000Z")
    }
    trust = [c for c in replayed.config_changes if c["field"] == "trust"]
    assert [(c["entity"], c["old"], c["new"]) for c in trust] == [
        ("gpu-002/mlx5_0", "dscp", "pcp"),
        ("gpu-002/mlx5_0", "pcp", "dscp"),
    ]
    # nothing else changed (the baselines are not changes)
    assert len(replayed.config_changes) == len(pfc) + len(trust)


# a 5 s simulated replay (about 1 s, shared by the module's replay tests)
@pytest.mark.slow
def test_the_storm_alert_carries_the_pfc_change_two_minutes_before_it(
    replayed: ReplayResult,
) -> None:
    storms = {a["labels"]["role"]: a for a in by_name(replayed, "PFCStorm")}
    origin = storms["origin"]
    assert origin["labels"]["node"] == "gpu-001"
    text = origin["annotations"]["config_changes"]
    # the origin NIC's cable goes to the leaf's Ethernet1/1: that port's change is named
    assert text == "pfc on leaf-r0-p0/Ethernet1/1 changed 3 -> 4, 2 min before this PFCStorm"
    (data,) = json.loads(origin["annotations"]["config_changes_json"])
    assert data["device"] == LEAF and data["field"] == "pfc"
    assert (data["old"], data["new"]) == ("3", "4")
    assert data["before_s"] == pytest.approx(120.0, abs=1.0)
    # the victim port on the leaf itself: every port of the leaf that changed
    victim = storms["victim"]["annotations"]["config_changes"]
    assert victim.startswith("pfc on leaf-r0-p0 (3 ports) changed 3 -> 4, 2 min before")


# a 5 s simulated replay (about 1 s, shared by the module's replay tests)
@pytest.mark.slow
def test_the_look_back_is_configurable(scenario: Path, tmp_path: Path) -> None:
    from rocewatch.config import config_from_dict

    cfg = config_from_dict({"detectors": {"roce_config_mismatch": {"changes_lookback_s": 60}}})
    res = replay(scenario, tmp_path, config=cfg)
    (origin,) = [a for a in by_name(res, "PFCStorm") if a["labels"]["role"] == "origin"]
    assert "config_changes" not in origin["annotations"]  # 2 min ago: outside 1 min


# a 5 s simulated replay (about 1 s, shared by the module's replay tests)
@pytest.mark.slow
def test_each_mismatch_is_an_alert_naming_both_ends(replayed: ReplayResult) -> None:
    pfc = [a for a in by_name(replayed, "RoCEConfigMismatch") if a["labels"]["check"] == "pfc"]
    ends = {a["annotations"]["ends"] for a in pfc}
    assert ends == {
        "gpu-001/mlx5_0, leaf-r0-p0/Ethernet1/1",
        "gpu-002/mlx5_0, leaf-r0-p0/Ethernet1/2",
        "leaf-r0-p0/Ethernet2/1, spine-0/Ethernet1/1",
    }
    for a in pfc:
        assert a["labels"]["severity"] == "critical"  # the check's error
        assert a["labels"]["switch"] in (LEAF, "spine-0")
        assert "leaf-r0-p0/" in a["annotations"]["evidence"]  # what each end holds
        assert a["annotations"]["fix"]
        assert a["startsAt"] == "2026-11-29T09:58:02.000Z"  # the snapshot that made it
        assert a["status"] == "firing"  # the leaf is never fixed in this run
    uplink = [a for a in pfc if "spine-0" in a["annotations"]["ends"]]
    assert uplink[0]["labels"]["peer"] == "spine-0/Ethernet1/1"


# a 5 s simulated replay (about 1 s, shared by the module's replay tests)
@pytest.mark.slow
def test_a_mismatch_resolves_when_the_configuration_is_fixed(replayed: ReplayResult) -> None:
    (trust,) = [
        a for a in by_name(replayed, "RoCEConfigMismatch") if a["labels"]["check"] == "trust"
    ]
    labels = trust["labels"]
    assert (labels["node"], labels["nic"], labels["switch"], labels["port"]) == (
        "gpu-002",
        "mlx5_0",
        LEAF,
        "Ethernet1/2",
    )
    assert trust["annotations"]["evidence"] == (
        "gpu-002/mlx5_0 trusts pcp; leaf-r0-p0/Ethernet1/2 trusts dscp"
    )
    assert trust["startsAt"] == "2026-11-29T10:00:01.000Z"
    assert trust["status"] == "resolved"
    assert "2026-11-29T10:00:03" in trust["endsAt"] or "2026-11-29T10:00:04" in trust["endsAt"]
    # a mismatch inhibits nothing, and nothing drains on it
    mismatches = {a["fingerprint"] for a in by_name(replayed, "RoCEConfigMismatch")}
    by = {a["annotations"]["inhibited_by"] for a in replayed.inhibited}
    assert by and not by & mismatches  # the storm inhibits its symptoms; a mismatch nothing
    assert {a["node"] for a in replayed.actions} == {"gpu-001"}


def run(scenario: Path, checkpoint_at_s: float | None = None) -> list[dict[str, Any]]:
    """Replay's loop; with ``checkpoint_at_s``, the pipeline is stopped there (mid-fault: the
    trust mismatch firing, the leaf's change waiting for the storm) and started again from its
    state through the product's codec."""
    topo = Topology.load(scenario / "topology.yaml")
    p = Pipeline(topo, Config(), rollup_s=None)
    load_recorded(p.roce, scenario)
    sources = scenario_sources(scenario, topo, p.stats)
    t0 = 1795946400000000000
    for df, wm in merged(sources, p.engine.lateness_ns()):
        if df.height:
            p.ingest(df)
        if wm >= 0:
            p.advance(wm)
        if checkpoint_at_s is not None and wm >= t0 + checkpoint_at_s * S:
            assert any(a.name == "RoCEConfigMismatch" for a in p.lifecycle.firing.values())
            assert p.roce.recent
            p = restart_pipeline(p)
            checkpoint_at_s = None
    p.finish()
    return [a.to_json() for a in p.all_alerts()]


# a 5 s simulated replay (about 1 s, shared by the module's replay tests)
@pytest.mark.slow
def test_a_checkpoint_mid_fault_loses_no_change_nor_mismatch(scenario: Path) -> None:
    straight = run(scenario)
    assert any("config_changes" in a["annotations"] for a in straight)
    assert run(scenario, checkpoint_at_s=1.5) == straight


def test_diff_ignores_values_that_became_unknown_or_were_unknown() -> None:
    old = RoceEnd("nic", "gpu-1", "mlx5_0", mtu=9000, trust="dscp", pfc=frozenset({3}))
    new = RoceEnd(
        "nic", "gpu-1", "mlx5_0", mtu=9000, trust=None, pfc=frozenset({3, 4}), roce_tos=106
    )
    assert diff_ends(old, new, 7) == [
        ConfigChange(7, "nic", "gpu-1", "mlx5_0", "pfc", "3", "3,4", "")
    ]


def test_bad_records_are_counted_and_skipped() -> None:
    topo = Topology.from_dict(
        {
            "switches": [{"name": "leaf-0", "role": "leaf"}],
            "nodes": [{"name": "gpu-1", "nics": [{"nic": "mlx5_0", "switch_port": "leaf-0/p1"}]}],
        }
    )
    w = ConfigWatch(topo)
    w.add_lines("nic", [b"{not json\n", b'{"node": "gpu-1"}\n', b'{"timestamp": 5}\n'])
    w.add_lines("switch", [b'{"timestamp": 5, "tags": {"source": "nowhere:1"}, "values": {}}\n'])
    assert w.advance(10) == []
    assert w.stats.get("roce_config_skipped") == 4


FAULTS = (
    "nic_pcp_trust=gpu-001/mlx5_0",
    "no_roce_v2_gid=gpu-002/mlx5_0",
    "pfc_wrong_priority=leaf-r0-p0",
    "uplink_mtu=leaf-r0-p0/Ethernet2/1",
    "spine_no_ecn=spine-0",
)


@pytest.mark.slow
@pytest.mark.parametrize("faults", [FAULTS, ()], ids=["all-five", "correct"])
def test_each_simulated_config_fault_gives_exactly_its_mismatch_alerts(
    tmp_path: Path, faults: tuple[str, ...]
) -> None:
    """Replay of a short simulated run with the simulator's configuration faults: exactly the
    RoCEConfigMismatch alerts of each fault (its check, on each cable it touches, both ends
    named), and none on the correct fabric."""
    from rocewatch.roce.score import score
    from rocewatch.sim import write_scenario
    from rocewatch.sim.roce_config import parse_fault, write_roce_config
    from rocewatch.sim.simulator import SimConfig

    cfg = SimConfig(nodes=2, nics_per_node=1, spines=1, duration_s=1.0, seed=1)
    write_scenario(cfg, tmp_path)
    resolved = write_roce_config(tmp_path, cfg, [parse_fault(f) for f in faults])
    res = replay(tmp_path, tmp_path / "out")
    truth = json.loads((tmp_path / "config_truth.json").read_text())["config_faults"]
    assert len(truth) == len(resolved) == len(faults)
    s = score(Topology.load(tmp_path / "topology.yaml"), truth, res.alerts)
    assert s["exact"], s
    assert s["alerts"] == s["expected"] == (7 if faults else 0)
    assert {k: v["hits"] for k, v in s["kinds"].items()} == (
        {
            "nic_pcp_trust": 1,
            "no_roce_v2_gid": 1,
            "pfc_wrong_priority": 3,  # every cable of the leaf
            "uplink_mtu": 1,
            "spine_no_ecn": 1,  # the spine's one cable
        }
        if faults
        else {}
    )
    if faults:  # and the score says so when an alert is missing, wrong or names one end
        mism = [a for a in res.alerts if a["labels"]["alertname"] == "RoCEConfigMismatch"]
        topo = Topology.load(tmp_path / "topology.yaml")
        assert score(topo, truth, mism[1:])["recall"] < 1
        wrong = json.loads(json.dumps(mism[0]))
        wrong["labels"]["check"] = "ets"
        assert score(topo, truth, [*mism, wrong])["false"] == 1
        one_end = json.loads(json.dumps(mism[0]))
        one_end["labels"].pop("switch")
        assert not score(topo, truth, [one_end, *mism[1:]])["exact"]


def test_records_arriving_out_of_order_are_applied_in_time_order() -> None:
    topo = Topology.from_dict(
        {
            "switches": [{"name": "leaf-0", "role": "leaf"}],
            "nodes": [{"name": "gpu-1", "nics": [{"nic": "mlx5_0", "switch_port": "leaf-0/p1"}]}],
        }
    )
    w = ConfigWatch(topo)
    snap = {"node": "gpu-1", "nic": "mlx5_0"}
    w.add_nic(snap | {"timestamp": 30, "mtu": 1500})
    w.add_nic(snap | {"timestamp": 10, "mtu": 9000})
    w.add_nic(snap | {"timestamp": 50, "mtu": 4200})
    assert w.advance(5) == []  # nothing due yet
    got = [(c.ts, c.old, c.new) for c in w.advance(40)]
    assert got == [(30, "9000", "1500")]
    assert [(c.ts, c.old, c.new) for c in w.advance(None)] == [(50, "1500", "4200")]


def test_a_deleted_config_db_field_is_a_change() -> None:
    """gnmic's ``deletes``: SONiC removing ``pfc_enable`` from a port's PORT_QOS_MAP entry
    (``config interface pfc`` off) is PFC on no priority: a change, and a lossy cable."""
    topo = Topology.from_dict(
        {
            "switches": [{"name": "leaf-0", "role": "leaf"}],
            "nodes": [
                {"name": "gpu-1", "nics": [{"nic": "mlx5_0", "switch_port": "leaf-0/Ethernet0"}]}
            ],
        }
    )
    w = ConfigWatch(topo)
    tags = {"source": "leaf-0:8080", "target": "CONFIG_DB"}
    w.add_switch(
        {"timestamp": 1, "tags": tags, "values": {"/PORT_QOS_MAP/Ethernet0/pfc_enable": "3"}}
    )
    w.add_switch(
        {"timestamp": 5 * S, "tags": tags, "deletes": ["/PORT_QOS_MAP/Ethernet0/pfc_enable"]}
    )
    assert w.advance(2) == []
    assert [(c.entity, c.field, c.old, c.new) for c in w.advance(6 * S)] == [
        ("leaf-0/Ethernet0", "pfc", "3", "none")
    ]
    assert [f["check"] for f in w.current()] == ["mode"]
    assert w.stats.get("roce_config_skipped") == 0
