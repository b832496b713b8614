"""collector/nccl: each NCCL format parsed from a fixture in its real layout, bad lines counted,
the directory tailer losing nothing on truncation and rotation, and the rank join."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from collector.nccl.comma import CommaDecoder
from collector.nccl.debug import DebugLog
from collector.nccl.inspector import InspectorDecoder, dump_interval_warning
from collector.nccl.join import RankJoin
from collector.nccl.prometheus import parse_textfile
from collector.nccl.ras import parse_ras, ras_samples
from collector.nccl.recording import read_job
from collector.nccl.tail import InspectorTail
from rocewatch.core.model import METRICS, SAMPLE_SCHEMA
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology

FIX = Path(__file__).parent / "fixtures" / "nccl"
JOB = FIX / "job-a"
COMM = "0x7f8c496ae9f661"


def topo() -> Topology:
    nodes = [
        {
            "name": f"gpu-00{i}",
            "nics": [{"nic": f"mlx5_{k}", "switch_port": f"leaf{k}/Ethernet{i}"} for k in (0, 1)],
        }
        for i in (1, 2, 3)
    ]
    switches = [{"name": f"leaf{k}", "role": "leaf"} for k in (0, 1)]
    return Topology.from_dict({"switches": switches, "nodes": nodes})


def decode_job(stats: Stats) -> tuple[InspectorDecoder, pl.DataFrame]:
    dec = InspectorDecoder(topo(), stats)
    frames = []
    for p in sorted(JOB.glob("*.log")):
        with p.open("rb") as fh:
            dec.lines(p.name, fh)
        frames.append(dec.frame())
    dec.finish()
    frames.append(dec.frame())
    return dec, pl.concat(frames)


def test_inspector_verbose_v43_gives_per_rank_lag_and_busbw() -> None:
    stats = Stats()
    dec, df = decode_job(stats)
    assert df.schema == pl.Schema(SAMPLE_SCHEMA)
    assert set(df["metric"]) <= set(METRICS)
    lag = df.filter(pl.col("metric") == "nccl_kernel_start_lag_us")
    # 6 collectives x 4 ranks, all complete (every rank's file holds them)
    assert lag.height == 24
    late = lag.filter(pl.col("port") == "rank3")
    assert late["device"].unique().to_list() == ["gpu-002"]
    assert late["qual"].unique().to_list() == [COMM]
    assert late["value"].min() > 250  # 300 us late, less the median's share
    assert lag.filter(pl.col("port") != "rank3")["value"].abs().max() < 10
    bw = df.filter(pl.col("metric") == "nccl_coll_busbw_gbs")
    assert bw.height == 24
    assert bw["qual"].unique().to_list() == [f"{COMM}/AllReduce/2147483648"]
    # times are the kernels' own (microseconds -> ns), not the dumps'
    assert lag["ts"].min() == (1795946405000000 + 500000) * 1000 + 3500  # the median rank's
    # rank 1's file ends with a line cut mid-write and a line of garbage: counted, skipped
    assert stats.get("nccl_malformed_lines") == 2
    assert dec.ranks[(COMM, 3)].host == "gpu-002" and dec.ranks[(COMM, 3)].pid == 5152


def test_inspector_v42_plain_records_and_orphans() -> None:
    stats = Stats()
    dec = InspectorDecoder(topo(), stats)
    dec.lines("gpu-003-pid777.log", (FIX / "gpu-003-pid777.log").read_bytes().splitlines())
    df = dec.frame()
    # three self-contained v4.2 records; the hostname's domain is dropped for the topology
    assert df["device"].unique().to_list() == ["gpu-003"]
    exec_us = df.filter(pl.col("metric") == "nccl_coll_exec_us")
    assert exec_us["value"].to_list() == [812.0] * 3
    # non-verbose records carry no kernel times: the dump's time, and no lag
    assert exec_us["ts"].to_list() == [(1795946405000000 + k * 1000000) * 1000 for k in (1, 2, 3)]
    assert df.filter(pl.col("metric") == "nccl_kernel_start_lag_us").height == 0
    assert stats.get("nccl_orphan_records") == 1


def test_inspector_dump_count_mismatch_is_counted() -> None:
    stats = Stats()
    dec = InspectorDecoder(None, stats)
    lines = (JOB / "gpu-001-pid4242.log").read_bytes().splitlines()
    # drop the second record of the first dump: the next marker finds the dump short
    dec.lines("f", lines[:2] + lines[3:])
    assert stats.get("nccl_truncated_dumps") == 1
    assert dec.frame().filter(pl.col("metric") == "nccl_coll_exec_us").height == 5


def test_teardown_only_configuration_is_flagged() -> None:
    assert "teardown" in (dump_interval_warning({"NCCL_INSPECTOR_ENABLE": "1"}) or "")
    env = {"NCCL_INSPECTOR_ENABLE": "1", "NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS": "-1"}
    assert dump_interval_warning(env) is not None
    env["NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS"] = "1000000"
    assert dump_interval_warning(env) is None


def test_teardown_dump_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    # (another test's command may have raised the root logger's level: this one's is its own)
    caplog.set_level(logging.WARNING, logger="collector.nccl")
    lines = (
        (JOB / "gpu-002-pid5152.log")
        .read_bytes()
        .replace(b'"dump_timestamp_us":1795946406600000', b'"dump_timestamp_us":1795946606600000')
    )
    dec = InspectorDecoder(None, Stats())
    dec.lines("f", lines.splitlines())
    assert dec.teardown_warned
    assert "only at teardown" in caplog.text


def test_prometheus_textfile() -> None:
    stats = Stats()
    text = (FIX / "prom" / "nccl_inspector_GPU0.prom").read_text().splitlines()
    df = parse_textfile(text, ts=1795946430000000000, topology=topo(), stats=stats)
    assert sorted(df["metric"].to_list()) == [
        "nccl_coll_busbw_gbs",
        "nccl_coll_busbw_gbs",
        "nccl_coll_exec_us",
    ]
    row = df.filter(pl.col("metric") == "nccl_coll_exec_us").row(0, named=True)
    assert (row["device"], row["port"], row["qual"], row["value"]) == (
        "gpu-001",
        "GPU0",
        "DP Group 0/AllReduce/4-5GB",
        9498.47,
    )
    # an escaped quote in a label value is read as a quote
    assert 'PP "stage" 1/AllGather/1-2MB' in df["qual"].to_list()
    assert stats.get("nccl_prom_malformed") == 2  # an unclosed label set, a value "NaNx"


def test_comma_otlp_json_interval_means() -> None:
    stats = Stats()
    dec = CommaDecoder(topo(), stats)
    df = dec.lines((FIX / "comma_otlp.jsonl").read_bytes().splitlines())
    send = df.filter(pl.col("metric") == "nccl_net_send_latency_ns")
    assert send["port"].to_list() == ["rank3->rank0"] * 2
    # first point: the cumulative mean; second: the mean of what came since
    assert send["value"].to_list() == [20000.0, 30000.0]
    dur = df.filter(pl.col("metric") == "nccl_coll_duration_ns")
    assert dur["qual"].to_list() == [f"{COMM}/ncclAllReduce/gt16m"] * 2
    assert dur["value"].to_list() == [4.1e7, 4.2e7]
    # the aggregated stream is skipped; a point without time or sum and a cut line counted
    assert stats.get("nccl_comma_malformed") == 2


def test_ras_json_missing_ranks() -> None:
    stats = Stats()
    missing = parse_ras((FIX / "ras.json").read_bytes(), stats)
    assert [(m.comm, m.rank, m.host, m.dead) for m in missing] == [(COMM, 3, "10.0.1.2", True)]
    assert stats.get("nccl_ras_malformed") == 1
    df = ras_samples(missing, ts=1)
    assert df["metric"].to_list() == ["nccl_rank_missing"] and df["value"].to_list() == [1.0]
    assert parse_ras(b"{not json", stats) == []
    assert stats.get("nccl_ras_malformed") == 2


def test_debug_lines_map_process_to_nic() -> None:
    stats = Stats()
    log = DebugLog(stats)
    log.read(str(JOB / "debug" / "gpu-001.log"))
    p0, p1 = log.processes[("gpu-001", 4242)], log.processes[("gpu-001", 4243)]
    assert p0.net_devs == {0: "mlx5_0", 1: "mlx5_1"} and p0.link[0] == "RoCE"
    assert (p0.cuda_dev, p0.nic(), p0.ranks) == (0, "mlx5_0", {COMM: 0})
    assert (p1.cuda_dev, p1.nic(), p1.ranks) == (1, "mlx5_1", {COMM: 1})
    assert stats.get("nccl_debug_unparsed") == 1  # "via NET/IB/" without its index


def test_join_prefers_debug_lines_then_topology_and_refreshes_on_restart() -> None:
    stats = Stats()
    dec, _ = decode_job(stats)
    log = DebugLog(stats)
    log.read(str(JOB / "debug" / "gpu-001.log"))
    join = RankJoin(topo())
    join.update("job-a", dec.ranks, log)
    p1 = join.place("job-a", COMM, 1)
    assert p1 is not None and (p1.host, p1.gpu, p1.nic, p1.guessed) == (
        "gpu-001",
        1,
        "mlx5_1",
        False,
    )
    p3 = join.place("job-a", COMM, 3)  # no debug log for gpu-002: its local index, guessed
    assert p3 is not None and (p3.host, p3.gpu, p3.nic, p3.guessed) == (
        "gpu-002",
        1,
        "mlx5_1",
        True,
    )
    s = join.samples(7)
    assert s.filter(pl.col("port") == "rank1")["qual"].to_list() == [f"{COMM}/mlx5_1"]
    # the job restarts: rank 3 comes back in another process on another host
    info = dec.ranks[(COMM, 3)]
    moved = type(info)("gpu-003", 9999, COMM, info.comm_name, 3, 4)
    join.update("job-a", {(COMM, 3): moved}, log)
    assert join.restarts == 1
    p3 = join.place("job-a", COMM, 3)
    assert p3 is not None and p3.host == "gpu-003" and p3.pid == 9999
    assert join.place("job-a", COMM, 0) is None  # the old incarnation is gone


def test_recorded_job_directory() -> None:
    stats = Stats()
    df, join = read_job(JOB, topo(), stats)
    assert df["ts"].is_sorted()
    m = df.filter(pl.col("metric") == "nccl_rank_gpu")
    assert m.height >= 4 and m["ts"].min() <= df["ts"].min()
    assert join.place("job-a", COMM, 0).nic == "mlx5_0"  # type: ignore[union-attr]


def _write(path: Path, data: bytes) -> None:
    with path.open("ab") as fh:
        fh.write(data)


def test_tail_follows_appends_partial_lines_truncation_and_rotation(tmp_path: Path) -> None:
    stats = Stats()
    tail = InspectorTail(tmp_path, topo(), stats)
    lines = (JOB / "gpu-002-pid5152.log").read_bytes().splitlines(keepends=True)
    f = tmp_path / "gpu-002-pid5152.log"

    def execs() -> int:
        return int(got.filter(pl.col("metric") == "nccl_coll_exec_us").height)

    _write(f, lines[0] + lines[1] + lines[2][:30])  # a record cut mid-write
    got = tail.poll()
    assert execs() == 1
    _write(f, lines[2][30:] + lines[3])  # its end arrives: nothing lost
    got = tail.poll()
    assert execs() == 2
    # rotation: the writer renames the file and starts a new one; the old file's last
    # dump, written before the rename, is read through the descriptor still open
    _write(f, lines[4] + lines[5] + lines[6] + lines[7][:10])
    os.rename(f, tmp_path / "old.1")
    _write(f, lines[4] + lines[5])
    got = tail.poll()
    assert execs() == 2 + 1  # records 5 and 6 of the old file, 5 of the new one
    assert stats.get("nccl_truncated_lines") == 1  # the old file's cut last line
    # truncation in place: read again from the start, the partial line counted
    _write(f, lines[6][:5])
    tail.poll()
    with f.open("wb") as fh:
        fh.write(lines[4] + lines[5])
    got = tail.poll()
    assert execs() == 1
    assert stats.get("nccl_truncated_files") == 1
    assert stats.get("nccl_truncated_lines") == 2
    tail.close()


def test_tail_of_a_whole_job_matches_the_recording(tmp_path: Path) -> None:
    for p in JOB.glob("*.log"):
        shutil.copy(p, tmp_path / p.name)
    tail = InspectorTail(tmp_path, topo(), Stats())
    df = pl.concat([tail.poll(), tail.finish()])
    tail.close()
    ref, _ = read_job(JOB, topo(), Stats())
    ref = ref.filter(pl.col("metric") != "nccl_rank_gpu")
    key = ["ts", "device", "port", "qual", "metric"]
    assert df.sort(key).equals(ref.sort(key))


def test_collector_sends_samples_and_the_join_as_files_grow(tmp_path: Path) -> None:
    from collector.nccl.service import NcclCollector

    got: list[pl.DataFrame] = []

    class Sink:
        def __call__(self, df: pl.DataFrame) -> None:
            got.append(df)

        def close(self) -> None:
            pass

    shutil.copytree(JOB / "debug", tmp_path / "debug")
    files = sorted(JOB.glob("*.log"))
    for p in files:
        (tmp_path / p.name).write_bytes(b"".join(p.read_bytes().splitlines(keepends=True)[:4]))
    coll = NcclCollector(tmp_path, "job-a", topo(), Sink())
    assert coll.poll() > 0
    first = pl.concat(got)
    join = first.filter(pl.col("metric") == "nccl_rank_gpu")
    assert join.filter(pl.col("port") == "rank1")["qual"].to_list() == [f"{COMM}/mlx5_1"]
    # the first dump's 3 collectives are complete in every file: their lags are out
    assert first.filter(pl.col("metric") == "nccl_kernel_start_lag_us").height == 12
    for p in files:
        (tmp_path / p.name).write_bytes(p.read_bytes())
    got.clear()
    coll.poll(final=True)
    rest = pl.concat(got)
    assert rest.filter(pl.col("metric") == "nccl_kernel_start_lag_us").height == 12
    assert rest.filter(pl.col("metric") == "nccl_rank_gpu").height == 0  # the map is unchanged
    assert coll.stats.get("nccl_malformed_lines") == 2  # rank 1's cut record, a garbage line
    assert coll.stats.get("nccl_debug_unparsed") == 1  # read once, though polled twice
    coll.close()


def test_nccl_collect_command_writes_json_lines(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    shutil.copytree(JOB, tmp_path / "job")
    # the job's other outputs: CoMMA's exports where a recording keeps them (comma/), the
    # Prometheus textfiles and a RAS document where the flags say (tests/test_nccl_follow.py
    # follows each live)
    (tmp_path / "job" / "comma").mkdir()
    shutil.copy(FIX / "comma_otlp.jsonl", tmp_path / "job" / "comma" / "gpu-002.jsonl")
    shutil.copytree(FIX / "prom", tmp_path / "textfiles")
    shutil.copy(FIX / "ras.json", tmp_path / "ras.json")
    out = tmp_path / "out.jsonl"
    res = subprocess.run(
        [sys.executable, "-m", "rocewatch.cli", "nccl-collect", str(tmp_path / "job"),
         "--job", "job-a", "--out", str(out), "--duration", "0.01", "--interval", "0.01",
         "--prom-dir", str(tmp_path / "textfiles"), "--ras-file", str(tmp_path / "ras.json")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    lag = [r for r in rows if r["metric"] == "nccl_kernel_start_lag_us" and r["port"] == "rank3"]
    assert len(lag) == 6 and min(r["value"] for r in lag) > 250
    assert "nccl_malformed_lines=2" in res.stdout and "nccl_debug_unparsed=1" in res.stdout
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["metric"], []).append(r)
    assert len(by["nccl_net_send_latency_ns"]) == 2 and len(by["nccl_coll_duration_ns"]) == 2
    assert [r["qual"] for r in by["nccl_coll_exec_us"] if r["port"] == "GPU0"] == [
        "DP Group 0/AllReduce/4-5GB"
    ]
    # RAS knows rank 3's host as 10.0.1.2; the join (Inspector's records) places it on gpu-002
    assert [(r["device"], r["port"], r["value"]) for r in by["nccl_rank_missing"]] == [
        ("gpu-002", "rank3", 1.0)
    ]
    # CoMMA: a point without time or sum, a cut line; the textfile: an unclosed label set, a
    # value "NaNx"; RAS: a missing rank "x"
    for n in ("nccl_comma_malformed=2", "nccl_prom_malformed=2", "nccl_ras_malformed=1"):
        assert n in res.stdout


def test_a_collective_a_rank_lost_is_given_up_once_every_rank_moved_on() -> None:
    from collector.nccl.inspector import CollJoin, RankStart

    stats = Stats()
    j = CollJoin(stats, horizon=2)
    judged: dict[int, list[int]] = {}

    def add(sn: int, r: int) -> None:
        for key in j.add("c", sn, 4, RankStart("h", r, 100.0 * sn, 0, 0.0)):
            starts = j.take(key)
            if starts is not None:
                judged[key[1]] = sorted(starts)

    # rank 3 lost collective 1 (its ring overwrote it); the ranks report at their own pace
    for r in (0, 1, 2):
        for sn in range(1, 6):
            add(sn, r)
    assert judged == {}  # rank 3 has said nothing yet: nothing can be judged
    for sn in range(2, 6):
        add(sn, 3)
    # 2-5 complete; 1 given up once every rank passed it by the horizon, judged on 3 of 4
    assert judged == {1: [0, 1, 2], 2: [0, 1, 2, 3], 3: [0, 1, 2, 3], 4: [0, 1, 2, 3],
                      5: [0, 1, 2, 3]}  # fmt: skip
    assert stats.get("nccl_partial_collectives") == 1


def test_nccl_telemetry_is_keyed_by_job_and_communicator(
    kafka_bootstrap: str, kafka_topics: Any, tmp_path: Path
) -> None:
    """Published to a real broker with the NCCL key: every record's key is
    ``nccl/<job>/<comm>``, holds only that communicator's samples (every rank's, from both
    hosts, Inspector's, CoMMA's and RAS's), and all of them travel in one partition."""
    from collector.nccl.service import NcclCollector
    from rocewatch import wire
    from rocewatch.bus.publish import TelemetryPublisher, nccl_key
    from rocewatch.bus.topics import ensure_topics
    from tests.test_kafka_pipeline import kafka_cfg, read_topic

    shutil.copytree(JOB, tmp_path / "job")
    # the communicator's CoMMA edges and RAS findings travel with its Inspector samples
    (tmp_path / "job" / "comma").mkdir()
    shutil.copy(FIX / "comma_otlp.jsonl", tmp_path / "job" / "comma" / "gpu-002.jsonl")
    cfg = kafka_cfg(kafka_bootstrap, kafka_topics, tmp_path, tmp_path)
    ensure_topics(cfg.kafka)
    pub = TelemetryPublisher(cfg.kafka, source="nccl-collect:job-a", key=nccl_key("job-a"))
    coll = NcclCollector(tmp_path / "job", "job-a", topo(), pub, ras_file=FIX / "ras.json")
    coll.poll(final=True)
    coll.close()
    pub.close()
    msgs = read_topic(kafka_bootstrap, cfg.kafka.topics.telemetry)
    assert msgs and {m.key for m in msgs} == {f"nccl/job-a/{COMM}".encode()}
    assert len({m.partition for m in msgs}) == 1
    rows = pl.concat([wire.decode(m.value) for m in msgs])
    # RAS's missing rank 3 (host "10.0.1.2" to RAS) is placed on its node by the join
    assert set(rows["device"]) == {"gpu-001", "gpu-002"}
    assert {"nccl_net_send_latency_ns", "nccl_rank_missing"} <= set(rows["metric"])
    assert rows.height == coll.sent
