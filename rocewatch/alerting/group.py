"""Grouping: one alert per fault, whatever number of ports or NICs the detectors report.

The PFC storm detector reports every stalled receiver and every sending port on its own. A
storm is one fault, so the findings are grouped here, between the detectors and the alert
lifecycle:

- **origin**: one alert per device. A NIC is its own device (its finding passes unchanged);
  a switch that is the origin on several ports raises one alert labelled with a
  representative port (``switch`` + ``port``: the first port seen, kept while the alert fires,
  so an origin match on those labels still works) and lists every port in ``ports``.
- **victims**: one alert per storm, labelled with the ``origin`` that paused them (``node/nic``
  or the switch; ``unknown`` when no origin is found) and with the entity labels of a
  representative victim (the one the origin paused directly, else the first paused; kept
  while the alert fires). ``victims`` lists every entity the storm paused since it began.
  In a fabric split into domains, a storm's victims are grouped per domain, in every mode (the
  scale-out detect stage runs one pipeline per domain, which sees no further): a domain the
  pause enters from another is labelled with the device it comes from.

A victim belongs to the storm whose origin reaches it first over the pause graph: each
paused entity is paused by the device at the other end of its cable, which is either an
origin or itself paused.

Every grouped alert carries ``members``: its current members (seen within the lifecycle's
``resolve_after_s``) as a JSON list of entity label sets. Every origin alert carries ``tree``:
the storm's pause tree as the same kind of list, its own members (the NIC, or the switch's
ports) and the current members of every victim alert of its storm; the inhibition stage reads it
to tell the storm's symptoms (congestion on the ports it pauses, the origin's silence). The
inhibition stage and the detectors that read the alerts firing (``StepContext.firing``) see a
grouped alert as one alert per member (``views``), so grouping changes what is notified, not
what they know.

>>> views({"alertname": "PFCStorm", "switch": "leaf-0", "port": "Ethernet1", "role": "origin"},
...       {"members": '[{"port":"Ethernet1","switch":"leaf-0"},'
...                   '{"port":"Ethernet2","switch":"leaf-0"}]'})[1]["port"]
'Ethernet2'
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from rocewatch.core.members import (
    ENTITY_KEYS,
    MEMBERS,
    encode_members,
    parse_members,
    views,
)
from rocewatch.core.model import PFC_STORM, Finding
from rocewatch.core.state import Stateful
from rocewatch.core.topology import NicEnd, PortEnd, Topology

STORM = PFC_STORM
TREE = "tree"  # an origin alert's pause tree: its members and its storm's victims
Entity = tuple[str, str, str]  # ("nic", node, nic) | ("port", switch, port)
Device = tuple[str, str, str]  # ("nic", node, nic) | ("switch", switch, "")


def entity_of(labels: Mapping[str, str]) -> Entity | None:
    node, nic = labels.get("node"), labels.get("nic")
    if node and nic:
        return ("nic", node, nic)
    switch, port = labels.get("switch"), labels.get("port")
    if switch and port:
        return ("port", switch, port)
    return None


def _device(e: Entity) -> Device:
    """A NIC is its own device; a switch port belongs to its switch."""
    return e if e[0] == "nic" else ("switch", e[1], "")


def _device_name(d: Device) -> str:
    return f"{d[1]}/{d[2]}" if d[0] == "nic" else d[1]


def _entity_name(e: Entity) -> str:
    return f"{e[1]}/{e[2]}"


def _member_labels(labels: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k in ENTITY_KEYS}


@dataclass(frozen=True)
class _Traced:
    storm: Device  # the storm's origin
    label: Device  # the device its victims' alert names: the origin, or where it enters
    direct: bool  # paused by that device itself


@dataclass
class _Group:
    labels: dict[str, str]  # the alert's labels, fixed while it fires
    rep: Entity
    origin: Device | None = None  # a victim group's origin (or border) device, when known
    storm: Device | None = None  # the storm's origin, when known
    # member -> (its finding, the last step it was seen)
    current: dict[Entity, tuple[Finding, int]] = field(default_factory=dict)
    ever: set[Entity] = field(default_factory=set)
    last: int = 0


class StormGrouper(Stateful):
    """Groups each step's PFCStorm findings into one origin alert per device and one victim
    alert per storm (module docstring); other findings pass unchanged.

    ``hold_s``: how long a member (and a group) outlives its last finding; the lifecycle's
    ``resolve_after_s``, so a group keeps its labels exactly as long as its alert fires.
    ``split_domains``: group victims per fabric domain; by default when the topology has
    domains, in every mode, so that replay and the scale-out detect stage (one pipeline per
    domain, each seeing only its domain and the cable ends facing it) raise the same alerts.
    """

    def __init__(
        self, topology: Topology, hold_s: float = 1.0, split_domains: bool | None = None
    ) -> None:
        self.topology = topology
        self.hold_ns = int(hold_s * 1e9)
        if split_domains is None:
            split_domains = len(getattr(topology, "domains", [""])) > 1
        self.split_domains = split_domains
        self.groups: dict[tuple[str, ...], _Group] = {}

    STATE_TYPES: ClassVar[tuple[type, ...]] = (_Group, Finding)
    NOT_STATE: ClassVar[frozenset[str]] = frozenset({"hold_ns", "split_domains"})

    def group(self, now_ns: int, findings: list[Finding]) -> list[Finding]:
        """``findings`` of one detector for the step ending at ``now_ns``, grouped."""
        storms = [f for f in findings if f.alertname == STORM]
        if not storms and not self.groups:
            return findings
        out = [f for f in findings if f.alertname != STORM]
        origins = [f for f in storms if f.labels.get("role") == "origin"]
        victims = [f for f in storms if f.labels.get("role") == "victim"]
        # a storm finding with neither role (or no entity) is not grouped: kept as it is
        out += [
            f
            for f in storms
            if f.labels.get("role") not in ("origin", "victim") or entity_of(f.labels) is None
        ]
        mine = self._origins(now_ns, origins)
        paused = self._victims(now_ns, victims, origins)
        out += [self._with_tree(f) for f in mine] + paused
        self._forget(now_ns)
        return out

    def _with_tree(self, f: Finding) -> Finding:
        """An origin finding with its storm's pause tree (``TREE``): its own members and the
        current members of the victim groups whose storm it started."""
        e = entity_of(f.labels)
        if e is None:
            return f
        origin = _device(e)
        own = parse_members(f.extra.get(MEMBERS, "")) if MEMBERS in f.extra else ()
        sets: list[Mapping[str, str]] = [dict(m) for m in own] or [_member_labels(f.labels)]
        for key in sorted(self.groups):
            g = self.groups[key]
            if key[0] == "victim" and g.storm == origin:
                sets += [_member_labels(v.labels) for v, _ in g.current.values()]
        return Finding(
            f.alertname,
            f.labels,
            f.severity,
            f.ts,
            f.summary,
            f.evidence,
            f.description,
            {**f.extra, TREE: encode_members(sets)},
        )

    # --- origins -----------------------------------------------------------------------------
    def _origins(self, now: int, origins: list[Finding]) -> list[Finding]:
        out: list[Finding] = []
        by_switch: dict[tuple[str, ...], dict[Entity, Finding]] = {}
        for f in origins:
            e = entity_of(f.labels)
            if e is None:
                continue
            if e[0] == "nic":  # a NIC is one device already
                out.append(f)
                continue
            by_switch.setdefault(("origin", e[1], f.labels.get("priority", "")), {})[e] = f
        for sw_key in sorted(by_switch):
            g = self._update(sw_key, now, by_switch[sw_key], first_hop=set())
            out.append(self._origin_finding(sw_key, g, now))
        return out

    def _origin_finding(self, key: tuple[str, ...], g: _Group, now: int) -> Finding:
        _, switch, prio = key
        present = [f for f, seen in g.current.values() if seen == now]
        ports = sorted(e[2] for e in g.ever)
        now_ports = sorted(e[2] for e, (_, seen) in g.current.items() if seen == now)
        return Finding(
            STORM,
            dict(g.labels),
            "critical",
            min(f.ts for f in present),
            summary=f"PFC storm on priority {prio} originating at switch {switch}",
            description=f"{switch} keeps sending PFC pause on priority {prio} from "
            f"{len(now_ports)} port(s) ({', '.join(now_ports)}) while not itself paused: one "
            "alert for the switch, every port it paused from in the ports annotation.",
            evidence="; ".join(sorted(f.evidence for f in present)[:8]),
            extra={
                "ports": ", ".join(ports),
                MEMBERS: encode_members(_member_labels(f.labels) for f, _ in g.current.values()),
            },
        )

    # --- victims -----------------------------------------------------------------------------
    def _victims(self, now: int, victims: list[Finding], origins: list[Finding]) -> list[Finding]:
        if not victims:
            return []
        by_prio: dict[str, list[Finding]] = {}
        for f in victims:
            by_prio.setdefault(f.labels.get("priority", ""), []).append(f)
        orig_by_prio: dict[str, list[Finding]] = {}
        for f in origins:
            orig_by_prio.setdefault(f.labels.get("priority", ""), []).append(f)
        out: list[Finding] = []
        for prio in sorted(by_prio):
            members: dict[tuple[str, ...], dict[Entity, Finding]] = {}
            traced = self._trace(prio, by_prio[prio], orig_by_prio.get(prio, []))
            for f in by_prio[prio]:
                e = entity_of(f.labels)
                if e is None:
                    continue
                t = traced.get(e)
                name = _device_name(t.label) if t is not None else "unknown"
                domain = self._domain(e) if self.split_domains else ""
                members.setdefault(("victim", name, prio, domain), {})[e] = f
            for key in sorted(members):
                found = members[key]
                first_hop = {e for e in found if (t := traced.get(e)) is not None and t.direct}
                g = self._update(key, now, found, first_hop)
                if g.origin is None:
                    t = next((traced[e] for e in sorted(found) if e in traced), None)
                    if t is not None:
                        g.origin, g.storm = t.label, t.storm
                out.append(self._victim_finding(key, g, now))
        return out

    def _domain(self, e: Entity | Device) -> str:
        return self.topology.domain_of(e[1])

    def _trace(
        self, prio: str, victims: list[Finding], origins: list[Finding]
    ) -> dict[Entity, _Traced]:
        """Each victim's storm, breadth first from the origins over the pause graph.

        A victim the origins found now do not reach (the origin stopped first, as it does while
        a storm drains down) stays in the storm whose victims pause it, or whose member it is.
        With domains, a victim in another domain than its storm's origin is labelled with the
        device the pause came in from, as the pipeline of its own domain, which sees no
        further, names it: so every mode groups and labels alike."""
        paused_by: dict[Device, list[Entity]] = {}
        for f in victims:
            e = entity_of(f.labels)
            if e is None:
                continue
            sender = self._sender(e)
            if sender is not None:
                paused_by.setdefault(sender, []).append(e)
        # device -> (the storm's origin, the device where the pause last entered a domain)
        reached: dict[Device, tuple[Device, Device]] = {}
        out: dict[Entity, _Traced] = {}

        def spread(queue: deque[Device]) -> None:
            while queue:
                d = queue.popleft()
                storm, via = reached[d]
                for e in sorted(paused_by.get(d, ())):
                    if e in out:
                        continue
                    # with domains: where the pause last came in over a border; a victim in
                    # another domain than its origin is named after that device
                    crossed = self.split_domains and self._domain(d) != self._domain(e)
                    entry = d if crossed else via
                    label = storm
                    if self.split_domains and self._domain(storm) != self._domain(e):
                        label = entry
                    out[e] = _Traced(storm, label, direct=d == label)
                    dd = _device(e)
                    if dd not in reached:
                        reached[dd] = (storm, entry)
                        queue.append(dd)

        origin_devs = set()
        for f in origins:
            e = entity_of(f.labels)
            if e is not None:
                origin_devs.add(_device(e))
        for d in origin_devs:
            reached[d] = (d, d)
        spread(deque(sorted(origin_devs)))
        # what the storms this grouper follows held a moment ago
        member_of: dict[Entity, _Traced] = {}
        fresh: list[Device] = []
        for key in sorted(self.groups):
            g = self.groups[key]
            if key[0] != "victim" or key[2] != prio or g.origin is None or g.storm is None:
                continue
            for d in [g.origin, *map(_device, g.current)]:
                if d not in reached:
                    reached[d] = (g.storm, g.origin)
                    fresh.append(d)
            for e in g.current:
                member_of.setdefault(e, _Traced(g.storm, g.origin, direct=False))
        spread(deque(fresh))
        for f in victims:
            e = entity_of(f.labels)
            if e is not None and e not in out and e in member_of:
                out[e] = member_of[e]
        return out

    def _sender(self, e: Entity) -> Device | None:
        """The device at the other end of the paused entity's cable: what paused it."""
        topo = self.topology
        peer = topo.peer_of_port(e[1], e[2]) if e[0] == "port" else topo.peer(NicEnd(e[1], e[2]))
        if isinstance(peer, NicEnd):
            return ("nic", peer.node, peer.nic)
        if isinstance(peer, PortEnd):
            return ("switch", peer.switch, "")
        return None

    def _victim_finding(self, key: tuple[str, ...], g: _Group, now: int) -> Finding:
        _, origin, prio, _ = key
        present = [f for f, seen in g.current.values() if seen == now]
        rep = g.current.get(g.rep)
        shown = rep[0] if rep is not None else min(present, key=lambda f: (f.ts, f.evidence))
        n_now = len(present)
        extra = {
            "origin": origin,
            "victims": ", ".join(sorted(_entity_name(e) for e in g.ever)),
            MEMBERS: encode_members(_member_labels(f.labels) for f, _ in g.current.values()),
        }
        if self.split_domains and g.origin is not None and self._domain(g.origin) != key[3]:
            # grouped per fabric domain, this storm came in over the domain's border: the
            # device it came from is named; where it started, when this pipeline saw it
            started = (
                f"; it started at {_device_name(g.storm)}"
                if g.storm is not None and g.storm != g.origin
                else "; that domain's alerts name where it started"
            )
            extra["origin_note"] = (
                f"the pause enters fabric domain '{key[3]}' from {origin} (domain "
                f"'{self._domain(g.origin)}'){started}"
            )
        return Finding(
            STORM,
            dict(g.labels),
            "warning",
            min(f.ts for f in present),
            summary=f"PFC storm victims on priority {prio}: stalled by the storm from {origin}",
            description=f"Entities stalled by PFC pause from the storm that {origin} started; "
            "none of them is the culprit. One alert per storm: the victims annotation lists "
            "every entity it paused.",
            # (the evidence stays as the alert fired; the victims annotation grows)
            evidence=shown.evidence
            + (f"; {n_now - 1} more paused in the same step" if n_now > 1 else ""),
            extra=extra,
        )

    # --- state -------------------------------------------------------------------------------
    def _update(
        self,
        key: tuple[str, ...],
        now: int,
        found: dict[Entity, Finding],
        first_hop: set[Entity],
    ) -> _Group:
        g = self.groups.get(key)
        if g is None:
            # the representative: one the origin paused directly, else the first paused; its
            # labels become the alert's and stay while it fires
            rep = min(found, key=lambda e: (e not in first_hop, found[e].ts, e))
            labels = dict(found[rep].labels)
            if key[0] == "victim":
                labels["origin"] = key[1]
            g = self.groups[key] = _Group(labels, rep)
        for e, f in found.items():
            g.current[e] = (f, now)
            g.ever.add(e)
        g.last = now
        return g

    def _forget(self, now: int) -> None:
        for key in list(self.groups):
            g = self.groups[key]
            if now - g.last >= self.hold_ns:
                del self.groups[key]
                continue
            for e in [e for e, (_, seen) in g.current.items() if now - seen >= self.hold_ns]:
                del g.current[e]


__all__ = [
    "MEMBERS",
    "TREE",
    "StormGrouper",
    "encode_members",
    "entity_of",
    "parse_members",
    "views",
]
