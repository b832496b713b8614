"""The state topic: state records written off the stage's thread, and the latest one per
partition read back (read committed). Every record is signed (``rocewatch.bus.signing``): a
stage restores only a record whose MAC one of its keys verifies."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

from kafka import KafkaConsumer
from kafka.structs import TopicPartition

from rocewatch.bus.config import KafkaConfig
from rocewatch.bus.signing import StateKeys
from rocewatch.bus.topics import (
    MAX_MESSAGE_BYTES,
    record_limit,
)
from rocewatch.core import checkpoint
from rocewatch.core.errors import RetryableError

# --- the state topic -----------------------------------------------------------------------------


# serialises the frames of a checkpoint off the stage's thread (one at a time, in order)
_SERIALISER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rocewatch-state")


def _as_checkpoint(obj: Any) -> tuple[Any, str, checkpoint.StateTypes]:
    """A stage's state as the data its record holds, the record's kind and the record types
    in it (a stage's state says all three: ``record_data``)."""
    record_data = getattr(obj, "record_data", None)
    if record_data is not None:
        data, kind, types = record_data()
        return data, kind, types
    return obj, "state", checkpoint.NO_TYPES


class Signed(NamedTuple):
    """A state record ready for the state topic: its key, value and the headers with its MAC."""

    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]


class Stored(NamedTuple):
    """A state topic's record as read back, not yet verified (``StateStore.open`` verifies)."""

    key: bytes | None
    value: bytes
    offset: int
    headers: list[tuple[str, bytes | None]]


class StateSnapshot:
    """A stage's state as a state record (docs/formats/checkpoint.md), taken in two parts.

    At once, in the stage's thread: a consistent copy of the state (``checkpoint.Snapshot``:
    its Polars frames copied, its arrays copied out, the rest encoded as JSON values). Then,
    on a worker thread (``start``), the part that costs: the frames as zstd Arrow IPC (Polars
    releases the GIL), the record's checksum and, given ``keys`` and the record's ``key``, its
    MAC. At 1,024 GPUs the copy takes tens of ms and the serialisation 0.1 to 0.2 s, which no
    longer holds up the stream."""

    def __init__(
        self, obj: Any, copy: bool = True, keys: StateKeys | None = None, key: str = ""
    ) -> None:
        data, kind, types = _as_checkpoint(obj)
        self.snap = checkpoint.Snapshot(data, kind, copy_frames=copy, types=types)
        self.keys = keys
        self.key = key.encode()
        self.future: Future[bytes] | None = None
        self.signed_future: Future[Signed] | None = None

    def start(self) -> StateSnapshot:
        if self.keys is None:
            self.future = _SERIALISER.submit(self.snap.record)
        else:
            self.signed_future = _SERIALISER.submit(self._signed)
        return self

    def done(self) -> bool:
        fut = self.future or self.signed_future
        return fut is None or fut.done()

    def record(self) -> bytes:
        """The state record (waits for the worker when started)."""
        if self.signed_future is not None:
            return self.signed_future.result().value
        return self.future.result() if self.future is not None else self.snap.record()

    def signed(self) -> Signed:
        """The state record signed with the write key (waits for the worker when started)."""
        if self.signed_future is not None:
            return self.signed_future.result()
        return self._signed()

    def _signed(self) -> Signed:
        if self.keys is None:
            raise ValueError("a snapshot taken without keys cannot be signed")
        value = self.future.result() if self.future is not None else self.snap.record()
        return Signed(self.key, value, self.keys.sign(self.key, value))


def state_record(obj: Any) -> bytes:
    """A state record at once: nothing changes the frames meanwhile, so they are not copied."""
    return StateSnapshot(obj, copy=False).record()


