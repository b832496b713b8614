import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rocewatch.core.errors import ConfigError
from rocewatch.core.topology import NicEnd, PortEnd, Topology

GOOD = {
    "fabric": "t",
    "switches": [
        {"name": "leaf-0", "role": "leaf", "rail": 0, "address": "10.0.0.1", "int_node_id": 11},
        {"name": "spine-0", "role": "spine"},
    ],
    "links": [{"a": "leaf-0/Ethernet1/1", "b": "spine-0/et-0/0/1"}],
    "nodes": [
        {
            "name": "gpu-001",
            "scheduler": "slurm",
            "nics": [{"nic": "mlx5_0", "netdev": "eth0", "switch_port": "leaf-0/Ethernet1/33"}],
        },
    ],
    "jobs": [{"name": "llm", "tenant": "a", "priority": 3, "nodes": ["gpu-001"]}],
    "site_owner": "kept and ignored",
}


def test_good_topology_lookups():
    t = Topology.from_dict(GOOD)
    assert t.peer_of_port("leaf-0", "Ethernet1/1") == PortEnd("spine-0", "et-0/0/1")
    assert t.peer_of_port("leaf-0", "Ethernet1/33") == NicEnd("gpu-001", "mlx5_0")
    assert t.peer(NicEnd("gpu-001", "mlx5_0")) == PortEnd("leaf-0", "Ethernet1/33")
    assert t.resolve_device("leaf-0:9339") == "leaf-0"
    assert t.resolve_device("10.0.0.1:57400") == "leaf-0"
    assert t.resolve_device("nowhere:1") is None
    assert t.nic_rail("gpu-001", "mlx5_0") == 0
    assert t.node_jobs["gpu-001"] == ["llm"]
    assert t.extra == {"site_owner": "kept and ignored"}
    again = Topology.from_dict(t.to_dict())
    assert again.to_dict() == t.to_dict()


def test_bad_topology_one_line_per_problem():
    bad = {
        "switches": [{"name": "leaf-0", "role": "leaf"}],
        "links": [
            {"a": "leaf-0/Ethernet1", "b": "ghost/Ethernet1"},
            {"a": "leaf-0/Ethernet1", "b": "leaf-0/Ethernet2"},
        ],
        "nodes": [{"name": "gpu-001", "nics": []}],
    }
    with pytest.raises(ConfigError) as e:
        Topology.from_dict(bad)
    lines = str(e.value).splitlines()
    assert any("undefined switch 'ghost'" in x for x in lines)
    assert any("leaf-0/Ethernet1 is already used" in x for x in lines)
    assert any("gpu-001" in x and "no NICs" in x for x in lines)
    assert len(lines) == 3


@pytest.mark.slow
def test_cli_topology_check(tmp_path: Path):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(GOOD))
    r = subprocess.run(
        [sys.executable, "-m", "rocewatch.cli", "topology", "check", str(good)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "1 nodes" in r.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "switches: [{name: a}]\nnodes: [{name: n, nics: [{nic: x, switch_port: b/1}]}]\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "rocewatch.cli", "topology", "check", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "undefined switch 'b'" in r.stderr
    assert "Traceback" not in r.stderr


def pods() -> dict:
    """Two pods, each a leaf (domain pod-a / pod-b) with one node; one spine of no domain."""
    return {
        "switches": [
            {"name": "leaf-a", "role": "leaf", "domain": "pod-a"},
            {"name": "leaf-b", "role": "leaf", "domain": "pod-b"},
            {"name": "spine-0", "role": "spine"},
        ],
        "links": [
            {"a": "leaf-a/Ethernet2/1", "b": "spine-0/Ethernet1/1"},
            {"a": "leaf-b/Ethernet2/1", "b": "spine-0/Ethernet1/2"},
        ],
        "nodes": [
            {
                "name": "gpu-a1",
                "nics": [{"nic": "mlx5_0", "netdev": "eth0", "switch_port": "leaf-a/Ethernet1/1"}],
            },
            {
                "name": "gpu-b1",
                "domain": "pod-a",  # its own domain wins over its leaf's
                "nics": [{"nic": "mlx5_0", "switch_port": "leaf-b/Ethernet1/1"}],
            },
        ],
    }


def test_domains_come_from_switches_and_nodes_inherit_their_leafs():
    t = Topology.from_dict(pods())
    assert t.domains == ["", "pod-a", "pod-b"]
    assert [t.domain_of(d) for d in ("leaf-a", "spine-0", "gpu-a1", "gpu-b1")] == [
        "pod-a",
        "",
        "pod-a",
        "pod-a",
    ]
    assert t.domain_of("not-in-the-topology") == ""  # the domain of no name, which exists
    # every cable end facing another domain, with the domains on its other side
    assert t.cross_domain_ends() == {
        ("leaf-a", "Ethernet2/1"): {""},
        ("spine-0", "Ethernet1/1"): {"pod-a"},
        ("leaf-b", "Ethernet2/1"): {""},
        ("spine-0", "Ethernet1/2"): {"pod-b"},
        ("gpu-b1", "mlx5_0"): {"pod-b"},
        ("leaf-b", "Ethernet1/1"): {"pod-a"},
    }
    again = Topology.from_dict(t.to_dict())
    assert again.to_dict() == t.to_dict() and again.domains == t.domains


def test_a_fabric_without_domains_is_one_and_unknown_devices_join_the_first():
    assert Topology.from_dict(GOOD).domains == [""]
    doc = pods()
    doc["switches"][2]["domain"] = "core"
    t = Topology.from_dict(doc)
    assert t.domains == ["core", "pod-a", "pod-b"]
    assert t.domain_of("not-in-the-topology") == "core"
