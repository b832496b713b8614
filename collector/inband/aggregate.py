"""INT report rows -> canonical samples, per switch egress port and queue, per interval.

Each interval (100 ms by default) of reports becomes, per (switch, port, queue):
``queue_peak_bytes`` (the interval's maximum occupancy: what a detector compares with the
buffer), ``int_queue_mean_bytes``, ``int_queue_p99_bytes``, ``int_hop_latency_max_ns`` and
``int_hop_latency_mean_ns``, stamped at the interval's end. The group header's Node ID names the
switch (topology ``int_node_id``), ``int_ports`` names the port, and occupancy is converted from
the switch's ``int_cell_bytes`` to bytes. A report is placed by its egress timestamp, else its
ingress timestamp, else the time its datagram was received or captured (``rx_ts``: reports need
carry no timestamp, as the specification's own example shows); one with none of them, or from an
unknown node, is counted and skipped. Sequence gaps (a ``SequenceTracker`` the parser feeds) are
counted as lost reports per switch (``int_report_loss``, detail and ``lost_by_switch`` by switch
name); late / duplicate datagrams and exporter restarts are counted too. Memory is bounded:
an interval that piles up more than ``max_open_rows`` reports before a later one arrives is
closed early (counted in ``int_interval_closed_early``; its samples then come in more than one
part, each with the interval's timestamp).
"""

from __future__ import annotations

from collections import Counter

import polars as pl

from collector.inband.sequence import SequenceTracker
from rocewatch.core.model import conform, empty_samples
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology

_METRICS = {
    "occ_max": "queue_peak_bytes",
    "occ_mean": "int_queue_mean_bytes",
    "occ_p99": "int_queue_p99_bytes",
    "lat_max": "int_hop_latency_max_ns",
    "lat_mean": "int_hop_latency_mean_ns",
}


class IntAggregator:
    """Aggregates report rows; an interval is emitted once a later interval has been seen."""

    def __init__(
        self,
        topology: Topology,
        stats: Stats,
        interval_ns: int = 100_000_000,
        max_open_rows: int = 2_000_000,
        seq: SequenceTracker | None = None,
    ) -> None:
        self.stats = stats
        # the parser feeds it (parse_buffer(seq=...)): it sees every datagram, reports or not
        self.seq = seq if seq is not None else SequenceTracker()
        self.lost_by_switch: Counter[str] = Counter()
        self._seq_counted = {"late": 0, "restarts": 0, "untracked": 0}
        self.interval_ns = interval_ns
        # rows of the newest (still open) interval are kept until a later one shows up; a flood
        # inside one interval closes it early instead of growing without bound
        self.max_open_rows = max_open_rows
        sw = topology.switches.values()
        self.nodes = pl.DataFrame(
            {
                "node_id": [s.int_node_id for s in sw if s.int_node_id is not None],
                "device": [s.name for s in sw if s.int_node_id is not None],
                "cell": [s.int_cell_bytes for s in sw if s.int_node_id is not None],
            },
            schema={"node_id": pl.UInt32, "device": pl.String, "cell": pl.Int64},
        )
        ports = [
            (s.int_node_id, pid, name)
            for s in sw
            if s.int_node_id is not None
            for pid, name in s.int_ports.items()
        ]
        self.ports = pl.DataFrame(
            {
                "node_id": [p[0] for p in ports],
                "egress_port": [p[1] for p in ports],
                "port_name": [p[2] for p in ports],
            },
            schema={"node_id": pl.UInt32, "egress_port": pl.UInt32, "port_name": pl.String},
        )
        self.names = {s.int_node_id: s.name for s in sw if s.int_node_id is not None}
        self.carry: pl.DataFrame | None = None

    def add(self, reports: pl.DataFrame, final: bool = False) -> pl.DataFrame:
        """Report rows (collector.inband.REPORT_SCHEMA) -> samples of the closed intervals."""
        self._count_loss()
        r = reports.with_columns(
            pl.coalesce(
                # a timestamp past Int64 is garbage: null, so the next one in line is used
                pl.col("egress_ts").cast(pl.Int64, strict=False),
                pl.col("ingress_ts").cast(pl.Int64, strict=False),
                pl.col("rx_ts"),
            ).alias("ts"),
            pl.col("node_id").cast(pl.UInt32),
            pl.col("egress_port").cast(pl.UInt32),
        )
        no_ts = r.filter(pl.col("ts").is_null()).height
        if no_ts:
            self.stats.inc("int_reports_without_timestamp", no_ts)
        r = r.filter(pl.col("ts").is_not_null()).join(self.nodes, on="node_id", how="left")
        unknown = r.filter(pl.col("device").is_null())
        if unknown.height:
            self.stats.inc("int_unknown_node", unknown.height, detail=str(unknown["node_id"][0]))
            r = r.filter(pl.col("device").is_not_null())
        r = r.with_columns((pl.col("ts") // self.interval_ns).alias("bucket")).select(
            "bucket",
            "device",
            "node_id",
            "egress_port",
            "queue_id",
            "cell",
            "queue_occupancy_cells",
            "hop_latency_ns",
        )
        if self.carry is not None and self.carry.height:
            r = pl.concat([self.carry, r], how="vertical")
        if r.height == 0:
            self.carry = None
            return empty_samples()
        if final or r.height > self.max_open_rows:
            if not final:
                self.stats.inc("int_interval_closed_early")
            ready, self.carry = r, None
        else:
            newest = int(r["bucket"].max())  # type: ignore[arg-type]
            ready = r.filter(pl.col("bucket") < newest)
            self.carry = r.filter(pl.col("bucket") >= newest)
        if ready.height == 0:
            return empty_samples()
        occ = pl.col("queue_occupancy_cells").cast(pl.Float64) * pl.col("cell")
        lat = pl.col("hop_latency_ns").cast(pl.Float64)
        agg = (
            ready.join(self.ports, on=["node_id", "egress_port"], how="left")
            .with_columns(
                pl.coalesce("port_name", pl.col("egress_port").cast(pl.String)).alias("port"),
                pl.col("queue_id").cast(pl.String).fill_null("").alias("qual"),
                occ.alias("occ"),
                lat.alias("lat"),
            )
            .group_by(["bucket", "device", "port", "qual"])
            .agg(
                pl.col("occ").max().alias("occ_max"),
                pl.col("occ").mean().alias("occ_mean"),
                pl.col("occ").quantile(0.99, "nearest").alias("occ_p99"),
                pl.col("lat").max().alias("lat_max"),
                pl.col("lat").mean().alias("lat_mean"),
            )
            .with_columns(((pl.col("bucket") + 1) * self.interval_ns - 1).alias("ts"))
        )
        long = agg.unpivot(
            index=["ts", "device", "port", "qual"],
            on=list(_METRICS),
            variable_name="m",
            value_name="value",
        ).filter(pl.col("value").is_not_null())
        long = long.with_columns(pl.col("m").replace_strict(_METRICS).alias("metric"))
        return conform(long.select("ts", "device", "port", "qual", "metric", "value"))

    def _count_loss(self) -> None:
        """Move the tracker's new losses (per switch) and other counts into ``stats``."""
        for (node, hw), n in sorted(self.seq.take_lost().items()):
            name = self.names.get(node, f"node-{node}")
            self.lost_by_switch[name] += n
            self.stats.inc("int_report_loss", n, detail=name if hw == 0 else f"{name}/hw{hw}")
        for name, before in self._seq_counted.items():
            now = getattr(self.seq, name)
            if now > before:
                self.stats.inc(f"int_seq_{name}", now - before)
                self._seq_counted[name] = now
