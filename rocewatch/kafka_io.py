"""The live path over Kafka: publish telemetry batches, and the detector service.

Delivery is at least once, with effects made exactly once:

* offsets are committed only after the results of the records before them are durable
  (alerts and actions flushed to their topics, storage committed) and the pipeline's state is
  checkpointed with those offsets;
* after a crash the service restores the checkpoint, re-reads what came after it, and
  recomputes the same results (windows close on event time, so the replay is deterministic);
  events it already published after the checkpoint are read back from the output topics and
  not sent again, so no alert or drain is doubled.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import os
import signal
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import polars as pl
from kafka import ConsumerRebalanceListener, KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import KafkaError, KafkaTimeoutError, TopicAlreadyExistsError
from kafka.structs import OffsetAndMetadata, TopicPartition

from actions.api import OperatorApi
from actions.membership import build_live_jobs
from actions.operator import MemoryCommands, apply_pending
from actions.routing import RoutingExecutor
from detectors.clock_guard import ClockGuard
from rocewatch import checkpoint, wire
from rocewatch.checkpoint import CheckpointError
from rocewatch.config import Config, KafkaConfig
from rocewatch.errors import BadInput, ConfigError, ProducerFailed, RetryableError
from rocewatch.kafka_check import preflight
from rocewatch.kafka_poll import poll_group
from rocewatch.model import Action, Alert, rfc3339
from rocewatch.pipeline import ROLLUP_S, Output, Pipeline
from rocewatch.runtime import reclaim
from rocewatch.sources import merged, scenario_sources
from rocewatch.stats import Stats
from rocewatch.topology import Topology

log = logging.getLogger(__name__)

MAX_ROWS_PER_MESSAGE = 8192
PUBLISH_SLICE_NS = 100_000_000  # a message holds one device's samples of at most this span
# The pipeline takes a poll's records in slices of about this many samples: its working memory
# grows with the rows it handles at once, and a detector behind its topic gets full polls
# (max_poll_records of records of up to MAX_ROWS_PER_MESSAGE rows) on every call.
MAX_ROWS_PER_INGEST = 500_000
# How far one telemetry partition may run ahead of the slowest (see DetectService._balance).
MAX_SKEW_S = 2.0
STATE_VERSION = 1
STATE_FILE = "detect-state.ckpt"  # in state_dir (docs/formats/checkpoint.md)
RETENTION_EVERY_S = 3600.0  # how often the service prunes storage by age


# A group member learns of new partitions (and of a topic created after it joined) at the next
# metadata refresh; kafka-python's default of 5 minutes would leave them unread that long.
GROUP_METADATA_MAX_AGE_MS = 30_000


def wait_for_partitions(consumer: Any, topic: str, timeout_s: float = 30.0) -> bool:
    """Wait until the broker reports ``topic``'s partitions to ``consumer``.

    A member that joins its group before then is assigned nothing (the range assignor has no
    partition metadata) until the next metadata refresh. Returns False, with a warning, when the
    partitions do not show up in time; joining then still works, only later."""
    deadline = time.monotonic() + timeout_s
    while not consumer.partitions_for_topic(topic):
        if time.monotonic() >= deadline:
            log.warning(
                "no partition metadata for %s after %.0f s; joining anyway", topic, timeout_s
            )
            return False
        time.sleep(0.2)
    return True


def ensure_topics(k: KafkaConfig, extra: Sequence[NewTopic] = ()) -> None:
    """Create rocewatch's topics (and ``extra``) if the broker lacks them (telemetry with
    k.partitions).

    First checks TLS and SASL against the broker (kafka_check.preflight), so an untrusted
    certificate or a refused password fails at once with a clear error.
    """
    preflight(k)
    try:
        admin = KafkaAdminClient(**k.client_kwargs(), request_timeout_ms=30000)
    except KafkaError as e:
        raise RetryableError(f"cannot reach Kafka at {k.bootstrap_servers}: {e}") from e
    try:
        existing = set(admin.list_topics())
        t = k.topics
        want = [
            NewTopic(t.telemetry, k.partitions, 1),
            NewTopic(t.alerts, 1, 1),
            NewTopic(t.actions, 1, 1),
            NewTopic(t.dead_letter, 1, 1),
            *extra,
        ]
        missing = [n for n in want if n.name not in existing]
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(missing)
    finally:
        admin.close()


def make_producer(k: KafkaConfig, **extra: Any) -> KafkaProducer:
    kw: dict[str, Any] = {
        "acks": "all",
        "linger_ms": 20,
        "batch_size": 1 << 20,
        "max_request_size": 8 << 20,
        "compression_type": None if k.compression_type == "none" else k.compression_type,
        "retries": 2147483647,
        "delivery_timeout_ms": 120000,
        "request_timeout_ms": 30000,
        "max_in_flight_requests_per_connection": 1,
    }
    kw.update(extra)
    try:
        return KafkaProducer(**k.client_kwargs(), **kw)
    except KafkaError as e:
        raise RetryableError(f"cannot reach Kafka at {k.bootstrap_servers}: {e}") from e


class WatchedProducer:
    """A ``KafkaProducer`` that remembers the first send that failed (``check`` raises
    ``ProducerFailed`` from then on): refused by the broker, which kafka-python's idempotent
    producer takes as fatal, or not delivered in ``delivery_timeout_ms`` (a broker away for
    minutes). Either way a record is lost unless the process stops before its next
    checkpoint. Everything else is the producer's own."""

    def __init__(self, inner: KafkaProducer) -> None:
        self.inner = inner
        self.error: BaseException | None = None
        self.topic: str | None = None
        self.unanswered = 0  # sent, neither delivered nor failed yet
        self.answered = threading.Condition()
        self.reported = False  # check raised the failure to the caller

    def send(self, topic: str, *args: Any, **kw: Any) -> Any:
        fut = self.inner.send(topic, *args, **kw)
        with self.answered:
            self.unanswered += 1
        fut.add_callback(self._delivered)
        fut.add_errback(self._failed, topic)
        return fut

    def _delivered(self, _: Any) -> None:  # the sender thread
        with self.answered:
            self.unanswered -= 1
            self.answered.notify_all()

    def _failed(self, topic: str, exc: BaseException) -> None:  # the sender thread
        if self.error is None:
            self.error, self.topic = exc, topic
        self._delivered(None)

    def check(self) -> None:
        if self.error is not None:
            self.reported = True
            raise ProducerFailed(
                f"a record for {self.topic} did not reach Kafka ({self.error!r}: refused by "
                "the broker, or not delivered within delivery_timeout_ms); this process "
                "stops before any checkpoint passes it: a restart resumes from its last "
                "checkpoint and nothing it had accepted is lost"
            )

    def flush(self, timeout: float | None = None) -> None:
        """The producer's flush; after a lost record, ``ProducerFailed``. kafka-python's own
        flush raises "Future not done" for a batch it split after MESSAGE_TOO_LARGE, though
        the halves may still be delivered: then it waits for every record's answer."""
        try:
            self.inner.flush(timeout=timeout)
        except KafkaError:
            self.check()
            with self.answered:
                if not self.answered.wait_for(lambda: self.unanswered <= 0, timeout):
                    raise
        self.check()

    def finish(self, timeout: float = 30.0) -> None:
        """Flush and close, for a service's close: a record lost that the caller was not
        told of yet (it stopped for another reason) is logged, not raised over that reason."""
        try:
            self.flush(timeout=timeout)
        except (ProducerFailed, KafkaError) as e:
            if not self.reported:
                log.error("at close: %s", e)
        self.inner.close(timeout=10)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def producer_is_dead(producer: Any) -> bool:
    """True once kafka-python's idempotent producer is in its fatal state (after a record the
    broker refused for good): it fails every later send, so only a new producer sends again.
    (kafka-python has no public call for it; a producer without the attribute is alive.)"""
    tm = getattr(producer, "_transaction_manager", None)
    return bool(tm is not None and tm.has_fatal_error())


