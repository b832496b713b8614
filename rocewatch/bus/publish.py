"""Producers, and the publisher that sends telemetry to the telemetry topic."""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from typing import Any

import numpy as np
import polars as pl
from kafka import KafkaProducer
from kafka.errors import KafkaError, KafkaTimeoutError

from rocewatch import wire
from rocewatch.bus.config import KafkaConfig
from rocewatch.core.errors import ProducerFailed, RetryableError

log = logging.getLogger(__name__)

MAX_ROWS_PER_MESSAGE = 8192
PUBLISH_SLICE_NS = 100_000_000  # a message holds one device's samples of at most this span


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
        abandon_producer(self.inner, timeout=10)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def producer_is_dead(producer: Any) -> bool:
    """True once kafka-python's idempotent producer is in its fatal state (after a record the
    broker refused for good): it fails every later send, so only a new producer sends again.
    (kafka-python has no public call for it; a producer without the attribute is alive.)"""
    tm = getattr(producer, "_transaction_manager", None)
    return bool(tm is not None and tm.has_fatal_error())


def abandon_producer(producer: Any, timeout: float) -> None:
    """Close a producer that may have failed, never raising. kafka-python's ``close`` flushes
    first and, when that raises (a failed transaction, a broker gone), never marks itself
    closed: its ``__del__`` then tries again at garbage collection and raises there, out of
    everyone's reach. So a failed close stops the sender thread and marks it closed."""
    try:
        producer.close(timeout=timeout)
    except Exception:
        sender = getattr(producer, "_sender", None)
        with contextlib.suppress(Exception):
            if sender is not None:
                sender.force_close()
                sender.join(timeout)
        producer._closed = True  # (kafka-python's flag; its __del__ then does nothing)


class TelemetryPublisher:
    """Sample frames -> TelemetryBatch messages on the telemetry topic, keyed by device (or by
    ``key``: NCCL job telemetry by job and communicator).

    Memory is bounded while the broker is slow or away: at most ``k.publish_buffer_bytes`` of
    messages wait for the broker's acknowledgement. When that is full, ``publish_when_full``
    decides: ``block`` (wait for room; the collector is slowed, nothing is lost) or ``drop``
    (the new message is dropped and counted in ``dropped_messages``/``dropped_samples``).

    A message the broker refuses for good (a topic limit lowered, a revoked ACL) is counted in
    ``failed_messages`` and leaves kafka-python's producer failing every later send: the
    publisher then starts a new producer (``producer_restarts``), so a collector keeps
    streaming once the cause is fixed instead of failing quietly until it is restarted.
    """

    def __init__(
        self,
        k: KafkaConfig,
        source: str = "rocewatch",
        producer: Any = None,
        key: pl.Expr | None = None,
    ) -> None:
        """``key``: each row's message key (a string expression over the sample columns)
        instead of its device: NCCL job telemetry is keyed by job and communicator
        (``nccl_key``)."""
        self.k = k
        self.key = key
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
        abandon_producer(dead, timeout=1)

    def readings(self) -> list[tuple[str, str, str, dict[str, str], float]]:
        """Publishing's own numbers for /metrics (``rocewatch.core.metrics.Reading``)."""
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

    def __call__(self, df: pl.DataFrame) -> None:
        """A collector's output (collector.output): ``publish`` with the default slice."""
        self.publish(df)

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
                pl.col("device") if self.key is None else self.key.alias("device"),
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
            abandon_producer(self.producer, timeout=1)  # what the broker never answered: counted
            raise
        self.producer.close(timeout=1 if producer_is_dead(self.producer) else None)


def time_slices(df: pl.DataFrame, slice_ns: int = PUBLISH_SLICE_NS) -> list[pl.DataFrame]:
    """A frame's rows per time slice, in time order (a frame with unknown times: itself)."""
    ts = df.get_column("ts")
    if ts.null_count():
        return [df]
    df = df.sort("ts", maintain_order=True)
    b = df.get_column("ts").to_numpy() // slice_ns
    bounds = [0, *(np.flatnonzero(b[1:] != b[:-1]) + 1).tolist(), df.height]
    return [df.slice(a, z - a) for a, z in itertools.pairwise(bounds)]


def nccl_key(job: str) -> pl.Expr:
    """The message key of NCCL job telemetry: ``nccl/<job>/<communicator>`` (the first part of
    the sample's qual: ``<comm>``, ``<comm>/<collective>/<size>`` or ``<comm>/<nic>``), so a
    communicator's samples, every rank's, travel in one partition in order."""
    return pl.concat_str(
        [pl.lit(f"nccl/{job}/"), pl.col("qual").cast(pl.String).str.split("/").list.first()]
    )
