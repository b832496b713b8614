"""Decoders for recorded and streamed JSON telemetry: gnmic events and node-agent snapshots.

Both build whole columnar batches: values are appended to plain column lists and turned into one
Polars frame per batch, so nothing per sample outlives the decode loop.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import orjson
import polars as pl

from collector.mapping import GnmiMapper, NicMapper, default_gnmi_mapper, default_nic_mapper
from collector.mapping import pcie_speed_gts as _pcie
from rocewatch.model import SAMPLE_SCHEMA, empty_samples, is_counter
from rocewatch.stats import Stats
from rocewatch.topology import Topology

_U64 = 1 << 64


class _Columns:
    __slots__ = ("device", "metric", "port", "qual", "raw", "ts", "value")

    def __init__(self) -> None:
        self.ts: list[int] = []
        self.device: list[str] = []
        self.port: list[str] = []
        self.qual: list[str] = []
        self.metric: list[str] = []
        self.value: list[float] = []
        self.raw: list[int | None] = []

    def frame(self) -> pl.DataFrame:
        if not self.ts:
            return empty_samples()
        return pl.DataFrame(
            {
                "ts": self.ts,
                "device": self.device,
                "port": self.port,
                "qual": self.qual,
                "metric": self.metric,
                "value": self.value,
                "raw": self.raw,
            },
            schema=SAMPLE_SCHEMA,
        )


def _number(v: Any, counter: bool, scale: float) -> tuple[float, int | None] | None:
    """A telemetry value -> (value, exact raw for counters); None when not numeric."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        if counter and 0 <= v < _U64:
            raw = v if scale == 1.0 else int(v * scale)
            return float(raw), raw
        return float(v) * scale, None
    if isinstance(v, float):
        if not math.isfinite(v):
            return None
        if counter and v >= 0 and v.is_integer() and v < 2.0**64:
            raw = int(v * scale)
            return float(raw), raw
        return v * scale, None
    if isinstance(v, str):
        s = v.strip()
        try:
            return _number(int(s), counter, scale)
        except ValueError:
            pass
        try:
            return _number(float(s), counter, scale)
        except ValueError:
            return None
    return None


class GnmicEventDecoder:
    """gnmic's JSON event format (docs/formats.md section 2) -> sample batches.

    Unknown switches, unknown paths and non-numeric values are counted in ``stats`` and skipped.
    """

    def __init__(
        self, topology: Topology, stats: Stats | None = None, mapper: GnmiMapper | None = None
    ) -> None:
        self.topology = topology
        self.stats = stats or Stats()
        self.mapper = mapper or default_gnmi_mapper()
        self._source_memo: dict[str, str | None] = {}
        self._paths: dict[str, tuple[str, bool, float, str | None, str | None]] = {}

    def decode_lines(self, lines: Iterable[bytes | str]) -> pl.DataFrame:
        cols = _Columns()
        for line in lines:
            if not line or (isinstance(line, (bytes, str)) and not line.strip()):
                continue
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError:
                self.stats.inc("malformed_lines", detail="switch: not JSON")
                continue
            if isinstance(doc, list):
                for ev in doc:
                    self._event(ev, cols)
            else:
                self._event(doc, cols)
        return cols.frame()

    def _event(self, ev: Any, cols: _Columns) -> None:
        st = self.stats
        if not isinstance(ev, dict):
            st.inc("malformed_events", detail="not an object")
            return
        tags = ev.get("tags") or {}
        values = ev.get("values")
        ts = ev.get("timestamp")
        if not isinstance(tags, dict) or not isinstance(values, dict) or not isinstance(ts, int):
            st.inc("malformed_events", detail="missing timestamp, tags or values")
            return
        source = tags.get("source")
        if not isinstance(source, str):
            st.inc("malformed_events", detail="no tags.source")
            return
        try:
            device = self._source_memo[source]
        except KeyError:
            device = self.topology.resolve_device(source)
            if len(self._source_memo) < 100_000:
                self._source_memo[source] = device
        if device is None:
            st.inc("unknown_source", detail=source)
            return
        tag_port = next((tags[t] for t in self.mapper.port_tags if t in tags), "")
        tag_qual = next((tags[t] for t in self.mapper.qual_tags if t in tags), "")
        paths = self._paths
        for path, v in values.items():
            try:
                metric, counter, scale, t_port, t_qual = paths[path]
            except KeyError:
                t = self.mapper.lookup(path)
                if t is None:
                    st.inc("unknown_paths", detail=path)
                    continue
                entry = (t.metric, is_counter(t.metric), t.scale, t.port, t.qual)
                if len(paths) < 100_000:
                    paths[path] = entry
                metric, counter, scale, t_port, t_qual = entry
            # the common cases inline: a counter as a decimal string or an int, scale 1
            if counter and scale == 1.0 and type(v) is str:
                try:
                    raw = int(v)
                    num: tuple[float, int | None] | None = (
                        (float(raw), raw) if 0 <= raw < _U64 else (float(raw), None)
                    )
                except ValueError:
                    num = _number(v, counter, scale)
            elif counter and scale == 1.0 and type(v) is int and 0 <= v < _U64:
                num = (float(v), v)
            else:
                num = _number(v, counter, scale)
            if num is None:
                st.inc("non_numeric_values", detail=path)
                continue
            port = t_port or tag_port
            if not port:
                st.inc("malformed_events", detail=f"no interface for {path}")
                continue
            cols.ts.append(ts)
            cols.device.append(device)
            cols.port.append(port if type(port) is str else str(port))
            q = t_qual if t_qual is not None else tag_qual
            cols.qual.append(q if type(q) is str else str(q))
            cols.metric.append(metric)
            cols.value.append(num[0])
            cols.raw.append(num[1])


