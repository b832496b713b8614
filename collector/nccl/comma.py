"""google/CoMMA's OpenTelemetry metrics (OTLP/JSON, as an OTel collector's file exporter
writes them: one ``ExportMetricsServiceRequest`` a line) -> rocewatch samples.

CoMMA (``NCCL_PROFILER_OTEL_ENABLE=1``) exports histograms with cumulative temporality:

- ``nccl.net.send.latency`` / ``nccl.net.recv.latency`` (ns; its docs also spell them
  ``nccl.net_send.latency`` / ``nccl.net_recv.latency``, both are read) with
  ``nccl.communicator.hash``, ``nccl.source.rank``, ``nccl.destination.rank``,
  ``nccl.hostname``: one edge, source rank -> destination rank;
- ``nccl.collective.duration`` (ns) with ``nccl.comm.hash``, ``nccl.collective.name``,
  ``nccl.rank``, ``nccl.size.class``, ``nccl.hostname``.

Each data point becomes the mean over the interval since that series' previous point
(``sum`` and ``count`` differences; the cumulative mean for its first point):
``nccl_net_send_latency_ns`` / ``nccl_net_recv_latency_ns`` (device the host, port
``rank<src>->rank<dst>``, qual the communicator) and ``nccl_coll_duration_ns`` (port
``rank<r>``, qual ``<comm>/<collective>/<size class>``). Aggregated streams
(``nccl.metric.aggregated``, no edge) are skipped. Lines that are not OTLP/JSON, points
without count, sum or time: counted (``nccl_comma_malformed``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
import polars as pl

from collector.nccl.inspector import node_of
from rocewatch.core.model import SAMPLE_SCHEMA, empty_samples
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology

EDGE = {
    "nccl.net.send.latency": "nccl_net_send_latency_ns",
    "nccl.net_send.latency": "nccl_net_send_latency_ns",
    "nccl.net.recv.latency": "nccl_net_recv_latency_ns",
    "nccl.net_recv.latency": "nccl_net_recv_latency_ns",
}
DURATION = "nccl.collective.duration"


def _attrs(point: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for a in point.get("attributes") or []:
        if not isinstance(a, dict) or not isinstance(a.get("key"), str):
            continue
        v = a.get("value")
        if isinstance(v, dict):
            for k in ("stringValue", "intValue", "boolValue", "doubleValue"):
                if k in v:
                    out[a["key"]] = str(v[k]).lower() if k == "boolValue" else str(v[k])
                    break
    return out


class CommaDecoder:
    def __init__(self, topology: Topology | None = None, stats: Stats | None = None) -> None:
        self.topology = topology
        self.stats = stats or Stats()
        self.last: dict[tuple[str, str, str, str], tuple[float, float]] = {}

    def lines(self, lines: Iterable[bytes]) -> pl.DataFrame:
        cols: dict[str, list[object]] = {k: [] for k in SAMPLE_SCHEMA}
        for line in lines:
            if not line.strip():
                continue
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError:
                self.stats.inc("nccl_comma_malformed", detail="not JSON")
                continue
            if not isinstance(doc, dict) or not isinstance(doc.get("resourceMetrics"), list):
                self.stats.inc("nccl_comma_malformed", detail="not OTLP metrics")
                continue
            for rm in doc["resourceMetrics"]:
                for sm in (rm or {}).get("scopeMetrics") or []:
                    for m in (sm or {}).get("metrics") or []:
                        self._metric(m, cols)
        if not cols["ts"]:
            return empty_samples()
        return pl.DataFrame(cols, schema=SAMPLE_SCHEMA).sort("ts")

    def _metric(self, m: Any, cols: dict[str, list[object]]) -> None:
        if not isinstance(m, dict):
            return
        name = m.get("name")
        if name not in EDGE and name != DURATION:
            return
        body = m.get("histogram") or m.get("exponentialHistogram") or {}
        for p in body.get("dataPoints") or []:
            if not isinstance(p, dict):
                continue
            a = _attrs(p)
            try:
                ts, count, total = int(p["timeUnixNano"]), float(p["count"]), float(p["sum"])
            except (KeyError, TypeError, ValueError):
                self.stats.inc("nccl_comma_malformed", detail="data point")
                continue
            host = a.get("nccl.hostname")
            if a.get("nccl.metric.aggregated") == "true" or host is None:
                continue
            if name in EDGE:
                comm, src, dst = (
                    a.get("nccl.communicator.hash"),
                    a.get("nccl.source.rank"),
                    a.get("nccl.destination.rank"),
                )
                if comm is None or src is None or dst is None:
                    self.stats.inc("nccl_comma_malformed", detail="edge attributes")
                    continue
                metric, port, qual = EDGE[str(name)], f"rank{src}->rank{dst}", comm
            else:
                comm, rank = a.get("nccl.comm.hash"), a.get("nccl.rank")
                if comm is None or rank is None:
                    self.stats.inc("nccl_comma_malformed", detail="duration attributes")
                    continue
                metric, port = "nccl_coll_duration_ns", f"rank{rank}"
                coll = a.get("nccl.collective.name", "?")
                qual = f"{comm}/{coll}/{a.get('nccl.size.class', '?')}"
            node = node_of(self.topology, host)
            key = (node, port, qual, metric)
            c0, s0 = self.last.get(key, (0.0, 0.0))
            if count < c0:  # the process restarted: cumulative sums begin again
                c0, s0 = 0.0, 0.0
            self.last[key] = (count, total)
            if count <= c0:
                continue
            cols["ts"].append(ts)
            cols["device"].append(node)
            cols["port"].append(port)
            cols["qual"].append(qual)
            cols["metric"].append(metric)
            cols["value"].append((total - s0) / (count - c0))
            cols["raw"].append(None)
