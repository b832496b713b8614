"""The live path over a real Kafka broker: one `rocewatch detect` killed -9 and restarted,
bad messages, the publisher's keys. (Two instances against replay: tests/test_scaleout.py.)"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
import yaml
from kafka import KafkaProducer

from rocewatch.bus.publish import TelemetryPublisher
from rocewatch.bus.topics import ensure_topics
from rocewatch.config import Config, KafkaConfig, TopicsConfig
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology
from rocewatch.runtime.publish import publish_scenario
from rocewatch.runtime.service import DetectService
from rocewatch.sources import merged, scenario_sources
from tests.support.kafka_read import read_to_end
from tests.support.state_keys import SIGNING, SIGNING_YAML
from tests.support.until_done import run_service, stop_when_done


@pytest.fixture
def replayed(replay_result) -> list[dict]:
    return replay_result.alerts


def sorted_actions(actions: list[dict]) -> list[dict]:
    return sorted(actions, key=lambda a: (a["time"], a["node"], a["action"], a["outcome"]))


def kafka_cfg(bootstrap: str, kafka_topics, tmp_path: Path, scenario: Path) -> Config:
    names = ("telemetry", "alerts", "actions", "dead_letter", "steps", "state", "rollups")
    topics = TopicsConfig(**{n: kafka_topics(n) for n in names})
    k = KafkaConfig(
        bootstrap_servers=bootstrap,
        topics=topics,
        group_id=kafka_topics("group"),
        commit_interval_s=0.5,
        idle_flush_s=2.0,
        session_timeout_ms=6000,
        state_signing=SIGNING,
    )
    return Config(
        topology=str(scenario / "topology.yaml"), kafka=k, state_dir=str(tmp_path / "state")
    )


def read_topic(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list:
    """The topic's committed records, up to its end now (tests/support/kafka_read.py)."""
    return read_to_end(topic, timeout_s, bootstrap_servers=[bootstrap])


