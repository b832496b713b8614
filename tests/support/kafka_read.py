"""Read a Kafka topic to its end as it stands now, instead of until it has been quiet a while.

A consumer iterated with ``consumer_timeout_ms`` returns only after that long without a record:
every read of a finished topic costs the whole timeout. Here the end offsets are asked first
(under ``read_committed`` the broker answers with the last stable offset, as rocewatch's own
readers see it) and the read stops once every partition's position has reached its end.
"""

from __future__ import annotations

import time
from typing import Any

from kafka import KafkaConsumer
from kafka.structs import TopicPartition


def read_to_end(topic: str, timeout_s: float = 30.0, **client: Any) -> list[Any]:
    """Every record of ``topic`` up to the end it had when asked (committed ones only); what was
    read by ``timeout_s`` if the end is not reached by then. ``client``: KafkaConsumer settings
    (bootstrap_servers, security)."""
    c = KafkaConsumer(
        **client,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",  # as rocewatch's own readers (DetectWriter)
    )
    try:
        deadline = time.monotonic() + timeout_s
        known_by = min(deadline, time.monotonic() + 5.0)  # a topic that never existed: empty
        parts = c.partitions_for_topic(topic)
        while not parts and time.monotonic() < known_by:
            time.sleep(0.2)  # a topic created a moment ago: asked again, from the broker
            parts = c.partitions_for_topic(topic)
        if not parts:
            return []
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        ends = c.end_offsets(tps)
        out: list[Any] = []
        while time.monotonic() < deadline and any(c.position(tp) < ends[tp] for tp in tps):
            for records in c.poll(timeout_ms=200).values():
                out.extend(records)
        return out
    finally:
        c.close()
