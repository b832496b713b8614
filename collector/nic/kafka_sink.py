"""Snapshot lines -> Kafka, acknowledged or raised, so the spool knows what it may delete.

``batch`` (default): the lines are decoded into canonical samples and sent as TelemetryBatch
messages on the telemetry topic, keyed by node: what the detector service consumes. ``json``:
each snapshot line is sent unchanged (docs/formats.md section 3), keyed by node, for consumers that
want the agent's own format.
"""

from __future__ import annotations

import logging
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaError

from collector.decode import NicSnapshotDecoder
from rocewatch import wire
from rocewatch.config import KafkaConfig
from rocewatch.errors import RetryableError
from rocewatch.stats import Stats

log = logging.getLogger(__name__)
MAX_ROWS_PER_MESSAGE = 8192


class KafkaSnapshotSink:
    def __init__(
        self, k: KafkaConfig, node: str, fmt: str = "batch", topic: str | None = None
    ) -> None:
        self.k = k
        self.key = node.encode()
        self.fmt = fmt
        self.topic = topic or k.topics.telemetry
        self.stats = Stats()
        self.decoder = NicSnapshotDecoder(None, self.stats)
        self.producer: Any = None
        self.seq = 0
        self.source = f"agent:{node}"

    def _producer(self) -> Any:
        if self.producer is None:
            try:
                self.producer = KafkaProducer(
                    **self.k.client_kwargs(),
                    acks="all",
                    linger_ms=5,
                    compression_type=None
                    if self.k.compression_type == "none"
                    else self.k.compression_type,
                    retries=3,
                    max_block_ms=5000,
                    request_timeout_ms=5000,
                    delivery_timeout_ms=15000,
                    max_in_flight_requests_per_connection=1,
                )
            except KafkaError as e:
                raise RetryableError(f"Kafka at {self.k.bootstrap_servers}: {e}") from e
        return self.producer

    def _drop_producer(self) -> None:
        if self.producer is not None:
            try:
                self.producer.close(timeout=0)  # abandon what it still buffers: resent whole
            except Exception:
                log.debug("closing the Kafka producer failed", exc_info=True)
            self.producer = None

    def __call__(self, lines: list[bytes]) -> None:
        """Send and wait for the broker's acknowledgement; RetryableError when it does not."""
        try:
            prod = self._producer()
            futures = []
            if self.fmt == "json":
                for line in lines:
                    futures.append(prod.send(self.topic, key=self.key, value=line.rstrip(b"\n")))
            else:
                df = self.decoder.decode_lines(lines)
                for off in range(0, df.height, MAX_ROWS_PER_MESSAGE):
                    self.seq += 1
                    value = wire.encode(df.slice(off, MAX_ROWS_PER_MESSAGE), self.source, self.seq)
                    futures.append(prod.send(self.topic, key=self.key, value=value))
            prod.flush(timeout=20)
            for f in futures:
                if not f.is_done or f.failed():
                    raise RetryableError(f"Kafka did not acknowledge: {f.exception}")
        except (KafkaError, RetryableError) as e:
            self._drop_producer()
            if isinstance(e, RetryableError):
                raise
            raise RetryableError(f"Kafka at {self.k.bootstrap_servers}: {e}") from e

    def close(self) -> None:
        if self.producer is not None:
            self.producer.flush(timeout=10)
            self.producer.close(timeout=10)
            self.producer = None
