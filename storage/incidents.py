"""Incidents: what one page stands for, kept beside the alerts that make it.

An incident is one fault as an operator meets it: a PFC storm with its origin and victims, a
flaky cable with both ends, a straggler with its job (its PCIe downgrade joins it), or any
other alert on its own entity. The store files every alert event it writes into one
(``Store.write_alerts``, in the same transaction as the alert), every action under the
incident of its alert (``write_actions``) and every operator command under the incident that
drains its node (``add_command``), so the records are as idempotent as the alerts: writing the
same event twice changes nothing.

What an incident keeps:

- its **graph**, frozen as the alerts gave it when they were written (a later topology change
  does not redraw it): nodes (``origin``, ``victim``, ``relay`` switches, ``job``, ``host``
  for a node acted on, ``end`` for a cable's ends, ``entity`` otherwise) with their pause share
  (parsed from the alerts' evidence, where it names one) and when the incident first saw them
  paused (an alert's ``startsAt`` for the entity it is labelled with; for the other victims,
  the ``startsAt`` of the first alert event that listed them: the grouped victims alert does
  not carry a time per victim), and edges (``pauses``: who pauses whom, over the topology's
  cables when the store has the topology, else only the origin to the victim it paused
  directly; ``runs``: a NIC in a job; ``cable``; ``hosts``: a node and its NIC);
- its **timeline**: ``firing`` / ``resolved`` alert events, ``inhibited`` symptoms (alerts
  an inhibition rule attributes to one of its alerts), ``action`` decisions and ``command``
  operator commands;
- its **links**: the incidents it is related to (a FabricIncident's nodes).

Incident key: alerts with the same key join the incident of that key that is open, or that
ended less than ``JOIN_WINDOW_NS`` before the alert started; otherwise a new one begins.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Table, and_, or_, select, text

from rocewatch.core.model import (
    FABRIC_INCIDENT,
    FLAKY_LINK,
    PCIE_DOWNGRADE,
    PFC_STORM,
    STRAGGLER,
    Action,
    Alert,
)
from storage.models import (
    AlertRow,
    IncidentEdgeRow,
    IncidentEventRow,
    IncidentNodeRow,
    IncidentRow,
    datetime_to_ns,
    ns_to_datetime,
)

INCIDENTS: Table = IncidentRow.__table__  # type: ignore[assignment]
EVENTS: Table = IncidentEventRow.__table__  # type: ignore[assignment]
NODES: Table = IncidentNodeRow.__table__  # type: ignore[assignment]
EDGES: Table = IncidentEdgeRow.__table__  # type: ignore[assignment]
ALERTS: Table = AlertRow.__table__  # type: ignore[assignment]

JOIN_WINDOW_NS = 60 * 1_000_000_000
ALERT_EVENTS = ("firing", "inhibited")  # the events that file an alert under an incident

# "<device>/<port> prio <p> received|sent pause 99.8% of 0.20 s": the detectors' evidence
_SHARE = re.compile(r"(\S+?/\S+) prio \d+ (received|sent) pause ([\d.]+)% of")


# --- what an alert says ---------------------------------------------------------------------
def kind_of(a: Alert) -> str:
    name = a.labels.get("alertname", "")
    return {
        PFC_STORM: "storm",
        FLAKY_LINK: "flaky_link",
        STRAGGLER: "straggler",
        PCIE_DOWNGRADE: "straggler",
        FABRIC_INCIDENT: "fabric",
    }.get(name, name.lower() or "alert")


def entity_name(labels: dict[str, str]) -> str:
    if labels.get("node"):
        return f"{labels['node']}/{labels['nic']}" if labels.get("nic") else labels["node"]
    if labels.get("switch"):
        return f"{labels['switch']}/{labels['port']}" if labels.get("port") else labels["switch"]
    return labels.get("scope", "")


def incident_key(a: Alert) -> str:
    """Alerts of one fault share a key (the incident groups them)."""
    lab = a.labels
    kind = kind_of(a)
    if kind == "storm":
        origin = lab.get("origin") if lab.get("role") == "victim" else None
        if origin is None:
            origin = (
                f"{lab['node']}/{lab['nic']}"
                if lab.get("node") and lab.get("nic")
                else lab.get("switch", entity_name(lab))
            )
        return f"storm:{origin}:{lab.get('priority', '')}"
    if kind == "flaky_link":
        return f"flaky_link:{a.annotations.get('cable') or entity_name(lab)}"
    if kind == "straggler":
        return f"straggler:{entity_name(lab)}"
    if kind == "fabric":
        return f"fabric:{lab.get('scope', '')}"
    return f"{kind}:{entity_name(lab)}:{lab.get('queue', lab.get('priority', ''))}"


def title_of(a: Alert) -> str:
    lab, ann = a.labels, a.annotations
    kind = kind_of(a)
    if kind == "storm":
        origin = incident_key(a).split(":", 2)[1]
        return f"PFC storm from {origin} (priority {lab.get('priority', '?')})"
    if kind == "flaky_link":
        return f"Flaky link {ann.get('cable') or entity_name(lab)}"
    if kind == "straggler":
        job = f" in {lab['job']}" if lab.get("job") else ""
        return f"Straggler {entity_name(lab)}{job}"
    return ann.get("summary") or f"{lab.get('alertname', 'alert')} {entity_name(lab)}"


def shares(evidence: str) -> dict[str, float]:
    """Pause shares (0..1) the evidence text names, by entity (``device/port``)."""
    out: dict[str, float] = {}
    for m in _SHARE.finditer(evidence):
        out[m.group(1)] = max(out.get(m.group(1), 0.0), float(m.group(3)) / 100)
    return out


def members(a: Alert) -> list[dict[str, str]]:
    try:
        got = json.loads(a.annotations.get("members") or "[]")
    except ValueError:
        return []  # bad input: a graph without the members' jobs, never a failed write
    return [m for m in got if isinstance(m, dict)] if isinstance(got, list) else []


@dataclass
class Graph:
    """Nodes and edges of one incident (merged into what is stored)."""

    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    edges: dict[str, dict[str, Any]] = field(default_factory=dict)

    def node(self, node_id: str, kind: str, title: str, subtitle: str = "", **kw: Any) -> None:
        n = self.nodes.setdefault(
            node_id,
            {"kind": kind, "title": title, "subtitle": subtitle, "share": None,
             "first_paused": None, "detail": {}},
        )  # fmt: skip
        if _RANK.get(kind, 0) > _RANK.get(n["kind"], 0):
            n["kind"] = kind
        if subtitle and not n["subtitle"]:
            n["subtitle"] = subtitle
        share = kw.get("share")
        if share is not None and (n["share"] is None or share > n["share"]):
            n["share"] = share
        t = kw.get("first_paused")
        if t is not None and (n["first_paused"] is None or t < n["first_paused"]):
            n["first_paused"] = t
        for k, v in (kw.get("detail") or {}).items():
            if k == "ports":
                n["detail"]["ports"] = sorted(set(n["detail"].get("ports", [])) | set(v))
            else:
                n["detail"].setdefault(k, v)

    def edge(self, source: str, target: str, kind: str, share: float | None = None) -> None:
        if source == target:
            return
        e = self.edges.setdefault(
            f"{source}->{target}",
            {"source": source, "target": target, "kind": kind, "share": share},
        )
        if share is not None and (e["share"] is None or share > e["share"]):
            e["share"] = share


# a node seen as origin stays origin whatever else lists it
_RANK = {"entity": 0, "job": 1, "end": 1, "relay": 1, "victim": 2, "host": 2, "origin": 3}


def _nic_id(name: str) -> str:
    return f"nic:{name}"


def _device_node(g: Graph, name: str, topology: Any, known_nics: set[str]) -> str:
    """The graph node of a ``device/port`` entity: the NIC itself, or the port's switch."""
    dev, _, port = name.partition("/")
    is_nic = name in known_nics or (topology is not None and dev in topology.nodes)
    if topology is not None and dev in topology.switches:
        is_nic = False
    if is_nic:
        g.node(_nic_id(name), "victim", name, "NIC")
        return _nic_id(name)
    g.node(f"switch:{dev}", "relay", dev, "switch", detail={"ports": [port]} if port else {})
    return f"switch:{dev}"


