"""Decoders for recorded and streamed JSON telemetry: gnmic events and node-agent snapshots.

Both build whole columnar batches: values are appended to plain column lists and turned into one
Polars frame per batch, so nothing per sample outlives the decode loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
import polars as pl

from collector.mapping import GnmiMapper, NicMapper, default_gnmi_mapper
from collector.nic.samples import I64_MAX as _I64_MAX
from collector.nic.samples import I64_MIN as _I64_MIN
from collector.nic.samples import U64 as _U64
from collector.nic.samples import Columns, SnapshotReader, number
from rocewatch.core.model import SAMPLE_SCHEMA, empty_samples, is_counter
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology


class _Columns(Columns):
    __slots__ = ()

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


_number = number  # the gNMI decoder reads values as the NIC snapshot reader does


class GnmicEventDecoder:
    """gnmic's JSON event format (docs/formats.md section 2) -> sample batches.

    Unknown switches, unknown paths, non-numeric values, timestamps outside 64 bits (signed) and
    counters scaled past 64 bits are counted in ``stats`` and skipped.
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
        if not isinstance(tags, dict) or not isinstance(values, dict) or type(ts) is not int:
            st.inc("malformed_events", detail="missing timestamp, tags or values")
            return
        if not _I64_MIN <= ts <= _I64_MAX:  # one such row would fail the whole batch's frame
            st.inc("malformed_events", detail="timestamp out of range")
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
            if num[1] is not None and num[1] >= _U64:
                # a counter scaled past 64 bits (a mapping's scale > 1): the batch's UInt64
                # column cannot hold it, and one such value would fail every event's batch
                st.inc("out_of_range_values", detail=path)
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


class NicSnapshotDecoder(SnapshotReader):
    """Node-agent JSON lines (docs/formats.md section 3) -> sample batches (rows read by
    ``collector.nic.samples.SnapshotReader``, which the agent uses without Polars)."""

    def __init__(
        self,
        topology: Topology | None = None,
        stats: Stats | None = None,
        mapper: NicMapper | None = None,
    ) -> None:
        super().__init__(stats, mapper, topology.nodes if topology is not None else None)
        self.topology = topology

    def decode_lines(self, lines: Iterable[bytes | str]) -> pl.DataFrame:
        cols = _Columns()
        self.read_lines(lines, cols)
        return cols.frame()
