"""SlowEdge: one CoMMA send/receive edge persistently slower than its communicator's others,
named by both ranks, hosts and NICs, with the fabric alerts on the path between them as its
cause (unit tests on a four-node communicator fed through a real window engine)."""

from __future__ import annotations

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