def _sender(name: str, topology: Any) -> str | None:
    """What pauses a paused entity: the device at the other end of its cable."""
    if topology is None:
        return None
    from rocewatch.core.topology import NicEnd, PortEnd

    dev, _, port = name.partition("/")
    peer = (
        topology.peer(NicEnd(dev, port))
        if dev in topology.nodes
        else topology.peer_of_port(dev, port)
    )
    if isinstance(peer, NicEnd):
        return _nic_id(f"{peer.node}/{peer.nic}")
    if isinstance(peer, PortEnd):
        return f"switch:{peer.switch}"
    return None


def graph_of(a: Alert, topology: Any = None) -> Graph:
    """The part of an incident's graph this alert gives."""
    g = Graph()
    lab, ann = a.labels, a.annotations
    kind = kind_of(a)
    ent = entity_name(lab)
    ev_shares = shares(ann.get("evidence", ""))
    mem = members(a)
    known_nics = {f"{m['node']}/{m['nic']}" for m in mem if m.get("node") and m.get("nic")}
    if lab.get("node") and lab.get("nic"):
        known_nics.add(f"{lab['node']}/{lab['nic']}")

    def jobs(entries: Iterable[dict[str, str]]) -> None:
        for m in entries:
            if m.get("job") and m.get("node"):
                job = f"job:{m['job']}"
                g.node(job, "job", m["job"], m.get("tenant", ""))
                src = _nic_id(f"{m['node']}/{m['nic']}") if m.get("nic") else f"host:{m['node']}"
                if src in g.nodes:
                    g.edge(src, job, "runs")

    if kind == "storm" and lab.get("role") == "origin":
        if lab.get("nic"):
            oid = _nic_id(ent)
            prio = {"priority": lab.get("priority", "")}
            g.node(oid, "origin", ent, "NIC: origin", share=ev_shares.get(ent),
                   first_paused=a.starts_at, detail=prio)  # fmt: skip
        else:
            oid = f"switch:{lab.get('switch', ent)}"
            ports = [p.strip() for p in ann.get("ports", lab.get("port", "")).split(",") if p]
            g.node(oid, "origin", lab.get("switch", ent), "switch: origin",
                   share=ev_shares.get(ent), first_paused=a.starts_at,
                   detail={"ports": ports, "priority": lab.get("priority", "")})  # fmt: skip
        # the evidence names the ports the origin paused directly
        for name, share in ev_shares.items():
            if name != ent and not (lab.get("switch") and name.startswith(lab["switch"] + "/")):
                tgt = _device_node(g, name, topology, known_nics)
                g.node(tgt, "victim", g.nodes[tgt]["title"], share=share, first_paused=a.starts_at)
                g.edge(oid, tgt, "pauses", share)
        jobs([lab])
        return g
    if kind == "storm":  # the victims of one storm
        origin = lab.get("origin", "unknown")
        origin_id = _nic_id(origin) if "/" in origin else f"switch:{origin}"
        if origin != "unknown":
            g.node(origin_id, "origin" if "/" in origin else "relay", origin, "origin")
        rep = ent
        names = [v.strip() for v in ann.get("victims", "").split(",") if v.strip()] or [rep]
        for name in names:
            nid = _device_node(g, name, topology, known_nics)
            g.node(nid, "victim", g.nodes[nid]["title"], share=ev_shares.get(name),
                   first_paused=a.starts_at)  # fmt: skip
            sender = _sender(name, topology)
            if sender is not None:
                if sender not in g.nodes:
                    title = sender.split(":", 1)[1]
                    g.node(sender, "relay", title, "switch" if sender[0] == "s" else "NIC")
                g.edge(sender, nid, "pauses", ev_shares.get(name))
            elif name == rep and origin != "unknown":
                g.edge(origin_id, nid, "pauses", ev_shares.get(name))  # paused it directly
        jobs(mem)
        return g
    if kind == "flaky_link":
        ends = [e.strip() for e in ann.get("cable", "").split("<->") if e.strip()]
        ids = []
        for e in ends or [ent]:
            nid = _nic_id(e) if e in known_nics else f"port:{e}"
            g.node(nid, "end", e, "NIC" if e in known_nics else "switch port")
            ids.append(nid)
        if len(ids) == 2:
            g.edge(ids[0], ids[1], "cable")
        for node in [s.strip() for s in ann.get("strands", "").split(",") if s.strip()]:
            g.node(f"host:{node}", "host", node, "stranded node")
            for nid in ids:
                if nid.startswith(f"nic:{node}/"):
                    g.edge(f"host:{node}", nid, "hosts")
        jobs([lab])
        return g
    if lab.get("node") and lab.get("nic"):
        nid = _nic_id(ent)
        g.node(nid, "origin" if kind == "straggler" else "entity", ent, "NIC")
    elif lab.get("node"):
        nid = f"host:{lab['node']}"
        g.node(nid, "host", lab["node"], "node")
    elif lab.get("switch"):
        nid = f"port:{ent}"
        g.node(nid, "entity", ent, "switch port")
    else:
        for node in [s.strip() for s in ann.get("nodes", "").split(",") if s.strip()]:
            g.node(f"host:{node}", "host", node, "node")
        return g
    jobs([lab])
    return g


