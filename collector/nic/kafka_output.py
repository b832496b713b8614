"""Snapshot lines -> Kafka, acknowledged or raised, so the spool knows what it may delete.

``batch`` (default): the lines are read into canonical samples (collector/nic/samples.py) and
sent as TelemetryBatch messages (collector/nic/batch.py) on the telemetry topic, keyed by node:
what the detector service consumes. Neither needs Polars or NumPy (the lean agent has neither).
``json``: each snapshot line is sent unchanged (docs/formats.md section 3), keyed by node, for
consumers that want the agent's own format.

:class:`KafkaConfigOutput` sends the agent's RoCE configuration snapshots (``nic_config.jsonl``
lines, CONTRACTS.md section 5) unchanged on the configuration topic, keyed by node: the detect
stage reads them (rocewatch/runtime/config_feed.py).
"""

from __future__ import annotations

import logging
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaError

from collector.mapping import NicMapper
from collector.nic import batch
from collector.nic.samples import SnapshotReader
from rocewatch.bus.config import KafkaConfig
from rocewatch.core.errors import RetryableError
from rocewatch.core.stats import Stats

log = logging.getLogger(__name__)
MAX_ROWS_PER_MESSAGE = 8192


class KafkaSnapshotOutput:
    def __init__(
        self, k: KafkaConfig, node: str, fmt: str = "batch", topic: str | None = None
    ) -> None:
        self.k = k
        self.key = node.encode()
        self.fmt = fmt
        self.topic = topic or k.topics.telemetry
        self.stats = Stats()
        # the mapping's metric names are checked by the services that decode what is sent
        self.reader = SnapshotReader(self.stats, NicMapper(check_metrics=False))
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
                    # kafka-python waits 30 s for a first broker by default: the agent would
                    # neither retry sooner nor stop (SIGTERM) within a pod's grace period while
                    # the broker is away; the spool keeps what is unsent either way
                    bootstrap_timeout_ms=5000,
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

    def encode(self, lines: list[bytes]) -> list[bytes]:
        """Snapshot lines -> TelemetryBatch messages of at most MAX_ROWS_PER_MESSAGE rows."""
        cols = self.reader.read_lines(lines)
        out = []
        for off in range(0, len(cols), MAX_ROWS_PER_MESSAGE):
            self.seq += 1
            out.append(batch.encode(cols, off, off + MAX_ROWS_PER_MESSAGE, self.source, self.seq))
        return out

    def __call__(self, lines: list[bytes]) -> None:
        """Send and wait for the broker's acknowledgement; RetryableError when it does not."""
        try:
            prod = self._producer()
            futures = []
            if self.fmt == "json":
                for line in lines:
                    futures.append(prod.send(self.topic, key=self.key, value=line.rstrip(b"\n")))
            else:
                for value in self.encode(lines):
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


class KafkaConfigOutput(KafkaSnapshotOutput):
    """``nic_config.jsonl`` lines -> the configuration topic (``kafka.topics.config``), each
    line one record as it is, keyed by node. A send the broker does not acknowledge is counted
    (``agent_config_unsent``) and dropped, never raised: the agent sends every NIC's whole
    snapshot again at its configuration cadence, and the detect stage compares each snapshot
    with the last one it had, so a change sent late is still a change."""

    def __init__(self, k: KafkaConfig, node: str) -> None:
        super().__init__(k, node, "json", k.topics.config)

    def __call__(self, lines: list[bytes]) -> None:
        try:
            super().__call__(lines)
            self.stats.inc("agent_config_sent", len(lines))
        except RetryableError as e:
            self.stats.inc("agent_config_unsent", len(lines))
            log.warning("%d configuration snapshots not sent: %s", len(lines), e)
