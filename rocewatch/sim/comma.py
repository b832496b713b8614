"""google/CoMMA's per-edge latency of the simulated jobs, consistent with the simulated fabric.

Each rank of a job's ring sends to the rank with the same GPU on the next node (and receives
from the one on the previous node), as the simulated NCCL_DEBUG lines say
(rocewatch/sim/nccl.py). Every ``export_s`` each process exports what CoMMA's OTel exporter
writes through a collector's file exporter (OTLP/JSON, one ``ExportMetricsServiceRequest`` a
line, cumulative histograms): ``nccl.net.send.latency`` for its send edge and
``nccl.net.recv.latency`` for its receive edge, with ``nccl.communicator.hash`` (the
communicator id Inspector's header carries), ``nccl.source.rank``, ``nccl.destination.rank``,
``nccl.hostname``. A host's processes write to ``nccl/<job>/comma/<host>.jsonl``.

The faults show as they would on the wire: an edge through a NIC whose PCIe link trained down
takes as many times longer as the link lost bandwidth; one through a flaky NIC cable
``FLAKY_SLOW`` times longer (go-back-N resends what each corrupted frame held up); a PFC storm
pausing the job slows every edge alike (no edge stands out); a slow GPU leaves the wire as it
is. Each export gets a few per cent of jitter.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson

from rocewatch.sim.faults import FlakyLink, PcieDowngrade, PfcStorm

EDGE_NS = 12_000.0  # a healthy edge's mean message latency
FLAKY_SLOW = 3.0
STORM_SLOW = 3.0
MSGS = 400  # messages per edge and export


def write_comma(
    d: Path,
    host_of: list[str],
    nic_of: list[str],
    n_rails: int,
    comm: str,
    faults: list[object],
    start_ns: int,
    duration_s: float,
    export_s: float,
    rng: np.random.Generator,
) -> None:
    """Write ``d/comma/<host>.jsonl`` for one job's communicator (module docstring)."""
    n = len(host_of)
    if n <= n_rails:
        return  # one node: the ring never leaves it
    t = np.arange(1, int(duration_s / export_s) + 1) * export_s  # export times, s from start
    slow_nic = np.ones((n, len(t)))  # per rank: the factor its NIC gives its edges
    storm = np.ones(len(t))
    for f in faults:
        if not isinstance(f, PcieDowngrade | FlakyLink | PfcStorm):
            continue
        # an export covers the interval before it: on when the fault overlaps it
        on = (t > f.onset_s) & (t - export_s < f.end_s(duration_s))
        if isinstance(f, PfcStorm):
            if f.origin == "nic" and f.node in host_of:
                storm[on] = np.maximum(storm[on], STORM_SLOW)
            continue
        if isinstance(f, FlakyLink) and f.uplink:
            continue  # a ring edge stays under its rail's leaf
        for r in range(n):
            if host_of[r] == f.node and nic_of[r] == f.nic:
                k = (
                    32.0 * 16 / (f.speed_gts * f.width)
                    if isinstance(f, PcieDowngrade)
                    else FLAKY_SLOW
                )
                slow_nic[r, on] = np.maximum(slow_nic[r, on], k)
    peer = [(r + n_rails) % n for r in range(n)]
    lines: dict[str, list[bytes]] = {}
    sums = np.zeros((n, 2))  # per rank: cumulative sum of its send, recv edge
    for i, ts in enumerate(t):
        tn = start_ns + round(ts * 1e9)
        for r in range(n):
            points = []
            for kind, (src, dst) in enumerate(((r, peer[r]), (peer.index(r), r))):
                mean = EDGE_NS * max(slow_nic[src, i], slow_nic[dst, i]) * storm[i]
                sums[r, kind] += MSGS * mean * float(rng.uniform(0.97, 1.03))
                points.append(_point(comm, src, dst, host_of[r], start_ns, tn, i, sums[r, kind]))
            lines.setdefault(host_of[r], []).append(_request(points))
    (d / "comma").mkdir(parents=True, exist_ok=True)
    for host, ls in lines.items():
        (d / "comma" / f"{host}.jsonl").write_bytes(b"\n".join(ls) + b"\n")


def _point(
    comm: str, src: int, dst: int, host: str, t0: int, tn: int, i: int, total: float
) -> dict[str, object]:
    def attr(k: str, v: dict[str, object]) -> dict[str, object]:
        return {"key": k, "value": v}

    return {
        "attributes": [
            attr("nccl.communicator.hash", {"stringValue": comm}),
            attr("nccl.source.rank", {"intValue": str(src)}),
            attr("nccl.destination.rank", {"intValue": str(dst)}),
            attr("nccl.hostname", {"stringValue": host}),
        ],
        "startTimeUnixNano": str(t0),
        "timeUnixNano": str(tn),
        "count": str(MSGS * (i + 1)),
        "sum": round(float(total), 1),
        "bucketCounts": ["0", str(MSGS * (i + 1))],
        "explicitBounds": [1_000_000.0],
    }


def _request(points: list[dict[str, object]]) -> bytes:
    send, recv = points
    metrics = [
        {
            "name": name,
            "unit": "ns",
            "histogram": {"aggregationTemporality": 2, "dataPoints": [p]},
        }
        for name, p in (("nccl.net.send.latency", send), ("nccl.net.recv.latency", recv))
    ]
    return orjson.dumps(
        {
            "resourceMetrics": [
                {
                    "resource": {
                        "attributes": [{"key": "service.name", "value": {"stringValue": "CoMMA"}}]
                    },
                    "scopeMetrics": [{"scope": {"name": "CoMMA"}, "metrics": metrics}],
                }
            ]
        }
    )
