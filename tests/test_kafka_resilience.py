"""The live path when the real broker restarts mid-stream, and when detectors fall behind."""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
import tracemalloc
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest
from kafka import KafkaConsumer
from kafka.structs import TopicPartition

from rocewatch.bus.publish import (
    TelemetryPublisher,
    WatchedProducer,
    make_producer,
)
from rocewatch.bus.topics import ensure_topics
from rocewatch.config import Config, KafkaConfig, TopicsConfig
from rocewatch.core.errors import ProducerFailed
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology
from rocewatch.runtime.publish import publish_scenario
from rocewatch.sim.scenarios import default_scenario
from rocewatch.sources import merged, scenario_sources
from tests.support.kafka_read import read_to_end
from tests.support.state_keys import SIGNING
from tests.test_kafka_pipeline import wait_for_outputs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_cfg(
    bootstrap: str, kafka_topics: Any, tmp_path: Path, scenario: Path, **kw: Any
) -> Config:
    k = KafkaConfig(
        bootstrap_servers=bootstrap,
        topics=TopicsConfig(
            telemetry=kafka_topics("telemetry"),
            alerts=kafka_topics("alerts"),
            actions=kafka_topics("actions"),
            dead_letter=kafka_topics("dlq"),
            steps=kafka_topics("steps"),
            state=kafka_topics("state"),
            rollups=kafka_topics("rollups"),
        ),
        group_id=kafka_topics("group"),
        commit_interval_s=0.5,
        idle_flush_s=2.0,
        # the product default: on a loaded machine a 6 s session expired before the first poll
        # (the detector then read nothing for a minute)
        session_timeout_ms=10000,
        state_signing=SIGNING,
        **kw,
    )
    return Config(
        topology=str(scenario / "topology.yaml"), kafka=k, state_dir=str(tmp_path / "state")
    )


