"""Exactly-once output of the detect stage: alerts and actions published to their topics, and
those already published after the last checkpoint read back, so that the same events made again
after a restart or a takeover are not sent twice (docs/architecture.md).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson
from kafka import KafkaConsumer
from kafka.structs import TopicPartition

from rocewatch.config import Config
from rocewatch.core.model import Action, Alert, rfc3339
from rocewatch.pipeline import Output


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
    kinds: list[tuple[str, list[Any], Callable[[Any], str], Callable[[Any], str], bytes]] = [
        (t.alerts, out.alerts, _alert_id, lambda a: a.fingerprint, b"alert/v1"),
        (t.actions, out.actions, _action_id, lambda a: a.node, b"action/v1"),
    ]
    sent = []
    for topic, events, event_id, key, schema in kinds:
        n = 0
        for e in events:
            if published.take(topic, event_id(e)):
                continue
            n += 1
            producer.send(
                topic,
                key=key(e).encode(),
                value=orjson.dumps(e.to_json()),
                headers=[("rocewatch-schema", schema)],
            )
        sent.append(n)
    return sent[0], sent[1]


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
