"""The telemetry model every part shares: columnar sample batches, canonical metrics, alerts.

A batch of samples is a Polars DataFrame with the columns of ``SAMPLE_SCHEMA``; one row is one
reading of one metric of one entity at one instant. Entities are a switch port (``device`` is the
switch, ``port`` its interface) or a NIC (``device`` is the node, ``port`` the RDMA device);
``qual`` narrows a port to a PFC priority or an egress queue and is ``""`` otherwise.
Cumulative counters carry their exact unsigned value in ``raw`` (so 64-bit wraps can be told
from resets) as well as ``value``; gauges leave ``raw`` null.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import polars as pl

SAMPLE_SCHEMA: dict[str, pl.DataType] = {
    "ts": pl.Int64(),
    "device": pl.String(),
    "port": pl.String(),
    "qual": pl.String(),
    "metric": pl.String(),
    "value": pl.Float64(),
    "raw": pl.UInt64(),
}
SERIES_KEY = ["device", "port", "qual", "metric"]


def empty_samples() -> pl.DataFrame:
    return pl.DataFrame(schema=SAMPLE_SCHEMA)


def conform(df: pl.DataFrame) -> pl.DataFrame:
    """Cast and order a frame's columns to SAMPLE_SCHEMA (missing ``raw`` becomes null)."""
    if "raw" not in df.columns:
        df = df.with_columns(pl.lit(None, dtype=pl.UInt64).alias("raw"))
    if "qual" not in df.columns:
        df = df.with_columns(pl.lit("").alias("qual"))
    return df.select([pl.col(c).cast(t) for c, t in SAMPLE_SCHEMA.items()])


