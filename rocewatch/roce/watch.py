"""RoCE configuration in the stream: snapshots on telemetry time -> configuration-change events,
the current check findings (raised as ``RoCEConfigMismatch`` by
``detectors/roce_config_mismatch.py``) and, on every alert that fires, the changes seen on its
entities shortly before it.

The pipeline hands :class:`ConfigWatch` the configuration records as they arrive
(:meth:`ConfigWatch.add`: a ``nic_config.jsonl`` snapshot, or a gnmic event of
``switch_config.jsonl``; docs/formats/roce_config.md) and calls :meth:`ConfigWatch.advance` at
each step, which applies every record older than the step's end in time order:

- a NIC snapshot replaces the NIC's configuration (a value it does not say stays known);
- switch events update the switch's CONFIG_DB / OpenConfig view (gnmic's Subscribe sends what
  changed, a Get or ONCE everything); the events of one switch within ``SNAPSHOT_NS`` of each
  other are one snapshot, after which every port of the switch is rebuilt.

Each end's fields are compared with its previous snapshot (:func:`rocewatch.core.roce.diff_ends`):
one :class:`ConfigChange` per field that changed. The first snapshot of an end is its baseline,
not a change; a value that became unknown is not a change. When anything changed the fabric's
checks (``rocewatch/roce/checks.py``) run again, and their findings are what
``RoCEConfigMismatch`` raises until the configuration is fixed.

>>> from rocewatch.core.topology import Topology
>>> t = Topology.from_dict({"switches": [{"name": "leaf-0", "role": "leaf"}],
...     "nodes": [{"name": "gpu-1", "nics": [{"nic": "mlx5_0", "switch_port": "leaf-0/swp1"}]}]})
>>> w = ConfigWatch(t)
>>> w.add_nic({"timestamp": 10, "node": "gpu-1", "nic": "mlx5_0", "mtu": 9000})
>>> w.add_nic({"timestamp": 20, "node": "gpu-1", "nic": "mlx5_0", "mtu": 1500})
>>> [(c.entity, c.field, c.old, c.new) for c in w.advance(30)]
[('gpu-1/mlx5_0', 'mtu', '9000', '1500')]
"""

from __future__ import annotations

import bisect
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import orjson

from collector.roce_config.nic import parse_snapshot
from collector.roce_config.switch import SwitchConfigReader, split_path
from rocewatch.core.model import Alert
from rocewatch.core.roce import (
    NIC,
    SWITCH,
    ConfigChange,
    Gid,
    PfcWatchdog,
    RoceEnd,
    RoceFabric,
    Wred,
    diff_ends,
)
from rocewatch.core.state import Stateful
from rocewatch.core.stats import Stats
from rocewatch.core.topology import NicEnd, PortEnd, Topology
from rocewatch.roce.checks import intent_for, run_checks

log = logging.getLogger(__name__)

NIC_CONFIG = "nic_config.jsonl"
SWITCH_CONFIG = "switch_config.jsonl"
SNAPSHOT_NS = 1_000_000_000  # a switch's events this close together are one snapshot
# the checks run at most once a second of telemetry time: agents started one by one send a
# new NIC's first snapshot at every step, and a 512-NIC fabric's checks take ~25 ms
CHECK_EVERY_NS = 1_000_000_000
MAX_RECENT = 20_000  # changes kept for the look-back, at most
MAX_SHOWN = 8  # change groups an alert's annotation names at most
# annotations an alert carries (docs/formats.md section 6)
CHANGES = "config_changes"
CHANGES_JSON = "config_changes_json"


def _ts(doc: Any) -> int | None:
    v = doc.get("timestamp") if isinstance(doc, dict) else None
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.isdigit():
        return int(v)
    return None


def ago(ns: int) -> str:
    """A duration as an operator says it: '45 s', '3 min', '2 h'."""
    s = ns / 1e9
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


