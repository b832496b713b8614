"""SlowEdge: one CoMMA send/receive edge persistently slower than its communicator's others,
named by both ranks, hosts and NICs, with the fabric alerts on the path between them as its
cause (unit tests on a four-node communicator fed through a real window engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from detectors.slow_edge import UNKNOWN, SlowEdgeConfig, SlowEdgeDetector
from rocewatch.core.errors import ConfigError
from tests.support.nccl_edges import COMM, T0, S, run, topology


def slow_from(onset: int, edge: tuple[int, int] = (1, 2), k: float = 3.0, end: int = 99):
    return lambda sec: {edge: k} if onset <= sec < end else {}


def test_a_healthy_communicator_raises_nothing() -> None:
    topo = topology()
    _, found = run(SlowEdgeDetector(topo), topo, range(20), lambda s: {})
    assert not any(found)


def test_a_slow_edge_names_both_ranks_hosts_nics_and_the_path() -> None:
    topo = topology()
    det = SlowEdgeDetector(topo)
    _, found = run(det, topo, range(16), slow_from(4))
    first = next(i for i, f in enumerate(found) if f)
    (f,) = found[first]
    assert f.alertname == "SlowEdge"
    # slow from second 4; judged on 5 s of exports, 80 % slow spanning 3 s: fires at second 7
    assert f.ts == T0 + 7 * S and first == 7
    assert (f.labels["src_rank"], f.labels["dst_rank"], f.labels["comm"]) == ("1", "2", COMM)
    # no alert on either NIC, one slow edge: the source's end is named, the other is the peer
    assert (f.labels["node"], f.labels["nic"]) == ("gpu-002", "mlx5_0")
    assert (f.labels["peer_node"], f.labels["peer_nic"]) == ("gpu-003", "mlx5_0")
    assert f.labels["job"] == "llm"
    assert f.extra["cause"] == UNKNOWN
    # gpu-002 sits under leaf-0, gpu-003 under leaf-1: the spine between them is on the path
    assert f.extra["path_ports"] == (
        "leaf-0/Ethernet1, leaf-0/Ethernet34, leaf-1/Ethernet1, leaf-1/Ethernet33, "
        "spine-0/Ethernet1, spine-0/Ethernet2"
    )
    assert f.extra["path_nics"] == "gpu-002/mlx5_0, gpu-003/mlx5_0"
    assert "slow in" in f.evidence and "against 12." in f.evidence
    # the other edges never fire; it resolves once the edge is back
    assert all(len(x) <= 1 for x in found)
    _, later = run(det, topo, range(16, 30), lambda s: {})
    assert later[-1] == []


def test_the_cause_is_a_fabric_alert_on_the_path_and_the_alert_names_its_nic() -> None:
    topo = topology()
    pcie = {"alertname": "PCIeDowngrade", "node": "gpu-003", "nic": "mlx5_0"}
    det = SlowEdgeDetector(topo)
    _, found = run(det, topo, range(10), slow_from(2), firing=lambda: [pcie])
    f = next(x for x in found if x)[0]
    assert f.extra["cause"] == "PCIeDowngrade"
    assert "node=gpu-003" in f.extra["cause_alert"]
    # the destination's NIC has the alert: the alert is about it
    assert (f.labels["node"], f.labels["peer_node"]) == ("gpu-003", "gpu-002")
    # an uplink of the spine between the two leaves is on the path too
    flaky = {"alertname": "FlakyLink", "switch": "spine-0", "port": "Ethernet2"}
    det = SlowEdgeDetector(topo)
    _, found = run(det, topo, range(10), slow_from(2), firing=lambda: [flaky])
    f = next(x for x in found if x)[0]
    assert f.extra["cause"] == "FlakyLink" and f.labels["node"] == "gpu-002"
    # an alert elsewhere (another leaf's NIC port, a NIC of the same node's neighbour) is not
    other = {"alertname": "FlakyLink", "switch": "leaf-0", "port": "Ethernet33"}
    det = SlowEdgeDetector(topo)
    _, found = run(det, topo, range(10), slow_from(2), firing=lambda: [other])
    assert next(x for x in found if x)[0].extra["cause"] == UNKNOWN


def test_a_brief_slowdown_or_a_small_excess_stays_quiet() -> None:
    topo = topology()
    _, found = run(SlowEdgeDetector(topo), topo, range(20), slow_from(4, end=6))
    assert not any(found)  # two slow exports: span under hold_s
    _, found = run(SlowEdgeDetector(topo), topo, range(20), slow_from(4, k=1.3))
    assert not any(found)  # 30 % slower: under the 1.5x ratio


def test_config_is_validated() -> None:
    with pytest.raises(ConfigError):
        SlowEdgeConfig(ratio=1.0)
    with pytest.raises(ConfigError):
        SlowEdgeConfig(min_edges=0)


@pytest.mark.slow  # simulates and replays a 4-node, 10 s scenario (~4 s)
def test_replay_pcie_downgrade_mid_job_slow_edges_and_the_join_on_alerts(tmp_path: Path) -> None:
    """The simulator's CoMMA exports: a NIC whose PCIe link trains down mid-job slows both of
    its ring edges; each SlowEdge names both ranks, hosts and NICs, and the downgrade as its
    cause; the PCIeDowngrade alert names the job and rank on that NIC, and the job's alerts
    the fabric alerts on their path."""
    import dataclasses
    import json

    from rocewatch.core.model import Alert
    from rocewatch.replay import replay
    from rocewatch.sim import PcieDowngrade
    from rocewatch.sim.scenarios import healthy_scenario
    from rocewatch.sim.writers import write_scenario

    cfg = healthy_scenario(nodes=4, duration_s=10, seed=2)
    fault = PcieDowngrade(onset_s=4.0, node="gpu-002", nic="mlx5_1")
    scen = write_scenario(dataclasses.replace(cfg, faults=(fault,)), tmp_path / "s", nccl=True)
    assert (scen / "nccl" / "llm-train-a" / "comma" / "gpu-002.jsonl").exists()
    res = replay(scen, tmp_path / "out")
    alerts = [
        Alert.from_json(json.loads(x))
        for x in (tmp_path / "out" / "alerts.jsonl").read_text().splitlines()
    ]
    edges = [a for a in alerts if a.name == "SlowEdge"]
    # rank 9 (gpu-002 GPU 1) sends to rank 1 and receives from it (a two-node ring per job)
    assert sorted((a.labels["src_rank"], a.labels["dst_rank"]) for a in edges) == [
        ("1", "9"),
        ("9", "1"),
    ]
    for a in edges:
        assert (a.labels["node"], a.labels["nic"]) == ("gpu-002", "mlx5_1")
        assert (a.labels["peer_node"], a.labels["peer_nic"]) == ("gpu-001", "mlx5_1")
        assert a.annotations["cause"] == "PCIeDowngrade"
        assert a.annotations["path_nics"] == "gpu-001/mlx5_1, gpu-002/mlx5_1"
        assert 4e9 < a.starts_at - cfg.start_ns < 10e9
    (pcie,) = [a for a in alerts if a.name == "PCIeDowngrade"]
    assert pcie.annotations["jobs"] == "llm-train-a"
    assert pcie.annotations["ranks"] == "llm-train-a rank 9 (gpu-002 GPU 1 mlx5_1)"
    (rank,) = [a for a in alerts if a.name == "SlowRank"]
    assert rank.annotations["path_alerts"].startswith("PCIeDowngrade: job=llm-train-a")
    # the other job's edges, and every other edge of this one, stay quiet
    assert {a.labels["job"] for a in alerts if "comm" in a.labels} == {"llm-train-a"}
    assert not any(k.startswith("nccl_") for k in res.stats), res.stats