class TelemetryPublisher:
    """Sample frames -> TelemetryBatch messages on the telemetry topic, keyed by device.

    Memory is bounded while the broker is slow or away: at most ``k.publish_buffer_bytes`` of
    messages wait for the broker's acknowledgement. When that is full, ``publish_when_full``
    decides: ``block`` (wait for room; the collector is slowed, nothing is lost) or ``drop``
    (the new message is dropped and counted in ``dropped_messages``/``dropped_samples``).

    A message the broker refuses for good (a topic limit lowered, a revoked ACL) is counted in
    ``failed_messages`` and leaves kafka-python's producer failing every later send: the
    publisher then starts a new producer (``producer_restarts``), so a collector keeps
    streaming once the cause is fixed instead of failing quietly until it is restarted.
    """

    def __init__(self, k: KafkaConfig, source: str = "rocewatch", producer: Any = None) -> None:
        self.k = k
        self.producer = producer or make_producer(k)
        self.source = source
        self.seq = 0
        self.samples = 0
        self.pending_bytes = 0  # sent to the producer, not yet acknowledged by the broker
        self.max_pending_bytes = 0
        self.dropped_messages = 0
        self.dropped_samples = 0
        self.failed_messages = 0  # given up by the producer (refused, delivery timeout)
        self.producer_restarts = 0
        self._dead: Any = None  # the producer that failed for good, until replaced
        self._room = threading.Condition()

    def _acked(self, size: int, producer: Any, result: Any) -> None:  # the sender thread
        with self._room:
            self.pending_bytes -= size
            if isinstance(result, Exception):
                self.failed_messages += 1
                if self._dead is None and producer_is_dead(producer):
                    self._dead = producer
                    log.error(
                        "Kafka refused a telemetry message for good (%r): starting a new "
                        "producer; the messages it held are counted as failed",
                        result,
                    )
            self._room.notify_all()

    def _renew(self) -> None:
        """Replace the producer that failed for good (its messages are already failed)."""
        dead, self._dead = self._dead, None
        if dead is not self.producer:
            return
        self.producer = make_producer(self.k)
        self.producer_restarts += 1
        with contextlib.suppress(Exception):
            dead.close(timeout=1)

    def readings(self) -> list[tuple[str, str, str, dict[str, str], float]]:
        """Publishing's own numbers for /metrics (``rocewatch.metrics.Reading``)."""
        rows = [
            ("samples_total", "samples handed to Kafka", self.samples),
            (
                "pending_bytes",
                "bytes sent to the producer, not yet acknowledged by the broker",
                self.pending_bytes,
            ),
            (
                "dropped_messages_total",
                "messages dropped while the publish buffer was full (publish_when_full: drop)",
                self.dropped_messages,
            ),
            ("dropped_samples_total", "samples in those messages", self.dropped_samples),
            (
                "failed_messages_total",
                "messages the producer gave up (refused by the broker, delivery timeout)",
                self.failed_messages,
            ),
            (
                "producer_restarts_total",
                "new producers started after one failed for good",
                self.producer_restarts,
            ),
        ]
        return [
            (
                f"rocewatch_publish_{name}",
                "counter" if name.endswith("_total") else "gauge",
                doc,
                {},
                float(value),
            )
            for name, doc, value in rows
        ]

    def _send(self, key: bytes, value: bytes, rows: int) -> None:
        if self._dead is not None:
            self._renew()
        size = len(value)
        limit = self.k.publish_buffer_bytes
        with self._room:
            if self.pending_bytes > 0 and self.pending_bytes + size > limit:
                if self.k.publish_when_full == "drop":
                    if self.dropped_messages == 0:
                        log.warning(
                            "publish buffer full (%d bytes unacknowledged): dropping telemetry "
                            "until the broker catches up (counted)",
                            self.pending_bytes,
                        )
                    self.dropped_messages += 1
                    self.dropped_samples += rows
                    return
                while self.pending_bytes > 0 and self.pending_bytes + size > limit:
                    self._room.wait(1.0)
            self.pending_bytes += size
            self.max_pending_bytes = max(self.max_pending_bytes, self.pending_bytes)
        producer = self.producer
        fut = producer.send(self.k.topics.telemetry, key=key, value=value)
        fut.add_both(self._acked, size, producer)

    def publish(self, df: pl.DataFrame, slice_ns: int = PUBLISH_SLICE_NS) -> None:
        """Send a frame as one message per device and time slice, in time order.

        Slicing keeps each partition close to time order when a frame spans a long stretch of
        telemetry (a recording), which is what per-partition watermarks assume.
        """
        if df.height == 0:
            return
        span = int(df["ts"].max()) - int(df["ts"].min())  # type: ignore[arg-type]
        by = ["device"]
        if df.height > 1 and span >= slice_ns:
            df = df.sort("ts", maintain_order=True)
            by = ["_slice", "device"]
        idx = (
            df.lazy()
            .select(
                (pl.col("ts") // slice_ns).alias("_slice"),
                pl.col("device"),
                pl.int_range(pl.len(), dtype=pl.UInt32).alias("_row"),
            )
            .group_by(by, maintain_order=True)
            .agg(pl.col("_row"))
            .collect()
        )
        keys: list[bytes] = []
        groups: list[np.ndarray] = []
        for device, rows in zip(idx["device"], idx["_row"], strict=True):
            arr = rows.to_numpy()
            key = str(device).encode()
            for off in range(0, len(arr), MAX_ROWS_PER_MESSAGE):
                keys.append(key)
                groups.append(arr[off : off + MAX_ROWS_PER_MESSAGE])
        values = wire.encode_rows(df, groups, self.source, self.seq)
        for key, value, rows_ in zip(keys, values, groups, strict=True):
            self.seq += 1
            self._send(key, value, len(rows_))
        self.samples += df.height

    def flush(self, timeout: float = 60.0) -> None:
        """Send what waits now, and wait until the broker has answered for every message
        (acknowledged or failed, and counted)."""
        deadline = time.monotonic() + timeout
        # kafka-python's own flush raises "Future not done" for a batch it split after
        # MESSAGE_TOO_LARGE, and after its producer failed for good: this publisher's own
        # count of unanswered messages is the one waited for
        with contextlib.suppress(KafkaError):
            self.producer.flush(timeout=timeout)
        with self._room:
            while self.pending_bytes > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise KafkaTimeoutError(
                        f"{self.pending_bytes} bytes still unacknowledged after {timeout:.0f} s"
                    )
                self._room.wait(left)

    def close(self) -> None:
        try:
            self.flush()
        except KafkaError:
            self.producer.close(timeout=1)  # what the broker never answered is lost: counted
            raise
        self.producer.close(timeout=1 if producer_is_dead(self.producer) else None)


def _time_slices(df: pl.DataFrame, slice_ns: int = PUBLISH_SLICE_NS) -> list[pl.DataFrame]:
    """A frame's rows per time slice, in time order (a frame with unknown times: itself)."""
    ts = df.get_column("ts")
    if ts.null_count():
        return [df]
    df = df.sort("ts", maintain_order=True)
    b = df.get_column("ts").to_numpy() // slice_ns
    bounds = [0, *(np.flatnonzero(b[1:] != b[:-1]) + 1).tolist(), df.height]
    return [df.slice(a, z - a) for a, z in itertools.pairwise(bounds)]


def publish_scenario(scenario: Path, cfg: Config, rate: float = 0.0) -> int:
    """Send a scenario directory's recorded telemetry to Kafka (the collectors' side)."""
    topology = Topology.load(scenario / "topology.yaml")
    stats = Stats()
    sources = scenario_sources(scenario, topology, stats)
    if not sources:
        raise ConfigError(f"{scenario}: no telemetry to publish")
    ensure_topics(cfg.kafka)
    pub = TelemetryPublisher(cfg.kafka, source=f"publish:{scenario.name}")
    t_wall0 = time.monotonic()
    t_tel0: int | None = None
    try:
        for df, _wm in merged(sources, 0):
            if df.height == 0:
                continue
            if rate <= 0:
                pub.publish(df)
                continue
            # paced one time slice at a time, as collectors send: a whole read-ahead batch
            # (seconds of telemetry) at once, then silence, would let partitions go idle and
            # flush between batches, and the next batch's first samples would come late
            for part in _time_slices(df):
                lo = int(part["ts"].min())  # type: ignore[arg-type]
                t_tel0 = lo if t_tel0 is None else t_tel0
                ahead = (lo - t_tel0) / 1e9 / rate - (time.monotonic() - t_wall0)
                if ahead > 0:
                    time.sleep(ahead)
                pub.publish(part)
        pub.close()
    finally:
        for s in sources:
            s.close()
    if stats.counts:
        log.info("publish skipped input: %s", dict(stats.counts))
    if pub.dropped_samples:
        log.warning(
            "publish buffer was full: dropped %d samples in %d messages",
            pub.dropped_samples,
            pub.dropped_messages,
        )
    return pub.samples - pub.dropped_samples


# --- what both detector services share ----------------------------------------------------------


def parse_record(m: Any) -> tuple[wire.Decoded, int, int]:
    """A telemetry record -> (its columns, its newest sample time or -1 when empty, the time it
    was sent in ns). Latency starts at the record's CreateTime (when the collector sent it),
    else at the batch's own production time. Raises BadInput for anything but a valid batch."""
    if m.value is None:
        raise BadInput("empty message")
    d = wire.parse(m.value)
    if not d.rows:
        return d, -1, 0
    sent = m.timestamp * 1_000_000 if m.timestamp and m.timestamp > 0 else d.produced_ns
    return d, int(d.cols["ts"].max()), sent


def admit_record(guard: ClockGuard, d: wire.Decoded) -> int:
    """Set aside the rows of a decoded record whose device's clock disagrees with its
    partition's (``ClockGuard``: far ahead of it, or of the wall clock; far behind); return the
    newest sample time left, -1 when none is. A year-ahead snapshot thus never moves the
    partition's watermark. Usually one comparison of the record's extremes."""
    ts = d.cols["ts"]
    if not d.rows or guard.quick(ts):
        return int(ts.max()) if d.rows else -1
    names = np.asarray(d.dict, dtype=object)
    keep = guard.admit(ts, names[d.cols["device"]])
    if not keep.all():
        d.cols = {k: v[keep] for k, v in d.cols.items()}
        d.rows = int(keep.sum())
    return int(d.cols["ts"].max()) if d.rows else -1


def partition_guard(cfg: Config, stats: Stats, name: str) -> ClockGuard:
    """A live partition's ``ClockGuard``: bounded by the window config, and by the wall clock."""
    w = cfg.window
    return ClockGuard(w.max_ahead_s, w.max_behind_s, stats=stats, wall_ns=time.time_ns, name=name)


def send_dead_letter(producer: Any, topic: str, m: Any, err: Exception, stats: Stats) -> None:
    """Count a record that could not be used and keep it, with why, on the dead-letter topic."""
    stats.inc("dead_letter", detail=type(err).__name__)
    headers = [
        ("rocewatch-error", str(err)[:500].encode()),
        ("rocewatch-source", f"{m.topic}/{m.partition}/{m.offset}".encode()),
    ]
    producer.send(topic, key=m.key, value=m.value or b"", headers=headers)


class SendTimes:
    """When records were sent, held until the step holding their newest sample closes."""

    def __init__(self) -> None:
        self.q: deque[tuple[int, int]] = deque()  # (newest sample time, sent ns), arrival order

    def add(self, hi: int, sent: int) -> None:
        self.q.append((hi, sent))

    def __len__(self) -> int:
        return len(self.q)

    def closed(self, closed_ns: int) -> list[int]:
        """The send times of the records (in arrival order) whose samples all lie before
        ``closed_ns``, removed."""
        out: list[int] = []
        q = self.q
        while q and q[0][0] < closed_ns:
            out.append(q.popleft()[1])
        return out


class Published:
    """Alerts and actions published after the last checkpoint, read back after a restart or a
    takeover: the same events made again are not sent twice."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()

    def total(self) -> int:
        return sum(self.counts.values())

    def take(self, topic: str, eid: str) -> bool:
        """True (and one fewer kept) when this event was already published."""
        key = (topic, eid)
        if self.counts.get(key, 0) > 0:
            self.counts[key] -= 1
            return True
        return False

    def read_back(
        self,
        cfg: Config,
        starts: dict[TopicPartition, int],
        ends: dict[TopicPartition, int],
        timeout_s: float = 60.0,
        **reader_kw: Any,
    ) -> dict[TopicPartition, int]:
        """Read each output partition from ``starts`` to ``ends``, keeping the events' ids;
        return the partitions not read to their end within ``timeout_s``."""
        todo = {tp: start for tp, start in starts.items() if start < ends.get(tp, 0)}
        if not todo:
            return {}
        # read committed: a fenced instance's aborted events were never published. Done
        # by position, not by the last record: a transaction's marker can end a partition.
        reader_kw.setdefault("isolation_level", "read_committed")
        reader = KafkaConsumer(
            **cfg.kafka.client_kwargs(), enable_auto_commit=False, group_id=None, **reader_kw
        )
        remaining = {tp: ends[tp] for tp in todo}
        try:
            reader.assign(list(todo))
            for tp, start in todo.items():
                reader.seek(tp, start)
            deadline = time.monotonic() + timeout_s
            while remaining and time.monotonic() < deadline:
                for tp, msgs in reader.poll(timeout_ms=500).items():
                    for m in msgs:
                        if m.offset < remaining.get(tp, -1):
                            self.counts[(tp.topic, _event_id(tp.topic, m.value, cfg))] += 1
                for tp in list(remaining):
                    if reader.position(tp) >= remaining[tp]:
                        remaining.pop(tp)
        finally:
            reader.close()
        return remaining


def output_partitions(cfg: Config, consumer: Any) -> list[TopicPartition]:
    """The alerts and actions topics' partitions (as ``consumer``'s metadata knows them)."""
    out = []
    for topic in (cfg.kafka.topics.alerts, cfg.kafka.topics.actions):
        parts = consumer.partitions_for_topic(topic) or {0}
        out += [TopicPartition(topic, p) for p in sorted(parts)]
    return out


def send_events(producer: Any, cfg: Config, out: Output, published: Published) -> tuple[int, int]:
    """Publish ``out``'s alerts and actions, less those already published; how many of each."""
    t = cfg.kafka.topics
    n_alerts = n_actions = 0
    for a in out.alerts:
        if published.take(t.alerts, _alert_id(a)):
            continue
        n_alerts += 1
        producer.send(
            t.alerts,
            key=a.fingerprint.encode(),
            value=orjson.dumps(a.to_json()),
            headers=[("rocewatch-schema", b"alert/v1")],
        )
    for act in out.actions:
        if published.take(t.actions, _action_id(act)):
            continue
        n_actions += 1
        producer.send(
            t.actions,
            key=act.node.encode(),
            value=orjson.dumps(act.to_json()),
            headers=[("rocewatch-schema", b"action/v1")],
        )
    return n_alerts, n_actions


