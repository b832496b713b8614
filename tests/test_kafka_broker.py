"""The real Kafka broker from scripts/kafka_broker.py, exercised with kafka-python."""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from typing import Any, NamedTuple

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

SEND_TIMEOUT = 30.0
CONSUME_TIMEOUT = 60.0


class Rec(NamedTuple):
    key: str
    value: str
    partition: int


def _send(producer: KafkaProducer, topic: str, key: str, value: str) -> Any:
    return producer.send(topic, key=key.encode(), value=value.encode())


def _producer(bootstrap: str, **extra: Any) -> KafkaProducer:
    return KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        request_timeout_ms=10_000,
        **extra,
    )


def _consume(
    bootstrap: str, topic: str, expected: int, timeout: float = CONSUME_TIMEOUT
) -> list[Rec]:
    """Read ``expected`` records from the start of ``topic`` in a fresh group (bounded in time)."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=f"rwtest-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    records: list[Rec] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        while len(records) < expected and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=1000).values():
                records.extend(Rec(r.key.decode(), r.value.decode(), r.partition) for r in batch)
        if records:
            consumer.commit()
    finally:
        consumer.close()
    return records


def test_produce_consume_keyed_messages(kafka_bootstrap: str, kafka_topics: Any) -> None:
    topic = kafka_topics.create("keyed", partitions=4)

    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, request_timeout_ms=10_000)
    try:
        assert topic in admin.list_topics()
        (desc,) = admin.describe_topics([topic])
        assert len(desc["partitions"]) == 4
    finally:
        admin.close()

    sent = {(f"node-{i % 10:02d}", f"value-{i:03d}") for i in range(100)}
    producer = _producer(kafka_bootstrap, linger_ms=5)
    try:
        futures = [_send(producer, topic, k, v) for k, v in sorted(sent)]
        producer.flush(timeout=SEND_TIMEOUT)
        metas = [f.get(timeout=SEND_TIMEOUT) for f in futures]
    finally:
        producer.close(timeout=10)
    assert all(m.topic == topic and m.offset >= 0 for m in metas)

    records = _consume(kafka_bootstrap, topic, expected=100)
    got = [(r.key, r.value) for r in records]
    assert len(got) == 100, f"got {len(got)} of 100 records"
    assert set(got) == sent

    # keyed partitioning: each key sticks to one partition, and the keys spread over several
    partitions_by_key: dict[str, set[int]] = defaultdict(set)
    for r in records:
        partitions_by_key[r.key].add(r.partition)
    assert all(len(p) == 1 for p in partitions_by_key.values()), partitions_by_key
    assert len({r.partition for r in records}) > 1


def test_broker_restart_loses_nothing(restartable_kafka_broker: Any, kafka_topics: Any) -> None:
    broker = restartable_kafka_broker
    bootstrap = broker.bootstrap
    topic = kafka_topics.create("restart", partitions=4)

    producer = _producer(bootstrap, retries=20, retry_backoff_ms=250, reconnect_backoff_max_ms=1000)
    try:
        before = [_send(producer, topic, f"k{i}", f"before-{i}") for i in range(20)]
        producer.flush(timeout=SEND_TIMEOUT)
        for f in before:
            f.get(timeout=SEND_TIMEOUT)

        old_pid = broker.pid
        broker.restart()
        assert broker.is_running() and broker.pid != old_pid
        assert broker.bootstrap == bootstrap

        # the same producer, with retries, gets through to the restarted broker
        after = _send(producer, topic, "k-after", "after-restart")
        producer.flush(timeout=60)
        meta = after.get(timeout=60)
        assert meta.topic == topic and meta.offset >= 0
    finally:
        producer.close(timeout=10)

    records = _consume(bootstrap, topic, expected=21)
    values = sorted(r.value for r in records)
    assert values == sorted([f"before-{i}" for i in range(20)] + ["after-restart"])
