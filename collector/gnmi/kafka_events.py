"""Read gnmic's Kafka output (``format: event``) and publish it as rocewatch telemetry.

gnmic's Kafka output with ``format: event`` writes each notification as one message whose value
is a JSON array of event objects (docs/formats.md section 2); single objects are accepted too. The
bridge consumes that topic in its own consumer group, decodes whole polls into columnar batches
(``GnmicEventDecoder``), publishes them to the telemetry topic keyed by device, and commits the
gnmic offsets only once the producer has flushed (at least once). Messages that are not JSON or
not events are counted and skipped.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from kafka import KafkaConsumer
from kafka.errors import KafkaError

from collector.decode import GnmicEventDecoder
from rocewatch.bus.config import KafkaConfig
from rocewatch.bus.poll import poll_group
from rocewatch.bus.publish import TelemetryPublisher
from rocewatch.bus.topics import ensure_topics
from rocewatch.core.errors import RetryableError
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology

log = logging.getLogger(__name__)


class HasKafka(Protocol):
    """What the bridge reads of the product config: its ``kafka`` section."""

    @property
    def kafka(self) -> KafkaConfig: ...


class GnmicKafkaBridge:
    def __init__(
        self,
        cfg: HasKafka,
        topology: Topology,
        topic: str,
        group_id: str | None = None,
        stats: Stats | None = None,
    ) -> None:
        self.cfg = cfg
        self.topic = topic
        self.stats = stats or Stats()
        self.decoder = GnmicEventDecoder(topology, self.stats)
        k = cfg.kafka
        ensure_topics(k)
        try:
            self.consumer = KafkaConsumer(
                topic,
                **k.client_kwargs(),
                group_id=group_id or f"{k.group_id}.gnmic",
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                max_poll_records=5000,
            )
        except KafkaError as e:
            raise RetryableError(f"cannot reach Kafka at {k.bootstrap_servers}: {e}") from e
        self.publisher = TelemetryPublisher(k, source=f"gnmic:{topic}")
        self.messages = 0

    def poll_once(self, timeout_ms: int = 500) -> int:
        """One poll: decode, publish, flush, commit. Returns the messages read."""
        polled = poll_group(self.consumer, timeout_ms)
        values = [m.value for recs in polled.values() for m in recs if m.value is not None]
        n = sum(len(recs) for recs in polled.values())
        if not n:
            return 0
        df = self.decoder.decode_lines(values)
        if df.height:
            self.publisher.publish(df)
            self.publisher.flush()
        self.consumer.commit()
        self.messages += n
        return n

    def run(self, max_idle_s: float = 0.0) -> None:
        """Bridge until stopped (or ``max_idle_s`` without a message, when > 0)."""
        idle_since = time.monotonic()
        try:
            while True:
                if self.poll_once():
                    idle_since = time.monotonic()
                elif max_idle_s > 0 and time.monotonic() - idle_since >= max_idle_s:
                    return
        finally:
            self.close()

    def close(self) -> None:
        self.publisher.close()
        self.consumer.close()
        if self.stats.counts:
            log.info("gnmic bridge skipped input: %s", dict(self.stats.counts))
