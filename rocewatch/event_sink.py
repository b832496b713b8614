"""`rocewatch sink`: the alerts and actions topics into storage and the notify outbox.

The detect stage only publishes alerts and actions to Kafka (in transactions, exactly once);
this consumer group (``<group_id>-sink`` on ``kafka.topics.alerts`` and ``kafka.topics.actions``)
stores them and queues their notifications. ``rocewatch detect`` runs it in a thread of its own
when storage or notify is configured (``sink.embedded``, the default: one process does it all,
and several detect replicas split the sink's partitions as they split the rest); with
``sink.embedded: false`` run ``rocewatch sink`` beside the detectors instead:

- alert events are upserted by (fingerprint, startsAt) and a resolved event stays resolved;
  actions are inserted once per (time, action, node, fingerprint); each alert event is queued
  once per configured sink; with storage, the metric rollups stage 1 computes
  (``kafka.topics.rollups``) are upserted by bucket and series, so a complete bucket replaces
  the provisional one sent when its partition went idle. All are idempotent, so the order is:
  write a batch, then commit its offsets. A crash or a rebalance between the two re-reads the
  batch and changes nothing. Times are those of the published events (milliseconds).
- a record that is not an alert or action event (bad JSON, missing fields) is counted by reason,
  logged once per reason, and skipped; the stream goes on.
- when the database is unreachable the batch is kept, the partitions are paused (the group
  membership stays alive, nothing more is read) and the write is retried with capped backoff;
  nothing read is lost and the consumer lag shows the backlog.
- with ``notify`` configured, a sender thread delivers the outbox (or run ``rocewatch notify``
  beside it).
- with ``storage.retention_days``, rows older than that are pruned once an hour.

Run one or several (they split the partitions); the alerts topic is keyed by fingerprint, so an
alert's firing and resolved events stay in order on one partition.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
import polars as pl
from kafka import KafkaConsumer
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata, TopicPartition

from rocewatch.bus.poll import poll_group
from rocewatch.bus.topics import (
    GROUP_METADATA_MAX_AGE_MS,
    ensure_topics,
    rollups_topic,
    wait_for_partitions,
)
from rocewatch.config import Config
from rocewatch.core.errors import BadInput, ConfigError, PermanentError, RetryableError
from rocewatch.core.model import Action, Alert
from rocewatch.core.stats import Stats
from rocewatch.runtime.outputs import OutputWriter
from rocewatch.runtime.steps import decode_rollups

log = logging.getLogger(__name__)

RETRY_MIN_S = 0.5
RETRY_MAX_S = 30.0
RETENTION_EVERY_S = 3600.0  # how often storage is pruned by age
FINISH_S = 30.0  # an embedded sink's longest wait, once detect stops, for what it published


@dataclass
class Batch:
    alerts: list[Alert] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    rollups: list[pl.DataFrame] = field(default_factory=list)
    offsets: dict[TopicPartition, int] = field(default_factory=dict)  # next offset to commit

    def __bool__(self) -> bool:
        return bool(self.offsets)


def wanted(cfg: Config) -> bool:
    """True when ``rocewatch detect`` runs the sink in a thread of its own."""
    return cfg.sink.embedded and bool(cfg.storage_url or cfg.notify.enabled)


class EventSink:
    """``metrics``: the detect service's endpoint when embedded in it (one port for both);
    without it, ``metrics_port`` gets an endpoint of the sink's own."""

    def __init__(self, cfg: Config, metrics: Any = None) -> None:
        if not cfg.storage_url and not cfg.notify.enabled:
            raise ConfigError("sink: set storage.url or notify sinks: it has nowhere to write")
        self.cfg = cfg
        k = cfg.kafka
        self.topics = [k.topics.alerts, k.topics.actions]
        extra = []
        if cfg.storage_url:  # detect instances with storage send their metric rollups
            self.topics.append(k.topics.rollups)
            extra.append(rollups_topic(k))
        self.stats = Stats()
        self.stop_event = threading.Event()
        self.store: Any = None
        if cfg.storage_url:
            from storage.store import Store

            self.store = Store(cfg.storage_url)
            self.store.create_schema()
            if cfg.topology:  # incident graphs follow the pause over its cables
                from rocewatch.core.topology import Topology

                self.store.topology = Topology.load(cfg.topology)
        from rocewatch.runtime.notifier import open_dispatcher

        self.notifier = open_dispatcher(cfg, self.store)
        self.own_metrics = metrics is None
        self.metrics: Any = metrics
        if metrics is None and cfg.metrics_port:
            from rocewatch.core.metrics import ServiceMetrics

            self.metrics = ServiceMetrics(cfg.metrics_port)
        ensure_topics(k, extra)
        self.consumer = KafkaConsumer(
            **k.client_kwargs(),
            group_id=k.group_id + "-sink",
            enable_auto_commit=False,
            # a fenced detect stage's aborted events are not events (DetectWriter)
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            max_poll_records=2000,
            fetch_max_bytes=32 << 20,  # rollups records are large: what one poll may hold
            max_partition_fetch_bytes=8 << 20,
            session_timeout_ms=k.session_timeout_ms,
            heartbeat_interval_ms=max(1000, k.session_timeout_ms // 4),
            metadata_max_age_ms=GROUP_METADATA_MAX_AGE_MS,
        )
        self.pending = Batch()
        self.positions: dict[TopicPartition, int] = {}  # next offset to read, per partition
        self.retry_at = 0.0
        self.retry_s = RETRY_MIN_S
        self.alerts_written = 0
        self.actions_written = 0
        self.rollups_written = 0
        self.storage_retries = 0  # failed writes, each retried later
        self.queued = 0
        self.pruned_at = -float("inf")
        self.finishing = threading.Event()  # stop once read to the end (``finish``)

    # --- input -----------------------------------------------------------------------------------
    def _parse(self, m: Any) -> Alert | Action | pl.DataFrame | None:
        if m.topic == self.cfg.kafka.topics.rollups:
            try:
                return decode_rollups(m.value or b"")
            except BadInput as e:
                self._skip(m, "bad_rollups", e)
                return None
        try:
            d = orjson.loads(m.value or b"")
            if not isinstance(d, dict):
                raise TypeError("not a JSON object")
            return Alert.from_json(d) if m.topic == self.topics[0] else Action.from_json(d)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            self._skip(m, "bad_alert_event" if m.topic == self.topics[0] else "bad_action_event", e)
            return None

    def _skip(self, m: Any, reason: str, e: Exception) -> None:
        where = f"{m.topic}/{m.partition}@{m.offset}"
        if not self.stats.get(reason):
            log.warning("%s skipped: %s (counted as %s)", where, e, reason)
        self.stats.inc(reason, detail=where)

    def poll_once(self, timeout_ms: int = 500) -> int:
        """Read what is there, then write and commit it. While a batch waits to retry the
        database every partition stays paused (one assigned meanwhile too): the poll only keeps
        the group membership alive."""
        waiting = bool(self.pending) and time.monotonic() < self.retry_at
        if waiting:
            self._pause(True)
        recs = poll_group(
            self.consumer, min(timeout_ms, 200) if waiting else timeout_ms, pauses=True
        )
        got = 0
        for tp, msgs in recs.items():  # whatever a poll returns joins the batch: never dropped
            for m in msgs:
                ev = self._parse(m)
                if isinstance(ev, Alert):
                    self.pending.alerts.append(ev)
                elif isinstance(ev, Action):
                    self.pending.actions.append(ev)
                elif isinstance(ev, pl.DataFrame):
                    self.pending.rollups.append(ev)
                self.pending.offsets[tp] = m.offset + 1
                self.positions[tp] = m.offset + 1
                got += 1
        if self.pending and time.monotonic() >= self.retry_at:
            self._flush()
        return got

    # --- output ----------------------------------------------------------------------------------
    def _flush(self) -> None:
        b = self.pending
        try:
            w = OutputWriter(self.store, self.notifier).write(
                b.alerts, actions=b.actions, rollups=b.rollups
            )
            self.queued += w.queued
            self.alerts_written += w.alerts
            self.actions_written += w.actions
            self.rollups_written += w.rollups
        except RetryableError as e:
            if self.retry_s == RETRY_MIN_S:
                log.warning(
                    "sink: %s; holding %d events, retrying", e, len(b.alerts) + len(b.actions)
                )
            self.storage_retries += 1
            self._pause(True)
            self.retry_at = time.monotonic() + self.retry_s
            self.retry_s = min(RETRY_MAX_S, self.retry_s * 2)
            return
        if self.retry_s != RETRY_MIN_S:
            log.info("sink: storage is back; the held events are written")
            self._pause(False)
            self.retry_s = RETRY_MIN_S
        self.pending = Batch()
        self._commit(b.offsets)

    def _pause(self, on: bool) -> None:
        tps = list(self.consumer.assignment())
        if on and tps:
            self.consumer.pause(*tps)
        elif not on:
            self.consumer.resume(*self.consumer.paused())

    def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        mine = self.consumer.assignment()
        todo = {tp: OffsetAndMetadata(o, "", -1) for tp, o in offsets.items() if tp in mine}
        if not todo:
            return
        try:
            self.consumer.commit(todo)
        except KafkaError as e:  # written, not committed: a re-read writes nothing new
            log.warning("sink: offset commit failed (%s); those events may be read again", e)

    # --- the loop --------------------------------------------------------------------------------
    def run(self, max_idle_s: float = 0.0) -> None:
        for topic in self.topics:  # else the first assignment could miss a topic
            wait_for_partitions(self.consumer, topic)
        self.consumer.subscribe(self.topics)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop_event.set())
        if self.notifier is not None:
            self.notifier.start()
        log.info("sink: %s -> %s", ", ".join(self.topics), self._where())
        last = time.monotonic()
        ends: dict[TopicPartition, int] | None = None
        deadline = float("inf")
        had_partitions = False
        try:
            while not self.stop_event.is_set():
                if self.poll_once() or self.pending or not self.consumer.assignment():
                    last = time.monotonic()
                if self.metrics is not None:
                    self.metrics.update_sink(self)
                self._prune()
                if max_idle_s and time.monotonic() - last >= max_idle_s:
                    break
                assigned = bool(self.consumer.assignment())
                had_partitions = had_partitions or assigned
                if self.finishing.is_set():
                    if had_partitions and not assigned:  # another replica's sink holds them
                        break
                    if deadline == float("inf"):
                        deadline = time.monotonic() + FINISH_S
                    if ends is None:
                        ends = self._ends()
                    if self._read_to(ends) or time.monotonic() >= deadline:
                        break
        finally:
            self.close()

    def finish(self) -> None:
        """Stop once what the topics hold now is read, stored and committed (at most
        ``FINISH_S``): the detect service calls it after its final checkpoint, so a stopped
        ``rocewatch detect`` has stored everything it published."""
        self.finishing.set()

    def _ends(self) -> dict[TopicPartition, int] | None:
        """The topics' end offsets now (read_committed: the last stable offsets); None while
        the group has not assigned this member its partitions or the broker does not answer."""
        tps = list(self.consumer.assignment())
        if not tps:
            return None
        try:
            return dict(self.consumer.end_offsets(tps))
        except KafkaError as e:
            log.warning("sink: end offsets unknown (%s)", e)
            return None

    def _read_to(self, ends: dict[TopicPartition, int] | None) -> bool:
        if ends is None or self.pending:
            return False
        mine = self.consumer.assignment()
        for tp, end in ends.items():
            if tp in mine and self.consumer.position(tp) < end:
                return False
        return True

    def _prune(self) -> None:
        days = self.cfg.storage_retention_days
        now = time.monotonic()
        if self.store is None or not days or now - self.pruned_at < RETENTION_EVERY_S:
            return
        self.pruned_at = now
        try:
            self.store.apply_retention(days)
        except RetryableError as e:
            log.warning("retention: %s; trying again later", e)

    def _where(self) -> str:
        out = []
        if self.store is not None:
            out.append(f"storage {self.store.url}")
        if self.notifier is not None:
            out.append("notify " + ", ".join(self.notifier.sink_names))
        return " and ".join(out)

    def summary(self) -> dict[str, Any]:
        return {
            "alerts_written": self.alerts_written,
            "actions_written": self.actions_written,
            "rollups_written": self.rollups_written,
            "storage_retries": self.storage_retries,
            "notifications_queued": self.queued,
            "stats": self.stats.as_dict(),
        }

    def close(self) -> None:
        try:
            if self.metrics is not None:
                self.metrics.update_sink(self)
                if self.own_metrics:
                    self.metrics.close()
            if self.notifier is not None:
                self.notifier.stop()
                try:
                    self.notifier.drain(self.cfg.notify.drain_timeout_s)
                except (RetryableError, PermanentError) as e:
                    log.warning("notify: final delivery skipped: %s", e)
                if self.notifier.outbox.store is not self.store:
                    self.notifier.outbox.store.close()
        finally:
            self.consumer.close(autocommit=False)
            if self.store is not None:
                self.store.close()