# --- the detector service ---------------------------------------------------------------------


def _frame_from_ipc(data: bytes) -> pl.DataFrame:
    return pl.read_ipc(io.BytesIO(data))


CHECKPOINT_KIND = "detect-service"  # the state file's kind (rocewatch.checkpoint)


@dataclass
class Checkpoint:
    version: int
    pipeline: Pipeline
    offsets: dict[tuple[str, int], int]  # next offset to read, per telemetry partition
    part_hi: dict[tuple[str, int], int]  # newest sample time seen per partition
    out_ends: dict[tuple[str, int], int]  # end offsets of the output topics at checkpoint time

    def encode(self) -> bytes:
        """The checkpoint as a state file (docs/formats/checkpoint.md)."""
        return checkpoint.dumps(
            {
                "version": self.version,
                "pipeline": self.pipeline,
                "offsets": self.offsets,
                "part_hi": self.part_hi,
                "out_ends": self.out_ends,
            },
            CHECKPOINT_KIND,
        )

    @classmethod
    def decode(cls, data: bytes) -> Checkpoint:
        """``CheckpointError`` for anything but a state file of this build's format and
        ``STATE_VERSION``; nothing in ``data`` is executed."""
        d = checkpoint.loads(data, CHECKPOINT_KIND)
        if not isinstance(d, dict) or d.get("version") != STATE_VERSION:
            v = d.get("version") if isinstance(d, dict) else None
            raise CheckpointError(f"detect state version {v!r}, this build reads {STATE_VERSION}")
        pipe = d.get("pipeline")
        maps = [d.get(k) for k in ("offsets", "part_hi", "out_ends")]
        if not isinstance(pipe, Pipeline) or not all(isinstance(m, dict) for m in maps):
            raise CheckpointError("detect state lacks its pipeline or offsets")
        return cls(STATE_VERSION, pipe, *maps)  # type: ignore[arg-type]


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, svc: DetectService) -> None:
        self.svc = svc

    def on_partitions_revoked(self, revoked: Any) -> None:
        pass

    def on_partitions_assigned(self, assigned: Any) -> None:
        for tp in assigned:
            off = self.svc.offsets.get((tp.topic, tp.partition))
            if off is not None:
                self.svc.consumer.seek(tp, off)
        log.info("assigned partitions %s", sorted(tp.partition for tp in assigned))