# --- writing (inside the store's transactions) ----------------------------------------------
def _one(conn: Connection, q: Any) -> Any:
    return conn.execute(q.limit(1)).mappings().first()


def find_for_alert(conn: Connection, fingerprint: str, starts_at: dt.datetime) -> int | None:
    r = _one(
        conn,
        select(EVENTS.c.incident_id).where(
            EVENTS.c.ref == fingerprint,
            EVENTS.c.time == starts_at,
            EVENTS.c.kind.in_(ALERT_EVENTS),
        ),
    )
    return None if r is None else int(r["incident_id"])


def latest_with_alert(conn: Connection, fingerprint: str) -> int | None:
    r = _one(
        conn,
        select(EVENTS.c.incident_id)
        .where(EVENTS.c.ref == fingerprint, EVENTS.c.kind.in_(ALERT_EVENTS))
        .order_by(EVENTS.c.time.desc(), EVENTS.c.id.desc()),
    )
    return None if r is None else int(r["incident_id"])


INCIDENT_LOCK = 0x696E6364  # 'incd': one writer files alerts at a time on a shared PostgreSQL


def record_alerts(store: Any, conn: Connection, alerts: Iterable[Alert], now: dt.datetime) -> None:
    """File alert events under their incidents (called by ``Store.write_alerts``)."""
    if conn.dialect.name == "postgresql":
        # several sinks (one per detect instance) write at once: without the lock two of them
        # could each open an incident for one storm (SQLite serialises writers itself)
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": INCIDENT_LOCK})
    for a in sorted(alerts, key=lambda x: (x.starts_at, x.fingerprint)):
        starts = ns_to_datetime(a.starts_at)
        iid = find_for_alert(conn, a.fingerprint, starts)
        inhibited_by = a.annotations.get("inhibited_by") or ""
        kind = "firing"
        if iid is None and inhibited_by:
            iid = latest_with_alert(conn, inhibited_by)
            if iid is not None:
                kind = "inhibited"
        elif iid is not None:
            got = _one(
                conn,
                select(EVENTS.c.kind).where(
                    EVENTS.c.incident_id == iid,
                    EVENTS.c.ref == a.fingerprint,
                    EVENTS.c.time == starts,
                    EVENTS.c.kind.in_(ALERT_EVENTS),
                ),
            )
            kind = got["kind"]
        if iid is None:
            iid = _open_incident(store, conn, a, now)
        _event(store, conn, iid, starts, kind, a.fingerprint, a.annotations.get("summary", ""),
               {"alert": a.to_json()})  # fmt: skip
        if a.ends_at and kind == "firing":
            _event(store, conn, iid, ns_to_datetime(a.ends_at), "resolved", a.fingerprint,
                   a.annotations.get("summary", ""), {})  # fmt: skip
        if kind == "firing":
            merge_graph(store, conn, iid, graph_of(a, store.topology))
            _promote(conn, iid, a)
        _refresh(conn, iid, now)  # before the next alert looks for an open incident


