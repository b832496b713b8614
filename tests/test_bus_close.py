"""Closing a producer that failed (rocewatch.bus.publish.abandon_producer).

kafka-python's ``KafkaProducer.close`` flushes first; when that raises (a transaction the
broker left half done, a broker gone) the producer is never marked closed, so its ``__del__``
closes it again at garbage collection and raises there, where no one can catch it: the broker
restart test logged exactly that. A real KafkaProducer (no broker needed: its API version is
given) whose flush fails the way a failed transaction's does.
"""

from __future__ import annotations

import dataclasses
import gc
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import KafkaProducer
from kafka.errors import KafkaError

from rocewatch.bus.publish import abandon_producer
from rocewatch.bus.transactions import DetectWriter
from rocewatch.config import KafkaConfig


@pytest.fixture
def unraisable(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[BaseException]]:
    seen: list[BaseException] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    yield seen


def failing_producer() -> KafkaProducer:
    p = KafkaProducer(bootstrap_servers="127.0.0.1:9", api_version=(2, 5))

    def flush(timeout: Any = None) -> None:
        raise KafkaError("Invalid transition from COMMITTING_TRANSACTION to ABORTING_TRANSACTION")

    p.flush = flush  # type: ignore[method-assign]
    return p


def test_a_failed_close_raises_again_at_garbage_collection_without_it(
    unraisable: list[BaseException],
) -> None:
    """The bug itself, so the test below cannot pass for a kafka-python that fixed it."""
    p = failing_producer()
    with pytest.raises(KafkaError):
        p.close(timeout=0.2)
    del p
    gc.collect()
    assert len(unraisable) == 1 and "Invalid transition" in str(unraisable[0])


def test_abandon_producer_closes_a_failed_producer_for_good(
    unraisable: list[BaseException],
) -> None:
    p = failing_producer()
    abandon_producer(p, timeout=0.2)  # does not raise
    sender = p._sender
    sender.join(10)  # stopped, not left sending: it ends once its current wait does
    assert not sender.is_alive()
    del p
    gc.collect()
    assert unraisable == []


def test_the_detect_writer_gives_a_failed_transactional_producer_up_quietly(
    unraisable: list[BaseException],
) -> None:
    k = dataclasses.replace(KafkaConfig(), fence_detect=True)
    writer = DetectWriter(k, shared=None, state_partition=0)
    writer.producer = failing_producer()
    writer.open = True
    writer.close()
    assert writer.producer is None and not writer.open
    gc.collect()
    assert unraisable == []