class NicSnapshotDecoder:
    """Node-agent JSON lines (docs/formats.md section 3) -> sample batches."""

    SECTIONS = ("ethtool", "hw_counters", "port_counters")

    def __init__(
        self,
        topology: Topology | None = None,
        stats: Stats | None = None,
        mapper: NicMapper | None = None,
    ) -> None:
        self.topology = topology
        self.stats = stats or Stats()
        self.mapper = mapper or default_nic_mapper()
        self._names: dict[str, dict[str, tuple[str, str, float]]] = {}

    def decode_lines(self, lines: Iterable[bytes | str]) -> pl.DataFrame:
        cols = _Columns()
        for line in lines:
            if not line or not line.strip():
                continue
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError:
                self.stats.inc("malformed_lines", detail="nic: not JSON")
                continue
            self._snapshot(doc, cols)
        return cols.frame()

    def _snapshot(self, doc: Any, cols: _Columns) -> None:
        st = self.stats
        if not isinstance(doc, dict):
            st.inc("malformed_snapshots", detail="not an object")
            return
        ts, node, nic = doc.get("timestamp"), doc.get("node"), doc.get("nic")
        if not isinstance(ts, int) or not isinstance(node, str) or not isinstance(nic, str):
            st.inc("malformed_snapshots", detail="missing timestamp, node or nic")
            return
        if self.topology is not None and node not in self.topology.nodes:
            # still monitored: a node outside the topology has no peers but its own numbers count
            st.inc("unknown_node", detail=node)

        c_ts, c_dev, c_port, c_qual = cols.ts, cols.device, cols.port, cols.qual
        c_metric, c_value, c_raw = cols.metric, cols.value, cols.raw

        def put(metric: str, qual: str, num: tuple[float, int | None]) -> None:
            c_ts.append(ts)
            c_dev.append(node)
            c_port.append(nic)
            c_qual.append(qual)
            c_metric.append(metric)
            c_value.append(num[0])
            c_raw.append(num[1])

        if "speed_mbps" in doc:
            num = _number(doc["speed_mbps"], False, 1.0)
            if num is not None:
                put("nic_link_speed_mbps", "", num)
        names = self._names
        for section in self.SECTIONS:
            sec = doc.get(section)
            if sec is None:
                continue
            if not isinstance(sec, dict):
                st.inc("malformed_snapshots", detail=f"{section} is not an object")
                continue
            memo = names.setdefault(section, {})
            for name, v in sec.items():
                try:
                    metric, qual, scale = memo[name]
                except KeyError:
                    t = self.mapper.lookup(section, name)
                    if t is None:
                        continue
                    metric, qual, scale = t.metric, t.qual or "", t.scale
                    if len(memo) < 10_000:
                        memo[name] = (metric, qual, scale)
                if type(v) is int and scale == 1.0 and 0 <= v < _U64:
                    c_ts.append(ts)
                    c_dev.append(node)
                    c_port.append(nic)
                    c_qual.append(qual)
                    c_metric.append(metric)
                    c_value.append(float(v))
                    c_raw.append(v)
                    continue
                num = _number(v, True, scale)
                if num is None:
                    st.inc("non_numeric_values", detail=f"{section}.{name}")
                    continue
                put(metric, qual, num)
        mlx = doc.get("mlxlink")
        if isinstance(mlx, dict):
            for name, v in mlx.items():
                t = self.mapper.lookup("mlxlink", name)
                if t is None:
                    continue
                # a BER is a reading; an error count is cumulative (a counter)
                num = _number(v, not name.endswith("_ber"), t.scale)
                if num is None:
                    st.inc("non_numeric_values", detail=f"mlxlink.{name}")
                    continue
                put(t.metric, "", num)
        elif mlx is not None:
            st.inc("malformed_snapshots", detail="mlxlink is not an object")
        pcie = doc.get("pcie")
        if isinstance(pcie, dict):
            for name, v in pcie.items():
                t = self.mapper.lookup("pcie", name)
                if t is None:
                    continue
                val = _pcie(v) if "speed" in name else _number(v, False, 1.0)
                if isinstance(val, tuple):
                    put(t.metric, "", val)
                elif isinstance(val, float) and not math.isnan(val):
                    put(t.metric, "", (val, None))
                else:
                    st.inc("non_numeric_values", detail=f"pcie.{name}")
        elif pcie is not None:
            st.inc("malformed_snapshots", detail="pcie is not an object")
