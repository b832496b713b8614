"""NIC snapshots (docs/formats.md section 3) -> canonical sample rows, in plain Python lists.

One reading of the snapshot format for both ends: the agent's Kafka sink encodes these rows
itself (collector/nic/batch.py, no Polars on the node) and the services' decoder
(``collector.decode.NicSnapshotDecoder``) turns the same rows into a sample frame.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable
from typing import Any

import orjson

from collector.mapping import NicMapper, default_nic_mapper, pcie_speed_gts
from rocewatch.core.stats import Stats

U64 = 1 << 64
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1  # what a sample's ``ts`` (ns, Int64) can hold


class Columns:
    """Sample rows as columns of plain lists (the fields of ``core.model.SAMPLE_SCHEMA``)."""

    __slots__ = ("device", "metric", "port", "qual", "raw", "ts", "value")

    def __init__(self) -> None:
        self.ts: list[int] = []
        self.device: list[str] = []
        self.port: list[str] = []
        self.qual: list[str] = []
        self.metric: list[str] = []
        self.value: list[float] = []
        self.raw: list[int | None] = []

    def __len__(self) -> int:
        return len(self.ts)


def number(v: Any, counter: bool, scale: float) -> tuple[float, int | None] | None:
    """A telemetry value -> (value, exact raw for counters); None when not numeric."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        if counter and 0 <= v < U64:
            if scale == 1:
                raw = v
            elif float(scale).is_integer():
                # in integers: through a float, a count past 2**53 loses its last digits
                raw = v * int(scale)
            else:
                raw = int(v * scale)
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
            return number(int(s), counter, scale)
        except ValueError:
            pass
        try:
            return number(float(s), counter, scale)
        except ValueError:
            return None
    return None


class SnapshotReader:
    """Snapshot lines -> rows appended to a :class:`Columns`; malformed input is counted in
    ``stats`` and skipped. ``nodes``: the topology's node names, when there is one (a node
    outside it is counted, and still read)."""

    SECTIONS = ("ethtool", "hw_counters", "port_counters")

    def __init__(
        self,
        stats: Stats | None = None,
        mapper: NicMapper | None = None,
        nodes: Container[str] | None = None,
    ) -> None:
        self.stats = stats or Stats()
        self.mapper = mapper or default_nic_mapper()
        self.nodes = nodes
        self._names: dict[str, dict[str, tuple[str, str, float]]] = {}

    def read_lines(self, lines: Iterable[bytes | str], cols: Columns | None = None) -> Columns:
        cols = Columns() if cols is None else cols
        for line in lines:
            if not line or not line.strip():
                continue
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError:
                self.stats.inc("malformed_lines", detail="nic: not JSON")
                continue
            self.snapshot(doc, cols)
        return cols

    def snapshot(self, doc: Any, cols: Columns) -> None:
        st = self.stats
        if not isinstance(doc, dict):
            st.inc("malformed_snapshots", detail="not an object")
            return
        ts, node, nic = doc.get("timestamp"), doc.get("node"), doc.get("nic")
        if type(ts) is not int or not isinstance(node, str) or not isinstance(nic, str):
            st.inc("malformed_snapshots", detail="missing timestamp, node or nic")
            return
        if not I64_MIN <= ts <= I64_MAX:  # one such row would fail the whole batch
            st.inc("malformed_snapshots", detail="timestamp out of range")
            return
        if self.nodes is not None and node not in self.nodes:
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
            num = number(doc["speed_mbps"], False, 1.0)
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
                if type(v) is int and scale == 1.0 and 0 <= v < U64:
                    c_ts.append(ts)
                    c_dev.append(node)
                    c_port.append(nic)
                    c_qual.append(qual)
                    c_metric.append(metric)
                    c_value.append(float(v))
                    c_raw.append(v)
                    continue
                num = number(v, True, scale)
                if num is None:
                    st.inc("non_numeric_values", detail=f"{section}.{name}")
                    continue
                if num[1] is not None and num[1] >= U64:
                    # scaled past 64 bits (IB data words x 4 near their wrap): no UInt64 holds
                    # it, and one such value would fail the whole batch
                    st.inc("out_of_range_values", detail=f"{section}.{name}")
                    continue
                put(metric, qual, num)
        mlx = doc.get("mlxlink")
        if isinstance(mlx, dict):
            for name, v in mlx.items():
                t = self.mapper.lookup("mlxlink", name)
                if t is None:
                    continue
                # a BER is a reading; an error count is cumulative (a counter)
                num = number(v, not name.endswith("_ber"), t.scale)
                if num is None:
                    st.inc("non_numeric_values", detail=f"mlxlink.{name}")
                    continue
                if num[1] is not None and num[1] >= U64:
                    st.inc("out_of_range_values", detail=f"mlxlink.{name}")
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
                val = pcie_speed_gts(v) if "speed" in name else number(v, False, 1.0)
                if isinstance(val, tuple):
                    put(t.metric, "", val)
                elif isinstance(val, float) and not math.isnan(val):
                    put(t.metric, "", (val, None))
                else:
                    st.inc("non_numeric_values", detail=f"pcie.{name}")
        elif pcie is not None:
            st.inc("malformed_snapshots", detail="pcie is not an object")
