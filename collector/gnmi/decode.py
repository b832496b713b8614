"""gNMI notifications -> columnar sample batches, through the vendor mapping table.

The hot path does no per-update dict or path string work: a notification's prefix and each
update's path are memoised on their serialised bytes (a switch sends the same few hundred paths
every interval), so decoding one update is one bytes key, one dict lookup, one oneof test and
seven list appends. Unknown paths are counted per path and skipped; LLDP neighbour leaves go to
an ``LldpTable`` instead of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
import polars as pl

from collector.decode import _U64, _Columns, _number
from collector.gnmi.paths import flatten
from collector.mapping import GnmiMapper, default_gnmi_mapper
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import is_counter
from rocewatch.core.stats import Stats

_MEMO_MAX = 200_000
# entry kinds
METRIC, LLDP, SKIP = 0, 1, 2
LLDP_ROOT = "/lldp/interfaces/interface/neighbors/neighbor"


@dataclass
class LldpTable:
    """LLDP neighbours seen over gNMI: (device, local port) -> {leaf: value} per neighbour id."""

    rows: dict[tuple[str, str], dict[str, dict[str, str]]] = field(default_factory=dict)

    def put(self, device: str, port: str, neighbor: str, leaf: str, value: str) -> None:
        self.rows.setdefault((device, port), {}).setdefault(neighbor, {})[leaf] = value

    def neighbours(self) -> dict[tuple[str, str], tuple[str, str]]:
        """(device, port) -> (remote system name, remote port id), one neighbour per port."""
        out: dict[tuple[str, str], tuple[str, str]] = {}
        for key, by_id in self.rows.items():
            for leaves in by_id.values():
                name = leaves.get("system-name", "")
                port = leaves.get("port-id", "") or leaves.get("port-description", "")
                if name and port:
                    out[key] = (name, port)
                    break
        return out


class _Prefix:
    __slots__ = ("leaves", "names", "port", "qual", "tags")

    def __init__(self, names: str, tags: dict[str, str], port: str, qual: str) -> None:
        self.names = names
        self.tags = tags
        self.port = port
        self.qual = qual
        self.leaves: dict[bytes, tuple[Any, ...]] = {}


def typed_value(tv: Any) -> Any:
    """A gnmi.TypedValue -> int, float, str, bool or a decoded JSON value (None if empty)."""
    w = tv.WhichOneof("value")
    if w is None:
        return None
    v = getattr(tv, w)
    if w in ("json_val", "json_ietf_val"):
        try:
            return orjson.loads(v)
        except orjson.JSONDecodeError:
            return None
    if w == "decimal_val":
        # precision is a uint32 from the target: 10**4e9 would never finish, and past 400 any
        # int64 of digits is 0.0 anyway
        return v.digits / 10 ** min(v.precision, 400)
    if w == "bytes_val":
        return None
    if w == "leaflist_val":
        return [typed_value(e) for e in v.element]
    if w in ("any_val", "proto_bytes"):
        return None
    return v


class NotificationDecoder:
    """Decodes SubscribeResponses of any number of targets into one columnar batch at a time.

    ``add(device, response)`` appends the response's updates; ``take()`` returns the batch so
    far as a SAMPLE_SCHEMA frame and starts a new one. Counts go to ``stats``:
    ``gnmi_unknown_paths`` (detail: the path), ``gnmi_non_numeric_values``, ``gnmi_deletes``,
    ``gnmi_no_interface``, ``gnmi_out_of_range_values`` (a counter scaled past 64 bits),
    ``gnmi_bad_paths`` (an element path that cannot be read).
    """

    def __init__(
        self,
        stats: Stats | None = None,
        mapper: GnmiMapper | None = None,
        lldp: LldpTable | None = None,
    ) -> None:
        self.stats = stats or Stats()
        self.mapper = mapper or default_gnmi_mapper()
        self.lldp = lldp if lldp is not None else LldpTable()
        self._prefixes: dict[bytes, _Prefix] = {}
        self._cols = _Columns()
        self.updates = 0  # every update seen, mapped or not

    # --- memo ----------------------------------------------------------------------------------
    def _prefix(self, key: bytes, prefix: Any) -> _Prefix:
        names, tags = flatten(prefix, None) if key else ("", {})
        if names == "/":
            names = ""
        pt, qt = self.mapper.port_tags, self.mapper.qual_tags
        p = _Prefix(
            names,
            tags,
            next((tags[t] for t in pt if t in tags), ""),
            next((tags[t] for t in qt if t in tags), ""),
        )
        if len(self._prefixes) < _MEMO_MAX:
            self._prefixes[key] = p
        return p

    def _leaf(self, pfx: _Prefix, key: bytes, path: Any) -> tuple[Any, ...]:
        rest, tags = flatten(None, path, pfx.tags)
        full = pfx.names + rest if rest != "/" else pfx.names or "/"
        entry: tuple[Any, ...]
        if full.startswith(LLDP_ROOT + "/"):
            leaf = full.rsplit("/", 1)[1]
            entry = (LLDP, tags.get("interface_name", ""), tags.get("neighbor_id", ""), leaf)
        else:
            t = self.mapper.lookup(full)
            if t is None:
                entry = (SKIP, full)
            else:
                pt, qt = self.mapper.port_tags, self.mapper.qual_tags
                port = t.port or next((tags[x] for x in pt if x in tags), "")
                qual = (
                    t.qual if t.qual is not None else next((tags[x] for x in qt if x in tags), "")
                )
                entry = (METRIC, t.metric, is_counter(t.metric), t.scale, port, qual, full)
        if len(pfx.leaves) < _MEMO_MAX:
            pfx.leaves[key] = entry
        return entry

    # --- decoding -----------------------------------------------------------------------------
    def add(self, device: str, resp: Any, now_ns: int = 0) -> int:
        """Append one SubscribeResponse's updates for ``device``; returns the updates seen."""
        if resp.WhichOneof("response") != "update":
            return 0
        return self.add_notification(device, resp.update, now_ns)

    def add_notification(self, device: str, notif: Any, now_ns: int = 0) -> int:
        st = self.stats
        ts = notif.timestamp or now_ns
        pkey = notif.prefix.SerializeToString() if notif.HasField("prefix") else b""
        pfx = self._prefixes.get(pkey)
        if pfx is None:
            try:
                pfx = self._prefix(pkey, notif.prefix)
            except ConfigError as bad:  # an element path it cannot read: its updates go
                st.inc("gnmi_bad_paths", len(notif.update), detail=str(bad)[:200])
                self.updates += len(notif.update)
                return len(notif.update)
        leaves = pfx.leaves
        c = self._cols
        c_ts, c_dev, c_port, c_qual = c.ts, c.device, c.port, c.qual
        c_metric, c_value, c_raw = c.metric, c.value, c.raw
        n = 0
        for u in notif.update:
            n += 1
            path = u.path
            key = path.SerializeToString()
            e = leaves.get(key)
            if e is None:
                try:
                    e = self._leaf(pfx, key, path)
                except ConfigError as err:  # a malformed element path ('a[k=v'): this update
                    st.inc("gnmi_bad_paths", detail=str(err)[:200])
                    continue
            if e[0] != METRIC:
                if e[0] == LLDP:
                    v = typed_value(u.val)
                    self.lldp.put(device, e[1], e[2], e[3], "" if v is None else str(v))
                else:
                    st.inc("gnmi_unknown_paths", detail=e[1])
                continue
            _, metric, counter, scale, port, qual, full = e
            tv = u.val
            w = tv.WhichOneof("value")
            if w == "uint_val" and scale == 1.0:
                v = tv.uint_val
                value, raw = float(v), (v if counter else None)
            else:
                num = _number(typed_value(tv) if w else None, counter, scale)
                if num is None:
                    st.inc("gnmi_non_numeric_values", detail=full)
                    continue
                value, raw = num
                if raw is not None and raw >= _U64:
                    # scaled past 64 bits (a mapping's scale > 1): the batch's UInt64 column
                    # cannot hold it, and one such value would fail everyone's batch
                    st.inc("gnmi_out_of_range_values", detail=full)
                    continue
            if not port:
                st.inc("gnmi_no_interface", detail=full)
                continue
            c_ts.append(ts)
            c_dev.append(device)
            c_port.append(port)
            c_qual.append(qual)
            c_metric.append(metric)
            c_value.append(value)
            c_raw.append(raw)
        if len(notif.delete):
            st.inc("gnmi_deletes", len(notif.delete))
        self.updates += n
        return n

    def pending(self) -> int:
        return len(self._cols.ts)

    def take(self) -> pl.DataFrame:
        """The batch decoded since the last ``take`` (a SAMPLE_SCHEMA frame)."""
        cols, self._cols = self._cols, _Columns()
        return cols.frame()


def notification_events(
    source: str, subscription: str, notif: Any, now_ns: int = 0
) -> list[dict[str, Any]]:
    """gnmic "event" objects (docs/formats.md section 2) for one notification.

    Updates whose paths carry the same keys share one event, as gnmic groups them; LLDP strings
    and other non-numeric values are written as they came.
    """
    ts = notif.timestamp or now_ns
    base = {"source": source, "subscription-name": subscription}
    prefix = notif.prefix if notif.HasField("prefix") else None
    by_tags: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for u in notif.update:
        try:
            full, tags = flatten(prefix, u.path)
        except ConfigError:  # a malformed element path: counted by the decoder (gnmi_bad_paths)
            continue
        key = tuple(sorted(tags.items()))
        ev = by_tags.get(key)
        if ev is None:
            ev = by_tags[key] = {
                "name": subscription,
                "timestamp": ts,
                "tags": {**base, **tags},
                "values": {},
            }
        ev["values"][full] = typed_value(u.val)
    return list(by_tags.values())