def wait_for_records(bootstrap: str, topic: str, n: int, timeout_s: float = 90.0) -> list:
    """At least ``n`` committed records on ``topic``; fails the test when they do not come."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = read_topic(bootstrap, topic)
        if len(got) >= n:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(got)} of {n} records on {topic} after {timeout_s:.0f} s")
        time.sleep(0.2)


def wait_for_outputs(
    bootstrap: str, cfg: Config, alerts: list[dict], actions: list[dict], timeout: float = 240
) -> None:
    """Until the alert events on ``cfg``'s topics bring every alert of ``alerts`` (events or
    final alerts) to its final state, with at least as many actions as ``actions``: the
    stream has been worked through (what is compared afterwards is compared exactly)."""
    deadline = time.monotonic() + timeout
    while True:
        t = cfg.kafka.topics
        got_alerts = [orjson.loads(m.value) for m in read_topic(bootstrap, t.alerts)]
        got_actions = [orjson.loads(m.value) for m in read_topic(bootstrap, t.actions)]
        if comparable(got_alerts) == comparable(alerts) and len(got_actions) >= len(actions):
            return
        if time.monotonic() > deadline:
            want, got = comparable(alerts), comparable(got_alerts)
            missing = {k: v for k, v in want.items() if got.get(k) != v}
            raise AssertionError(
                f"outputs incomplete after {timeout:.0f} s: {len(missing)} alerts not (yet) in "
                f"their final state, {len(got_actions)} of {len(actions)} actions: "
                f"{list(missing.items())[:5]}"
            )
        time.sleep(0.5)


def detect_state_end(bootstrap: str, topic: str, committed: bool = False) -> int:
    """The end offset of the state topic's last partition (the detect stage's checkpoints).
    ``committed``: the last stable offset, which a state record still in its open transaction
    (one a kill -9 would abort) does not move."""
    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition

    isolation = "read_committed" if committed else "read_uncommitted"
    c = KafkaConsumer(bootstrap_servers=[bootstrap], group_id=None, isolation_level=isolation)
    try:
        parts = c.partitions_for_topic(topic) or {0}
        tp = TopicPartition(topic, max(parts))
        return int(c.end_offsets([tp])[tp])
    finally:
        c.close()


def final_states(events: list[dict]) -> dict[tuple[str, str], dict]:
    """Alert events -> the final state of each alert instance (resolved wins over firing)."""
    out: dict[tuple[str, str], dict] = {}
    for e in events:
        key = (e["fingerprint"], e["startsAt"])
        if key not in out or e["status"] == "resolved":
            out[key] = e
    return out


def comparable(alerts: list[dict]) -> dict[tuple[str, str], tuple]:
    return {
        k: (v["status"], v["endsAt"], v["labels"]["alertname"])
        for k, v in final_states(alerts).items()
    }


def test_detector_killed_mid_stream_loses_and_doubles_nothing(
    kafka_bootstrap, kafka_topics, tmp_path, scenario, replayed, replay_result
):
    cfg = kafka_cfg(kafka_bootstrap, kafka_topics, tmp_path, scenario)
    ensure_topics(cfg.kafka)
    conf = tmp_path / "rocewatch.yaml"
    k = cfg.kafka
    conf.write_text(
        yaml.safe_dump(
            {
                "topology": cfg.topology,
                "state_dir": cfg.state_dir,
                "kafka": {
                    "bootstrap_servers": k.bootstrap_servers,
                    "group_id": k.group_id,
                    "commit_interval_s": 0.5,
                    "idle_flush_s": 3.0,
                    "session_timeout_ms": 6000,
                    "topics": dataclasses.asdict(k.topics),
                    "state_signing": SIGNING_YAML,
                },
            }
        )
    )
    cmd = [sys.executable, "-m", "rocewatch.cli", "detect", "--config", str(conf)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first_log = tmp_path / "first.log"
    with first_log.open("wb") as fh:
        first = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)
    # once it reads, publish at 1.5x telemetry speed (20 s) in the background, so the kill
    # lands mid-stream
    deadline = time.monotonic() + 120
    while "detect stage active" not in first_log.read_text(errors="replace"):
        assert first.poll() is None and time.monotonic() < deadline, first_log.read_text()
        time.sleep(0.1)
    pub = threading.Thread(target=publish_scenario, args=(scenario, cfg, 1.5), daemon=True)
    pub.start()
    try:
        # kill -9 once it has published some alerts and checkpointed its detect stage since
        # (every commit interval, 0.5 s, to the state topic's last partition)
        wait_for_records(kafka_bootstrap, k.topics.alerts, 2)
        before = detect_state_end(kafka_bootstrap, k.topics.state)
        deadline = time.monotonic() + 60
        while detect_state_end(kafka_bootstrap, k.topics.state) <= before:
            assert time.monotonic() < deadline, "no checkpoint after the first alerts"
            assert first.poll() is None, first_log.read_text()[-3000:]
            time.sleep(0.1)
        assert first.poll() is None, first_log.read_text()[-3000:]
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    assert pub.is_alive(), "the stream ended before the kill: nothing was in flight"
    second_log = tmp_path / "second.log"
    with second_log.open("wb") as fh:  # (--max-idle: a safety net; stopped once done)
        second = subprocess.Popen(
            [*cmd, "--max-idle", "60"], env=env, stdout=fh, stderr=subprocess.STDOUT
        )
    try:
        pub.join(120)
        # once the restart has brought every alert to its final state and made the drains,
        # a graceful stop (SIGTERM: final checkpoint and transaction), not an idle one
        wait_for_outputs(kafka_bootstrap, cfg, replayed, replay_result.actions)
        second.send_signal(signal.SIGTERM)
        assert second.wait(120) == 0, second_log.read_text(errors="replace")[-3000:]
    finally:
        if second.poll() is None:
            second.kill()
    log = second_log.read_text(errors="replace")
    # the restart began from the checkpoints the killed one left, not from the start
    resumed = re.findall(r"partition \d+ resumes at offset (\d+)", log)
    assert resumed and max(int(o) for o in resumed) > 0, log[-3000:]
    restored = re.search(r"detect stage active \(steps offset (\d+)\)", log)
    assert restored and int(restored.group(1)) > 0, log[-3000:]
    events = [orjson.loads(m.value) for m in read_topic(kafka_bootstrap, k.topics.alerts)]
    keys = Counter((e["fingerprint"], e["startsAt"], e["status"]) for e in events)
    doubled = [key for key, c in keys.items() if c > 1]
    assert not doubled, f"published twice after the restart: {doubled}"
    assert comparable(events) == comparable(replayed)
    acts = [orjson.loads(m.value) for m in read_topic(kafka_bootstrap, k.topics.actions)]
    drains = Counter(a["node"] for a in acts if a["action"] == "drain")
    assert all(c == 1 for c in drains.values()), drains
    assert sorted_actions(acts) == sorted_actions(replay_result.actions)


def test_garbage_messages_go_to_dead_letter_and_the_stream_goes_on(
    kafka_bootstrap, kafka_topics, tmp_path, scenario, replayed
):
    cfg = kafka_cfg(kafka_bootstrap, kafka_topics, tmp_path, scenario)
    ensure_topics(cfg.kafka)
    garbage = KafkaProducer(bootstrap_servers=[kafka_bootstrap])
    for v in (b"\x00garbage", b'{"json": "is not protobuf"}', b""):
        garbage.send(cfg.kafka.topics.telemetry, key=b"leaf-r0-p0", value=v)
    garbage.flush()
    garbage.close()
    publish_scenario(scenario, cfg)
    svc = DetectService(cfg)
    worker, errors = run_service(svc, 8.0)  # the group join counts as idle time
    stop_when_done(svc, worker)
    assert not errors, errors
    assert svc.summary()["stats"]["dead_letter"] == 3
    dlq = read_topic(kafka_bootstrap, cfg.kafka.topics.dead_letter)
    assert len(dlq) == 3
    assert all(dict(m.headers).get("rocewatch-error") for m in dlq)
    events = [orjson.loads(m.value) for m in read_topic(kafka_bootstrap, cfg.kafka.topics.alerts)]
    assert comparable(events) == comparable(replayed)


def test_publisher_keys_by_device(kafka_bootstrap, kafka_topics, tmp_path, scenario):
    cfg = kafka_cfg(kafka_bootstrap, kafka_topics, tmp_path, scenario)
    ensure_topics(cfg.kafka)
    topo = Topology.load(scenario / "topology.yaml")
    src = scenario_sources(scenario, topo, Stats())
    pub = TelemetryPublisher(cfg.kafka)
    df, _ = next(iter(merged(src, 0)))
    pub.publish(df)
    pub.close()
    msgs = read_topic(kafka_bootstrap, cfg.kafka.topics.telemetry)
    from rocewatch import wire

    by_part: dict[bytes, set[int]] = {}
    for m in msgs:
        devices = set(wire.decode(m.value)["device"].unique())
        assert devices == {m.key.decode()}
        by_part.setdefault(m.key, set()).add(m.partition)
    assert all(len(p) == 1 for p in by_part.values())
    for s in src:
        s.close()


def test_event_read_back_matches_the_event_made_in_memory():
    """After a restart, events read back from the topics suppress the same events made again.

    Telemetry times carry nanoseconds; the JSON keeps milliseconds. The ids must agree anyway,
    or a restarted detector publishes every event since its checkpoint a second time.
    """
    from rocewatch.core.model import Action, Alert
    from rocewatch.runtime.delivery import _action_id, _alert_id, _event_id

    cfg = Config()
    t = 1_795_000_000_123_456_789  # sub-millisecond part, as sample times have
    alert = Alert(
        labels={"alertname": "PFCStorm", "severity": "critical", "node": "gpu-017"},
        annotations={"summary": "storm"},
        starts_at=t,
        ends_at=t + 2_000_000_000,
    )
    wire_alert = orjson.dumps(alert.to_json())
    assert _event_id(cfg.kafka.topics.alerts, wire_alert, cfg) == _alert_id(alert)
    act = Action(
        time=t,
        action="drain",
        node="gpu-017",
        scheduler="slurm",
        reason="rocewatch: PFCStorm origin mlx5_3",
        alert_fingerprint=alert.fingerprint,
        executed=False,
        outcome="dry-run",
    )
    wire_act = orjson.dumps(act.to_json())
    assert _event_id(cfg.kafka.topics.actions, wire_act, cfg) == _action_id(act)
    # different events stay apart
    later = Alert(labels=alert.labels, annotations={}, starts_at=t + 1_000_000)
    assert _alert_id(later) != _alert_id(alert)
