"""A domain's detect stage checkpoints: its outputs flushed, then its state written to the state
topic and its steps offset committed, fenced (the state and the offset in one transaction);
at once, or in two halves so the stream does not wait for the state's serialisation."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata, TopicPartition

from rocewatch.bus.state_store import Signed, StateSnapshot, StateStore, state_record
from rocewatch.bus.transactions import DetectWriter, TransactionFailed
from rocewatch.core.stats import Stats
from rocewatch.runtime.detect_state import DetectState

log = logging.getLogger(__name__)


class StageCheckpoints:
    """Writes ``DetectState``s of the stage named ``name`` (state key ``state_key``) through
    its fenced ``writer``; ``output_tps()`` are the output topics whose ends a state notes;
    ``stats()`` the stage's current counters (its pipeline's)."""

    def __init__(
        self,
        writer: DetectWriter,
        store: StateStore,
        consumer: Any,
        tp: TopicPartition,
        n_parts: int,
        state_key: str,
        name: str,
        output_tps: Callable[[], list[TopicPartition]],
        stats: Callable[[], Stats],
    ) -> None:
        self.writer = writer
        self.store = store
        self.consumer = consumer
        self.tp = tp
        self.n_parts = n_parts
        self.state_key = state_key
        self.name = name
        self.output_tps = output_tps
        self.stats = stats
        # a checkpoint whose frames are being serialised: (state, steps offset, snapshot)
        self.saving: tuple[DetectState, int, StateSnapshot] | None = None

    def now(self, st: DetectState, commit: bool) -> None:
        """Outputs flushed, the state written, the steps offset committed (with ``commit``)."""
        self.saving = None  # superseded by this one
        self.mark_outputs(st)
        self.write(self.store.sign(self.state_key, state_record(st)), st.offset, commit)

    def begin(self, st: DetectState) -> None:
        """The state copied now (its outputs flushed first), its frames serialised on a worker
        thread; ``finish`` writes it once they are."""
        if self.saving is not None:
            return
        self.mark_outputs(st)
        self.saving = (st, st.offset, self.store.snapshot(st, self.state_key).start())

    def ready(self) -> bool:
        return self.saving is not None and self.saving[2].done()

    def finish(self, current: DetectState | None) -> None:
        """Write the state ``begin`` copied, unless the stage was handed over or taken again
        since (``current`` is not that state)."""
        assert self.saving is not None
        st, offset, snap = self.saving
        self.saving = None
        if st is not current:
            return
        rec = snap.signed()
        self.writer.commit()  # the events of the steps since: the state's transaction holds none
        self.write(rec, offset, True)

    def mark_outputs(self, st: DetectState) -> None:
        """Flush what was published and note where the output topics end: a restart from
        this state suppresses what was published after it."""
        self.writer.commit()
        st.out_ends = {
            (tp.topic, tp.partition): int(off)
            for tp, off in self.store.end_offsets(self.output_tps()).items()
        }

    def write(self, rec: Signed, offset: int, commit: bool) -> None:
        if len(rec.value) > self.store.max_bytes:  # the stream goes on; a restart re-reads more
            self.stats().inc("state_too_large", detail=self.state_key)
            log.error(
                "%s state is %d bytes, above %d: not checkpointed",
                self.name,
                len(rec.value),
                self.store.max_bytes,
            )
            return
        offsets = {self.tp: OffsetAndMetadata(offset, "", -1)}
        fut = self.writer.send(
            self.store.topic,
            key=rec.key,
            value=rec.value,
            headers=rec.headers,
            partition=self.n_parts,
        )
        # the transaction holds only the state and the offset (the events went before it), so
        # a broker that refuses the state (a record too large for the topic, say) costs this
        # checkpoint and nothing else: it is aborted and counted, and the stream goes on
        try:
            if self.writer.fenced:
                self.writer.commit(offsets if commit else None)
                self.store.confirm(self.n_parts, fut)
                return
            self.writer.commit()
            self.store.confirm(self.n_parts, fut)
        except (TransactionFailed, KafkaError) as e:
            self.writer.abort()
            self.stats().inc("state_write_failed", detail=self.state_key)
            log.error("%s state not saved (%r); the stream goes on", self.name, e)
            return
        if not commit:
            return
        with contextlib.suppress(KafkaError):  # the state record holds the offset
            self.consumer.commit(offsets)