class Kind(StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"


class Scope(StrEnum):
    PORT = "port"  # switch interface
    PRIORITY = "priority"  # switch interface + PFC priority
    QUEUE = "queue"  # switch interface + egress queue
    NIC = "nic"  # RDMA device on a node
    NIC_PRIORITY = "nic_priority"
    RANK = "rank"  # an NCCL rank: device the host, port "rank<r>" (or the GPU), qual the comm


@dataclass(frozen=True)
class MetricDef:
    name: str
    kind: Kind
    scope: Scope
    unit: str
    help: str


def _m(name: str, kind: str, scope: str, unit: str, help: str) -> MetricDef:
    return MetricDef(name, Kind(kind), Scope(scope), unit, help)


# One canonical name per meaning, whatever the vendor calls it (collector/mappings/*.yaml).
METRICS: dict[str, MetricDef] = {
    m.name: m
    for m in [
        _m("port_in_fcs_errors", "counter", "port", "frames", "FCS/CRC errored frames received"),
        _m("port_in_errors", "counter", "port", "frames", "input errors"),
        _m("port_in_discards", "counter", "port", "frames", "input discards"),
        _m("port_carrier_transitions", "counter", "port", "events", "link up/down transitions"),
        _m("port_in_octets", "counter", "port", "bytes", "bytes received"),
        _m("port_out_octets", "counter", "port", "bytes", "bytes transmitted"),
        _m("port_in_pkts", "counter", "port", "packets", "packets received"),
        _m("port_out_pkts", "counter", "port", "packets", "packets transmitted"),
        _m("port_speed_mbps", "gauge", "port", "Mb/s", "negotiated link speed"),
        _m("pfc_rx_pause_frames", "counter", "priority", "frames", "PFC pause frames received"),
        _m("pfc_tx_pause_frames", "counter", "priority", "frames", "PFC pause frames sent"),
        _m("pfc_rx_pause_us", "counter", "priority", "us", "time paused by received PFC"),
        _m("pfc_tx_pause_us", "counter", "priority", "us", "pause time requested by sent PFC"),
        _m("queue_depth_bytes", "gauge", "queue", "bytes", "egress queue occupancy now"),
        _m("queue_peak_bytes", "gauge", "queue", "bytes", "egress queue peak occupancy"),
        _m("queue_ecn_marked_pkts", "counter", "queue", "packets", "ECN-marked packets"),
        _m("queue_tx_pkts", "counter", "queue", "packets", "packets transmitted by the queue"),
        _m("queue_dropped_pkts", "counter", "queue", "packets", "packets dropped by the queue"),
        _m(
            "int_queue_mean_bytes",
            "gauge",
            "queue",
            "bytes",
            "INT: mean occupancy in the interval",
        ),
        _m("int_queue_p99_bytes", "gauge", "queue", "bytes", "INT: p99 occupancy in the interval"),
        _m("int_hop_latency_max_ns", "gauge", "queue", "ns", "INT: maximum hop latency"),
        _m("int_hop_latency_mean_ns", "gauge", "queue", "ns", "INT: mean hop latency"),
        _m("nic_rx_pause_frames", "counter", "nic_priority", "frames", "PFC pauses received"),
        _m("nic_tx_pause_frames", "counter", "nic_priority", "frames", "PFC pauses sent"),
        _m("nic_rx_pause_us", "counter", "nic_priority", "us", "time paused by received PFC"),
        _m("nic_tx_pause_us", "counter", "nic_priority", "us", "pause time the NIC requested"),
        _m("nic_tx_pause_storm_warnings", "counter", "nic", "events", "pause storm warnings"),
        _m("nic_tx_pause_storm_errors", "counter", "nic", "events", "pause storm errors"),
        _m("nic_rx_crc_errors", "counter", "nic", "frames", "CRC errors at the PHY"),
        _m("nic_rx_symbol_errors", "counter", "nic", "symbols", "symbol errors at the PHY"),
        _m("nic_rx_corrected_bits", "counter", "nic", "bits", "FEC-corrected bits"),
        _m("nic_rx_uncorrectable", "counter", "nic", "blocks", "FEC-uncorrectable blocks"),
        _m("nic_link_down_events", "counter", "nic", "events", "PHY link down events"),
        _m("nic_rx_bytes", "counter", "nic", "bytes", "bytes received at the PHY"),
        _m("nic_tx_bytes", "counter", "nic", "bytes", "bytes transmitted at the PHY"),
        _m("nic_rx_rdma_bytes", "counter", "nic", "bytes", "RDMA unicast bytes received"),
        _m("nic_tx_rdma_bytes", "counter", "nic", "bytes", "RDMA unicast bytes transmitted"),
        _m("nic_ecn_marked_pkts", "counter", "nic", "packets", "ECN-marked RoCE packets seen"),
        _m("nic_cnp_sent", "counter", "nic", "packets", "CNPs sent (notification point)"),
        _m("nic_cnp_handled", "counter", "nic", "packets", "CNPs handled (reaction point)"),
        _m("nic_out_of_sequence", "counter", "nic", "packets", "out-of-sequence packets"),
        _m("nic_packet_seq_err", "counter", "nic", "events", "NAK sequence errors"),
        _m("nic_local_ack_timeout", "counter", "nic", "events", "local ACK timeouts"),
        _m("nic_rnr_nak_retry_err", "counter", "nic", "events", "RNR NAK retries exceeded"),
        _m("nic_implied_nak_seq_err", "counter", "nic", "events", "implied NAK sequence errors"),
        _m("nic_link_speed_mbps", "gauge", "nic", "Mb/s", "netdev link speed"),
        _m("nic_pcie_speed_gts", "gauge", "nic", "GT/s", "PCIe current link speed"),
        _m("nic_pcie_max_speed_gts", "gauge", "nic", "GT/s", "PCIe maximum link speed"),
        _m("nic_pcie_width", "gauge", "nic", "lanes", "PCIe current link width"),
        _m("nic_pcie_max_width", "gauge", "nic", "lanes", "PCIe maximum link width"),
        _m("nic_port_rcv_errors", "counter", "nic", "packets", "IB port: packets received bad"),
        _m("nic_port_xmit_discards", "counter", "nic", "packets", "IB port: packets discarded"),
        _m("nic_port_symbol_errors", "counter", "nic", "symbols", "IB port: symbol errors"),
        _m("nic_port_link_downed", "counter", "nic", "events", "IB port: link down events"),
        _m("nic_port_link_error_recovery", "counter", "nic", "events", "IB port: link recoveries"),
        _m(
            "nic_port_link_integrity_errors",
            "counter",
            "nic",
            "events",
            "IB port: local link integrity errors",
        ),
        _m("nic_port_buffer_overruns", "counter", "nic", "events", "IB port: buffer overruns"),
        _m("nic_port_xmit_wait", "counter", "nic", "ticks", "IB port: ticks waiting to send"),
        _m("nic_port_rx_bytes", "counter", "nic", "bytes", "IB port: data received"),
        _m("nic_port_tx_bytes", "counter", "nic", "bytes", "IB port: data transmitted"),
        _m("nic_mlxlink_raw_ber", "gauge", "nic", "ratio", "mlxlink: raw physical (pre-FEC) BER"),
        _m("nic_mlxlink_effective_ber", "gauge", "nic", "ratio", "mlxlink: effective BER"),
        _m("nic_mlxlink_symbol_ber", "gauge", "nic", "ratio", "mlxlink: symbol BER"),
        _m("nic_mlxlink_effective_errors", "counter", "nic", "errors", "mlxlink: effective errors"),
        _m("nic_mlxlink_symbol_errors", "counter", "nic", "symbols", "mlxlink: symbol errors"),
        # NCCL job telemetry (collector/nccl): device the host, port the rank ("rank<r>") or
        # the GPU ("GPU<i>"), qual the communicator ("<comm>" or "<comm>/<coll>/<size>")
        _m(
            "nccl_kernel_start_lag_us",
            "gauge",
            "rank",
            "us",
            "NCCL: the rank's kernel start after its communicator's median, same coll_sn",
        ),
        _m("nccl_coll_exec_us", "gauge", "rank", "us", "NCCL: collective execution time"),
        _m("nccl_coll_busbw_gbs", "gauge", "rank", "GB/s", "NCCL: collective bus bandwidth"),
        _m("nccl_coll_algobw_gbs", "gauge", "rank", "GB/s", "NCCL: collective algo bandwidth"),
        _m(
            "nccl_rank_gpu",
            "gauge",
            "rank",
            "index",
            "NCCL join: the rank's CUDA device; qual '<comm>/<nic>' names its NIC",
        ),
        _m("nccl_net_send_latency_ns", "gauge", "rank", "ns", "NCCL: mean send latency"),
        _m("nccl_net_recv_latency_ns", "gauge", "rank", "ns", "NCCL: mean receive latency"),
        _m("nccl_coll_duration_ns", "gauge", "rank", "ns", "NCCL: mean collective duration"),
        _m("nccl_rank_missing", "gauge", "rank", "bool", "NCCL RAS: rank missing (1: dead)"),
    ]
}
# Driver counters with no canonical name are kept under these prefixes, as counters.
UNKNOWN_PREFIXES = ("ethtool:", "hw:", "port:")


def is_counter(metric: str) -> bool:
    d = METRICS.get(metric)
    if d is None:
        return metric.startswith(UNKNOWN_PREFIXES)
    return d.kind is Kind.COUNTER


# --- time -----------------------------------------------------------------------------------

ZERO_TIME = "0001-01-01T00:00:00Z"


def rfc3339(ts_ns: int) -> str:
    """Format epoch nanoseconds as RFC 3339 UTC with milliseconds, as Alertmanager writes."""
    t = dt.datetime.fromtimestamp(ts_ns // 1_000_000_000, tz=dt.UTC)
    ms = (ts_ns // 1_000_000) % 1000
    return t.strftime("%Y-%m-%dT%H:%M:%S") + f".{ms:03d}Z"


def parse_rfc3339(s: str) -> int:
    if s.startswith("0001-01-01"):
        return 0
    t = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1000


# --- alerts and actions -----------------------------------------------------------------------

# Each alert name as a constant, for code that means one alert (policy, grouping, inhibition,
# the simulator's truth, evaluation, incidents): a typo is a NameError, not a silent mismatch.
# ``ALERTNAMES`` below is the contract's list (CONTRACTS.md section 6); tests/test_alertnames.py
# checks every constant is in it.
PFC_STORM = "PFCStorm"
FLAKY_LINK = "FlakyLink"
STRAGGLER = "Straggler"
PCIE_DOWNGRADE = "PCIeDowngrade"
ECN_CONGESTION = "ECNCongestion"
QUEUE_BUILDUP = "QueueBuildup"
TRANSPORT_ERRORS = "TransportErrors"
PORT_ANOMALY = "PortAnomaly"
FABRIC_INCIDENT = "FabricIncident"
SLOW_RANK = "SlowRank"
BUS_BANDWIDTH_DROP = "BusBandwidthDrop"
ROCE_CONFIG_MISMATCH = "RoCEConfigMismatch"
ECMP_IMBALANCE = "ECMPImbalance"
SLOW_EDGE = "SlowEdge"

ALERTNAMES = (
    "PFCStorm",
    "FlakyLink",
    "Straggler",
    "PCIeDowngrade",
    "ECNCongestion",
    "QueueBuildup",
    "TransportErrors",
    "PortAnomaly",
    "FabricIncident",
    "SlowRank",
    "BusBandwidthDrop",
    "RoCEConfigMismatch",
    "ECMPImbalance",
    "SlowEdge",
)


def fingerprint(labels: dict[str, str]) -> str:
    """A stable id for a label set (same labels, same fingerprint, in every process)."""
    h = hashlib.sha256()
    for k in sorted(labels):
        h.update(k.encode())
        h.update(b"\xff")
        h.update(labels[k].encode())
        h.update(b"\xff")
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Finding:
    """A condition that holds at this step, for one entity.

    ``ts`` is the telemetry time of the newest sample the condition needed: when the finding is
    new, it becomes the alert's ``startsAt``.
    """

    alertname: str
    labels: dict[str, str]
    severity: str
    ts: int
    summary: str
    evidence: str
    description: str = ""
    extra: dict[str, str] = field(default_factory=dict)


@dataclass
class Alert:
    """One alert instance, from firing to (maybe) resolved; serialises as Alertmanager's object."""

    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: int  # ns, telemetry time of the sample that made it fire
    ends_at: int = 0  # ns; 0 while firing
    fingerprint: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.fingerprint:
            self.fingerprint = fingerprint(self.labels)

    @property
    def status(self) -> str:
        return "resolved" if self.ends_at else "firing"

    @property
    def name(self) -> str:
        return self.labels["alertname"]

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "fingerprint": self.fingerprint,
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "startsAt": rfc3339(self.starts_at),
            "endsAt": rfc3339(self.ends_at) if self.ends_at else ZERO_TIME,
            "generatorURL": "",
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Alert:
        return cls(
            labels=dict(d["labels"]),
            annotations=dict(d.get("annotations", {})),
            starts_at=parse_rfc3339(d["startsAt"]),
            ends_at=parse_rfc3339(d.get("endsAt", ZERO_TIME)),
            fingerprint=d.get("fingerprint", ""),
        )

    def event_key(self) -> tuple[str, int, str]:
        """Identifies one notification: the same alert firing, then resolved, are two events."""
        return (self.fingerprint, self.starts_at, self.status)


@dataclass(frozen=True)
class Action:
    """A drain or resume decision, executed or not (docs/formats.md section 7)."""

    time: int  # ns, telemetry time of the decision
    action: str  # drain | resume
    node: str
    scheduler: str
    reason: str
    alert_fingerprint: str
    executed: bool
    outcome: str

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["time"] = rfc3339(self.time)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Action:
        kw = {f.name: d[f.name] for f in dataclasses.fields(cls)}
        kw["time"] = parse_rfc3339(d["time"])
        return cls(**kw)
