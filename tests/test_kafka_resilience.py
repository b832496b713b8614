"""The live path when the real broker restarts mid-stream, and when detectors fall behind."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from kafka import KafkaConsumer

from rocewatch.config import Config, KafkaConfig, TopicsConfig
from rocewatch.kafka_io import DetectService, ensure_topics, publish_scenario
from rocewatch.replay import replay
from rocewatch.sim import write_scenario
from rocewatch.sim.scenarios import default_scenario

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("scenario")
    write_scenario(default_scenario(nodes=8, duration_s=30.0, seed=3), d)
    return d


@pytest.fixture(scope="module")
def replay_result(scenario: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    res = replay(scenario, tmp_path_factory.mktemp("replay"))
    assert res.alerts and res.actions, "the default scenario must raise alerts and drains"
    return res


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
        ),
        group_id=kafka_topics("group"),
        commit_interval_s=0.5,
        idle_flush_s=2.0,
        session_timeout_ms=6000,
        **kw,
    )
    return Config(
        topology=str(scenario / "topology.yaml"), kafka=k, state_dir=str(tmp_path / "state")
    )


def read_topic(bootstrap: str, topic: str, timeout_s: float = 8.0) -> list[Any]:
    c = KafkaConsumer(
        topic,
        bootstrap_servers=[bootstrap],
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
        consumer_timeout_ms=int(timeout_s * 1000),
    )
    msgs = list(c)
    c.close()
    return msgs


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


def test_broker_restart_mid_stream_loses_and_doubles_nothing(
    restartable_kafka_broker, kafka_topics, tmp_path, scenario, replay_result
):
    broker = restartable_kafka_broker
    cfg = make_cfg(broker.bootstrap, kafka_topics, tmp_path, scenario)
    ensure_topics(cfg.kafka)
    svc = DetectService(cfg)
    detect = Worker(lambda: svc.run(max_idle_s=20.0))
    published: list[int] = []
    publish = Worker(lambda: published.append(publish_scenario(scenario, cfg, 1.5)))  # 20 s
    detect.start()
    publish.start()
    deadline = time.monotonic() + 60
    while svc.pipeline.samples_in < 50_000 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert svc.pipeline.samples_in >= 50_000, "the detector never got going"
    assert publish.is_alive(), "the publisher finished before the restart: make it slower"
    t0 = time.monotonic()
    broker.restart()
    down_s = time.monotonic() - t0
    publish.join(240)
    detect.join(300)
    assert not publish.is_alive() and not detect.is_alive()
    assert publish.error is None, repr(publish.error)
    assert detect.error is None, repr(detect.error)
    assert down_s > 2.0  # the broker really was away for a while

    events = [orjson.loads(m.value) for m in read_topic(broker.bootstrap, cfg.kafka.topics.alerts)]
    keys = Counter((e["fingerprint"], e["startsAt"], e["status"]) for e in events)
    assert max(keys.values()) == 1, "an alert event was published twice"
    assert comparable(events) == comparable(replay_result.alerts)
    acts = [orjson.loads(m.value) for m in read_topic(broker.bootstrap, cfg.kafka.topics.actions)]
    assert sorted_actions(acts) == sorted_actions(replay_result.actions)
    # every sample the publisher accepted reached the detector exactly once
    assert svc.pipeline.samples_in == published[0]