class ConfigWatch(Stateful):
    """Configuration snapshots -> change events, findings, alert annotations (module doc).

    ``lookback_s``: how long before an alert's start a change on its entities is named in its
    annotations. ``stats`` counts skipped records (``roce_config_skipped``)."""

    STATE_TYPES: ClassVar[tuple[type, ...]] = (RoceEnd, Wred, PfcWatchdog, Gid, ConfigChange)
    NOT_STATE: ClassVar[frozenset[str]] = frozenset({"lookback_ns", "intent", "reader"})

    def __init__(
        self, topology: Topology, lookback_s: float = 600.0, stats: Stats | None = None
    ) -> None:
        self.topology = topology
        self.stats = stats or Stats()
        self.lookback_ns = int(lookback_s * 1e9)
        self.intent = intent_for(topology)
        # records not applied yet: (ts, kind, doc), kept in time order from the first advance on
        self.pending: list[tuple[int, str, dict[str, Any]]] = []
        self.unsorted = False  # records were added since
        self.ends: dict[tuple[str, str], RoceEnd] = {}
        self.reader = SwitchConfigReader(topology)
        # the switches' CONFIG_DB as read so far (plain data: the reader's ``db``)
        self.switch_db: dict[str, dict[str, dict[str, dict[str, Any]]]] = self.reader.db
        self.recent: list[ConfigChange] = []
        # current findings of the checks (``Finding.to_dict()`` plus ``since``: the telemetry
        # time of the snapshot that made each appear)
        self.findings: list[dict[str, Any]] = []
        self.applied = 0  # records applied so far
        # the newest record applied since the checks last ran, when it changed something
        self.dirty_ts: int | None = None
        self.checked_at: int | None = None  # the step end the checks last ran at
        self.changes = 0  # change events so far

    def restored(self) -> None:
        self.reader.db = self.switch_db

    # --- input -----------------------------------------------------------------------------------
    def add_nic(self, doc: Any) -> None:
        """A ``nic_config.jsonl`` snapshot (a parsed line)."""
        self._add(NIC, doc)

    def add_switch(self, doc: Any) -> None:
        """A gnmic event of ``switch_config.jsonl``, or a list of them (a parsed line)."""
        for ev in doc if isinstance(doc, list) else [doc]:
            self._add(SWITCH, ev)

    def _add(self, kind: str, doc: Any) -> None:
        ts = _ts(doc)
        if ts is None:
            self.stats.inc("roce_config_skipped", detail=f"{kind}: no timestamp")
            return
        if self.pending and ts < self.pending[-1][0]:
            self.unsorted = True
        self.pending.append((ts, kind, doc))

    def add_lines(self, kind: str, lines: Iterable[bytes]) -> int:
        """JSON lines of ``nic_config.jsonl`` (``kind`` nic) or ``switch_config.jsonl``
        (switch); a line that is not JSON is counted and skipped. Returns the lines read."""
        n = 0
        for line in lines:
            if not line.strip():
                continue
            n += 1
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError:
                self.stats.inc("roce_config_skipped", detail=f"{kind}: bad JSON")
                continue
            if kind == NIC:
                self.add_nic(doc)
            else:
                self.add_switch(doc)
        return n

    # --- applying --------------------------------------------------------------------------------
    def advance(self, until_ns: int | None) -> list[ConfigChange]:
        """Apply every record older than ``until_ns`` (all with None), in time order; return the
        changes they made. The checks run again when anything changed or a new end appeared,
        at most once every ``CHECK_EVERY_NS`` of telemetry time (a finding's ``since`` is the
        newest record applied before they ran)."""
        changes = self._apply(until_ns)
        if self.dirty_ts is not None and (
            until_ns is None
            or self.checked_at is None
            or until_ns - self.checked_at >= CHECK_EVERY_NS
        ):
            self._check(self.dirty_ts)
            self.checked_at = until_ns if until_ns is not None else self.dirty_ts
            self.dirty_ts = None
        return changes

    def _apply(self, until_ns: int | None) -> list[ConfigChange]:
        if not self.pending:
            return []
        if self.unsorted:  # a recording's records, or late ones: time order (stable)
            self.pending.sort(key=lambda r: r[0])
            self.unsorted = False
        if until_ns is None:
            due, self.pending = self.pending, []
        else:
            if self.pending[0][0] >= until_ns:  # the common case: nothing due at this step
                return []
            cut = bisect.bisect_left(self.pending, until_ns, key=lambda r: r[0])
            due = self.pending[:cut]
            del self.pending[:cut]
        changes: list[ConfigChange] = []
        fresh = False
        open_switch: dict[str, int] = {}  # switch -> first ts of its open snapshot

        def close(dev: str) -> None:
            nonlocal fresh
            first = open_switch.pop(dev)
            last = self.reader.ts.get(dev, first)
            c, f = self._rebuild_switch(dev, last)
            changes.extend(c)
            fresh |= f

        for ts, kind, doc in due:
            self.applied += 1
            if kind == NIC:
                try:
                    end = parse_snapshot(doc)
                except ValueError:
                    self.stats.inc("roce_config_skipped", detail="nic: no node or nic")
                    continue
                c, f = self._replace(end, ts)
                changes.extend(c)
                fresh |= f
                continue
            tags = doc.get("tags") if isinstance(doc, dict) else None
            dev = self.reader._device(tags) if isinstance(tags, dict) else None
            if dev is None:
                self.stats.inc("roce_config_skipped", detail="switch: no known source")
                continue
            if dev in open_switch and ts - open_switch[dev] > SNAPSHOT_NS:
                close(dev)
            deletes = doc.get("deletes")
            if isinstance(deletes, list):
                self._delete(dev, deletes)
            if isinstance(doc.get("values"), dict) or not isinstance(deletes, list):
                skipped = sum(self.reader.skipped.values())
                self.reader.feed_event(doc)
                if sum(self.reader.skipped.values()) > skipped:
                    self.stats.inc("roce_config_skipped", detail="switch: unusable event or path")
            open_switch.setdefault(dev, ts)
        for dev in list(open_switch):
            close(dev)
        if changes or fresh:
            self.dirty_ts = max(r[0] for r in due)
        self.changes += len(changes)
        self.recent += changes
        if len(self.recent) > MAX_RECENT:
            self.recent = self.recent[-MAX_RECENT:]
        return changes

    def _delete(self, dev: str, paths: list[Any]) -> None:
        """gnmic's ``deletes`` of CONFIG_DB paths: a whole table entry (``/QUEUE/Ethernet0|3``)
        or one field of it (``/PORT_QOS_MAP/Ethernet0/pfc_enable``). A field removed changes the
        port (``pfc_enable`` gone: PFC on no priority); an entry removed leaves what it said
        unknown, so the port keeps its last known values."""
        db = self.reader.db.get(dev)
        for p in paths:
            if not isinstance(p, str) or db is None:
                continue
            elems, _ = split_path(p)
            if len(elems) < 2 or elems[0] not in db:
                continue
            table = db[elems[0]]
            whole = "/".join(elems[1:])
            if whole in table:
                del table[whole]
            elif len(elems) >= 3:
                table.get("/".join(elems[1:-1]), {}).pop(elems[-1], None)

    def _replace(self, end: RoceEnd, ts: int) -> tuple[list[ConfigChange], bool]:
        end.timestamp = ts
        key = (end.device, end.port)
        prev = self.ends.get(key)
        self.ends[key] = end
        if prev is None:
            return [], True
        end.merge(prev)  # what this snapshot does not say stays as it was
        return diff_ends(prev, end, ts), False

    def _rebuild_switch(self, dev: str, ts: int) -> tuple[list[ConfigChange], bool]:
        fab = RoceFabric()
        for end in self.reader._sonic_ends(dev) + self.reader._oc_ends(dev):
            fab.add(end)
        changes: list[ConfigChange] = []
        fresh = False
        for end in fab.ends.values():
            c, f = self._replace(end, ts)
            changes += c
            fresh |= f
        return changes, fresh

    def _check(self, ts: int) -> None:
        fab = RoceFabric(ends=dict(self.ends))
        since = {(f["check"], tuple(f["ends"]), f["severity"]): f["since"] for f in self.findings}
        out = []
        for f in run_checks(self.topology, fab, self.intent):
            d = f.to_dict()
            d["since"] = since.get((f.check, tuple(f.ends), f.severity), ts)
            out.append(d)
        self.findings = out

    # --- what others read ------------------------------------------------------------------------
    def current(self) -> Sequence[Mapping[str, Any]]:
        """The findings of the checks now (``StepContext.config_findings``)."""
        return self.findings

    def prune(self, now_ns: int) -> None:
        """Forget changes too old to be named on any alert starting from ``now_ns`` on."""
        cut = now_ns - 2 * self.lookback_ns
        if self.recent and self.recent[0].ts < cut:
            self.recent = [c for c in self.recent if c.ts >= cut]

    def entities(self, labels: Mapping[str, str]) -> tuple[set[str], set[tuple[str, str]]]:
        """What an alert is about: its devices (every port of them counts) and the cable ends
        facing its ports (only those ports of the peer devices count)."""
        devices: set[str] = set()
        peer_ports: set[tuple[str, str]] = set()
        node, nic = labels.get("node"), labels.get("nic")
        switch, port = labels.get("switch"), labels.get("port")
        if node:
            devices.add(node)
            if nic:
                p = self.topology.peer(NicEnd(node, nic))
                if isinstance(p, PortEnd):
                    peer_ports.add((p.switch, p.port))
        if switch:
            devices.add(switch)
            if port:
                p = self.topology.peer(PortEnd(switch, port))
                if isinstance(p, PortEnd):
                    peer_ports.add((p.switch, p.port))
                elif isinstance(p, NicEnd):
                    peer_ports.add((p.node, p.nic))
        return devices, peer_ports

    def changes_before(self, labels: Mapping[str, str], starts_at: int) -> list[ConfigChange]:
        """The changes on an alert's entities within the look-back before ``starts_at``."""
        devices, peer_ports = self.entities(labels)
        if not devices and not peer_ports:
            return []
        lo = starts_at - self.lookback_ns
        return [
            c
            for c in self.recent
            if lo <= c.ts <= starts_at and (c.device in devices or (c.device, c.port) in peer_ports)
        ]

    def annotate(self, events: Sequence[Alert], firing: Mapping[str, Alert]) -> int:
        """Name the configuration changes seen on its entities in the look-back on every alert
        that starts firing in ``events`` (and on its record in ``firing``, the lifecycle's, so
        its later events and final state carry them). Returns the alerts annotated."""
        n = 0
        for ev in events:
            if ev.ends_at or CHANGES in ev.annotations:
                continue
            found = self.changes_before(ev.labels, ev.starts_at)
            if not found:
                continue
            text, data = describe(found, ev.starts_at, ev.labels.get("alertname", "alert"))
            ann = {CHANGES: text, CHANGES_JSON: json.dumps(data, separators=(",", ":"))}
            ev.annotations.update(ann)
            rec = firing.get(ev.fingerprint)
            if rec is not None and rec.starts_at == ev.starts_at:
                rec.annotations.update(ann)
            n += 1
        return n