class DetectService:
    """Consume telemetry, run the pipeline, publish alerts and actions, checkpoint, commit."""

    def __init__(self, cfg: Config, topology: Topology | None = None) -> None:
        self.cfg = cfg
        k = cfg.kafka
        if topology is None:
            if not cfg.topology:
                raise ConfigError("detect needs 'topology' (a topology file) in its config")
            topology = Topology.load(cfg.topology)
        self.topology = topology
        self.state_path = Path(cfg.state_dir) / STATE_FILE
        self.stats = Stats()
        self.offsets: dict[tuple[str, int], int] = {}
        self.part_hi: dict[tuple[str, int], int] = {}
        self.guards: dict[tuple[str, int], ClockGuard] = {}  # per partition: bad clocks
        self.part_seen_wall: dict[tuple[str, int], float] = {}
        # when the broker last said a partition was read to its end; the last end-offset
        # check; when the input last stalled with records still to come (see _read_to_end)
        self.end_ok: dict[tuple[str, int], float] = {}
        self.end_checked = -float("inf")
        self.disrupted_at = -float("inf")
        self.published = Published()
        restored = self._restore()
        executor = RoutingExecutor(cfg.executors)
        # metric rollups only when there is a store to keep them (they cost a quarter of
        # the detector's CPU)
        rollup_s = ROLLUP_S if cfg.storage_url else None
        if restored is None:  # a fresh start; otherwise the checkpoint brought its pipeline
            self.pipeline = Pipeline(
                topology, cfg, executor=executor, stats=self.stats, rollup_s=rollup_s, retain=False
            )
        else:  # the policy's state came back; its scheduler clients follow today's config
            self.pipeline.policy.executor = executor
            self.pipeline.set_rollups(rollup_s)
        self.live_jobs = build_live_jobs(
            self.pipeline.topology,
            cfg.membership,
            kube_api(cfg),
            static=list(topology.jobs.values()),
        )
        ensure_topics(k)
        self.producer = WatchedProducer(make_producer(k))
        self.consumer = KafkaConsumer(
            **k.client_kwargs(),
            group_id=k.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            # one poll's records may all come from one partition: few enough that it runs at
            # most a few seconds of telemetry ahead of the others (see _balance)
            max_poll_records=1000,
            fetch_max_bytes=64 << 20,
            max_partition_fetch_bytes=16 << 20,
            session_timeout_ms=k.session_timeout_ms,
            heartbeat_interval_ms=max(1000, k.session_timeout_ms // 4),
            metadata_max_age_ms=GROUP_METADATA_MAX_AGE_MS,
        )
        if restored is not None:
            self._load_suppressions(restored)
        self.store: Any = None
        if cfg.storage_url:
            from storage.store import Store

            self.store = Store(cfg.storage_url)
            self.store.create_schema()
        # operators' commands: from the store (CLI, API) or, without one, the API's memory
        self.commands_mem = MemoryCommands()
        self._pending_snapshot: list[str] = self.pipeline.policy.pending()
        self._next_commands = 0.0
        self.api: OperatorApi | None = None
        if cfg.api.listen:
            self.api = OperatorApi(
                cfg.api,
                self.store if self.store is not None else self.commands_mem,
                self.store,
                pending=lambda: list(self._pending_snapshot),
            ).start()
        from rocewatch.notify.service import open_dispatcher

        self.notifier = open_dispatcher(cfg, self.store)
        self.latencies: deque[float] = deque(maxlen=100_000)
        self._pending_lat = SendTimes()
        self.stop_event = threading.Event()
        self.metrics: Any = None
        if cfg.metrics_port:
            from rocewatch.metrics import ServiceMetrics

            self.metrics = ServiceMetrics(cfg.metrics_port)

    # --- checkpoints -----------------------------------------------------------------------------
    def _restore(self) -> Checkpoint | None:
        if not self.state_path.exists():
            return None
        try:
            cp = Checkpoint.decode(self.state_path.read_bytes())
        except (CheckpointError, OSError) as e:  # torn, foreign or forged: start clean, say so
            self.stats.inc("checkpoint_rejected")
            log.error(
                "checkpoint %s rejected (%s); starting from committed offsets", self.state_path, e
            )
            return None
        self.pipeline = cp.pipeline
        self.stats = cp.pipeline.stats
        self.offsets = dict(cp.offsets)
        self.part_hi = dict(cp.part_hi)
        log.info(
            "restored checkpoint: %d partitions, watermark state of %d",
            len(cp.offsets),
            len(cp.part_hi),
        )
        return cp

    def _output_tps(self) -> list[TopicPartition]:
        return output_partitions(self.cfg, self.consumer)

    def _load_suppressions(self, cp: Checkpoint) -> None:
        """Read what was published after the checkpoint: it must not be published again."""
        tps = self._output_tps()
        ends = self.consumer.end_offsets(tps)
        starts = {tp: cp.out_ends.get((tp.topic, tp.partition), 0) for tp in tps}
        if not any(start < ends.get(tp, 0) for tp, start in starts.items()):
            return
        self.published.read_back(self.cfg, starts, ends, consumer_timeout_ms=5000)
        log.info(
            "after restart, %d already-published events will not be sent again",
            self.published.total(),
        )

    def checkpoint(self) -> bool:
        """Make results durable, save state with offsets, then commit offsets to Kafka.

        While the broker is away nothing can be made durable: the checkpoint is postponed (the
        previous one and its offsets stay valid) and False returned.
        """
        try:
            self.producer.flush(timeout=60)  # ProducerFailed after a lost event
            out_ends = {
                (tp.topic, tp.partition): off
                for tp, off in self.consumer.end_offsets(self._output_tps()).items()
            }
        except KafkaError as e:
            log.warning("checkpoint postponed, Kafka unreachable: %s", e)
            return False
        cp = Checkpoint(
            STATE_VERSION, self.pipeline, dict(self.offsets), dict(self.part_hi), out_ends
        )
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        with tmp.open("wb") as fh:
            fh.write(cp.encode())
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(self.state_path)
        freed, ms = reclaim()
        log.debug("reclaimed %d objects in %.0f ms", freed, ms)
        commit = {
            TopicPartition(t, p): OffsetAndMetadata(off, "", -1)
            for (t, p), off in self.offsets.items()
        }
        if commit:
            try:
                self.consumer.commit(commit)
            except KafkaError as e:  # the checkpoint file still holds the offsets
                log.warning("offset commit failed (%s); the checkpoint keeps them", e)
        return True

    # --- output ----------------------------------------------------------------------------------
    def _emit(self, out: Output) -> None:
        if self.notifier is not None and out.alerts:
            # committed before the checkpoint: a restart re-derives nothing the outbox lost,
            # and an event re-derived after a restart is already queued (unique per sink)
            self.notifier.enqueue(out.alerts)
        send_events(self.producer, self.cfg, out, self.published)
        if self.store is not None:
            if out.alerts or out.inhibited:  # inhibited: kept, never notified (alerting.md)
                self.store.write_alerts(out.alerts + out.inhibited)
            if out.actions:
                self.store.write_actions(out.actions)
            for r in out.rollups:
                self.store.write_rollups(r)

    def _dead_letter(self, m: Any, err: Exception) -> None:
        send_dead_letter(self.producer, self.cfg.kafka.topics.dead_letter, m, err, self.stats)

    # --- the loop --------------------------------------------------------------------------------
    def _watermark(self) -> int | None:
        """The slowest live partition's newest sample time, less the allowed lateness.

        None while an assigned partition has records but none of them has been read yet: its
        time is unknown, and closing steps on the others' would make its samples late (a poll
        may well bring one partition's records only)."""
        if self._unknown_partition():
            return None
        now = time.monotonic()
        idle_s = max(self.cfg.kafka.partition_idle_s, 3 * self.cfg.kafka.idle_flush_s)
        paused = {(tp.topic, tp.partition) for tp in self.consumer.paused()}
        live: list[int] = []
        silent: list[tuple[str, int]] = []
        for key, hi in self.part_hi.items():
            quiet = now - self.part_seen_wall.get(key, now) >= idle_s
            if not quiet or key in paused or self._has_unread(key):
                live.append(hi)
            else:
                silent.append(key)
        if silent:
            done = self._read_to_end(silent, now)
            live += [self.part_hi[key] for key in silent if key not in done]
        if not live:
            return None
        return min(live) - self.pipeline.engine.lateness_ns()

    def _read_to_end(self, keys: list[tuple[str, int]], now: float) -> set[tuple[str, int]]:
        """Of these silent partitions, those that may be left out of the watermark: the broker
        said, after the partition's last record, that it is read to its end, and no input has
        stalled for partition_idle_s.

        Silence alone is not enough, nor is the fetcher's highwater: after a broker restart a
        partition's fetches may stall while its records wait (its highwater then looks read),
        and publishers resend what they buffered during the outage for a while. So the end
        offsets are asked for (at most once a second, one request for all); a partition
        found behind is sought to its position, which starts its fetches again, and counts as
        a stall."""
        if now - self.disrupted_at < self.cfg.kafka.partition_idle_s:
            return set()
        done = {k for k in keys if self.end_ok.get(k, -1.0) > self.part_seen_wall.get(k, now)}
        todo = [k for k in keys if k not in done]
        if not todo or now - self.end_checked < 1.0:
            return done
        self.end_checked = now
        tps = [TopicPartition(*k) for k in todo]
        try:
            ends = self.consumer.end_offsets(tps, timeout_ms=2000)
        except KafkaError as e:
            log.info("end offsets unknown (%s): silent partitions stay in the watermark", e)
            self.disrupted_at = now
            return set()
        behind = []
        for tp in tps:
            key = (tp.topic, tp.partition)
            off = self.offsets.get(key)
            end = ends.get(tp)
            if end is None or off is None:
                continue
            if off >= end:
                self.end_ok[key] = now
                done.add(key)
            else:
                behind.append(tp)
                with contextlib.suppress(KafkaError, AssertionError, ValueError):
                    self.consumer.seek(tp, off)  # the fetcher starts over from here
        if behind:
            log.warning(
                "partitions %s silent with records to read: fetching them again, not idle",
                sorted(tp.partition for tp in behind),
            )
            self.stats.inc("stalled_partition", len(behind))
            self.disrupted_at = now
            return set()
        return done

    def _has_unread(self, key: tuple[str, int]) -> bool:
        """True when the broker last said this partition holds records not read yet. Such a
        partition is not idle however long it has been silent (paused, or behind a broker
        outage): leaving it out of the watermark would make its records late."""
        hw = self.consumer.highwater(TopicPartition(*key))
        off = self.offsets.get(key)
        return hw is not None and off is not None and off < hw

    def _unknown_partition(self) -> bool:
        """True while an assigned partition may hold records of which none has been read."""
        topic = self.cfg.kafka.topics.telemetry
        for tp in self.consumer.assignment():
            key = (tp.topic, tp.partition)
            if tp.topic != topic or key in self.part_hi:
                continue
            hw = self.consumer.highwater(tp)
            if hw is None or self.offsets.get(key, 0) < hw:
                return True
        return False

    def poll_once(self, timeout_ms: int = 200) -> int:
        recs = poll_group(self.consumer, timeout_ms, pauses=True)
        batches: list[wire.Decoded] = []
        rows = 0
        n = 0
        now_wall = time.monotonic()
        for tp, msgs in recs.items():
            key = (tp.topic, tp.partition)
            if msgs:
                self.part_seen_wall[key] = now_wall
            for m in msgs:
                try:
                    d, hi, sent = parse_record(m)
                except BadInput as e:
                    self._dead_letter(m, e)
                    continue
                guard = self.guards.get(key)
                if guard is None:
                    guard = self.guards[key] = partition_guard(self.cfg, self.stats, f"{key}")
                hi = admit_record(guard, d)
                if d.rows:
                    batches.append(d)
                    rows += d.rows
                    if hi > self.part_hi.get(key, -1):
                        self.part_hi[key] = hi
                    self._pending_lat.add(hi, sent)
                if rows >= MAX_ROWS_PER_INGEST:
                    n += self._ingest(batches)
                    batches, rows = [], 0
            if msgs:
                self.offsets[key] = msgs[-1].offset + 1
        n += self._ingest(batches)
        self._balance()
        return n

    def _balance(self) -> None:
        """Pause partitions that run more than MAX_SKEW_S ahead of the slowest one with records
        still to read, resume them once it has caught up.

        The watermark is the slowest partition's: whatever the others deliver ahead of it waits
        in the window engine. A detector behind its topic gets records partition by partition
        (a fetch fills up on one before the next), so without this the wait, and the memory it
        holds, grows with the backlog. A partition read to its end holds nobody back; one with
        records of which none has been read yet holds back all the others.
        """
        topic = self.cfg.kafka.topics.telemetry
        assigned = self.consumer.assignment()
        his: dict[TopicPartition, int] = {}
        unread: list[int] = []
        for (t, p), hi in self.part_hi.items():
            tp = TopicPartition(t, p)
            if t != topic or tp not in assigned:
                continue
            his[tp] = hi
            if self._has_unread((t, p)):
                unread.append(hi)
        paused = set(self.consumer.paused())
        if self._unknown_partition():  # its time is unknown: the others wait for it
            ahead = set(his)
        elif not unread:
            if paused:
                self.consumer.resume(*paused)
            return
        else:
            limit = min(unread) + int(MAX_SKEW_S * 1e9)
            ahead = {tp for tp, hi in his.items() if hi > limit}
        if ahead - paused:
            self.consumer.pause(*(ahead - paused))
        if paused - ahead:
            self.consumer.resume(*(paused - ahead))

    def _ingest(self, batches: list[wire.Decoded]) -> int:
        """Run the pipeline on some decoded records, then close what the watermark allows."""
        n = 0
        if batches:
            df = wire.coded_frames(batches)
            n = df.height
            self.pipeline.ingest(df)
        wm = self._watermark()
        if wm is not None:
            self._emit(self.pipeline.advance(wm))
            self._account_latency()
        return n

    def _account_latency(self) -> None:
        closed = self.pipeline.engine.closed_ns
        if closed is None:
            return
        now = time.time_ns()
        for produced in self._pending_lat.closed(closed):
            if produced:
                self.latencies.append((now - produced) / 1e9)

    def _caught_up(self) -> bool:
        """True when the broker answers and every assigned partition has been read to its end."""
        try:
            tps = list(self.consumer.assignment())
            if not tps:
                return False
            try:
                ends = self.consumer.end_offsets(tps, timeout_ms=2000)
            except TypeError:  # kafka-python 2.x takes no timeout here
                ends = self.consumer.end_offsets(tps)
            for tp, end in ends.items():
                off = self.offsets.get((tp.topic, tp.partition))
                if (off if off is not None else self.consumer.position(tp)) < end:
                    return False
        except KafkaError as e:
            log.info("broker unreachable while input is idle: %s", e)
            return False
        return True

    def flush_idle(self) -> None:
        """No input for a while: close every pending step (the end of a recording, a quiet hour)."""
        self._emit(self.pipeline.finish())
        self._account_latency()

    def run(self, max_idle_s: float = 0.0) -> None:
        wait_for_partitions(self.consumer, self.cfg.kafka.topics.telemetry)
        self.consumer.subscribe([self.cfg.kafka.topics.telemetry], listener=_Listener(self))
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop_event.set())
        last_input = time.monotonic()
        last_commit = time.monotonic()
        last_prune = 0.0
        flushed = True
        log.info(
            "detecting on %s as group %s", self.cfg.kafka.topics.telemetry, self.cfg.kafka.group_id
        )
        if self.notifier is not None:
            self.notifier.start()
        try:
            while not self.stop_event.is_set():
                self.producer.check()
                if self.live_jobs is not None:
                    self.live_jobs.maybe_refresh()
                n = self.poll_once()
                now = time.monotonic()
                if now >= self._next_commands:
                    self._next_commands = now + 0.5
                    self.apply_operator_commands()
                if not n and not self.consumer.assignment():
                    last_input = now  # idle time counts from the group join, not before it
                elif n:
                    last_input = now
                    flushed = False
                elif (
                    not flushed
                    and now - last_input >= self.cfg.kafka.idle_flush_s
                    and now - self.disrupted_at >= self.cfg.kafka.partition_idle_s
                ):
                    # (after a broker outage, publishers may take a while to resend: "read to
                    # the end" is not "the end" until partition_idle_s has passed)
                    if self._caught_up():
                        self.flush_idle()
                        flushed = True
                        self.checkpoint()
                        last_commit = now
                    else:
                        # a broker outage or a stalled fetch, not a quiet stream: closing every
                        # window now would make the backlog late; partitions stay live meanwhile
                        last_input = self.disrupted_at = time.monotonic()
                        for key in self.part_seen_wall:
                            self.part_seen_wall[key] = last_input
                if now - last_commit >= self.cfg.kafka.commit_interval_s:
                    self.checkpoint()
                    last_commit = now
                if (
                    self.store is not None
                    and self.cfg.storage_retention_days
                    and now - last_prune >= RETENTION_EVERY_S
                ):
                    last_prune = now
                    try:
                        self.store.apply_retention(self.cfg.storage_retention_days)
                    except RetryableError as e:
                        log.warning("retention: %s; trying again later", e)
                if self.metrics is not None:
                    self.metrics.update(self)
                if max_idle_s and now - last_input >= max_idle_s and flushed:
                    break
            self.checkpoint()
        finally:
            self.close()

    def apply_operator_commands(self) -> int:
        """Carry out pending approve / reject / undrain commands at once; return how many."""
        queues: list[Any] = [self.commands_mem]
        if self.store is not None:
            queues.append(self.store)
        n = apply_pending(self.pipeline.policy, queues)
        if n:
            self._emit(self.pipeline.operator_tick())
        self._pending_snapshot = self.pipeline.policy.pending()
        return n

    def close(self) -> None:
        if self.api is not None:
            self.api.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.notifier is not None:
            self.notifier.stop()
            # a graceful stop delivers what it can; the outbox keeps the rest for the next start
            try:
                self.notifier.drain(self.cfg.notify.drain_timeout_s)
            except RetryableError as e:
                log.warning("notify: final delivery skipped: %s", e)
            if self.notifier.outbox.store is not self.store:
                self.notifier.outbox.store.close()
        try:
            self.producer.finish()
        finally:
            self.consumer.close(autocommit=False)
            if self.store is not None:
                self.store.close()


def kube_api(cfg: Config) -> Any:
    """A CoreV1Api factory when Kubernetes is configured (built only when first needed)."""
    kcfg = cfg.executors.kubernetes
    if kcfg is None:
        return None

    def make() -> Any:
        from kubernetes import client

        from actions.kubernetes import api_client

        return client.CoreV1Api(api_client(kcfg))

    return make


# Event ids compare an event made in memory with the same event read back from its topic, so
# they use what the JSON keeps: times to the millisecond (RFC 3339 as Alertmanager writes it).
def _alert_id(a: Alert) -> str:
    fp, start, status = a.event_key()
    return f"{fp}|{rfc3339(start)}|{status}"


def _action_id(a: Action) -> str:
    return f"{rfc3339(a.time)}|{a.action}|{a.node}|{a.alert_fingerprint}|{a.outcome}"


def _event_id(topic: str, value: bytes | None, cfg: Config) -> str:
    if not value:
        return ""
    try:
        d = orjson.loads(value)
        if topic == cfg.kafka.topics.alerts:
            return _alert_id(Alert.from_json(d))
        return _action_id(Action.from_json(d))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return ""