def _open_incident(store: Any, conn: Connection, a: Alert, now: dt.datetime) -> int:
    key = incident_key(a)[:256]
    starts = ns_to_datetime(a.starts_at)
    window = ns_to_datetime(max(0, a.starts_at - JOIN_WINDOW_NS))
    r = _one(
        conn,
        select(INCIDENTS.c.id)
        .where(
            INCIDENTS.c.key == key,
            or_(INCIDENTS.c.ended_at.is_(None), INCIDENTS.c.ended_at >= window),
        )
        .order_by(INCIDENTS.c.started_at.desc()),
    )
    if r is not None:
        return int(r["id"])
    lab = a.labels
    res = conn.execute(
        INCIDENTS.insert()
        .values(
            key=key,
            kind=kind_of(a)[:32],
            title=title_of(a)[:512],
            severity=lab.get("severity", ""),
            status="open",
            started_at=starts,
            ended_at=None,
            updated_at=now,
            labels={k: v for k, v in lab.items() if k != "alertname"},
            links=[],
        )
        .returning(INCIDENTS.c.id)
    )
    iid = int(res.scalar_one())
    if kind_of(a) == "fabric":
        _link_fabric(conn, iid, a)
    return iid


def _link_fabric(conn: Connection, iid: int, a: Alert) -> None:
    """A FabricIncident names the nodes whose drains it withheld: link their incidents."""
    links = []
    for node in [s.strip() for s in a.annotations.get("nodes", "").split(",") if s.strip()]:
        r = _one(
            conn,
            select(NODES.c.incident_id)
            .where(
                or_(
                    NODES.c.node_id == f"host:{node}",
                    NODES.c.node_id.like(f"nic:{node}/%"),
                ),
                NODES.c.kind.in_(("origin", "end", "host")),
                NODES.c.incident_id != iid,
            )
            .order_by(NODES.c.incident_id.desc()),
        )
        if r is not None:
            links.append({"title": f"incident of {node}", "incident": int(r["incident_id"])})
    if links:
        conn.execute(INCIDENTS.update().where(INCIDENTS.c.id == iid).values(links=links))


