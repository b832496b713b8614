"""Switch RoCE configuration from gnmic events (``switch_config.jsonl``) into per-port
:class:`rocewatch.core.roce.RoceEnd`.

Two vocabularies, both as gnmic's event format writes them (path keys as ``<elem>_<key>`` tags,
JSON values flattened into ``<path>/<field>`` keys, the Get/Subscribe prefix target as tag
``target``):

- **SONiC CONFIG_DB** as SONiC's gNMI server serves it (target ``CONFIG_DB``, a path per table
  entry: ``/PORT_QOS_MAP/Ethernet0/pfc_enable``): ``PORT`` (``mtu``), ``PORT_QOS_MAP``
  (``dscp_to_tc_map``, ``dot1p_to_tc_map``, ``tc_to_pg_map``, ``tc_to_queue_map``,
  ``pfc_enable``; the ``global`` entry's map applies to every port), ``DSCP_TO_TC_MAP``,
  ``TC_TO_PRIORITY_GROUP_MAP``, ``TC_TO_QUEUE_MAP``, ``QUEUE`` (``<ports>|<queue or range>``:
  ``wred_profile``, ``scheduler``), ``WRED_PROFILE`` (``green_min_threshold``,
  ``green_max_threshold``, ``ecn``), ``SCHEDULER`` (``type`` STRICT/DWRR/WRR, ``weight``) and
  ``PFC_WD`` (``action``, ``detection_time``, ``restoration_time`` in ms). References are accepted
  bare (``AZURE``) and in the older bracket form (``[DSCP_TO_TC_MAP|AZURE]``).
- **OpenConfig** (openconfig-interfaces, openconfig-qos): ``/interfaces/interface/config/mtu``,
  ``/qos/queue-management-profiles/queue-management-profile/{wred,red}/uniform/config/
  {min-threshold,max-threshold,enable-ecn}``, the profile of each egress queue
  (``/qos/interfaces/interface/output/queues/queue/config/queue-management-profile``, or
  ``/qos/queues/queue/config/queue-management-profile`` for every port), classifier terms
  (``.../conditions/ipv4/config/dscp`` or ``dscp-set`` -> ``.../actions/config/target-group`` ->
  ``/qos/forwarding-groups/forwarding-group/config/output-queue``) and scheduler policies
  (``.../schedulers/scheduler/config/priority`` STRICT, ``inputs/input/config/{queue,weight}``).
  OpenConfig QoS has no PFC or trust leaves: those stay unknown from this source.

Lines that are not JSON, events without a resolvable source and values that do not parse are
counted (``skipped``) and skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from rocewatch.core.roce import SWITCH, PfcWatchdog, RoceEnd, RoceFabric, Wred
from rocewatch.core.topology import Topology

_KEY_RE = re.compile(r"\[([^=\]]+)=([^\]]*)\]")


def split_path(path: str) -> tuple[list[str], dict[str, str]]:
    """'/a/b[k=v/1]/c' -> (['a', 'b', 'c'], {'b_k': 'v/1'}); origin and module prefixes dropped."""
    if not path.startswith("/") and ":/" in path:
        path = path.split(":/", 1)[1]
    if "[" not in path and ":" not in path:  # what gnmic writes: keys are in the tags
        return [e for e in path.split("/") if e], {}
    elems: list[str] = []
    keys: dict[str, str] = {}
    buf, depth = "", 0
    for ch in path:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "/" and depth == 0:
            if buf:
                elems.append(buf)
            buf = ""
        else:
            buf += ch
    if buf:
        elems.append(buf)
    out = []
    for e in elems:
        name = e.split("[", 1)[0]
        name = name.rsplit(":", 1)[-1] if ":" in name else name
        for k, v in _KEY_RE.findall(e):
            keys[f"{name}_{k}"] = v
        out.append(name)
    return out, keys


def _int(v: Any) -> int | None:
    if isinstance(v, str):
        if v.isdigit():  # CONFIG_DB's values: the common case, fast
            return int(v)
        try:
            return int(v.strip(), 0)
        except ValueError:
            pass
        try:
            f = float(v)
        except ValueError:
            return None
        return int(f) if f.is_integer() else None
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def _bool(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false", "enable", "disable"):
        return v.lower() in ("true", "enable")
    return None


def _ref(v: str) -> str:
    """'[DSCP_TO_TC_MAP|AZURE]' or 'AZURE' -> 'AZURE'."""
    v = v.strip()
    if v.startswith("[") and v.endswith("]"):
        v = v[1:-1]
    return v.split("|", 1)[1] if "|" in v else v


def _int_map(entry: dict[str, Any] | None) -> dict[int, int] | None:
    if entry is None:
        return None
    out = {}
    for k, v in entry.items():
        a, b = _int(k), _int(v)
        if a is not None and b is not None:
            out[a] = b
    return out


def _queues(spec: str) -> list[int]:
    """SONiC queue keys: '3', '3-4'."""
    a, _, b = spec.partition("-")
    lo, hi = _int(a), _int(b) if b else _int(a)
    if lo is None or hi is None or hi < lo or hi - lo > 64:
        return []
    return list(range(lo, hi + 1))


@dataclass
class _Oc:
    mtu: dict[str, int] = field(default_factory=dict)
    profiles: dict[str, Wred] = field(default_factory=dict)
    queue_profile: dict[tuple[str, str], str | None] = field(default_factory=dict)
    global_queue_profile: dict[str, str | None] = field(default_factory=dict)
    queue_id: dict[str, int] = field(default_factory=dict)
    terms: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    fg_queue: dict[str, str] = field(default_factory=dict)
    sched_strict: dict[tuple[str, str], bool] = field(default_factory=dict)
    sched_inputs: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    ports: set[str] = field(default_factory=set)


class SwitchConfigReader:
    """Accumulates configuration events per switch; :meth:`ends` builds the per-port view."""

    def __init__(self, topology: Topology | None = None) -> None:
        self.topology = topology
        self.db: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
        self.oc: dict[str, _Oc] = {}
        self.ts: dict[str, int] = {}
        self.skipped: dict[str, int] = {}

    def _skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    # --- input ---------------------------------------------------------------------------------
    def feed_lines(self, lines: Iterable[bytes | str]) -> None:
        for line in lines:
            if isinstance(line, str):
                line = line.encode()
            if not line.strip():
                continue
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError:
                self._skip("bad_json")
                continue
            for ev in doc if isinstance(doc, list) else [doc]:
                self.feed_event(ev)

    def _device(self, tags: dict[str, Any]) -> str | None:
        src = tags.get("source")
        if not isinstance(src, str) or not src:
            return None
        if self.topology is not None:
            return self.topology.resolve_device(src)
        return src.rsplit(":", 1)[0] if src.count(":") == 1 else src

    def feed_event(self, ev: Any) -> None:
        if not isinstance(ev, dict) or not isinstance(ev.get("values"), dict):
            self._skip("not_an_event")
            return
        tags = ev.get("tags") if isinstance(ev.get("tags"), dict) else {}
        assert isinstance(tags, dict)
        dev = self._device(tags)
        if dev is None:
            self._skip("unknown_source")
            return
        ts = _int(ev.get("timestamp"))
        if ts is not None:
            self.ts[dev] = max(self.ts.get(dev, 0), ts)
        config_db = tags.get("target") == "CONFIG_DB"
        for path, value in ev["values"].items():
            if not isinstance(path, str):
                continue
            elems, keys = split_path(path)
            if not elems:
                continue
            if elems[0] in ("interfaces", "qos"):
                self._openconfig(dev, elems, {**tags, **keys}, value)
            elif config_db or (elems[0].isupper() and len(elems) >= 3):
                if len(elems) < 3:
                    self._skip("config_db_path")
                    continue
                table, key, fld = elems[0], "/".join(elems[1:-1]), elems[-1]
                self.db.setdefault(dev, {}).setdefault(table, {}).setdefault(key, {})[fld] = value
            else:
                self._skip("unknown_path")

    def _openconfig(self, dev: str, el: list[str], tags: dict[str, Any], value: Any) -> None:
        oc = self.oc.setdefault(dev, _Oc())
        # a state leaf says what the device applied, the config leaf what was asked: either will do
        el = ["config" if e == "state" else e for e in el]
        leaf = el[-1]
        p = "/".join(el)
        if p == "interfaces/interface/config/mtu" or p == "interfaces/interface/state/mtu":
            port, mtu = tags.get("interface_name"), _int(value)
            if isinstance(port, str) and mtu is not None:
                oc.mtu[port] = mtu
                oc.ports.add(port)
            else:
                self._skip("bad_value")
            return
        if p.startswith("qos/queue-management-profiles/queue-management-profile/"):
            name = tags.get("queue-management-profile_name")
            if not isinstance(name, str) or "uniform" not in el or "config" not in el:
                return
            w = oc.profiles.setdefault(name, Wred(profile=name))
            if leaf == "min-threshold":
                w.min_bytes = _int(value)
            elif leaf == "max-threshold":
                w.max_bytes = _int(value)
            elif leaf == "enable-ecn":
                w.ecn = _bool(value)
            return
        if p == "qos/interfaces/interface/output/queues/queue/config/queue-management-profile":
            port, q = tags.get("interface_interface-id"), tags.get("queue_name")
            if isinstance(port, str) and isinstance(q, str):
                oc.queue_profile[(port, q)] = value if isinstance(value, str) and value else None
                oc.ports.add(port)
            return
        if p == "qos/interfaces/interface/output/queues/queue/config/name":
            port, q = tags.get("interface_interface-id"), tags.get("queue_name")
            if isinstance(port, str) and isinstance(q, str):
                oc.queue_profile.setdefault((port, q), None)
                oc.ports.add(port)
            return
        if p.startswith("qos/queues/queue/config/"):
            q = tags.get("queue_name")
            if not isinstance(q, str):
                return
            if leaf == "queue-management-profile":
                oc.global_queue_profile[q] = value if isinstance(value, str) and value else None
            elif leaf == "queue-id" and _int(value) is not None:
                oc.queue_id[q] = _int(value)  # type: ignore[assignment]
            elif leaf == "name":
                oc.global_queue_profile.setdefault(q, None)
            return
        if p.startswith("qos/classifiers/classifier/terms/term/"):
            key = (str(tags.get("classifier_name")), str(tags.get("term_id")))
            t = oc.terms.setdefault(key, {})
            if leaf in ("dscp", "dscp-set") and "conditions" in el:
                vals = value if isinstance(value, list) else str(value).split(",")
                t.setdefault("dscp", []).extend(d for v in vals if (d := _int(v)) is not None)
            elif leaf == "target-group":
                t["group"] = str(value)
            return
        if p == "qos/forwarding-groups/forwarding-group/config/output-queue":
            fg = tags.get("forwarding-group_name")
            if isinstance(fg, str):
                oc.fg_queue[fg] = str(value)
            return
        if p.startswith("qos/scheduler-policies/scheduler-policy/schedulers/scheduler/"):
            pol, seq = str(tags.get("scheduler-policy_name")), str(tags.get("scheduler_sequence"))
            if "inputs" in el:
                inp = oc.sched_inputs.setdefault((pol, seq, str(tags.get("input_id"))), {})
                if leaf in ("queue", "weight"):
                    inp[leaf] = value
            elif leaf == "priority":
                oc.sched_strict[(pol, seq)] = str(value).upper().endswith("STRICT")
            return
        if p.startswith("qos/interfaces/interface/"):
            port = tags.get("interface_interface-id")
            if isinstance(port, str):
                oc.ports.add(port)

    # --- output --------------------------------------------------------------------------------
    def fabric(self, into: RoceFabric | None = None) -> RoceFabric:
        fab = into if into is not None else RoceFabric()
        for dev in sorted(set(self.db) | set(self.oc)):
            for end in self._sonic_ends(dev) + self._oc_ends(dev):
                fab.add(end)
        for reason, n in self.skipped.items():
            fab.skip(f"switch_config:{reason}", n)
        return fab

    def ends(self) -> list[RoceEnd]:
        return list(self.fabric().ends.values())

    def _sonic_ends(self, dev: str) -> list[RoceEnd]:
        db = self.db.get(dev)
        if not db:
            return []
        ts = self.ts.get(dev)
        t = lambda name: db.get(name, {})  # noqa: E731
        maps: dict[tuple[str, str], dict[int, int] | None] = {}

        def int_map(table: str, ref: Any) -> dict[int, int] | None:
            key = (table, _ref(str(ref)))
            if key not in maps:
                maps[key] = _int_map(t(table).get(key[1]))
            m = maps[key]
            return dict(m) if m is not None else None

        # older qos templates key one entry by a comma-separated port list (orchagent splits it)
        qos_map: dict[str, dict[str, Any]] = {}
        for key, entry in t("PORT_QOS_MAP").items():
            for port in key.split(","):
                qos_map.setdefault(port, {}).update(entry)
        glob = qos_map.get("global", {})
        queues: dict[str, dict[int, dict[str, Any]]] = {}
        for key, entry in t("QUEUE").items():
            plist, _, qspec = key.rpartition("|")
            for port in plist.split(","):
                for q in _queues(qspec):
                    queues.setdefault(port, {})[q] = entry
        ports = set(t("PORT")) | {p for p in qos_map if p != "global"} | set(queues)
        ports |= {p for p in t("PFC_WD") if p.upper() != "GLOBAL"}
        out = []
        for port in sorted(ports):
            end = RoceEnd(kind=SWITCH, device=dev, port=port, source="CONFIG_DB", timestamp=ts)
            end.mtu = _int(t("PORT").get(port, {}).get("mtu"))
            pm = qos_map.get(port)
            if pm is not None or glob:
                pm = pm or {}
                dscp_ref = pm.get("dscp_to_tc_map") or glob.get("dscp_to_tc_map")
                if dscp_ref:
                    end.trust = "dscp"
                    end.dscp_to_prio = int_map("DSCP_TO_TC_MAP", dscp_ref)
                elif pm.get("dot1p_to_tc_map"):
                    end.trust = "pcp"
                for fld, attr, table in (
                    ("tc_to_pg_map", "prio_to_pg", "TC_TO_PRIORITY_GROUP_MAP"),
                    ("tc_to_queue_map", "prio_to_tc", "TC_TO_QUEUE_MAP"),
                ):
                    ref = pm.get(fld) or glob.get(fld)
                    if ref:
                        setattr(end, attr, int_map(table, ref))
            if port in qos_map:
                raw = str(qos_map[port].get("pfc_enable", ""))
                end.pfc = frozenset(p for s in raw.split(",") if (p := _int(s)) is not None)
            if port in queues:
                end.wred, end.tc_tsa, end.tc_bw = {}, {}, {}
                for q, entry in queues[port].items():
                    prof = entry.get("wred_profile")
                    if not prof:
                        end.wred[q] = Wred(ecn=False)
                    elif (wp := t("WRED_PROFILE").get(_ref(str(prof)))) is not None:
                        ecn = str(wp.get("ecn", "ecn_none")).lower()
                        end.wred[q] = Wred(
                            min_bytes=_int(wp.get("green_min_threshold")),
                            max_bytes=_int(wp.get("green_max_threshold")),
                            ecn=ecn not in ("ecn_none", ""),
                            profile=_ref(str(prof)),
                        )
                    sch = entry.get("scheduler")
                    if sch and (se := t("SCHEDULER").get(_ref(str(sch)))) is not None:
                        kind = str(se.get("type", "")).upper()
                        end.tc_tsa[q] = "strict" if kind == "STRICT" else "ets"
                        w = _int(se.get("weight"))
                        if w is not None:
                            end.tc_bw[q] = w
            wd = t("PFC_WD").get(port)
            if wd is None and t("PFC_WD"):
                end.pfc_watchdog = PfcWatchdog(action="off")  # the table is read: none here
            elif wd is not None:
                end.pfc_watchdog = PfcWatchdog(
                    action=str(wd["action"]) if "action" in wd else None,
                    detection_ms=_int(wd.get("detection_time")),
                    restoration_ms=_int(wd.get("restoration_time")),
                )
            out.append(end)
        return out

    def _oc_ends(self, dev: str) -> list[RoceEnd]:
        oc = self.oc.get(dev)
        if oc is None:
            return []
        ts = self.ts.get(dev)

        def qnum(q: str) -> int | None:
            return oc.queue_id.get(q, _int(q))

        dscp: dict[int, int] = {}
        for term in oc.terms.values():
            q = oc.fg_queue.get(term.get("group", ""))
            n = qnum(q) if q is not None else None
            if n is not None:
                for d in term.get("dscp", []):
                    dscp[d] = n
        tsa: dict[int, str] = {}
        bw: dict[int, int] = {}
        for (pol, seq, _), inp in oc.sched_inputs.items():
            n = qnum(str(inp.get("queue"))) if "queue" in inp else None
            if n is None:
                continue
            strict = oc.sched_strict.get((pol, seq))
            if strict is not None:
                tsa[n] = "strict" if strict else "ets"
            w = _int(inp.get("weight"))
            if w is not None and not strict:
                bw[n] = w
        out = []
        for port in sorted(oc.ports):
            end = RoceEnd(kind=SWITCH, device=dev, port=port, source="openconfig", timestamp=ts)
            end.mtu = oc.mtu.get(port)
            if dscp:
                end.dscp_to_prio = dict(dscp)
                end.prio_to_tc = {q: q for q in set(dscp.values())}
            if tsa:
                end.tc_tsa = dict(tsa)
            if bw:
                end.tc_bw = dict(bw)
            profs = {q: p for (pt, q), p in oc.queue_profile.items() if pt == port}
            for q, p in oc.global_queue_profile.items():
                profs.setdefault(q, p)
            if profs:
                end.wred = {}
                for q, p in profs.items():
                    n = qnum(q)
                    if n is None:
                        continue
                    if p is None:
                        end.wred[n] = Wred(ecn=False)
                    elif p in oc.profiles:
                        end.wred[n] = oc.profiles[p]
            out.append(end)
        return out
