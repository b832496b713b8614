"""Live INT over UDP on 127.0.0.1: the same aggregates (and QueueBuildup) as from the pcap;
garbage counted; a flood is dropped and counted with the ring's memory fixed."""

from __future__ import annotations

import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from collector.inband import build_report, write_pcap
from collector.inband.live import IntCollector
from collector.inband.udp import UdpListener, UdpListenerConfig
from rocewatch.config import Config
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology
from rocewatch.pipeline import Pipeline
from rocewatch.sim.inband import UdpSender
from rocewatch.sources import PcapSource
from tests.notify_receiver import free_port
from tests.support.prom import Samples, scrape
from tests.test_int_replay import T0, int_payloads, topology
from tests.test_int_spec import group, int_report, spec_example

KEYS = ["ts", "device", "port", "qual", "metric"]


def _pcap_samples(tmp_path: Path, topo: Topology) -> tuple[pl.DataFrame, Stats]:
    write_pcap(tmp_path / "int.pcap", int_payloads())
    stats = Stats()
    src = PcapSource(tmp_path / "int.pcap", topo, stats)
    frames = []
    while (df := src.next()) is not None:
        frames.append(df)
    return pl.concat(frames).sort(KEYS), stats


def _live_samples(topo: Topology, payloads: list[bytes]) -> tuple[pl.DataFrame, IntCollector]:
    frames: list[pl.DataFrame] = []
    listener = UdpListener(UdpListenerConfig(host="127.0.0.1", port=0))
    coll = IntCollector(topo, listener, frames.append, Stats())
    stop = threading.Event()
    runner = threading.Thread(target=coll.run, kwargs={"stop": stop})
    runner.start()
    sender = UdpSender("127.0.0.1", listener.port, rate=20_000)
    try:
        assert sender.send(payloads) == len(payloads)
        deadline = time.monotonic() + 30
        while listener.stats.received < len(payloads) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        stop.set()
        runner.join(30)
        listener.close()
        sender.close()
    return pl.concat(frames).sort(KEYS), coll


def test_live_udp_matches_pcap(tmp_path: Path) -> None:
    topo = Topology.from_dict(topology())
    want, pstats = _pcap_samples(tmp_path, topo)
    payloads = int_payloads()
    got, coll = _live_samples(topo, payloads)
    assert listener_counts_ok(coll, len(payloads))
    assert got.equals(want)
    for key in ("int_malformed_datagrams", "int_truncated_reports", "int_report_loss"):
        assert coll.stats.get(key) == pstats.get(key), key
    assert coll.stats.get("int_report_loss") == 5
    assert coll.stats.get("int_malformed_datagrams") + coll.stats.get("int_truncated_reports") >= 24

    # the live samples find the queue building up on leaf-0 Ethernet1/1 queue 3 from 3 s on
    pipe = Pipeline(topo, Config(), stats=Stats())
    pipe.ingest(got)
    pipe.advance(int(got["ts"].max()))  # type: ignore[arg-type]
    pipe.finish()
    alerts = [a.to_json() for a in pipe.all_alerts()]
    builds = [a for a in alerts if a["labels"]["alertname"] == "QueueBuildup"]
    assert [(a["labels"]["switch"], a["labels"]["port"], a["labels"]["queue"]) for a in builds] == [
        ("leaf-0", "Ethernet1/1", "3")
    ]
    assert builds[0]["startsAt"] >= "2026-11-29T10:00:03"


def listener_counts_ok(coll: IntCollector, sent: int) -> bool:
    c = coll.counts()
    return c["datagrams"] == sent and c.get("int_udp_kernel_drops", 0) == 0


def test_flood_is_dropped_and_counted() -> None:
    """Nobody polls while 3000 datagrams arrive: the kernel keeps what fits in the socket's
    receive buffer, the rest is counted as dropped; the ring never grows."""
    cfg = UdpListenerConfig(
        host="127.0.0.1", port=0, ring_bytes=4096, max_datagram_bytes=256, rcvbuf_bytes=65536
    )
    listener = UdpListener(cfg)
    ring_bytes = listener._ring.nbytes
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dgram = build_report(11, 0, [{"hop_latency_ns": 1, "egress_ts": T0}])
    sent = 3000
    try:
        for _ in range(sent - 1):
            tx.sendto(dgram, ("127.0.0.1", listener.port))
        tx.sendto(b"x" * 1000, ("127.0.0.1", listener.port))  # longer than max_datagram_bytes
        rows = 0
        while (df := listener.poll(timeout=0.2)).height or listener.stats.received == 0:
            rows += df.height
            assert listener._ring.nbytes == ring_bytes
        st = listener.stats
        assert st.kernel_drops > 0
        assert st.received + st.kernel_drops + st.oversize == sent
        assert rows == st.received
        assert listener.parse_stats.reports == st.received
    finally:
        tx.close()
        listener.close()