class StateStore:
    """Latest state per state-topic partition (one key per partition, so the last record wins).

    Read committed: the detect stage writes its state in transactions (``DetectWriter``), so a
    partition's last offset may be a transaction marker, and a fenced instance's aborted state
    must never be restored.

    Both stages of an instance read through it, each from its own thread: a KafkaConsumer is
    not safe to share between threads, so every read holds ``lock``.

    Records are signed with ``keys`` (``sign``, ``snapshot``); a stage restores a record only
    once ``open`` has verified its MAC."""

    def __init__(
        self, k: KafkaConfig, producer: Any, max_bytes: int | None = None, *, keys: StateKeys
    ) -> None:
        self.topic = k.topics.state
        self.producer = producer
        self.keys = keys
        self.lock = threading.RLock()
        self.reader = KafkaConsumer(
            **k.client_kwargs(),
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
            fetch_max_bytes=MAX_MESSAGE_BYTES,
        )
        self.written_end: dict[int, int] = {}  # end offset after our own last write
        # a state above it is not sent (RECORD_OVERHEAD, taken off the topic's limit, leaves
        # room for the key and the MAC's header)
        self.max_bytes = record_limit(k, self.topic) if max_bytes is None else max_bytes

    def end(self, partition: int) -> int:
        tp = TopicPartition(self.topic, partition)
        return int(self.end_offsets([tp])[tp])

    def end_offsets(self, tps: list[TopicPartition], timeout_ms: int | None = None) -> Any:
        """Any topic's end offsets (read committed), as ``KafkaConsumer.end_offsets``."""
        with self.lock:
            return self.reader.end_offsets(tps, timeout_ms=timeout_ms)

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        with self.lock:
            return self.reader.partitions_for_topic(topic)  # type: ignore[no-any-return]

    def load(self, partition: int, key: str | None = None, timeout_s: float = 60.0) -> bytes | None:
        """The value of the partition's last committed record (with ``key``, if given), as
        stored: its MAC is not verified (``load_stored`` and ``open`` are what a stage uses)."""
        rec = self.load_record(partition, key, timeout_s)
        return None if rec is None else rec[0]

    def load_record(
        self, partition: int, key: str | None = None, timeout_s: float = 60.0
    ) -> tuple[bytes, int] | None:
        """``load``, with the record's offset (for a log line about it)."""
        rec = self.load_stored(partition, key, timeout_s)
        return None if rec is None else (rec.value, rec.offset)

    def load_stored(
        self, partition: int, key: str | None = None, timeout_s: float = 60.0
    ) -> Stored | None:
        """The partition's last committed record (with ``key``, if given): its key, value,
        offset and headers, for ``open`` to verify. None if there is none (or it is empty)."""
        with self.lock:
            return self._load(partition, key, timeout_s)

    def open(self, rec: Stored) -> bytes:
        """The record's value, once its MAC is verified; ``SignatureError`` if it is not."""
        self.keys.verify(rec.key, rec.value, rec.headers)
        return rec.value

    def sign(self, key: str, value: bytes) -> Signed:
        """A state record signed now, in the caller's thread (``snapshot`` signs off it)."""
        k = key.encode()
        return Signed(k, value, self.keys.sign(k, value))

    def snapshot(self, obj: Any, key: str) -> StateSnapshot:
        """A stage's state as a record under ``key``, copied now and serialised and signed on
        the worker thread (``StateSnapshot``; call ``start``)."""
        return StateSnapshot(obj, keys=self.keys, key=key)

    def _load(self, partition: int, key: str | None, timeout_s: float) -> Stored | None:
        tp = TopicPartition(self.topic, partition)
        end = self.end(partition)
        want = None if key is None else key.encode()
        back = 8  # the last record is usually within the last few offsets (markers, fences)
        # (a wait on the broker: real time, whatever clock the stages run on)
        deadline = time.monotonic() + timeout_s
        while end > 0:
            start = max(0, end - back)
            self.reader.assign([tp])
            self.reader.seek(tp, start)
            found: Any = None
            while self.reader.position(tp) < end:
                if time.monotonic() > deadline:
                    raise RetryableError(f"state {self.topic}/{partition} not readable to {end}")
                for m in self.reader.poll(timeout_ms=500).get(tp, []):
                    if m.offset < end and (want is None or m.key == want):
                        found = m
            if found is not None:
                if not found.value:
                    return None
                return Stored(
                    None if found.key is None else bytes(found.key),
                    bytes(found.value),
                    int(found.offset),
                    list(found.headers or ()),
                )
            if start == 0:
                break
            back *= 8
        return None

    def save(self, partition: int, rec: Signed) -> Any:
        return self.producer.send(
            self.topic, key=rec.key, value=rec.value, headers=rec.headers, partition=partition
        )

    def confirm(self, partition: int, future: Any) -> None:
        self.written_end[partition] = int(future.get(timeout=60).offset) + 1

    def close(self) -> None:
        with self.lock:
            self.reader.close()
