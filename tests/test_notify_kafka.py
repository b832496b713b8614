"""`rocewatch detect` over a real Kafka broker delivers its alerts by signed webhook, once each:
its detect stage publishes them, the sink in its process queues and sends them."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import orjson

from rocewatch.config import Config, KafkaConfig, TopicsConfig
from rocewatch.notify.base import NotifyConfig, RetryConfig, WebhookConfig
from rocewatch.runtime.publish import publish_scenario
from rocewatch.runtime.service import DetectService
from rocewatch.sim import write_scenario
from rocewatch.sim.scenarios import default_scenario
from tests.notify_receiver import Receiver, free_port
from tests.support.state_keys import SIGNING
from tests.support.until_done import run_service, stop_when_done
from tests.test_kafka_pipeline import read_topic
from tests.test_notify import SECRET, check_signed, events


def test_detect_service_sends_every_alert_event_once(
    kafka_bootstrap: str, kafka_topics, tmp_path: Path
) -> None:
    scenario = tmp_path / "scenario"
    write_scenario(default_scenario(nodes=8, duration_s=15.0, seed=3), scenario)
    names = ("telemetry", "alerts", "actions", "dead_letter", "steps", "state", "rollups")
    topics = TopicsConfig(**{n: kafka_topics(n) for n in names})
    k = KafkaConfig(
        bootstrap_servers=kafka_bootstrap,
        topics=topics,
        group_id=kafka_topics("group"),
        commit_interval_s=0.5,
        idle_flush_s=2.0,
        session_timeout_ms=6000,
        state_signing=SIGNING,
    )
    rx = Receiver(free_port()).start()
    hook = WebhookConfig(name="ops", url=f"http://127.0.0.1:{rx.port}/", secret=SECRET)
    cfg = Config(
        topology=str(scenario / "topology.yaml"),
        kafka=k,
        state_dir=str(tmp_path / "state"),
        storage_url=f"sqlite:///{tmp_path / 'rocewatch.db'}",
        notify=NotifyConfig(
            sinks={"webhooks": (hook,)}, retry=RetryConfig(initial_s=0.2, max_s=1.0)
        ),
    )
    cfg = dataclasses.replace(cfg, notify=dataclasses.replace(cfg.notify, poll_s=0.2))
    try:
        assert publish_scenario(scenario, cfg) > 10_000
        svc = DetectService(cfg)
        assert svc.sink is not None  # storage and notify: the sink runs in the service
        worker, errors = run_service(svc, 8.0)
        stop_when_done(svc, worker)  # a graceful stop: the embedded sink finishes first
        assert not errors, errors
    finally:
        rx.stop()
    published = [orjson.loads(m.value) for m in read_topic(kafka_bootstrap, topics.alerts)]
    assert published
    want = Counter((e["fingerprint"], e["startsAt"], e["status"]) for e in published)
    got: Counter[tuple[str, str, str]] = Counter()
    for req in rx.requests:
        check_signed(req)
        got.update(events(req))
    assert got == want
