"""Live INT over UDP on 127.0.0.1: the same aggregates (and QueueBuildup) as from the pcap;
garbage counted; a flood is dropped and counted with the ring's memory fixed."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from collector.inband import build_report, write_pcap
from collector.inband.live import IntCollector
from collector.inband.udp import UdpListener, UdpListenerConfig
from rocewatch.config import Config
from rocewatch.pipeline import Pipeline
from rocewatch.sim.inband import UdpSender
from rocewatch.sources import PcapSource
from rocewatch.stats import Stats
from rocewatch.topology import Topology
from tests.notify_receiver import free_port
from tests.support.prom import scrape
from tests.test_int_replay import T0, int_payloads, topology

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


def test_cli_int_listen_and_send(tmp_path: Path) -> None:
    """`rocewatch int-send` a pcap to `rocewatch int-listen --out`: the file holds the samples."""
    import subprocess
    import sys

    topo = Topology.from_dict(topology())
    want, _ = _pcap_samples(tmp_path, topo)
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(topology()))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "samples.jsonl"
    cli = [sys.executable, "-m", "rocewatch.cli"]
    metrics_port = free_port()
    listen = subprocess.Popen(
        [
            *cli,
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
            "10",
            "--metrics-port",
            str(metrics_port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(2.0)  # the interpreter starting and binding
        sent = subprocess.run(
            [*cli, "int-send", str(tmp_path), "--to", f"127.0.0.1:{port}", "--rate", "20000"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert f"sent {len(int_payloads())} datagrams" in sent.stdout
        # while it runs, its /metrics count what arrived and what was skipped
        n = len(int_payloads())
        deadline = time.monotonic() + 6
        m = scrape(metrics_port)
        while m.get(("rocewatch_int_datagrams_total", ())) != n and time.monotonic() < deadline:
            time.sleep(0.2)
            m = scrape(metrics_port)
        assert m[("rocewatch_int_datagrams_total", ())] == n
        assert m[("rocewatch_int_reports_total", ())] > 0
        assert m[("rocewatch_input_skipped", (("reason", "int_report_loss"),))] == 5
        stdout, stderr = listen.communicate(timeout=60)
    finally:
        if listen.poll() is None:
            listen.kill()
            listen.wait()
    assert listen.returncode == 0, stderr
    assert f"datagrams={len(int_payloads())}" in stdout and "int_report_loss=5" in stdout
    got = pl.read_ndjson(out).sort(KEYS)
    assert got.height == want.height
    assert got["value"].to_list() == want["value"].to_list()


@pytest.mark.kafka
def test_live_udp_to_kafka(tmp_path: Path, kafka_bootstrap: str, kafka_topics: Any) -> None:
    """What `rocewatch int-listen` does without --out: samples on the telemetry topic, keyed by
    switch, equal to the pcap's."""
    from kafka import KafkaConsumer

    from rocewatch import wire
    from rocewatch.config import KafkaConfig, TopicsConfig
    from rocewatch.kafka_io import TelemetryPublisher

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