def run_int_listen(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], send: Callable[[int], int]
) -> tuple[str, pl.DataFrame, Samples]:
    """`rocewatch int-listen --out` in this process, fed by ``send(port)`` (returns datagrams
    sent). It runs in the main thread (it installs a SIGTERM handler); a driver thread waits for
    its /metrics, sends, waits until /metrics count every datagram, then stops it with SIGTERM.
    Returns its stdout, the samples it wrote and the last /metrics scrape."""
    from rocewatch.cli import main

    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(topology()))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    metrics_port = free_port()
    out = tmp_path / "samples.jsonl"
    before = signal.getsignal(signal.SIGTERM)
    done = threading.Event()
    seen: Samples = {}
    errors: list[BaseException] = []

    def drive() -> None:
        deadline = time.monotonic() + 30
        try:
            while not done.is_set():  # up once /metrics answer: the socket is bound by then
                try:
                    scrape(metrics_port)
                    break
                except OSError:
                    assert time.monotonic() < deadline, "int-listen did not start"
                    time.sleep(0.01)
            n = send(port)
            m = scrape(metrics_port)
            while m.get(("rocewatch_int_datagrams_total", ())) != n and not done.is_set():
                assert time.monotonic() < deadline, f"int-listen did not get {n} datagrams"
                time.sleep(0.01)
                m = scrape(metrics_port)
            seen.update(m)
        except BaseException as e:  # reported by the test below
            errors.append(e)
        finally:
            if not done.is_set() and signal.getsignal(signal.SIGTERM) is not before:
                os.kill(os.getpid(), signal.SIGTERM)  # its handler: stop and flush

    driver = threading.Thread(target=drive)
    driver.start()
    try:
        rc = main(
            [
                "int-listen",
                "--topology",
                str(tmp_path / "topology.yaml"),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--out",
                str(out),
                "--duration",
                "30",  # a bound only: SIGTERM ends it
                "--metrics-port",
                str(metrics_port),
            ]
        )
    finally:
        done.set()
        driver.join(30)
        signal.signal(signal.SIGTERM, before)
    assert not errors, errors
    assert rc == 0
    samples = pl.read_ndjson(out) if out.exists() and out.stat().st_size else pl.DataFrame()
    return capsys.readouterr().out, samples, seen


