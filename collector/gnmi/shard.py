"""Spread gNMI targets over several collector instances with a Kafka consumer group.

Every instance joins one consumer group on a small "shard" topic of P partitions (no records
are ever written to it: the group is only used for membership). Target ``t`` belongs to
partition ``crc32(t) % P``; the group coordinator hands each live instance a share of the
partitions, and an instance collects exactly the targets of the partitions it holds. When an
instance stops (it leaves the group) or dies (its session times out), Kafka reassigns its
partitions and the survivors pick its targets up; when one joins, targets move to it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import zlib

from kafka import ConsumerRebalanceListener, KafkaConsumer
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError
from kafka.structs import TopicPartition

from collector.gnmi.client import Collector
from collector.gnmi.config import TargetConfig
from rocewatch.bus.config import KafkaConfig
from rocewatch.bus.poll import poll_group
from rocewatch.core.errors import RetryableError

log = logging.getLogger(__name__)


def partition_of(target: str, partitions: int) -> int:
    return zlib.crc32(target.encode()) % partitions


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, shard: KafkaSharding) -> None:
        self.shard = shard

    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.shard._release({tp.partition for tp in revoked})

    def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.shard._take({tp.partition for tp in assigned})


class KafkaSharding:
    """Runs ``collector`` on this instance's share of ``targets`` (see the module docstring)."""

    def __init__(
        self,
        kafka: KafkaConfig,
        collector: Collector,
        targets: list[TargetConfig],
        group: str,
        topic: str = "rocewatch.gnmi-shards",
        partitions: int = 32,
        session_timeout_ms: int = 6000,
    ) -> None:
        self.collector = collector
        self.partitions = partitions
        self.by_partition: dict[int, list[TargetConfig]] = {}
        for t in targets:
            self.by_partition.setdefault(partition_of(t.name, partitions), []).append(t)
        self.owned: set[int] = set()
        self.lock = threading.Lock()
        self._ensure_topic(kafka, topic, partitions)
        try:
            self.consumer = KafkaConsumer(
                **kafka.client_kwargs(),
                group_id=group,
                enable_auto_commit=False,
                session_timeout_ms=session_timeout_ms,
                heartbeat_interval_ms=max(500, session_timeout_ms // 4),
            )
        except KafkaError as e:
            raise RetryableError(f"cannot reach Kafka at {kafka.bootstrap_servers}: {e}") from e
        self.consumer.subscribe([topic], listener=_Listener(self))

    @staticmethod
    def _ensure_topic(kafka: KafkaConfig, topic: str, partitions: int) -> None:
        admin = KafkaAdminClient(**kafka.client_kwargs(), request_timeout_ms=30000)
        try:
            if topic not in set(admin.list_topics()):
                with contextlib.suppress(TopicAlreadyExistsError):
                    admin.create_topics([NewTopic(topic, partitions, 1)])
        finally:
            admin.close()

    def owned_targets(self) -> list[str]:
        with self.lock:
            return sorted(t.name for p in self.owned for t in self.by_partition.get(p, []))

    def _take(self, parts: set[int]) -> None:
        with self.lock:
            new = parts - self.owned
            self.owned |= new
        for p in sorted(new):
            for t in self.by_partition.get(p, []):
                if t.name not in self.collector.targets():
                    self.collector.add_target(t, start=True)
        if new:
            log.info("gNMI shard: now collecting %d targets", len(self.owned_targets()))

    def _release(self, parts: set[int]) -> None:
        with self.lock:
            gone = parts & self.owned
            self.owned -= gone
        for p in gone:
            for t in self.by_partition.get(p, []):
                self.collector.remove_target(t.name)

    def poll(self, timeout_ms: int = 500) -> None:
        """Keep the membership alive (rebalances run inside the poll)."""
        poll_group(self.consumer, timeout_ms)

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                self.poll()
        finally:
            self.close()

    def close(self) -> None:
        """Leave the group (the others take this instance's targets at once)."""
        with contextlib.suppress(KafkaError):
            self.consumer.close()
        self._release(set(self.owned))
