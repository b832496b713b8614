"""``rocewatch nccl-collect`` following the job's other NCCL outputs live
(collector/nccl/follow.py): CoMMA's OTLP/JSON exports, Inspector's Prometheus textfiles and
NCCL RAS's JSON, each written to while the collector polls, with the bad lines counted and
truncation and rotation survived."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import polars as pl

from collector.nccl.service import NcclCollector
from rocewatch.core.topology import Topology

FIX = Path(__file__).parent / "fixtures" / "nccl"
COMM = "0x7f8c496ae9f661"
T0 = 1795946400000000000


def topo() -> Topology:
    nodes = [{"name": f"gpu-00{i}", "nics": [{"nic": "mlx5_0"}]} for i in (1, 2)]
    return Topology.from_dict({"switches": [], "nodes": nodes})


class Sink:
    def __init__(self) -> None:
        self.got: list[pl.DataFrame] = []

    def __call__(self, df: pl.DataFrame) -> None:
        self.got.append(df)

    def close(self) -> None:
        pass

    def take(self, metric: str | None = None) -> pl.DataFrame:
        df = pl.concat(self.got) if self.got else pl.DataFrame()
        self.got.clear()
        return df.filter(pl.col("metric") == metric) if metric and df.height else df


def comma_line(t_s: float, count: int, total_ns: float) -> bytes:
    """One OTLP/JSON ExportMetricsServiceRequest as an OTel collector's file exporter writes
    it: CoMMA's cumulative send-latency histogram of the edge rank 3 -> rank 0."""
    attrs = [
        {"key": "nccl.communicator.hash", "value": {"stringValue": COMM}},
        {"key": "nccl.source.rank", "value": {"intValue": "3"}},
        {"key": "nccl.destination.rank", "value": {"intValue": "0"}},
        {"key": "nccl.hostname", "value": {"stringValue": "gpu-002"}},
    ]
    point = {
        "attributes": attrs,
        "startTimeUnixNano": str(T0),
        "timeUnixNano": str(T0 + int(t_s * 1e9)),
        "count": str(count),
        "sum": total_ns,
        "bucketCounts": ["0", str(count)],
        "explicitBounds": [1000000.0],
    }
    metric = {
        "name": "nccl.net.send.latency",
        "unit": "ns",
        "histogram": {"aggregationTemporality": 2, "dataPoints": [point]},
    }
    res = {"attributes": [{"key": "service.name", "value": {"stringValue": "CoMMA"}}]}
    doc = {
        "resourceMetrics": [
            {"resource": res, "scopeMetrics": [{"scope": {"name": "CoMMA"}, "metrics": [metric]}]}
        ]
    }
    return orjson.dumps(doc) + b"\n"


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as fh:
        fh.write(data)


def test_comma_exports_followed_through_cut_lines_rotation_and_truncation(tmp_path: Path) -> None:
    (tmp_path / "comma").mkdir()
    f = tmp_path / "comma" / "gpu-002.jsonl"
    sink = Sink()
    coll = NcclCollector(tmp_path, "job-a", topo(), sink)
    send = "nccl_net_send_latency_ns"

    def values() -> list[float]:
        return sink.take(send)["value"].to_list() if sink.got else []

    l2 = comma_line(2, 200, 5e6)
    append(f, comma_line(1, 100, 2e6) + l2[:40])  # the second export cut mid-write
    coll.poll()
    assert values() == [20000.0]
    append(f, l2[40:] + b"not json\n")  # its end arrives, then a line that is not OTLP/JSON
    coll.poll()
    assert values() == [30000.0]  # the mean over the interval since the first export
    assert coll.stats.get("nccl_comma_malformed") == 1
    # rotation as the file exporter does it: the file is renamed to a backup beside it (its
    # last export written before the rename) and a new one started under the name
    append(f, comma_line(3, 300, 9e6))
    os.rename(f, tmp_path / "comma" / "gpu-002-2026-12-06T13-00-00.000.jsonl")
    append(f, comma_line(4, 400, 1.4e7))
    coll.poll()
    assert values() == [40000.0, 50000.0]  # each export once, none read again
    # truncated in place (the collector restarted with a new CoMMA process: counts restart)
    append(f, comma_line(5, 500, 2e7)[:25])
    coll.poll()
    with f.open("wb") as fh:
        fh.write(comma_line(6, 10, 1e5))
    coll.poll()
    assert values() == [10000.0]
    assert coll.stats.get("nccl_comma_truncated_files") == 1
    assert coll.stats.get("nccl_comma_truncated_lines") == 1  # the cut line lost, only it
    append(f, comma_line(7, 20, 3e5)[:30])
    coll.poll(final=True)  # the collector stops with a line half-written
    assert values() == []
    assert coll.stats.get("nccl_comma_truncated_lines") == 2
    coll.close()