def _promote(conn: Connection, iid: int, a: Alert) -> None:
    """A straggler's PCIe downgrade may come first: the Straggler alert names the incident;
    an origin names a storm first seen from its victims."""
    name, role = a.labels.get("alertname"), a.labels.get("role")
    if name == STRAGGLER or (name == PFC_STORM and role == "origin"):
        conn.execute(
            INCIDENTS.update()
            .where(INCIDENTS.c.id == iid)
            .values(
                kind=kind_of(a)[:32],
                title=title_of(a)[:512],
                severity=a.labels.get("severity", ""),
                labels={k: v for k, v in a.labels.items() if k != "alertname"},
            )
        )


def _event(
    store: Any,
    conn: Connection,
    iid: int,
    time: dt.datetime,
    kind: str,
    ref: str,
    summary: str,
    detail: dict[str, Any],
) -> None:
    ins = store._insert(EVENTS).values(
        incident_id=iid, time=time, kind=kind, ref=ref[:128], summary=summary, detail=detail
    )
    conn.execute(
        ins.on_conflict_do_update(
            index_elements=["incident_id", "kind", "ref", "time"],
            set_={"summary": ins.excluded.summary, "detail": ins.excluded.detail},
        )
    )


def merge_graph(store: Any, conn: Connection, iid: int, g: Graph) -> None:
    """Merge a graph into the incident's: nodes keep their highest share, earliest time."""
    if not g.nodes and not g.edges:
        return
    have = Graph()
    for r in conn.execute(select(NODES).where(NODES.c.incident_id == iid)).mappings():
        have.nodes[r["node_id"]] = {
            "kind": r["kind"], "title": r["title"], "subtitle": r["subtitle"],
            "share": r["share"],
            "first_paused": datetime_to_ns(r["first_paused"]) if r["first_paused"] else None,
            "detail": dict(r["detail"] or {}),
        }  # fmt: skip
    for r in conn.execute(select(EDGES).where(EDGES.c.incident_id == iid)).mappings():
        have.edges[r["edge_id"]] = {
            "source": r["source"], "target": r["target"], "kind": r["kind"], "share": r["share"]
        }  # fmt: skip
    for nid, n in g.nodes.items():
        have.node(nid, n["kind"], n["title"], n["subtitle"], share=n["share"],
                  first_paused=n["first_paused"], detail=n["detail"])  # fmt: skip
    for e in g.edges.values():
        have.edge(e["source"], e["target"], e["kind"], e["share"])
    node_rows = [
        {"incident_id": iid, "node_id": nid[:256], "kind": n["kind"], "title": n["title"][:256],
         "subtitle": n["subtitle"], "share": n["share"],
         "first_paused": ns_to_datetime(n["first_paused"]) if n["first_paused"] else None,
         "detail": n["detail"]}
        for nid, n in have.nodes.items()
    ]  # fmt: skip
    ins = store._insert(NODES)
    conn.execute(
        ins.on_conflict_do_update(
            index_elements=["incident_id", "node_id"],
            set_={c: ins.excluded[c] for c in ("kind", "title", "subtitle", "share",
                                               "first_paused", "detail")},
        ),
        node_rows,
    )  # fmt: skip
    if have.edges:
        edge_rows = [
            {"incident_id": iid, "edge_id": eid[:512], "source": e["source"][:256],
             "target": e["target"][:256], "kind": e["kind"], "share": e["share"]}
            for eid, e in have.edges.items()
        ]  # fmt: skip
        ins = store._insert(EDGES)
        conn.execute(
            ins.on_conflict_do_update(
                index_elements=["incident_id", "edge_id"],
                set_={"kind": ins.excluded.kind, "share": ins.excluded.share},
            ),
            edge_rows,
        )


