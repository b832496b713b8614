"""The fabric between two NICs, from the topology: the NICs, and the switch ports traffic between
them may cross.

A NIC's cable ends on a leaf port (``switch_port``). Two NICs on the same leaf talk through
their two leaf ports; on different leaves, ECMP picks one of the spines that link both leaves,
so every such uplink (the leaf's port and the spine's port of each cable, on both sides) is
on the path: an alert on any of them may be the one the traffic crosses. Without topology for
a NIC, its end of the path is the NIC alone.

>>> topo = Topology.from_dict({
...     "switches": [{"name": "l0", "role": "leaf"}, {"name": "l1", "role": "leaf"},
...                  {"name": "s0", "role": "spine"}],
...     "links": [{"a": "l0/E1", "b": "s0/E1"}, {"a": "l1/E1", "b": "s0/E2"}],
...     "nodes": [{"name": "a", "nics": [{"nic": "mlx5_0", "switch_port": "l0/E33"}]},
...               {"name": "b", "nics": [{"nic": "mlx5_0", "switch_port": "l1/E33"}]}]})
>>> sorted(str(p) for p in path_between(topo, ("a", "mlx5_0"), ("b", "mlx5_0")).ports)
['l0/E1', 'l0/E33', 'l1/E1', 'l1/E33', 's0/E1', 's0/E2']
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from rocewatch.core.model import (
    ECN_CONGESTION,
    FLAKY_LINK,
    PCIE_DOWNGRADE,
    PFC_STORM,
    PORT_ANOMALY,
    QUEUE_BUILDUP,
    STRAGGLER,
    TRANSPORT_ERRORS,
)
from rocewatch.core.topology import PortEnd, Topology

# fabric alerts that can slow NCCL traffic through a NIC or a port
FABRIC_ALERTS = (
    PCIE_DOWNGRADE,
    FLAKY_LINK,
    PFC_STORM,
    STRAGGLER,
    TRANSPORT_ERRORS,
    ECN_CONGESTION,
    QUEUE_BUILDUP,
    PORT_ANOMALY,
)


@dataclass(frozen=True)
class Path:
    nics: frozenset[tuple[str, str]] = field(default_factory=frozenset)  # (node, nic)
    ports: frozenset[PortEnd] = field(default_factory=frozenset)

    def __or__(self, other: Path) -> Path:
        return Path(self.nics | other.nics, self.ports | other.ports)

    def touches(self, labels: Mapping[str, str]) -> bool:
        """Whether an alert's entity (``node``+``nic``, a whole ``node``, or ``switch``+
        ``port``) is on this path."""
        node, nic = labels.get("node"), labels.get("nic")
        if node is not None:
            if nic is not None:
                return (node, nic) in self.nics
            return any(n == node for n, _ in self.nics)
        sw, port = labels.get("switch"), labels.get("port")
        return sw is not None and port is not None and PortEnd(sw, port) in self.ports


def nic_path(topology: Topology, node: str, nic: str) -> Path:
    """A NIC and its leaf port."""
    n = topology.nics.get((node, nic))
    ports = frozenset({n.switch_port}) if n is not None and n.switch_port is not None else None
    return Path(frozenset({(node, nic)}), ports or frozenset())


def _uplinks(topology: Topology, leaf: str) -> dict[str, list[tuple[PortEnd, PortEnd]]]:
    """The leaf's cables to other switches, by the switch at the far end."""
    out: dict[str, list[tuple[PortEnd, PortEnd]]] = {}
    for a, b in topology.links:
        if a.switch == leaf:
            out.setdefault(b.switch, []).append((a, b))
        elif b.switch == leaf:
            out.setdefault(a.switch, []).append((b, a))
    return out


def path_between(topology: Topology, a: tuple[str, str], b: tuple[str, str]) -> Path:
    """Both NICs, their leaf ports, and the uplinks of every spine that joins their leaves."""
    pa, pb = nic_path(topology, *a), nic_path(topology, *b)
    path = pa | pb
    la = next(iter(pa.ports), None)
    lb = next(iter(pb.ports), None)
    if la is None or lb is None or la.switch == lb.switch:
        return path
    ua, ub = _uplinks(topology, la.switch), _uplinks(topology, lb.switch)
    extra: set[PortEnd] = set()
    for mid in ua.keys() & ub.keys():
        for near, far in ua[mid] + ub[mid]:
            extra |= {near, far}
    if lb.switch in ua:  # leaves cabled to each other
        for near, far in ua[lb.switch]:
            extra |= {near, far}
    return Path(path.nics, path.ports | frozenset(extra))


def alerts_on(path: Path, firing: Iterable[Mapping[str, str]]) -> list[Mapping[str, str]]:
    """The fabric alerts (``FABRIC_ALERTS``) firing on the path, in that order of names."""
    found = [a for a in firing if a.get("alertname") in FABRIC_ALERTS and path.touches(a)]
    return sorted(found, key=lambda a: FABRIC_ALERTS.index(a["alertname"]))


def say(a: Mapping[str, str]) -> str:
    """An alert's label set in one line (its name first)."""
    rest = ", ".join(f"{k}={v}" for k, v in sorted(a.items()) if k != "alertname")
    return f"{a.get('alertname', '?')}: {rest}"
