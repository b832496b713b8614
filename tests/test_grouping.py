"""One fault, one alert: a storm's origin per device and its victims per storm
(rocewatch/alerting/group.py), through the real pipeline with scripted storm findings."""

from __future__ import annotations

import orjson

from detectors.base import Finding, StepContext, node_labels, port_labels
from rocewatch.alerting.group import StormGrouper, parse_members
from rocewatch.core.model import Alert
from rocewatch.core.topology import Topology
from rocewatch.pipeline import Pipeline
from tests import test_inhibit
from tests.test_inhibit import T0, Scripted, at, named, run


def fabric(domains: bool = False) -> Topology:
    """Two leaves under a spine; gpu-001/002 on leaf-0, gpu-003/004 on leaf-1; with
    ``domains``, each leaf and its nodes a fabric domain (pod-0, pod-1), the spine in none."""
    return Topology.from_dict(
        {
            "switches": [
                {
                    "name": "leaf-0",
                    "role": "leaf",
                    "rail": 0,
                    "domain": "pod-0" if domains else None,
                },
                {
                    "name": "leaf-1",
                    "role": "leaf",
                    "rail": 0,
                    "domain": "pod-1" if domains else None,
                },
                {"name": "spine-0", "role": "spine"},
            ],
            "links": [
                {"a": "leaf-0/Ethernet9", "b": "spine-0/Ethernet1"},
                {"a": "leaf-1/Ethernet9", "b": "spine-0/Ethernet2"},
            ],
            "nodes": [
                {
                    "name": f"gpu-00{i + 1}",
                    "nics": [
                        {"nic": "mlx5_0", "switch_port": f"leaf-{i // 2}/Ethernet{i % 2 + 1}"}
                    ],
                }
                for i in range(4)
            ],
        }
    )


TOPO = fabric()
PODS = fabric(domains=True)


def pipeline(*dets: object) -> Pipeline:
    return test_inhibit.pipeline(*dets, topology=TOPO)


def origin_port(switch: str, port: str, t: float) -> Finding:
    labels = {**port_labels(TOPO, switch, port), "priority": "3", "role": "origin"}
    return Finding("PFCStorm", labels, "critical", at(t), "storm", f"{switch}/{port} sends")


def origin_nic(node: str, t: float) -> Finding:
    labels = {**node_labels(TOPO, node, "mlx5_0"), "priority": "3", "role": "origin"}
    return Finding("PFCStorm", labels, "critical", at(t), "storm", f"{node} sends")


def victim(t: float, switch: str = "", port: str = "", node: str = "") -> Finding:
    ent = node_labels(TOPO, node, "mlx5_0") if node else port_labels(TOPO, switch, port)
    labels = {**ent, "priority": "3", "role": "victim"}
    return Finding("PFCStorm", labels, "warning", at(t), "paused", f"{switch or node} paused")


def switch_storm(t: float) -> list[Finding]:
    """leaf-1 storms from three ports at staggered times (it pauses the spine and two NICs)."""
    out = []
    for port, (a, b) in {
        "Ethernet9": (1.0, 5.0),
        "Ethernet1": (1.5, 6.0),
        "Ethernet2": (3.0, 4.0),
    }.items():
        if a <= t < b:
            out.append(origin_port("leaf-1", port, t))
    if 1.0 <= t < 6.0:
        out.append(origin_nic("gpu-001", t))  # another device: its own alert
    return out


def two_storms(t: float) -> list[Finding]:
    """gpu-001 pauses leaf-0, which pauses gpu-002 and the spine; gpu-004 pauses leaf-1,
    which pauses gpu-003. The origins stop before their victims recover, as they do."""
    out: list[Finding] = []
    if 1.0 <= t < 4.0:
        out += [origin_nic("gpu-001", t), origin_nic("gpu-004", t)]
    if 1.0 <= t < 4.5:
        out += [
            victim(t, "leaf-0", "Ethernet1"),
            victim(t, node="gpu-002"),
            victim(t, "spine-0", "Ethernet1"),
            victim(t, "leaf-1", "Ethernet2"),
            victim(t, node="gpu-003"),
        ]
    return out


def test_one_origin_alert_per_switch_with_its_ports() -> None:
    p = pipeline(Scripted("pfc_storm", switch_storm))
    run(p, 0, 9)
    origins = [a for a in p.all_alerts() if a.labels.get("role") == "origin"]
    by_device = {a.labels.get("switch") or a.labels["node"]: a for a in origins}
    assert sorted(by_device) == ["gpu-001", "leaf-1"] and len(origins) == 2
    sw = by_device["leaf-1"]
    # labelled with the first port seen, kept while it fired though that port stopped first
    assert sw.labels["port"] == "Ethernet9" and sw.labels["priority"] == "3"
    assert sw.annotations["ports"] == "Ethernet1, Ethernet2, Ethernet9"
    assert sw.ends_at >= at(6.0)
    assert by_device["gpu-001"].labels["nic"] == "mlx5_0"
    assert "ports" not in by_device["gpu-001"].annotations