def describe(
    changes: Sequence[ConfigChange], starts_at: int, alertname: str
) -> tuple[str, list[dict[str, Any]]]:
    """Changes grouped by (device, field, old, new), newest first: one line each ("pfc on
    leaf-0 (16 ports) changed 3 -> 4, 2 min before this PFCStorm") and the same as data."""
    groups: dict[tuple[str, str, str, str], list[ConfigChange]] = {}
    for c in changes:
        groups.setdefault((c.device, c.field, c.old, c.new), []).append(c)
    ordered = sorted(groups.items(), key=lambda kv: -max(c.ts for c in kv[1]))
    lines, data = [], []
    for (device, fld, old, new), cs in ordered[:MAX_SHOWN]:
        ts = max(c.ts for c in cs)
        ports = sorted({c.port for c in cs})
        where = f"{device}/{ports[0]}" if len(ports) == 1 else f"{device} ({len(ports)} ports)"
        when = ago(starts_at - ts)
        lines.append(f"{fld} on {where} changed {old} -> {new}, {when} before this {alertname}")
        data.append(
            {
                "device": device,
                "ports": ports,
                "kind": cs[0].kind,
                "field": fld,
                "old": old,
                "new": new,
                "time": cs[0].to_json()["time"] if len(cs) == 1 else _time(ts),
                "before_s": round((starts_at - ts) / 1e9, 3),
            }
        )
    if len(ordered) > MAX_SHOWN:
        lines.append(f"and {len(ordered) - MAX_SHOWN} more changes")
    return "; ".join(lines), data


def _time(ts: int) -> str:
    from rocewatch.core.model import rfc3339

    return rfc3339(ts)


def load_recorded(watch: ConfigWatch, scenario: Path) -> int:
    """Queue a scenario directory's ``nic_config.jsonl`` and ``switch_config.jsonl`` (or their
    ``.gz``), when present; returns the lines read. Configuration is small (a snapshot per NIC
    and switch a minute): read whole, applied on telemetry time as the steps pass."""
    import gzip

    n = 0
    for name, kind in ((NIC_CONFIG, NIC), (SWITCH_CONFIG, SWITCH)):
        for p in (scenario / name, scenario / f"{name}.gz"):
            if not p.exists():
                continue
            with gzip.open(p, "rb") if p.suffix == ".gz" else p.open("rb") as fh:
                n += watch.add_lines(kind, fh)
            break
    return n
