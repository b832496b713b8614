"""NCCL Inspector's Prometheus textfile (``NCCL_INSPECTOR_PROM_DUMP=1``) -> rocewatch samples.

Inspector rewrites one textfile per GPU every dump interval (at least 30 s in this mode) for
node_exporter's textfile collector, in the Prometheus text exposition format::

    nccl_bus_bandwidth_gbs{version="v5.1",slurm_job_id="4242",node="gpu-001",gpu="GPU0",
        comm_name="DP Group 0",n_nodes="2",nranks="16",collective="AllReduce",
        message_size="4-5GB",algo_proto="Ring_ll"} 678.263

``nccl_bus_bandwidth_gbs`` becomes ``nccl_coll_busbw_gbs`` and
``nccl_collective_exec_time_microseconds`` ``nccl_coll_exec_us``: device the ``node`` label
(the topology's node where it names one), port the ``gpu`` label, qual
``<comm_name>/<collective>/<message_size>`` (a bucket such as ``4-5GB``: these are aggregates,
not single operations). The file carries no timestamps: the caller gives the file's time.
The plugin's source (``inspector_prom.cc``: files ``nccl_inspector_metrics_<GPU UUID>.prom``
in ``NCCL_INSPECTOR_DUMP_DIR``) labels the same series ``hostname``, ``gpu_device_id`` and
``comm_id`` (the communicator hash) and adds ``nccl_algorithm_bandwidth_gbs``
(``nccl_coll_algobw_gbs``): either label set is read (``node``/``gpu``/``comm_name`` first).
P2P and the per-device stats metrics are read past; ``# HELP``/``# TYPE`` lines too. A line
that does not parse (or a value that is not a number) is counted (``nccl_prom_malformed``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

import polars as pl

from collector.nccl.inspector import node_of
from rocewatch.core.model import SAMPLE_SCHEMA, empty_samples
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology

METRICS = {
    "nccl_bus_bandwidth_gbs": "nccl_coll_busbw_gbs",
    "nccl_algorithm_bandwidth_gbs": "nccl_coll_algobw_gbs",
    "nccl_collective_exec_time_microseconds": "nccl_coll_exec_us",
}
_LINE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)"
    r"(?:\s+(?P<ts>-?\d+))?\s*$"
)
_LABEL = re.compile(r'\s*(?P<k>[a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"(?P<v>(?:[^"\\]|\\.)*)"\s*(?:,|$)')


def parse_labels(text: str) -> dict[str, str] | None:
    """``k="v",...`` (with ``\\"``, ``\\\\`` and ``\\n`` escapes) -> dict; None if malformed."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if m is None:
            return None if text[pos:].strip() else out
        v = m["v"].replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")
        out[m["k"]] = v
        pos = m.end()
    return out


def parse_textfile(
    lines: Iterable[str], ts: int, topology: Topology | None = None, stats: Stats | None = None
) -> pl.DataFrame:
    stats = stats or Stats()
    cols: dict[str, list[object]] = {k: [] for k in SAMPLE_SCHEMA}
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        labels = parse_labels(m["labels"] or "") if m else None
        if m is None or labels is None:
            stats.inc("nccl_prom_malformed", detail="line")
            continue
        metric = METRICS.get(m["name"])
        if metric is None:
            continue
        try:
            v = float(m["value"])
        except ValueError:
            stats.inc("nccl_prom_malformed", detail="value")
            continue
        node = labels.get("node", labels.get("hostname"))
        gpu = labels.get("gpu", labels.get("gpu_device_id"))
        if not math.isfinite(v) or node is None or gpu is None:
            stats.inc("nccl_prom_malformed", detail="value or labels")
            continue
        comm = labels.get("comm_name", labels.get("comm_id", "?"))
        qual = "/".join([comm, labels.get("collective", "?"), labels.get("message_size", "?")])
        cols["ts"].append(int(m["ts"]) * 1_000_000 if m["ts"] else ts)
        cols["device"].append(node_of(topology, node))
        cols["port"].append(gpu)
        cols["qual"].append(qual)
        cols["metric"].append(metric)
        cols["value"].append(v)
        cols["raw"].append(None)
    if not cols["ts"]:
        return empty_samples()
    return pl.DataFrame(cols, schema=SAMPLE_SCHEMA)