PROM = (
    'nccl_algorithm_bandwidth_gbs{{comm_id="{c}",hostname="gpu-001",rank="0",slurm_job="train",'
    'slurm_job_id="4242",nranks="4",n_nodes="2",gpu_device_id="GPU0",collective="AllReduce",'
    'coll_sn="{sn}",timestamp="2026-12-06T13:00:00",message_size="4.00GB"}} {algo}{ts}\n'
    'nccl_bus_bandwidth_gbs{{comm_id="{c}",hostname="gpu-001",rank="0",slurm_job="train",'
    'slurm_job_id="4242",nranks="4",n_nodes="2",gpu_device_id="GPU0",collective="AllReduce",'
    'coll_sn="{sn}",timestamp="2026-12-06T13:00:00",message_size="4.00GB"}} {bus}{ts}\n'
)


def prom(sn: int, busbw: float, ts_ms: int | None = None) -> bytes:
    ts = f" {ts_ms}" if ts_ms is not None else ""
    return PROM.format(c=COMM, sn=sn, algo=busbw / 1.5, bus=busbw, ts=ts).encode()


def rewrite(path: Path, data: bytes, mtime_ns: int) -> None:
    """Rewritten whole, as Inspector does every dump interval; the time set so the test does
    not depend on the file system's clock."""
    with path.open("wb") as fh:
        fh.write(data)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_prometheus_textfiles_reread_when_rewritten_each_snapshot_sent_once(
    tmp_path: Path,
) -> None:
    # Inspector writes them into its NCCL_INSPECTOR_DUMP_DIR: the collector's directory
    f = tmp_path / "nccl_inspector_metrics_GPU-5e1f0c2a.prom"
    sink = Sink()
    coll = NcclCollector(tmp_path, "job-a", topo(), sink)
    bus = "nccl_coll_busbw_gbs"
    rewrite(f, prom(10, 400.0), T0)
    coll.poll()
    got = sink.take()
    assert sorted(got["metric"].to_list()) == ["nccl_coll_algobw_gbs", bus]
    row = got.filter(pl.col("metric") == bus).row(0, named=True)
    assert (row["ts"], row["device"], row["port"], row["qual"], row["value"]) == (
        T0,
        "gpu-001",
        "GPU0",
        f"{COMM}/AllReduce/4.00GB",
        400.0,
    )
    coll.poll()
    assert sink.take().height == 0  # unchanged: nothing sent again
    # the next snapshot, caught while Inspector writes it: waits for its end
    data = prom(11, 300.0) + b"nccl_bus_bandwidth_gbs{broken\n"
    rewrite(f, data[:150], T0 + 10**9)
    coll.poll()
    assert sink.take().height == 0
    rewrite(f, data, T0 + 2 * 10**9)
    coll.poll()
    got = sink.take(bus)
    assert got["value"].to_list() == [300.0] and got["ts"].to_list() == [T0 + 2 * 10**9]
    assert coll.stats.get("nccl_prom_partial_reads") == 1
    assert coll.stats.get("nccl_prom_malformed") == 1  # the broken line, counted once
    # lines that carry their own time (ms): a rewrite restating the same samples sends nothing
    rewrite(f, prom(12, 350.0, ts_ms=1795946500000), T0 + 3 * 10**9)
    coll.poll()
    assert sink.take(bus)["ts"].to_list() == [1795946500000 * 10**6]
    rewrite(f, prom(12, 350.0, ts_ms=1795946500000) + b"\n", T0 + 4 * 10**9)
    coll.poll()
    assert sink.take().height == 0
    coll.close()


def test_ras_json_reread_when_it_changes(tmp_path: Path) -> None:
    ras = tmp_path / "ras.json"
    sink = Sink()
    coll = NcclCollector(tmp_path, "job-a", topo(), sink, ras_file=ras)
    coll.poll()  # not there yet: nothing, nothing counted
    assert sink.take().height == 0 and coll.stats.get("nccl_ras_malformed") == 0

    def write(data: bytes, mtime_ns: int) -> None:  # by rename, as docs/nccl.md says
        tmp = tmp_path / "ras.tmp"
        tmp.write_bytes(data)
        os.utime(tmp, ns=(mtime_ns, mtime_ns))
        os.replace(tmp, ras)

    doc = (FIX / "ras.json").read_bytes()
    write(doc, T0)
    coll.poll()
    got = sink.take("nccl_rank_missing")
    assert got.select("ts", "device", "port", "qual", "value").rows() == [
        (T0, "10.0.1.2", "rank3", COMM, 1.0)
    ]  # no Inspector records here, so no join: the host as RAS knows it
    assert coll.stats.get("nccl_ras_malformed") == 1  # the fixture's rank entry "x"
    coll.poll()
    assert sink.take().height == 0  # unchanged
    # rank 3 now only unresponsive, then a document that does not parse
    d = orjson.loads(doc)
    d["communicators"][0]["missing_ranks"][0]["status"]["considered_dead"] = False
    write(orjson.dumps(d), T0 + 10**9)
    coll.poll()
    assert sink.take("nccl_rank_missing")["value"].to_list() == [0.5]
    write(doc[:100], T0 + 2 * 10**9)
    coll.poll()
    coll.poll()
    assert sink.take().height == 0
    assert coll.stats.get("nccl_ras_malformed") == 3  # the cut document, counted once
    coll.close()