def read_topic(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[Any]:
    """The topic's committed records, up to its end now (tests/support/kafka_read.py)."""
    return read_to_end(topic, timeout_s, bootstrap_servers=[bootstrap])


def comparable(alerts: list[dict]) -> dict[tuple[str, str], tuple]:
    final: dict[tuple[str, str], dict] = {}
    for e in alerts:
        key = (e["fingerprint"], e["startsAt"])
        if key not in final or e["status"] == "resolved":
            final[key] = e
    return {k: (v["status"], v["endsAt"], v["labels"]["alertname"]) for k, v in final.items()}


def sorted_actions(actions: list[dict]) -> list[dict]:
    return sorted(actions, key=lambda a: (a["time"], a["node"], a["action"], a["outcome"]))


class Worker(threading.Thread):
    """A thread that keeps its target's exception for the test to raise."""

    def __init__(self, target: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.fn = target
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.fn()
        except BaseException as e:
            self.error = e


def restart_mid_stream(
    broker: Any,
    cfg: Config,
    scenario: Path,
    run: Callable[[], Any],
    going: Callable[[], bool],
    consumed: Callable[[], int],
    stop: Callable[[], Any],
    replay_result: Any,
) -> int:
    """Run the detector (``run``) and publish the scenario at 1.5x (20 s), both in threads;
    once ``going()``, restart the broker mid-stream; once the publisher is done, the detector
    has ``consumed()`` every sample and its outputs bring every alert of the replay to its
    final state, ``stop`` it (a graceful stop). The samples published."""
    detect = Worker(run)
    published: list[int] = []
    publish = Worker(lambda: published.append(publish_scenario(scenario, cfg, 1.5)))
    detect.start()
    publish.start()
    deadline = time.monotonic() + 60
    while not going() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert going(), "the detector never got going"
    assert publish.is_alive(), "the publisher finished before the restart: make it slower"
    t0 = time.monotonic()
    broker.restart()
    down_s = time.monotonic() - t0
    publish.join(240)
    assert not publish.is_alive() and publish.error is None, repr(publish.error)
    try:
        deadline = time.monotonic() + 240
        while consumed() < published[0] and time.monotonic() < deadline and detect.is_alive():
            time.sleep(0.2)
        # a detector that stopped on an error says so, rather than as outputs that never came
        assert detect.is_alive() or detect.error is None, repr(detect.error)
        wait_for_outputs(broker.bootstrap, cfg, replay_result.alerts, replay_result.actions)
    finally:
        stop()
        detect.join(300)
    assert not detect.is_alive()
    assert publish.error is None, repr(publish.error)
    assert detect.error is None, repr(detect.error)
    assert down_s > 2.0  # the broker really was away for a while
    return published[0]


def assert_replay_events_once(bootstrap: str, cfg: Config, replay_result: Any) -> None:
    """The alert events and actions published are the replay's, none twice."""
    events = [orjson.loads(m.value) for m in read_topic(bootstrap, cfg.kafka.topics.alerts)]
    keys = Counter((e["fingerprint"], e["startsAt"], e["status"]) for e in events)
    assert max(keys.values()) == 1, "an alert event was published twice"
    assert comparable(events) == comparable(replay_result.alerts)
    acts = [orjson.loads(m.value) for m in read_topic(bootstrap, cfg.kafka.topics.actions)]
    assert sorted_actions(acts) == sorted_actions(replay_result.actions)


def test_scale_out_broker_restart_mid_stream_loses_and_doubles_nothing(
    restartable_kafka_broker, kafka_topics, tmp_path, scenario, replay_result
):
    """Both scale-out stages and the detect stage's transactions across a broker restart: the
    open transaction commits once the broker is back, the steps and state topics carry on."""
    from rocewatch.runtime.service import DetectService

    broker = restartable_kafka_broker
    cfg = make_cfg(broker.bootstrap, kafka_topics, tmp_path, scenario)
    svc = DetectService(cfg)
    published = restart_mid_stream(
        broker,
        cfg,
        scenario,
        lambda: svc.run(max_idle_s=60.0),  # (a safety net: stopped once done)
        lambda: svc.det.steps_evaluated >= 20,
        lambda: svc.agg.samples,
        svc.stop_event.set,
        replay_result,
    )
    assert_replay_events_once(broker.bootstrap, cfg, replay_result)
    assert svc.agg.samples == published
    stats = svc.summary()["stats"]
    late = {k: v for k, v in stats.items() if k.startswith("late")}
    assert not late, late
    assert svc.det.shards[0].writer.commits > 0  # the detect stage did write in transactions


def set_topic_limit(bootstrap: str, topic: str, max_bytes: int) -> None:
    """Change ``topic``'s max.message.bytes on the running broker (an operator's edit)."""
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        res = ConfigResource(
            ConfigResourceType.TOPIC, topic, configs={"max.message.bytes": str(max_bytes)}
        )
        admin.alter_configs([res])
    finally:
        admin.close()


def scrape(port: int) -> dict[str, float]:
    """The service's /metrics over HTTP, as {"name{labels}": value}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def scenario_frames(scenario: Path) -> list[pl.DataFrame]:
    topo = Topology.load(scenario / "topology.yaml")
    src = scenario_sources(scenario, topo, Stats())
    frames = [df for df, _ in merged(src, 0) if df.height]
    for s in src:
        s.close()
    return frames


def count_messages(bootstrap: str, topic: str) -> int:
    c = KafkaConsumer(bootstrap_servers=[bootstrap], group_id=None)
    parts = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or ())]
    ends = c.end_offsets(parts)
    c.close()
    return sum(ends.values())


def test_a_publisher_whose_message_was_refused_streams_again_on_a_new_producer(
    kafka_bootstrap, kafka_topics, tmp_path, scenario
):
    """The telemetry topic's limit is lowered below a message, then put back. The refused
    messages are counted as failed; kafka-python's producer would fail every later send, so
    the publisher starts a new one, and the collector streams again once the limit is back
    (before, it failed quietly until restarted)."""
    cfg = make_cfg(kafka_bootstrap, kafka_topics, tmp_path, scenario)
    ensure_topics(cfg.kafka)
    topic = cfg.kafka.topics.telemetry
    frames = scenario_frames(scenario)
    pub = TelemetryPublisher(cfg.kafka, source="refused")
    try:
        set_topic_limit(kafka_bootstrap, topic, 64)  # below any record batch
        deadline = time.monotonic() + 30
        i = 0
        while not pub.failed_messages and time.monotonic() < deadline:
            pub.publish(frames[i % len(frames)])
            pub.flush()
            i += 1
        assert pub.failed_messages, "no message was refused"
        before = count_messages(kafka_bootstrap, topic)
        set_topic_limit(kafka_bootstrap, topic, 1 << 20)
        deadline = time.monotonic() + 30
        while count_messages(kafka_bootstrap, topic) == before and time.monotonic() < deadline:
            pub.publish(frames[i % len(frames)])
            pub.flush()
            i += 1
        assert count_messages(kafka_bootstrap, topic) > before, "nothing sent after the refusal"
        assert pub.producer_restarts >= 1
        got = {name: value for name, _, _, _, value in pub.readings()}
        assert got["rocewatch_publish_failed_messages_total"] == pub.failed_messages
        assert got["rocewatch_publish_producer_restarts_total"] == pub.producer_restarts
        assert got["rocewatch_publish_pending_bytes"] == 0
    finally:
        pub.close()


def test_publisher_memory_is_bounded_while_the_broker_is_away(
    restartable_kafka_broker, kafka_topics, tmp_path, scenario
):
    broker = restartable_kafka_broker
    bound = 2 << 20
    base = make_cfg(broker.bootstrap, kafka_topics, tmp_path, scenario).kafka
    pubs = {}
    for mode in ("drop", "block"):
        k = dataclasses.replace(
            base,
            topics=dataclasses.replace(base.topics, telemetry=kafka_topics(f"telemetry-{mode}")),
            publish_buffer_bytes=bound,
            publish_when_full=mode,
        )
        ensure_topics(k)
        pubs[mode] = TelemetryPublisher(k)
    frames = scenario_frames(scenario)
    for pub in pubs.values():  # the producers know the topics' leaders before the broker goes
        pub.publish(frames[0])
        pub.flush()
    broker.stop()
    try:
        # drop: publishing goes on at full speed, memory stays bounded, drops are counted
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        drop = pubs["drop"]
        offered = 0
        for df in frames[1:]:  # ~50 MB of messages: 25 times the bound
            drop.publish(df)
            offered += df.height
        peak = tracemalloc.get_traced_memory()[1] - before
        tracemalloc.stop()
        assert drop.max_pending_bytes <= bound
        assert drop.dropped_samples > offered / 2, "the broker is away: most must be dropped"
        assert peak < 4 * bound, f"publisher memory grew by {peak} bytes"
        # block: the publisher waits for room instead; nothing is dropped
        block = pubs["block"]
        worker = Worker(lambda: [block.publish(df) for df in frames[1:]])
        worker.start()
        time.sleep(3.0)
        assert worker.is_alive(), "the publisher should be blocked while the broker is away"
        assert block.pending_bytes <= bound and block.dropped_messages == 0
    finally:
        broker.start()
    worker.join(120)
    assert not worker.is_alive() and worker.error is None, repr(worker.error)
    for pub in pubs.values():
        pub.close()
        assert pub.failed_messages == 0 and pub.pending_bytes == 0
    # nothing accepted was lost: every message not dropped reached the topic
    assert count_messages(broker.bootstrap, pubs["block"].k.topics.telemetry) == pubs["block"].seq
    accepted = pubs["drop"].seq - pubs["drop"].dropped_messages
    assert count_messages(broker.bootstrap, pubs["drop"].k.topics.telemetry) == accepted


def test_a_detector_behind_its_topic_keeps_partitions_together_and_reads_everything(
    kafka_bootstrap, kafka_topics, tmp_path
):
    """A backlog: fetches fill by bytes per partition, so partitions whose devices send less run
    ahead in telemetry time and what they deliver waits in the detect stage for the slowest one
    (memory). The aggregate stage pauses the ones more than MAX_SKEW_S ahead of the slowest and
    resumes them once it has caught up: every sample is still read (kafka-python 3.0 stalled a
    resumed partition for good; see rocewatch.bus.poll.unpark_resumed)."""
    from rocewatch.runtime.service import DetectService
    from rocewatch.runtime.timing import MAX_SKEW_S
    from rocewatch.sim import Simulator

    # the backlog must be several fetches deep for a partition to run ahead: measured, 16 nodes
    # for 16 s left none ahead at all (the test fails), 16 x 20 s one 8.7 s ahead, 24 x 30 s
    # 11.4 s (3 of 4 paused), 48 x 40 s 19 s in 2.5 times the time
    sim = Simulator(default_scenario(nodes=24, duration_s=30.0, seed=5))
    k = make_cfg(kafka_bootstrap, kafka_topics, tmp_path, tmp_path, partitions=4).kafka
    cfg = Config(kafka=k, state_dir=str(tmp_path / "state"))
    ensure_topics(k)
    pub = TelemetryPublisher(k)
    for frame in sim.ticks():
        pub.publish(frame)
    pub.close()

    svc = DetectService(cfg, topology=sim.topology)
    svc.subscribe()
    agg = svc.agg
    paused_seen: set[int] = set()
    wrong: list[tuple[int, float, bool]] = []
    deadline = time.monotonic() + 240
    try:
        while agg.samples < pub.samples and time.monotonic() < deadline:
            agg.poll_once(200)
            paused = {tp.partition for tp in agg.consumer.paused()}
            paused_seen |= paused
            live = {p: part.hi for p, part in agg.parts.items() if part.hi >= 0 and not part.idle}
            if not live:
                continue
            slowest = min(live.values())
            for p, hi in live.items():  # paused exactly while far ahead of the slowest
                ahead = (hi - slowest) / 1e9
                if (ahead > MAX_SKEW_S) != (p in paused):
                    wrong.append((p, ahead, p in paused))
    finally:
        svc.close()
    assert agg.samples == pub.samples  # every sample, none twice
    assert paused_seen, "no partition ran ahead: the backlog did not exercise the balance"
    assert not wrong, f"(partition, seconds ahead, paused) against the balance: {wrong[:5]}"


def test_a_batch_the_broker_splits_is_flushed_whole_and_a_record_too_large_stops(
    kafka_bootstrap, kafka_topics
):
    """Records that fit a topic's max.message.bytes one by one, batched past it: the broker
    refuses the batch and kafka-python splits it and sends the halves, but its own flush
    raises "Future not done". The detect services' producer waits for every record's answer
    instead, so a flush after a split succeeds with every record delivered; a record too
    large alone is lost, and flush says so (ProducerFailed)."""
    topic = kafka_topics.create("split", partitions=1, **{"max.message.bytes": "20000"})
    k = KafkaConfig(bootstrap_servers=kafka_bootstrap, compression_type="none")
    w = WatchedProducer(make_producer(k))
    values = [os.urandom(7000) for _ in range(8)]  # 56 kB in one batch
    for v in values:
        w.send(topic, value=v)
    w.flush(30)
    assert w.unanswered == 0 and w.error is None
    got = KafkaConsumer(
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
        group_id=None,
    )
    got.assign([TopicPartition(topic, 0)])
    assert sorted(m.value for m in got) == sorted(values)
    got.close()
    w.send(topic, value=os.urandom(30000))
    with pytest.raises(ProducerFailed, match=topic):
        w.flush(30)
    w.close()
