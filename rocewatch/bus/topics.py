"""The Kafka topics rocewatch uses: created with the partitions and limits each needs, and the
largest record each takes."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic
from kafka.errors import (
    InvalidPartitionsError,
    KafkaError,
    TopicAlreadyExistsError,
)

from rocewatch.bus.config import KafkaConfig
from rocewatch.bus.preflight import preflight
from rocewatch.core.errors import (
    ConfigError,
    RetryableError,
)

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 << 20  # steps and state topics; the producer's request limit matches


RECORD_OVERHEAD = 4096  # what a record batch adds to its value (key, headers, framing)


def record_limit(k: KafkaConfig, topic: str) -> int:
    """The largest value the broker takes on ``topic`` (its ``max.message.bytes``, less the
    batch framing), at most MAX_MESSAGE_BYTES. A record above it would be refused, and a
    refused record is fatal to an idempotent producer: everything it holds is dropped, the
    steps with it. So larger states are not sent (``state_too_large``), and larger steps and
    rollups go out in more messages."""
    return record_limits(k, [topic])[topic]


def record_limits(k: KafkaConfig, topics: list[str]) -> dict[str, int]:
    """``record_limit`` of each topic, from one admin connection."""
    out = dict.fromkeys(topics, MAX_MESSAGE_BYTES)
    try:
        admin = KafkaAdminClient(**k.client_kwargs(), request_timeout_ms=30000)
    except KafkaError as e:
        log.warning("record limits of %s unknown (%s); taking %d", topics, e, MAX_MESSAGE_BYTES)
        return out
    try:
        want = [ConfigResource(ConfigResourceType.TOPIC, t, ["max.message.bytes"]) for t in topics]
        try:
            # every value: kafka-python's default filter ("modified") leaves out a topic on
            # the broker's default limit (1 MiB), which must not be taken for 64 MiB
            res = admin.describe_configs(want, config_filter="all")
        except TypeError:  # an older kafka-python, without the argument
            res = admin.describe_configs(want)
        for t in topics:
            try:
                value = res["topic"][t]["max.message.bytes"]["value"]
                out[t] = max(0, min(MAX_MESSAGE_BYTES, int(value) - RECORD_OVERHEAD))
            except (KeyError, TypeError, ValueError) as e:
                log.warning("record limit of %s unknown (%s); taking %d", t, e, MAX_MESSAGE_BYTES)
        return out
    except KafkaError as e:
        log.warning("record limits of %s unknown (%s); taking %d", topics, e, MAX_MESSAGE_BYTES)
        return out
    finally:
        admin.close()


def ensure_detect_topics(k: KafkaConfig, domains: int = 1) -> int:
    """Create the telemetry, output, steps and state topics; return the telemetry partitions.
    The steps topic has a partition per fabric domain (one more domain in the topology: one
    more partition, added here)."""
    ensure_topics(k)
    try:
        admin = KafkaAdminClient(**k.client_kwargs(), request_timeout_ms=30000)
    except KafkaError as e:
        raise RetryableError(f"cannot reach Kafka at {k.bootstrap_servers}: {e}") from e
    try:
        existing: set[str] = set()

        def count(topic: str) -> int:
            if topic not in existing:
                return 0
            desc = admin.describe_topics([topic])
            return len(desc[0].get("partitions") or []) if desc else 0

        deadline = time.monotonic() + 30
        n = 0
        while n <= 0:  # a topic just created may take a moment to show its partitions
            existing = set(admin.list_topics())
            n = count(k.topics.telemetry)
            if n <= 0 and time.monotonic() > deadline:
                raise RetryableError(f"telemetry topic {k.topics.telemetry} has no partitions")
            if n <= 0:
                time.sleep(0.2)
        have_state = count(k.topics.state)
        big = {"max.message.bytes": str(MAX_MESSAGE_BYTES)}
        want = [rollups_topic(k)] if k.topics.rollups not in existing else []
        have_steps = count(k.topics.steps)
        if k.topics.steps not in existing:
            want.append(
                NewTopic(
                    k.topics.steps, domains, 1, topic_configs={**big, "retention.ms": "86400000"}
                )
            )
        elif have_steps < domains:
            log.warning(
                "steps topic %s has %d partitions: adding up to %d, one per fabric domain",
                k.topics.steps,
                have_steps,
                domains,
            )
            # (another instance starting with the same topology may have grown it first)
            with contextlib.suppress(InvalidPartitionsError):
                admin.create_partitions({k.topics.steps: domains})
        if have_state == 0:
            want.append(
                NewTopic(
                    k.topics.state,
                    n + 1,
                    1,
                    topic_configs={**big, "cleanup.policy": "compact", "segment.ms": "600000"},
                )
            )
        elif have_state < n + 1:
            raise ConfigError(
                f"kafka.topics.state {k.topics.state} has {have_state} partitions; scale-out "
                f"needs the telemetry partitions + 1 = {n + 1}"
            )
        if want:
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(want)
        return n
    finally:
        admin.close()


def rollups_topic(k: KafkaConfig) -> NewTopic:
    """The metric rollups stage 1 computes when storage is configured (``rocewatch sink``
    stores them): keyed by telemetry partition, a day's retention, records up to 64 MB."""
    return NewTopic(
        k.topics.rollups,
        k.partitions,
        1,
        topic_configs={"max.message.bytes": str(MAX_MESSAGE_BYTES), "retention.ms": "86400000"},
    )


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

    First checks TLS and SASL against the broker (rocewatch.bus.preflight), so an untrusted
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
            # configuration is small and read whole by every detect stage: one partition keeps
            # every device's records in the order they were published; a day of it (the agents
            # and a sampled subscription send everything again every minute), so a detect stage
            # starting afresh reads a day at most
            NewTopic(t.config, 1, 1, topic_configs={"retention.ms": "86400000"}),
            *extra,
        ]
        missing = [n for n in want if n.name not in existing]
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(missing)
    finally:
        admin.close()