def _refresh(conn: Connection, iid: int, now: dt.datetime) -> None:
    """Open while any of its (not inhibited) alerts fires; else ended when the last ended."""
    q = (
        select(ALERTS.c.ends_at)
        .select_from(
            EVENTS.join(
                ALERTS,
                and_(ALERTS.c.fingerprint == EVENTS.c.ref, ALERTS.c.starts_at == EVENTS.c.time),
            )
        )
        .where(EVENTS.c.incident_id == iid, EVENTS.c.kind == "firing")
    )
    ends = [r[0] for r in conn.execute(q)]
    if not ends:
        return
    firing = any(e is None for e in ends)
    conn.execute(
        INCIDENTS.update()
        .where(INCIDENTS.c.id == iid)
        .values(
            status="open" if firing else "resolved",
            ended_at=None if firing else max(e for e in ends if e is not None),
            updated_at=now,
        )
    )


def record_actions(store: Any, conn: Connection, actions: Iterable[Action]) -> None:
    """File each action under the incident of its alert; a drained node joins the graph."""
    for a in actions:
        iid = latest_with_alert(conn, a.alert_fingerprint)
        if iid is None:
            continue
        t = ns_to_datetime(a.time)
        _event(store, conn, iid, t, "action", f"{a.action}:{a.node}:{a.alert_fingerprint}",
               f"{a.action} {a.node}: {a.outcome}", {"action": a.to_json()})  # fmt: skip
        g = Graph()
        host = f"host:{a.node}"
        g.node(host, "host", a.node, "node")
        have = conn.execute(  # the NICs the incident blames (not its victims on that node)
            select(NODES.c.node_id).where(
                NODES.c.incident_id == iid,
                NODES.c.node_id.like(f"nic:{a.node}/%"),
                NODES.c.kind.in_(("origin", "end", "entity")),
            )
        ).scalars()
        for nic in have:
            g.edge(host, nic, "hosts")
        merge_graph(store, conn, iid, g)
        # the host's subtitle says what became of it, whatever it said before
        conn.execute(
            NODES.update()
            .where(NODES.c.incident_id == iid, NODES.c.node_id == host)
            .values(subtitle=f"{a.action}: {a.outcome}"[:500])
        )


