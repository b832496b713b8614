"""How the detect stage writes: Kafka transactions that fence out a previous holder, and the
fence before each drain or resume."""

from __future__ import annotations

import os
from typing import Any

import orjson
from kafka.errors import (
    InvalidProducerEpochError,
    KafkaError,
    KafkaTimeoutError,
    ProducerFencedError,
)
from kafka.structs import OffsetAndMetadata, TopicPartition

from rocewatch.bus.config import KafkaConfig
from rocewatch.bus.publish import abandon_producer, make_producer
from rocewatch.bus.topics import MAX_MESSAGE_BYTES
from rocewatch.core.clock import SYSTEM_CLOCK, Clock
from rocewatch.core.errors import (
    Fenced,
    RetryableError,
    RocewatchError,
)

# the longest a transaction's commit, abort or offsets may wait for the broker; kafka-python
# waits for them without a bound, and its sender can stay stuck on a connection to a broker
# that restarted (seen in CI: the detect stage blocked in a commit for good)
TXN_WAIT_S = 30.0


class DetectWriter:
    """How the detect stage writes to Kafka: alerts, actions, its state and, with
    ``kafka.fence_detect``, a fence before each drain or resume.

    Fenced (the default), every write is part of a Kafka transaction of the producer with
    transactional id ``<group_id>-detect``, the same in every instance. An instance that takes
    the stage calls ``start``: the broker bumps the id's epoch, aborts whatever the previous
    holder left open, and from then on rejects the previous holder's writes
    (``Fenced``). Events are committed as soon as they are sent (readers read committed,
    so an event is visible at its commit). A checkpoint commits the state record with the
    steps-topic offset, atomically. Before a drain or resume the stage commits a small fence
    record to the state partition: a stalled instance that lost the stage learns it before it
    touches the scheduler, not after.

    Unfenced, writes go through the instance's shared producer.
    """

    def __init__(
        self,
        k: KafkaConfig,
        shared: Any,
        state_partition: int,
        batch_size: int = 1 << 20,
        suffix: str = "",
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.k = k
        self.clock = clock  # a fence record's time
        self.shared = shared
        self.batch_size = batch_size  # the shared producer's: sized to the topics' limits
        self.state_partition = state_partition
        self.fenced = k.fence_detect
        # (``suffix``: a fabric domain's own, "@<domain>", when the stage is split by domain)
        self.transactional_id = f"{k.group_id}-detect{suffix}"
        self.fence_key = f"fence{suffix}".encode()
        self.producer: Any = None if self.fenced else shared
        self.open = False
        self.commits = 0

    def start(self) -> None:
        """Take the stage's transactional id (fencing its previous holder). Before reading the
        stage's state: what that holder left open is aborted first, so it is not read."""
        if not self.fenced:
            return
        self.close()
        self.producer = make_producer(
            self.k,
            max_request_size=MAX_MESSAGE_BYTES,
            batch_size=self.batch_size,
            linger_ms=0,  # a transaction is committed right after its last send
            max_in_flight_requests_per_connection=5,
            enable_idempotence=True,
            transactional_id=self.transactional_id,
        )
        try:
            self.producer.init_transactions()
        except KafkaError as e:
            raise RetryableError(f"cannot take the detect stage's transactional id: {e}") from e

    def send(self, topic: str, **kw: Any) -> Any:
        if self.producer is None:
            raise Fenced("the detect stage's writer is closed")
        if self.fenced and not self.open:
            self._call(self.producer.begin_transaction)
            self.open = True
        return self._call(self.producer.send, topic, **kw)

    def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata] | None = None) -> None:
        """Make what was sent since the last commit visible (with ``offsets``, the detect
        group's consumer offsets, in the same transaction)."""
        if not self.fenced:
            self.shared.flush(timeout=60)  # ProducerFailed after a lost event
            return
        if not self.open:
            return
        if offsets:
            group = self.k.group_id + "-detect"
            self._call(self._bounded, "send_offsets_to_transaction", offsets, group)
        self._call(self._bounded, "commit_transaction")
        self.open = False
        self.commits += 1

    def _bounded(self, name: str, *args: Any) -> None:
        """The producer's transactional call ``name``, waited for at most ``TXN_WAIT_S``
        (``KafkaTimeoutError`` then: the stage gives this producer up and takes the stage
        again with a new one, whose ``init_transactions`` aborts what this one left open).
        The call is made as kafka-python's own method makes it, bar the unbounded wait."""
        manager = getattr(self.producer, "_transaction_manager", None)
        sender = getattr(self.producer, "_sender", None)
        begin = _TXN_BEGIN[name]
        if manager is None or sender is None or not hasattr(manager, begin):
            getattr(self.producer, name)(*args)  # another kafka-python: its own wait
            return
        result = getattr(manager, begin)(*args)
        sender.wakeup()
        if not result.wait(timeout_ms=TXN_WAIT_S * 1000):
            raise KafkaTimeoutError(f"{name} not done within {TXN_WAIT_S:.0f} s")

    def warm(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        """Commit ``offsets`` (where the stage resumes) in a transaction of their own. The
        first transaction that carries consumer offsets looks up the detect group's
        coordinator and connects to it, about 0.2 s here: done at takeover, that wait is
        not inside the first checkpoint, where it held up every step behind it."""
        if not self.fenced or self.open:
            return
        self._call(self.producer.begin_transaction)
        self.open = True
        self.commit(offsets)

    def abort(self) -> None:
        """Give up the open transaction (after a failure that leaves the producer usable);
        ``TransactionFailed`` if that fails too."""
        if self.fenced and self.open:
            self.open = False
            self._call(self._bounded, "abort_transaction")

    def fence(self) -> None:
        """Prove this instance still holds the stage (raises ``Fenced`` if not)."""
        if not self.fenced:
            return
        value = orjson.dumps(
            {"pid": os.getpid(), "host": os.uname().nodename, "ts": self.clock.time()}
        )
        self.send(
            self.k.topics.state, key=self.fence_key, value=value, partition=self.state_partition
        )
        self.commit()

    def _call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except KafkaError as e:
            # fenced shows as itself, or (a send after an earlier request of the transaction
            # failed) as a KafkaError that carries it, or (any call once the sender met the
            # fence first, as an instance waking from a stall does) only as the message of
            # the transaction manager's error state, whose last error is the fence
            manager = getattr(self.producer, "_transaction_manager", None)
            last = getattr(manager, "last_error", None)
            if any(isinstance(x, _FENCED) for x in (e, e.__cause__, last, *e.args)):
                raise Fenced(f"another instance took the detect stage over ({e!r})") from e
            if self.fenced:
                raise TransactionFailed(f"detect stage transaction failed: {e!r}") from e
            raise

    def close(self) -> None:
        """Give the transactional producer up (what is still open is aborted by the broker,
        or by the next holder's ``start``)."""
        if self.fenced and self.producer is not None:
            abandon_producer(self.producer, timeout=5)
            self.producer = None
        self.open = False


_FENCED = (ProducerFencedError, InvalidProducerEpochError)
# a transactional call of kafka-python's producer: the transaction manager's method it begins with
_TXN_BEGIN = {
    "commit_transaction": "begin_commit",
    "abort_transaction": "begin_abort",
    "send_offsets_to_transaction": "send_offsets_to_transaction",
}


class TransactionFailed(RocewatchError):
    """A transaction of the detect stage failed for a reason other than a fence: what it held
    is aborted, so the stage starts again from its last checkpoint."""


class FencedExecutor:
    """An executor that proves the detect stage is still this instance's before each drain
    and resume (``DetectWriter.fence``): a stalled instance that lost the stage raises
    ``Fenced`` instead of acting on the scheduler."""

    def __init__(self, inner: Any, fence: Any) -> None:
        self.inner = inner
        self.fence_fn = fence

    def _fence(self) -> None:
        if self.fence_fn is not None:
            self.fence_fn()

    def drain(self, node: str, scheduler: str, reason: str) -> str:
        self._fence()
        return str(self.inner.drain(node, scheduler, reason))

    def resume(self, node: str, scheduler: str) -> str:
        self._fence()
        return str(self.inner.resume(node, scheduler))