def test_one_victim_alert_per_storm_naming_its_origin_and_victims() -> None:
    p = pipeline(Scripted("pfc_storm", two_storms))
    outs = run(p, 0, 8)
    victims = [a for a in p.all_alerts() if a.labels.get("role") == "victim"]
    assert sorted(a.labels["origin"] for a in victims) == ["gpu-001/mlx5_0", "gpu-004/mlx5_0"]
    by_origin = {a.labels["origin"]: a for a in victims}
    one, four = by_origin["gpu-001/mlx5_0"], by_origin["gpu-004/mlx5_0"]
    # the representative: the port its origin paused directly
    assert (one.labels["switch"], one.labels["port"]) == ("leaf-0", "Ethernet1")
    assert one.annotations["victims"] == "gpu-002/mlx5_0, leaf-0/Ethernet1, spine-0/Ethernet1"
    assert four.annotations["victims"] == "gpu-003/mlx5_0, leaf-1/Ethernet2"
    assert one.labels["severity"] == "warning" and one.labels["priority"] == "3"
    # one instance each, though the origins stopped half a second before their victims
    assert len([a for a in named(outs, "PFCStorm") if a.labels["role"] == "victim"]) == 4
    assert all(a.ends_at >= at(4.5) for a in victims)


def test_detectors_reading_the_firing_alerts_see_every_member() -> None:
    """The isolation forest and FabricIncident read ``ctx.firing``: a grouped alert shows
    them one label set per member, as the per-entity alerts did."""
    seen: list[list[dict[str, str]]] = []

    class Reader:
        name = "reader"
        reads = frozenset()

        def evaluate(self, ctx: StepContext) -> list[Finding]:
            assert ctx.firing is not None
            seen.append([dict(x) for x in ctx.firing()])
            return []

    p = pipeline(Scripted("pfc_storm", two_storms), Reader())
    run(p, 0, 3)
    paused = {
        (x.get("node"), x.get("nic"), x.get("switch"), x.get("port"))
        for x in seen[-1]
        if x.get("role") == "victim"
    }
    assert paused == {
        ("gpu-002", "mlx5_0", None, None),
        ("gpu-003", "mlx5_0", None, None),
        (None, None, "leaf-0", "Ethernet1"),
        (None, None, "spine-0", "Ethernet1"),
        (None, None, "leaf-1", "Ethernet2"),
    }


def test_victims_without_a_reachable_origin() -> None:
    g = StormGrouper(TOPO, hold_s=1.0)
    lonely = victim(1.0, "leaf-0", "Ethernet7")  # no cable in the topology: no sender
    (f,) = g.group(at(1.0), [lonely])
    assert f.labels["origin"] == "unknown" and f.labels["port"] == "Ethernet7"


def victim_groups(found: list[Finding]) -> dict[str, tuple[dict[str, str], list[str], str]]:
    """origin label -> (labels, member devices, origin_note) of each victim finding."""
    out = {}
    for x in found:
        if x.labels["role"] == "victim":
            devices = sorted(
                dict(m).get("switch") or dict(m)["node"] for m in parse_members(x.extra["members"])
            )
            out[x.labels["origin"]] = (x.labels, devices, x.extra.get("origin_note", ""))
    return out


def test_with_domains_victims_are_grouped_per_domain_alike_in_every_mode() -> None:
    """Replay sees the whole fabric; the scale-out detect stage of the spines' domain sees
    only the spine and the leaf ports cabled to it, so it takes leaf-0 for the origin. Both
    name the spine's victims after leaf-0, where the pause enters their domain: the same
    alert in every mode."""
    whole = victim_groups(StormGrouper(PODS, hold_s=1.0).group(at(1.0), two_storms(1.0)))
    assert {k: v[1] for k, v in whole.items()} == {
        "gpu-001/mlx5_0": ["gpu-002", "leaf-0"],
        "leaf-0": ["spine-0"],
        "gpu-004/mlx5_0": ["gpu-003", "leaf-1"],
    }
    assert whole["gpu-001/mlx5_0"][2] == ""
    assert "from leaf-0 (domain 'pod-0'); it started at gpu-001/mlx5_0" in whole["leaf-0"][2]
    # what the spine domain's storm detector reports: leaf-0's uplink sends pause, unpaused
    seen = [origin_port("leaf-0", "Ethernet9", 1.0), victim(1.0, "spine-0", "Ethernet1")]
    spine = victim_groups(StormGrouper(PODS, hold_s=1.0).group(at(1.0), seen))
    assert spine["leaf-0"][0] == whole["leaf-0"][0]  # same labels: same fingerprint
    assert "that domain's alerts name where it started" in spine["leaf-0"][2]
    # without domains, one alert per storm
    one = victim_groups(StormGrouper(TOPO, hold_s=1.0).group(at(1.0), two_storms(1.0)))
    assert one["gpu-001/mlx5_0"][1] == ["gpu-002", "leaf-0", "spine-0"]


def test_members_annotation_round_trips() -> None:
    a = Alert({"alertname": "PFCStorm"}, {"members": '[{"node":"n","nic":"x"}, 3, "y"]'}, T0)
    assert parse_members(a.annotations["members"]) == ((("nic", "x"), ("node", "n")),)
    assert parse_members("not json") == () and parse_members(orjson.dumps({}).decode()) == ()
