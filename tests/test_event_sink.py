"""`rocewatch sink` over a real Kafka broker: the alerts and actions a detect stage
publishes reach storage and the webhooks once each, bad records are skipped and counted, and a
database outage holds the events until it is back (the test PostgreSQL)."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kafka import KafkaProducer
from polars.testing import assert_frame_equal
from sqlalchemy.engine import make_url

from rocewatch.config import Config, KafkaConfig, TopicsConfig
from rocewatch.core.model import Action, Alert
from rocewatch.event_sink import EventSink
from rocewatch.notify.base import NotifyConfig, RetryConfig, WebhookConfig
from rocewatch.pipeline import Output
from rocewatch.replay import replay
from rocewatch.runtime.delivery import Published, send_events
from rocewatch.runtime.publish import publish_scenario
from rocewatch.runtime.service import DetectService
from storage.store import Store
from tests.notify_receiver import Receiver, free_port
from tests.pg_fresh import fresh_database
from tests.support.state_keys import SIGNING
from tests.support.until_done import run_service, stop_when_done
from tests.test_kafka_resilience import scrape
from tests.test_notify import SECRET, check_signed, events
from tests.test_scaleout import PARTITIONS, so_cfg


@dataclasses.dataclass
class Events:
    alerts: list[Alert]
    actions: list[Action]


@pytest.fixture
def replayed(replay_8n: Any) -> Events:
    res = replay_8n
    return Events(
        [a if isinstance(a, Alert) else Alert.from_json(a) for a in res.alerts],
        [a if isinstance(a, Action) else Action.from_json(a) for a in res.actions],
    )


@contextlib.contextmanager
def database(server: str) -> Iterator[str]:
    """A fresh database on the test PostgreSQL server, dropped afterwards."""
    with fresh_database(server, prefix="rw_sink") as url:
        yield url


def sink_cfg(bootstrap: str, kafka_topics: Any, db: str, hook_port: int | None) -> Config:
    topics = TopicsConfig(
        **{n: kafka_topics(n) for n in ("telemetry", "alerts", "actions", "dead_letter", "rollups")}
    )
    k = KafkaConfig(
        bootstrap_servers=bootstrap,
        topics=topics,
        group_id=kafka_topics("group"),
        session_timeout_ms=6000,
        state_signing=SIGNING,
    )
    notify = NotifyConfig()
    if hook_port is not None:
        hook = WebhookConfig(name="ops", url=f"http://127.0.0.1:{hook_port}/", secret=SECRET)
        notify = NotifyConfig(
            sinks={"webhooks": (hook,)}, retry=RetryConfig(initial_s=0.2, max_s=1.0), poll_s=0.2
        )
    return Config(storage_url=db, kafka=k, notify=notify)


def publish(cfg: Config, alerts: list[Alert], actions: list[Action], junk: bool = False) -> None:
    """As the detect stage publishes (send_events), plus records that are no events."""
    p = KafkaProducer(bootstrap_servers=cfg.kafka.bootstrap_servers)
    try:
        send_events(p, cfg, Output(alerts=alerts, actions=actions), Published())
        if junk:
            t = cfg.kafka.topics
            p.send(t.alerts, key=b"x", value=b"{not json")
            p.send(t.alerts, key=b"y", value=b'{"labels": {"alertname": "X"}}')  # no startsAt
            p.send(t.actions, key=b"z", value=b"[1, 2]")
        p.flush(30)
    finally:
        p.close()


def final_states(alerts: list[Alert]) -> dict[tuple[str, int], tuple[str, int]]:
    out: dict[tuple[str, int], tuple[str, int]] = {}
    for a in alerts:  # in event order: the last event of an alert is its state
        out[(a.fingerprint, a.starts_at)] = (a.status, a.ends_at)
    return out


def stored(db: str) -> tuple[dict[tuple[str, int], tuple[str, int]], list[Action]]:
    with Store(db) as s:
        return final_states(s.alerts()), s.actions()


def test_sink_stores_and_notifies_every_event_once(
    kafka_bootstrap: str, kafka_topics: Any, postgres_url: str, replayed: Events
) -> None:
    kafka_topics.create("alerts", partitions=3)
    rx = Receiver(free_port()).start()
    try:
        with database(postgres_url) as db:
            cfg = sink_cfg(kafka_bootstrap, kafka_topics, db, rx.port)
            publish(cfg, replayed.alerts, replayed.actions, junk=True)
            # the same events again, as an upstream writer that retried would send them
            publish(cfg, replayed.alerts, replayed.actions)
            sink = EventSink(cfg)
            sink.run(max_idle_s=4.0)
            stats = sink.stats.as_dict()
            assert stats.get("bad_alert_event") == 2, stats
            assert stats.get("bad_action_event") == 1, stats

            alerts, actions = stored(db)
            assert alerts == final_states(replayed.alerts)
            assert sorted(actions, key=repr) == sorted(set(replayed.actions), key=repr)
            want = Counter(a.event_key() for a in replayed.alerts)
            assert max(want.values()) == 1
            got: Counter[tuple[str, str, str]] = Counter()
            for req in rx.requests:
                check_signed(req)
                got.update(events(req))
            assert got == Counter(
                (a.fingerprint, a.to_json()["startsAt"], a.status) for a in replayed.alerts
            )

            # a second sink group reads everything again: nothing changes, nothing is re-sent
            sent = len(rx.requests)
            again = dataclasses.replace(
                cfg, kafka=dataclasses.replace(cfg.kafka, group_id=kafka_topics("group2"))
            )
            EventSink(again).run(max_idle_s=4.0)
            assert stored(db) == (alerts, actions)
            assert len(rx.requests) == sent
    finally:
        rx.stop()


def _connections(server: str, dbname: str, allow: bool) -> None:
    dsn = (
        make_url(server)
        .set(drivername="postgresql", database="postgres")
        .render_as_string(hide_password=False)
    )
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS {"true" if allow else "false"}')
        if not allow:
            c.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (dbname,),
            )


def test_sink_holds_events_while_the_database_is_down(
    kafka_bootstrap: str, kafka_topics: Any, postgres_url: str, replayed: Events
) -> None:
    with database(postgres_url) as db:
        name = make_url(db).database
        assert name
        port = free_port()
        cfg = dataclasses.replace(
            sink_cfg(kafka_bootstrap, kafka_topics, db, None), metrics_port=port
        )
        sink = EventSink(cfg)  # creates the schema while the database is up
        t = threading.Thread(target=sink.run, daemon=True)
        want = (final_states(replayed.alerts), sorted(set(replayed.actions), key=repr))
        try:
            _connections(postgres_url, name, allow=False)
            t.start()
            half = len(replayed.alerts) // 2
            publish(cfg, replayed.alerts[:half], [])
            deadline = time.monotonic() + 60
            while sink.storage_retries < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert sink.storage_retries >= 2, "the sink never tried to write"
            held = len(sink.pending.alerts)  # what its polls had read when the write failed
            assert 0 < held <= half
            # more events while the database is down stay in Kafka, not in the sink's memory
            publish(cfg, replayed.alerts[half:], replayed.actions)
            # one more retry: its poll came after they were on the topic (a poll and a retry
            # make one pass), and read nothing while the batch waits
            retries = sink.storage_retries
            deadline = time.monotonic() + 60
            while sink.storage_retries <= retries and time.monotonic() < deadline:
                time.sleep(0.1)
            assert sink.storage_retries > retries, "the sink stopped retrying"
            assert len(sink.pending.alerts) == held and not sink.pending.actions
            assert sink.alerts_written == 0
            # what an operator sees meanwhile: events held, retries counted, nothing written
            got = scrape(port)
            assert got["rocewatch_sink_held_events"] == held
            assert got["rocewatch_sink_storage_retries"] >= 2
            assert got['rocewatch_sink_written_rows{kind="alerts"}'] == 0
            _connections(postgres_url, name, allow=True)
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                time.sleep(0.5)
                alerts, actions = stored(db)
                if (alerts, sorted(actions, key=repr)) == want:
                    break
        finally:
            _connections(postgres_url, name, allow=True)
            sink.stop_event.set()
            t.join(60)
        assert not t.is_alive()
        alerts, actions = stored(db)
        assert (alerts, sorted(actions, key=repr)) == want
        reg = sink.metrics.registry
        assert reg.get_sample_value("rocewatch_sink_held_events") == 0
        assert reg.get_sample_value("rocewatch_sink_written_rows", {"kind": "alerts"}) > 0
        for tp in sink.positions:
            labels = {"topic": tp.topic, "partition": str(tp.partition)}
            assert reg.get_sample_value("rocewatch_sink_lag_records", labels) == 0


def ms(ns: int) -> int:
    return ns - ns % 1_000_000


ROLLUP_KEY = ["bucket_start_ns", "resolution_s", "device", "port", "qual", "metric"]


def test_detect_stores_what_replay_stores_through_its_own_sink(
    kafka_bootstrap: str, kafka_topics: Any, postgres_url: str, tmp_path: Path, scenario: Path
) -> None:
    """Four telemetry partitions aggregated apart, their rollups, alerts and actions stored by
    the sink that runs in the detect service (no `rocewatch sink` beside it): once the service
    has stopped, the database holds what a replay writes to its own."""
    with database(postgres_url) as ref_db, database(postgres_url) as db:
        with Store(ref_db) as ref:
            ref.create_schema()
            replay(scenario, tmp_path / "replay", store=ref)
            # events cross Kafka as JSON with millisecond times (docs/formats.md), replay stores
            # microseconds: the sink's rows carry the published times
            want_alerts = {
                (fp, ms(start)): (status, ms(end))
                for (fp, start), (status, end) in final_states(ref.alerts()).items()
            }
            want_actions = [dataclasses.replace(a, time=ms(a.time)) for a in ref.actions()]
            want_rollups = ref.rollups().sort(ROLLUP_KEY)
        assert want_rollups.height and want_actions

        cfg = dataclasses.replace(
            so_cfg(kafka_bootstrap, kafka_topics, "so", tmp_path, scenario), storage_url=db
        )
        kafka_topics.create("so.telemetry", partitions=PARTITIONS)
        n = publish_scenario(scenario, cfg)
        svc = DetectService(cfg)
        assert svc.sink is not None
        worker, errors = run_service(svc, 4.0)
        stop_when_done(svc, worker)  # a graceful stop: the embedded sink finishes first
        assert not errors, errors
        assert svc.agg.samples == n
        assert not svc.sink.stats.as_dict(), svc.sink.stats.as_dict()

        alerts, actions = stored(db)
        assert alerts == want_alerts
        assert sorted(actions, key=repr) == sorted(want_actions, key=repr)
        with Store(db) as s:
            got_rollups = s.rollups().sort(ROLLUP_KEY)
        assert got_rollups.select(ROLLUP_KEY).equals(want_rollups.select(ROLLUP_KEY))
        assert_frame_equal(got_rollups, want_rollups, check_exact=False, rel_tol=1e-9)


def test_detect_runs_the_sink_itself_when_it_has_somewhere_to_write() -> None:
    """`rocewatch detect` stores and notifies in its own process with storage or notify sinks
    (as the single detector always did), unless `sink.embedded: false` leaves it to a separate
    `rocewatch sink`; `--scale-out` and `kafka.scale_out` are still accepted."""
    from rocewatch.cli import build_parser
    from rocewatch.config import config_from_dict
    from rocewatch.event_sink import wanted

    hook = {"webhooks": [{"name": "ops", "url": "http://127.0.0.1:1/", "secret": "s" * 16}]}
    assert wanted(config_from_dict({"storage": {"url": "sqlite:///x.db"}}))
    assert wanted(config_from_dict({"notify": hook}))
    assert not wanted(config_from_dict({}))  # nowhere to write: no sink
    off = {"storage": {"url": "sqlite:///x.db"}, "sink": {"embedded": False}}
    assert not wanted(config_from_dict(off))
    assert config_from_dict({"kafka": {"scale_out": True}}).kafka.scale_out
    args = build_parser().parse_args(["detect", "--config", "c.yaml", "--scale-out"])
    assert args.command == "detect" and args.scale_out