def test_cli_int_listen_and_send(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`rocewatch int-send` a pcap to `rocewatch int-listen --out`: the file holds the samples."""
    from rocewatch.cli import main

    topo = Topology.from_dict(topology())
    want, _ = _pcap_samples(tmp_path, topo)
    n = len(int_payloads())

    def send(port: int) -> int:
        assert (
            main(["int-send", str(tmp_path), "--to", f"127.0.0.1:{port}", "--rate", "20000"]) == 0
        )
        return n

    stdout, got, m = run_int_listen(tmp_path, capsys, send)
    assert f"sent {n} datagrams" in stdout
    # while it ran, its /metrics counted what arrived, what was skipped and what was lost
    assert m[("rocewatch_int_datagrams_total", ())] == n
    assert m[("rocewatch_int_reports_total", ())] > 0
    assert m[("rocewatch_input_skipped", (("reason", "int_report_loss"),))] == 5
    assert m[("rocewatch_int_reports_lost_total", (("switch", "leaf-0"),))] == 5
    assert f"datagrams={n}" in stdout and "int_report_loss=5" in stdout
    got = got.sort(KEYS)
    assert got.height == want.height
    assert got["value"].to_list() == want["value"].to_list()


def test_cli_int_listen_spec_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Datagrams laid out byte by byte as the specification's text writes them, its worked
    example among them (no timestamps: placed by their receive time), sent with `rocewatch
    int-send`: samples for the switch named by Node ID and the port by int_ports, occupancy in
    bytes (x int_cell_bytes), hop latency in ns, and nothing counted malformed."""
    from rocewatch.cli import main

    def md(eg: int, lat: int, q: int, occ: int) -> bytes:  # RepMdBits 1, 2, 3
        return struct.pack(">HHII", 9, eg, lat, (q << 24) | occ)

    dgrams = []
    for seq in range(40):
        dgrams.append(spec_example(seq=2 * seq))  # leaf-0 port 1, queue 3, 1234 cells
        dgrams.append(
            group(11, 2 * seq + 1)
            + int_report([1, 2, 3], md=md(2, 1500, 3, 100))  # leaf-0 port 2
            + int_report([1, 2, 3], md=md(1, 800, 3, 1234))  # leaf-0 port 1 again
        )
        dgrams.append(group(12, seq) + int_report([1, 2, 3], md=md(5, 700, 1, 10)))  # leaf-1
    write_pcap(tmp_path / "int.pcap", dgrams)

    def send(port: int) -> int:
        assert main(["int-send", str(tmp_path), "--to", f"127.0.0.1:{port}"]) == 0
        return len(dgrams)

    t0 = time.time_ns()
    stdout, got, _ = run_int_listen(tmp_path, capsys, send)
    t1 = time.time_ns()
    counts = dict(kv.split("=") for kv in stdout.split("\n")[-2].split())
    assert counts["datagrams"] == str(len(dgrams)) and counts["reports"] == str(160)
    assert not [k for k in counts if "malformed" in k or "truncated" in k or "loss" in k], counts
    want = {
        ("leaf-0", "Ethernet1/1", "3", "int_queue_p99_bytes"): {1234 * 80.0},
        ("leaf-0", "Ethernet1/1", "3", "queue_peak_bytes"): {1234 * 80.0},
        ("leaf-0", "Ethernet1/1", "3", "int_hop_latency_max_ns"): {800.0},
        ("leaf-0", "Ethernet1/2", "3", "int_queue_mean_bytes"): {100 * 80.0},
        ("leaf-0", "Ethernet1/2", "3", "int_hop_latency_mean_ns"): {1500.0},
        ("leaf-1", "5", "1", "int_queue_mean_bytes"): {10 * 80.0},
        ("leaf-1", "5", "1", "int_hop_latency_max_ns"): {700.0},
    }
    values = got.group_by(["device", "port", "qual", "metric"]).agg(pl.col("value").unique())
    have = {tuple(r[:4]): set(r[4]) for r in values.iter_rows()}
    for key, v in want.items():
        assert have.get(key) == v, key
    assert {k[:3] for k in have} == {k[:3] for k in want}
    # no timestamp of their own: stamped with the time they arrived (interval end: + 100 ms)
    assert t0 <= got["ts"].min() and got["ts"].max() <= t1 + 100_000_000  # type: ignore[operator]


@pytest.mark.kafka
def test_live_udp_to_kafka(tmp_path: Path, kafka_bootstrap: str, kafka_topics: Any) -> None:
    """What `rocewatch int-listen` does without --out: samples on the telemetry topic, keyed by
    switch, equal to the pcap's."""
    from kafka import KafkaConsumer

    from rocewatch import wire
    from rocewatch.bus.publish import TelemetryPublisher
    from rocewatch.config import KafkaConfig, TopicsConfig

    topo = Topology.from_dict(topology())
    want, _ = _pcap_samples(tmp_path, topo)
    topic = kafka_topics.create("telemetry", partitions=2)
    k = KafkaConfig(bootstrap_servers=kafka_bootstrap, topics=TopicsConfig(telemetry=topic))
    pub = TelemetryPublisher(k, source="int-listen:test")
    listener = UdpListener(UdpListenerConfig(host="127.0.0.1", port=0))
    coll = IntCollector(topo, listener, pub.publish, Stats())
    stop = threading.Event()
    runner = threading.Thread(target=coll.run, kwargs={"stop": stop})
    runner.start()
    payloads = int_payloads()
    sender = UdpSender("127.0.0.1", listener.port, rate=20_000)
    try:
        sender.send(payloads)
        deadline = time.monotonic() + 30
        while listener.stats.received < len(payloads) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        stop.set()
        runner.join(30)
        listener.close()
        sender.close()
        pub.close()
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
        group_id=None,
    )
    frames = []
    for m in consumer:
        df = wire.decode(m.value)
        assert {m.key.decode()} == set(df["device"].to_list())
        frames.append(df)
    consumer.close()
    got = pl.concat(frames).sort(KEYS)
    assert got.select([*KEYS, "value"]).equals(want.select([*KEYS, "value"]))


def test_open_interval_is_bounded() -> None:
    """Reports that all fall into one interval are aggregated once too many pile up."""
    from collector.inband import parse_datagrams
    from collector.inband.aggregate import IntAggregator

    topo = Topology.from_dict(topology())
    stats = Stats()
    agg = IntAggregator(topo, stats, max_open_rows=100)
    dgrams = [
        build_report(11, i, [{"egress_port": 1, "queue_id": 3, "queue_occupancy_cells": i,
                              "egress_ts": T0 + i}])
        for i in range(60)
    ]  # fmt: skip
    first = agg.add(parse_datagrams(dgrams[:30])[0])
    assert first.height == 0 and agg.carry is not None and agg.carry.height == 30
    second = agg.add(parse_datagrams(dgrams[30:] * 3)[0])  # 120 more: over the bound
    assert stats.get("int_interval_closed_early") == 1 and agg.carry is None
    peak = second.filter(pl.col("metric") == "queue_peak_bytes")["value"].to_list()
    assert peak == [59 * 80]
