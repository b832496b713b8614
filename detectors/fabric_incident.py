"""FabricIncident: many entities faulting at once, grouped into one incident per scope.

A mass storm or fabric-wide congestion makes the rule detectors fire for many NICs, nodes or
switch ports in the same step. Each of those alerts still fires; this detector adds one
FabricIncident per scope (``switch:<name>``, ``rail:<n>``, ``job:<name>`` or ``fabric``) that
holds such a group, which tells the drain policy to withhold drains of the nodes in that scope:
when that many entities fault together, the fabric is at fault, not the nodes.

It reads only the alerts firing now (``ctx.firing``), so it sits after every rule detector and
before ``isolation_forest``. Victims (``role=victim``), PortAnomaly and FabricIncident alerts
are not members, nor are alerts the inhibition stage holds inhibited (``inhibited_by``: another
alert explains them) or other alerts on an entity a PFC storm pauses or starts from (a storm's
members: the congestion on the ports it pauses, its origin's silence are the storm, which has
its own alert; a mass storm still counts its origins, a switch origin once, however many ports
it pauses from). Per alertname and entity kind (NIC, node, switch port), a scope qualifies when
at least ``min_entities`` distinct entities fire in it, or at least ``min_share`` of the scope's
entities of that kind (per the topology), and at least ``min_share_entities``. The narrowest
qualifying scope (fewest entities) takes the group; a wider scope is raised only for what the
narrower incidents leave over, if that still qualifies. An incident resolves when its scope
stops qualifying (the findings stop).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from detectors.base import Finding, StepContext
from rocewatch.core.members import encode_members
from rocewatch.core.model import (
    FABRIC_INCIDENT,
    PFC_STORM,
    PORT_ANOMALY,
    ROCE_CONFIG_MISMATCH,
)
from rocewatch.core.state import Stateful
from rocewatch.core.topology import NicEnd, PortEnd, Topology

ALERTNAME = FABRIC_INCIDENT
# a configuration mismatch names a cable to fix, not an entity faulting: never counted
IGNORED = (FABRIC_INCIDENT, PORT_ANOMALY, ROCE_CONFIG_MISMATCH)
STORM = PFC_STORM
# the label that keeps these apart from the policy's own (blast-radius) FabricIncidents
SOURCE = "detector"
LEVEL = {"switch": 0, "rail": 1, "job": 2, "fabric": 3}
MAX_LISTED = 10

Entity = tuple[str, str]  # (kind "nic"|"node"|"port", "node/nic" | "node" | "switch/port")


@dataclass(frozen=True)
class FabricIncidentConfig:
    enabled: bool = True
    min_entities: int = 6  # distinct entities of one alertname and kind in a scope
    min_share: float = 0.25  # or this share of the scope's entities of that kind ...
    min_share_entities: int = 3  # ... and at least this many


@dataclass
class FabricIncidentDetector(Stateful):
    topology: Topology
    config: FabricIncidentConfig = field(default_factory=FabricIncidentConfig)
    name: str = "fabric_incident"
    # the record types its state holds (rocewatch.core.state; the checkpoint codec reads no other)
    STATE_TYPES: ClassVar[tuple[type, ...]] = (Finding,)
    # derived from its configuration and topology when built: never restored
    NOT_STATE: ClassVar[frozenset[str]] = frozenset({"members", "scopes_of", "_sizes"})
    # the metrics it reads from the window engine (steps carry no others to the detect stage)
    reads: ClassVar[frozenset[str]] = frozenset()

    @property
    def window_s(self) -> float:
        """It reads no telemetry window, only the alerts firing now."""
        return 0.0

    def __post_init__(self) -> None:
        # scope -> entities of each kind in it, and entity -> its scopes, from the topology
        self.members: dict[str, set[Entity]] = {}
        self.scopes_of: dict[Entity, set[str]] = {}
        topo = self.topology
        for (node, nic), n in topo.nics.items():
            scopes = {"fabric", *(f"job:{j}" for j in topo.node_jobs.get(node, []))}
            if n.switch_port is not None:
                scopes.add(f"switch:{n.switch_port.switch}")
            rail = topo.nic_rail(node, nic)
            if rail is not None:
                scopes.add(f"rail:{rail}")
            self._index(("nic", f"{node}/{nic}"), scopes)
            self._index(("node", node), scopes)
        for node in topo.nodes:
            self._index(
                ("node", node), {"fabric", *(f"job:{j}" for j in topo.node_jobs.get(node, []))}
            )
        ports: set[PortEnd] = {e for link in topo.links for e in link}
        ports |= {n.switch_port for n in topo.nics.values() if n.switch_port is not None}
        for p in ports:
            scopes = {"fabric", f"switch:{p.switch}"}
            sw = topo.switches.get(p.switch)
            if sw is not None and sw.rail is not None:
                scopes.add(f"rail:{sw.rail}")
            peer = topo.peer(p)
            if isinstance(peer, NicEnd):
                scopes |= {f"job:{j}" for j in topo.node_jobs.get(peer.node, [])}
            self._index(("port", f"{p.switch}/{p.port}"), scopes)

    def _index(self, entity: Entity, scopes: set[str]) -> None:
        self.scopes_of.setdefault(entity, set()).update(scopes)
        for s in scopes:
            self.members.setdefault(s, set()).add(entity)

    def _size(self, scope: str, kind: str) -> int:
        # members are fixed at start-up, so each count is taken once (a cache: not pickled)
        sizes: dict[tuple[str, str], int] = self.__dict__.setdefault("_sizes", {})
        n = sizes.get((scope, kind))
        if n is None:
            n = sizes[(scope, kind)] = sum(1 for k, _ in self.members.get(scope, ()) if k == kind)
        return n

    def _entity(self, labels: Mapping[str, str]) -> tuple[Entity, set[str]] | None:
        """The entity an alert names and the scopes it belongs to (topology and labels)."""
        node, nic = labels.get("node"), labels.get("nic")
        switch, port = labels.get("switch"), labels.get("port")
        scopes = {"fabric"}
        if node:
            ent: Entity = ("nic", f"{node}/{nic}") if nic else ("node", node)
            scopes |= {f"job:{j}" for j in self.topology.node_jobs.get(node, [])}
        elif switch and port:
            ent = ("port", f"{switch}/{port}")
        else:
            return None
        scopes |= self.scopes_of.get(ent, set())
        if switch and ent[0] == "port":
            scopes.add(f"switch:{switch}")
        if labels.get("rail"):
            scopes.add(f"rail:{labels['rail']}")
        if labels.get("job"):
            scopes.add(f"job:{labels['job']}")
        return ent, scopes

    def _qualifies(self, n: int, size: int) -> bool:
        cfg = self.config
        if n >= cfg.min_entities:
            return True
        return size > 0 and n >= cfg.min_share_entities and n >= cfg.min_share * size

    def evaluate(self, ctx: StepContext) -> list[Finding]:
        if ctx.firing is None:
            return []
        # (alertname, kind) -> scope -> entities firing in it
        groups: dict[tuple[str, str], dict[str, set[str]]] = {}
        firing = list(ctx.firing())
        # what the storms firing now pause, or start from: their symptoms are theirs
        in_storm = {
            found[0]
            for labels in firing
            if labels.get("alertname") == STORM and (found := self._entity(labels)) is not None
        }
        for labels in firing:
            name = labels.get("alertname", "")
            if not name or name in IGNORED or labels.get("role") == "victim":
                continue
            if labels.get("inhibited_by"):  # another alert explains it (the inhibition stage)
                continue
            found = self._entity(labels)
            if found is None:
                continue
            (kind, ent), scopes = found
            if name != STORM and (kind, ent) in in_storm:
                continue
            if name == STORM and kind == "port" and labels.get("role") == "origin":
                # a switch that is the origin on many ports is one device at fault: one member
                ent = ent.partition("/")[0] + "/"
            by_scope = groups.setdefault((name, kind), {})
            for s in scopes:
                by_scope.setdefault(s, set()).add(ent)
        # scope -> [(alertname, kind, entities, scope size)]
        incidents: dict[str, list[tuple[str, str, set[str], int]]] = {}
        for (name, kind), by_scope in sorted(groups.items()):
            sized = {s: self._size(s, kind) for s in by_scope}
            order = sorted(
                by_scope, key=lambda s: (sized[s] or 1 << 30, LEVEL[s.split(":", 1)[0]], s)
            )
            covered: set[str] = set()
            for s in order:
                rest = by_scope[s] - covered
                if not self._qualifies(len(rest), sized[s]):
                    continue
                incidents.setdefault(s, []).append((name, kind, by_scope[s], sized[s]))
                covered |= by_scope[s]
        return [self._finding(s, parts, ctx.end) for s, parts in sorted(incidents.items())]

    def _finding(self, scope: str, parts: list[tuple[str, str, set[str], int]], ts: int) -> Finding:
        every = sorted({e for _, _, ents, _ in parts for e in ents})
        counts = "; ".join(
            f"{name}: {len(ents)} {kind}{'s' if len(ents) != 1 else ''}"
            + (f" of {size}" if size else "")
            for name, kind, ents, size in parts
        )
        kinds = ", ".join(sorted({name for name, _, _, _ in parts}))
        listed = ", ".join(every[:MAX_LISTED]) + (
            f" (+{len(every) - MAX_LISTED} more)" if len(every) > MAX_LISTED else ""
        )
        cfg = self.config
        return Finding(
            ALERTNAME,
            {"scope": scope, "source": SOURCE},
            "critical",
            ts,
            summary=f"{len(every)} entities faulting at once in {scope} ({kinds}): drains withheld",
            description=f"{kinds} fire for {len(every)} entities in {scope} at once (at least "
            f"{cfg.min_entities}, or {cfg.min_share:.0%} of the scope with at least "
            f"{cfg.min_share_entities}): a fabric event, not single faulty nodes. Drains of "
            f"nodes in {scope} are withheld while this fires; the per-entity alerts still fire.",
            evidence=f"{counts}; entities: {listed}",
            # every member, machine-readable: the inhibition stage ties their alerts to this
            # incident (an inhibit rule with members: true)
            extra={
                "members": encode_members(
                    _member_labels(kind, e) for _, kind, ents, _ in parts for e in ents
                )
            },
        )


def _member_labels(kind: str, name: str) -> dict[str, str]:
    """The entity labels of a member ("node/nic", "node" or "switch/port" of its kind)."""
    a, _, b = name.partition("/")  # device names never hold a slash, port names may
    if kind == "nic":
        return {"node": a, "nic": b}
    if kind == "port":
        return {"switch": a, "port": b} if b else {"switch": a}
    return {"node": name}


def build(topology: Topology, config: FabricIncidentConfig | None = None) -> FabricIncidentDetector:
    return FabricIncidentDetector(topology, config or FabricIncidentConfig())


__all__ = ["FabricIncidentConfig", "FabricIncidentDetector", "build"]