def incident_of_node(conn: Connection, node: str) -> int | None:
    """The latest incident that acted (or waits to act) on a node."""
    r = _one(
        conn,
        select(NODES.c.incident_id)
        .where(NODES.c.node_id == f"host:{node}", NODES.c.kind == "host")
        .order_by(NODES.c.incident_id.desc()),
    )
    return None if r is None else int(r["incident_id"])


def record_command(store: Any, conn: Connection, row: dict[str, Any]) -> None:
    """File an operator command (as queued, or with its result) under its node's incident."""
    iid = incident_of_node(conn, row["node"])
    if iid is None:
        return
    result = f": {row['result']}" if row.get("result") else ""
    _event(
        store, conn, iid, ns_to_datetime(row["requested_at"]), "command", str(row["id"]),
        f"{row['command']} {row['node']} by {row['requested_by']}: {row['status']}{result}",
        {"command": row},
    )  # fmt: skip


def prune(conn: Connection, cutoff: dt.datetime) -> int:
    """Delete incidents that ended before ``cutoff``, with their timelines and graphs."""
    ids = list(
        conn.execute(
            select(INCIDENTS.c.id).where(
                INCIDENTS.c.ended_at.is_not(None), INCIDENTS.c.ended_at < cutoff
            )
        ).scalars()
    )
    for i in range(0, len(ids), 500):
        part = ids[i : i + 500]
        for t in (EVENTS, NODES, EDGES):
            conn.execute(t.delete().where(t.c.incident_id.in_(part)))
        conn.execute(INCIDENTS.delete().where(INCIDENTS.c.id.in_(part)))
    return len(ids)


# --- reading ---------------------------------------------------------------------------------
def _incident_dict(r: Any) -> dict[str, Any]:
    return {
        "id": int(r["id"]),
        "key": r["key"],
        "kind": r["kind"],
        "title": r["title"],
        "severity": r["severity"],
        "status": r["status"],
        "started_at": datetime_to_ns(r["started_at"]),
        "ended_at": datetime_to_ns(r["ended_at"]) if r["ended_at"] is not None else None,
        "labels": dict(r["labels"] or {}),
        "links": list(r["links"] or []),
    }


def list_incidents(conn: Connection, limit: int = 200) -> list[dict[str, Any]]:
    """Open incidents first, then the most recent."""
    q = select(INCIDENTS).order_by(
        (INCIDENTS.c.status == "open").desc(), INCIDENTS.c.started_at.desc(), INCIDENTS.c.id
    )
    return [_incident_dict(r) for r in conn.execute(q.limit(limit)).mappings()]


def read_incident(conn: Connection, iid: int) -> dict[str, Any] | None:
    r = _one(conn, select(INCIDENTS).where(INCIDENTS.c.id == iid))
    if r is None:
        return None
    out = _incident_dict(r)
    out["nodes"] = [
        {"id": n["node_id"], "kind": n["kind"], "title": n["title"], "subtitle": n["subtitle"],
         "share": n["share"],
         "first_paused": datetime_to_ns(n["first_paused"]) if n["first_paused"] else None,
         "detail": dict(n["detail"] or {})}
        for n in conn.execute(
            select(NODES).where(NODES.c.incident_id == iid).order_by(NODES.c.id)
        ).mappings()
    ]  # fmt: skip
    out["edges"] = [
        {"id": e["edge_id"], "source": e["source"], "target": e["target"], "kind": e["kind"],
         "share": e["share"]}
        for e in conn.execute(
            select(EDGES).where(EDGES.c.incident_id == iid).order_by(EDGES.c.id)
        ).mappings()
    ]  # fmt: skip
    out["timeline"] = [
        {"time": datetime_to_ns(e["time"]), "kind": e["kind"], "ref": e["ref"],
         "summary": e["summary"], "detail": dict(e["detail"] or {})}
        for e in conn.execute(
            select(EVENTS).where(EVENTS.c.incident_id == iid).order_by(EVENTS.c.time, EVENTS.c.id)
        ).mappings()
    ]  # fmt: skip
    return out
