"""Stage 1, aggregate: a window engine per telemetry partition, its closed steps sent to the
steps topic, its state to the state topic."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
from kafka import KafkaConsumer
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata, TopicPartition

from detectors.clock_guard import ClockGuard
from detectors.isolation_forest import (
    FeatureFeed,
    IsolationForestConfig,
)
from detectors.registry import metrics_read
from detectors.windows import Step, WindowEngine
from rocewatch import wire
from rocewatch.alerting.interference import READS as INTERFERENCE_READS
from rocewatch.bus.poll import poll_group
from rocewatch.bus.signing import SignatureError
from rocewatch.bus.state_store import Signed, StateSnapshot, StateStore, state_record
from rocewatch.bus.topics import (
    GROUP_METADATA_MAX_AGE_MS,
    MAX_MESSAGE_BYTES,
    RECORD_OVERHEAD,
)
from rocewatch.config import Config
from rocewatch.core import checkpoint
from rocewatch.core.checkpoint import CheckpointError
from rocewatch.core.errors import (
    BadInput,
    ConfigError,
)
from rocewatch.core.stats import Stats
from rocewatch.pipeline import (
    COARSE_ROLLUP_S,
    ROLLUP_S,
    Rollups,
)
from rocewatch.runtime.intake import (
    SendTimes,
    admit_record,
    parse_record,
    partition_guard,
    send_dead_letter,
)
from rocewatch.runtime.steps import (
    ROWS_PER_STEPS_MESSAGE,
    CodedRows,
    DomainRoutes,
    StepsMessage,
    encode_rollups,
    encode_steps,
    steps_coded,
)
from rocewatch.runtime.timing import HEARTBEAT_S, MAX_SKEW_S, SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

STATE_VERSION = 2  # 2: each part's state as data (1 held the parts themselves)


def forest_window_s(cfg: Config) -> float | None:
    """The isolation forest's feature window when it is enabled (stage 1 then computes its
    window values), else None."""
    forest = cfg.detectors.get("isolation_forest") or IsolationForestConfig()
    return None if forest.enabled is False else float(forest.feature_window_s)


AGG_STATE_KIND = "aggregate-state"  # a stage-1 partition's state record (runtime.checkpoint)


def agg_state_types() -> checkpoint.StateTypes:
    """The record types a partition's state holds (its window engine's, the forest feed's)."""
    return checkpoint.StateTypes([*WindowEngine.STATE_TYPES, *FeatureFeed.STATE_TYPES])


def load_agg_state(
    raw: bytes,
    engine: WindowEngine,
    rollups: list[Rollups] | None = None,
    forest: FeatureFeed | None = None,
) -> AggState:
    """A stage-1 state record read back into parts built from today's configuration (its
    ``engine``, ``rollups`` and ``forest``, whose state it restores); ``CheckpointError``
    unless it is one of this build's format and ``STATE_VERSION`` and fits those parts
    (nothing in it is executed). Rollups or a forest feed the configuration no longer has
    are dropped; ones it has now start afresh."""
    d = checkpoint.loads(raw, AGG_STATE_KIND, agg_state_types())
    if not isinstance(d, dict) or d.get("version") != STATE_VERSION:
        v = d.get("version") if isinstance(d, dict) else None
        raise CheckpointError(f"partition state version {v!r}, reads {STATE_VERSION}")
    try:
        partition, offset, hi = d["partition"], d["offset"], d["hi"]
        if not all(isinstance(x, int) for x in (partition, offset, hi)):
            raise TypeError("partition, offset and hi must be integers")
        engine.restore(d["engine"])
        for r, st in zip(rollups or [], d.get("rollups") or [], strict=False):
            r.restore(st)
        if forest is not None and d.get("forest") is not None:
            forest.restore(d["forest"])
    except (KeyError, TypeError, ValueError, pl.exceptions.PolarsError) as e:
        raise CheckpointError(f"not a partition's state: {e}") from e
    return AggState(STATE_VERSION, partition, engine, offset, hi, rollups, forest)


# --- stage 1: aggregate ------------------------------------------------------------------------


@dataclass
class AggState:
    version: int
    partition: int
    engine: WindowEngine
    offset: int  # next telemetry offset to read
    hi: int  # newest sample time seen
    rollups: list[Rollups] | None = None  # open buckets (with storage configured)
    forest: FeatureFeed | None = None  # the isolation forest's open window

    def record_data(self) -> tuple[dict[str, Any], str, checkpoint.StateTypes]:
        """What its state record holds (each part's state, as data), the record's kind and
        the record types in it (``load_agg_state`` reads it)."""
        data = {
            "version": self.version,
            "partition": self.partition,
            "engine": self.engine.state(),
            "offset": self.offset,
            "hi": self.hi,
            "rollups": None if self.rollups is None else [r.state() for r in self.rollups],
            "forest": None if self.forest is None else self.forest.state(),
        }
        return data, AGG_STATE_KIND, agg_state_types()


@dataclass
class _Part:
    engine: WindowEngine
    offset: int | None
    hi: int = -1
    seen: float = 0.0  # when its last record came (set when it is assigned)
    idle: bool = False  # an idle report was sent since the last record
    reported: float = 0.0  # when the last steps message for it went out
    end_checked: float = 0.0  # when the broker was last asked for its end offset
    dirty: bool = True
    sent: SendTimes = field(default_factory=SendTimes)  # records waiting for their step
    rollups: list[Rollups] = field(default_factory=list)  # empty: no storage, none computed
    guard: ClockGuard | None = None  # bad clocks: made at the first record
    # the last step's table positions and their canonical order (steps_coded)
    order: list[np.ndarray] = field(default_factory=list)
    forest: FeatureFeed | None = None  # with the isolation forest on: its window values
    # its state record was refused: read from the group's committed offset, not the beginning
    from_committed: bool = False


def with_forest(
    chunks: list[tuple[CodedRows | None, int | None]], forest: pl.DataFrame | None
) -> list[tuple[CodedRows | None, int | None, pl.DataFrame | None]]:
    """The messages of one close with its forest window values spread over them: each
    window goes with the first message that closes past its end (it is done by then), the
    rest (an idle partition's open window) with the last."""
    out: list[tuple[CodedRows | None, int | None, pl.DataFrame | None]] = []
    rest = forest
    for i, (rows, to) in enumerate(chunks):
        mine = rest
        if i < len(chunks) - 1 and rest is not None and to is not None:
            done = pl.col("end") <= to
            mine, rest = rest.filter(done), rest.filter(~done)
            mine = mine if mine.height else None
        elif i < len(chunks) - 1:
            mine = None
        out.append((rows, to, mine))
    return out


class Aggregator:
    """Stage 1: per telemetry partition, samples -> closed steps on the steps topic."""

    def __init__(
        self,
        cfg: Config,
        n_parts: int,
        producer: Any,
        store: StateStore,
        limits: dict[str, int],
        routes: DomainRoutes | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.cfg = cfg
        self.clock = clock  # idle release, heartbeats and end-offset checks run on it
        self.k = cfg.kafka
        self.n_parts = n_parts
        self.producer = producer
        self.store = store
        self.routes = routes  # None: one domain, every row to steps partition 0
        # the isolation forest's window values are made here (one row per entity and window),
        # so the steps carry only what the other detectors read (rollups cover the rest)
        self.forest_s = forest_window_s(cfg)
        self.detect_metrics = metrics_read(cfg.detectors, fed=self.forest_s is not None)
        if cfg.interference.enabled:  # the attribution of congestion reads NIC counters too
            self.detect_metrics |= INTERFERENCE_READS
        self.stats = Stats()
        self.parts: dict[int, _Part] = {}
        self.retired: dict[int, _Part] = {}
        # the offset of each partition's state record this instance refused (not read again)
        self.refused: dict[int, int] = {}
        # checkpoints whose frames are being serialised: partition -> (its part, snapshot)
        self.saving: dict[int, tuple[_Part, int, StateSnapshot]] = {}
        self.closing = False
        self.group_changed = self.clock.monotonic()  # the last (re)assignment, for --max-idle
        # when a silent partition last turned out not to be read to its end (a broker outage,
        # a stalled fetch): no partition is reported idle within partition_idle_s of that
        self.disrupted_at = -float("inf")
        self.samples = 0
        # the largest steps and rollups records their topics take (``record_limits``): a topic
        # an operator created with a smaller max.message.bytes gets more, smaller messages
        self.steps_limit = limits[self.k.topics.steps]
        self.rollups_limit = limits[self.k.topics.rollups]
        self.consumer = KafkaConsumer(
            **self.k.client_kwargs(),
            group_id=self.k.group_id + "-agg",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=5000,
            fetch_max_bytes=64 << 20,
            max_partition_fetch_bytes=16 << 20,
            session_timeout_ms=self.k.session_timeout_ms,
            heartbeat_interval_ms=max(1000, self.k.session_timeout_ms // 4),
            metadata_max_age_ms=GROUP_METADATA_MAX_AGE_MS,
        )

    def _new_engine(self) -> WindowEngine:
        return WindowEngine(self.cfg.window, self.stats)

    def _new_rollups(self) -> list[Rollups]:
        """Rollup levels as replay keeps them, when storage is set: each partition's series are
        its own, so a partition's rollups are whole."""
        if not self.cfg.storage_url:
            return []
        return [Rollups(ROLLUP_S), Rollups(COARSE_ROLLUP_S)]

    # --- assignment ------------------------------------------------------------------------------
    def assigned(self, tps: list[TopicPartition]) -> None:
        self.group_changed = self.clock.monotonic()
        for tp in tps:
            p = tp.partition
            part = self.retired.pop(p, None)
            if part is None or self.store.written_end.get(p) != self.store.end(p):
                part = self._restore(p)
            part.seen = self.clock.monotonic()
            part.idle = False
            self.parts[p] = part
            if part.offset is not None:
                self.consumer.seek(tp, part.offset)
            elif not part.from_committed:
                self.consumer.seek_to_beginning(tp)
            # (else the consumer starts at the group's committed offset: it may not be asked
            # for it here, inside the rebalance)
        log.info("aggregating telemetry partitions %s", sorted(self.parts))

    def _restore(self, p: int) -> _Part:
        rec = self.store.load_stored(p, key=f"agg-{p}")
        if rec is not None and self.refused.get(p) == rec.offset:
            # refused already (the partition comes back before any state of it was written):
            # counted and logged once
            return _Part(
                self._new_engine(),
                None,
                rollups=self._new_rollups(),
                forest=self._new_forest(),
                from_committed=True,
            )
        if rec is not None:
            try:
                st = load_agg_state(
                    self.store.open(rec),
                    self._new_engine(),
                    self._new_rollups(),
                    self._new_forest(),
                )
                if st.partition != p:
                    raise CheckpointError(f"the state of partition {st.partition}")
            except (CheckpointError, SignatureError) as e:  # damaged, foreign or forged
                # nothing of it is run
                self.refused[p] = rec.offset
                self.stats.inc("checkpoint_rejected")
                if isinstance(e, SignatureError):
                    self.stats.inc("state_mac_rejected")
                log.error(
                    "state record %s/%d@%d rejected (%s); partition %d starts afresh from "
                    "its committed offset",
                    self.store.topic,
                    p,
                    rec.offset,
                    e,
                    p,
                )
                return _Part(
                    self._new_engine(),
                    None,
                    rollups=self._new_rollups(),
                    forest=self._new_forest(),
                    from_committed=True,
                )
            else:
                log.info("partition %d resumes at offset %d", p, st.offset)
                return _Part(
                    st.engine,
                    st.offset,
                    st.hi,
                    dirty=False,
                    rollups=st.rollups or [],
                    forest=st.forest,
                )
        return _Part(
            self._new_engine(), None, rollups=self._new_rollups(), forest=self._new_forest()
        )

    def _new_forest(self) -> FeatureFeed | None:
        return None if self.forest_s is None else FeatureFeed(self.forest_s)

    def revoked(self, tps: list[TopicPartition]) -> None:
        if self.closing:
            return
        gone = [tp.partition for tp in tps if tp.partition in self.parts]
        if gone:
            self.checkpoint(gone, commit=False)
        for p in gone:
            self.retired[p] = self.parts.pop(p)

    def lost(self, tps: list[TopicPartition]) -> None:
        """Evicted from the group (a stall past the session timeout): the partitions may have
        moved on under another instance, so their state here is stale. It is dropped unsaved
        (saving it would overwrite the new owner's newer state) and not kept for a return."""
        if self.closing:
            return
        gone = [tp.partition for tp in tps if tp.partition in self.parts]
        for p in gone:
            self.parts.pop(p)
            self.retired.pop(p, None)
        if gone:
            self.stats.inc("partitions_lost", len(gone))
            log.warning("evicted from the aggregate group: partitions %s dropped unsaved", gone)

    # --- the loop --------------------------------------------------------------------------------
    def poll_once(self, timeout_ms: int) -> int:
        recs = poll_group(self.consumer, timeout_ms, pauses=True)  # _balance pauses partitions
        now = self.clock.monotonic()
        n = 0
        for tp, msgs in recs.items():
            part = self.parts.get(tp.partition)
            if part is None or not msgs:
                continue
            batches: list[wire.Decoded] = []
            for m in msgs:
                try:
                    d, hi, sent = parse_record(m)
                except BadInput as e:
                    self._dead_letter(m, e)
                    continue
                if part.guard is None:
                    part.guard = partition_guard(self.cfg, self.stats, f"partition {tp.partition}")
                hi = admit_record(part.guard, d)
                if d.rows:
                    batches.append(d)
                    part.hi = max(part.hi, hi)
                    part.sent.add(hi, sent)
            part.offset = msgs[-1].offset + 1
            part.seen = now
            part.idle = False
            part.dirty = True
            if batches:
                df = wire.coded_frames(batches)
                n += df.height
                part.engine.add(df)
            if part.hi >= 0:
                wm = part.hi - part.engine.lateness_ns()
                self._publish(tp.partition, part, part.engine.close_until(wm), idle=False)
        self.samples += n
        self._balance()
        for p, part in self.parts.items():
            if now - part.reported >= HEARTBEAT_S:  # stage 2 tells a quiet owner from none
                self._publish(p, part, [], idle=part.idle, heartbeat=True)
            if (
                part.idle
                or now - part.seen < self.k.idle_flush_s
                or not self._caught_up(p, part)
                or now - self.disrupted_at < self.k.partition_idle_s
            ):
                continue
            self._publish(p, part, part.engine.finish(), idle=True)
            part.idle = True
            part.dirty = True
        return n

    def all_idle(self) -> bool:
        """True when every partition this instance owns has been reported idle."""
        return all(part.idle for part in self.parts.values())

    def _balance(self) -> None:
        """Pause partitions far ahead of the slowest one this instance owns: stage 2 waits for
        the slowest anyway, and what runs ahead only fills its buffer."""
        his = [part.hi for part in self.parts.values() if part.hi >= 0 and not part.idle]
        if not his:
            paused = self.consumer.paused()
            if paused:
                self.consumer.resume(*paused)
            return
        limit = min(his) + int(MAX_SKEW_S * 1e9)
        pause: list[TopicPartition] = []
        resume: list[TopicPartition] = []
        for p, part in self.parts.items():
            tp = TopicPartition(self.k.topics.telemetry, p)
            (pause if part.hi > limit else resume).append(tp)
        if pause:
            self.consumer.pause(*pause)
        if resume:
            self.consumer.resume(*resume)

    def _caught_up(self, p: int, part: _Part) -> bool:
        """True when the partition has been read to its end, as the broker says now.

        The fetcher's highwater is only as fresh as the partition's last fetch response: a
        partition whose fetches stalled (a resumed partition kafka-python forgot, a broker
        that restarted) looks read to its end while records wait. Calling it idle then would
        close its steps early and make those records late, so the end offset is asked for,
        at most once a second per partition (only silent partitions get here)."""
        tp = TopicPartition(self.k.topics.telemetry, p)
        hw = self.consumer.highwater(tp)
        if hw is None or tp in self.consumer.paused():
            return False
        if part.offset is None:
            return True
        now = self.clock.monotonic()
        if part.offset < hw:  # silent with records to read: a stalled fetch
            self.disrupted_at = now
            return False
        if now - part.end_checked < 1.0:
            return False
        part.end_checked = now
        try:
            end = self.consumer.end_offsets([tp], timeout_ms=2000).get(tp)
        except KafkaError as e:
            log.info("end offset of partition %d unknown (%s); not idle yet", p, e)
            self.disrupted_at = now
            return False
        if end is not None and part.offset < end:
            self.disrupted_at = now
            return False
        return end is not None

    def _publish(
        self, p: int, part: _Part, steps: list[Step], idle: bool, heartbeat: bool = False
    ) -> None:
        to = part.engine.closed_ns
        if not steps and not idle and not heartbeat:
            return
        part.reported = self.clock.monotonic()
        if part.rollups and (steps or (idle and not heartbeat)):
            self._rollups(p, part, steps, idle and not heartbeat)
        step_ns = part.engine.step_ns
        closed_from = steps[0].start if steps else to
        forest = None
        if part.forest is not None:
            for s in steps:
                part.forest.add(s)
            forest = part.forest.take(to, idle and not heartbeat)
        rows = steps_coded(steps, step_ns, part.engine.series, part.order, self.detect_metrics)
        sent = part.sent.closed(to) if to is not None else []
        offset = part.offset
        if offset is None:  # nothing read: the partition's end as the fetcher last saw it
            hw = self.consumer.highwater(TopicPartition(self.k.topics.telemetry, p))
            offset = -1 if hw is None else int(hw)
        if self.routes is None or self.routes.n == 1:
            self._send_steps(p, 0, rows, forest, closed_from, to, idle, sent, offset, step_ns)
            return
        # every domain hears of every close (its watermark waits for every partition), with
        # its own rows
        for k, (mine, trees) in enumerate(
            zip(self.routes.split(rows), self.routes.split_forest(forest), strict=True)
        ):
            self._send_steps(p, k, mine, trees, closed_from, to, idle, sent, offset, step_ns)

    def _send_steps(
        self,
        p: int,
        shard: int,
        rows: CodedRows | None,
        forest: pl.DataFrame | None,
        closed_from: int | None,
        to: int | None,
        idle: bool,
        sent: list[int],
        offset: int,
        step_ns: int,
    ) -> None:
        """One close of partition ``p`` to steps partition ``shard``."""
        # very large closes go out in several messages, each ending on a whole step
        chunks: list[tuple[CodedRows | None, int | None]] = [(rows, to)]
        if rows is not None and rows.height > ROWS_PER_STEPS_MESSAGE:
            chunks = []
            for idx, one in rows.slice_steps():
                end = (idx + 1) * step_ns
                prev = chunks[-1][0] if chunks else None
                if prev is not None and prev.height + one.height <= ROWS_PER_STEPS_MESSAGE:
                    chunks[-1] = (CodedRows(pl.concat([prev.frame, one.frame]), rows.values), end)
                else:
                    chunks.append((one, end))
            chunks[-1] = (chunks[-1][0], to)
        todo = deque(with_forest(chunks, forest))
        while todo:
            chunk, chunk_to, chunk_forest = todo.popleft()
            last = not todo
            msg = StepsMessage(
                p,
                closed_from,
                chunk_to,
                idle and last,
                sent if last else [],
                chunk,
                offset,
                chunk_forest,
            )
            value = encode_steps(msg)
            if len(value) > self.steps_limit:
                # a topic created with a smaller max.message.bytes than rocewatch gives it:
                # halves of the close, each ending on a whole step, until each one fits
                halves = self._halves(p, chunk, chunk_to, len(value), step_ns)
                todo.extendleft(reversed(with_forest(halves, chunk_forest)))
                continue
            self.producer.send(
                self.k.topics.steps, key=str(p).encode(), value=value, partition=shard
            )
            closed_from = chunk_to

    def _halves(
        self, p: int, chunk: CodedRows | None, to: int | None, size: int, step_ns: int
    ) -> list[tuple[CodedRows | None, int | None]]:
        """A steps message too large for the steps topic, as two, split on a step boundary;
        one step alone that does not fit is an error the operator must fix (the topic's
        limit), since a refused record would stop the instance anyway."""
        steps = chunk.slice_steps() if chunk is not None else []
        if len(steps) < 2:
            raise ConfigError(
                f"kafka.topics.steps {self.k.topics.steps} takes records up to "
                f"{self.steps_limit + RECORD_OVERHEAD} bytes (max.message.bytes), but one step "
                f"of telemetry partition {p} needs {size + RECORD_OVERHEAD}: raise the topic's "
                f"max.message.bytes (rocewatch creates it with {MAX_MESSAGE_BYTES})"
            )
        assert chunk is not None
        half = len(steps) // 2

        def rows(part: list[tuple[int, CodedRows]]) -> CodedRows:
            return CodedRows(pl.concat([r.frame for _, r in part]), chunk.values)

        self.stats.inc("steps_messages_split", detail=f"partition {p}")
        return [(rows(steps[:half]), (steps[half - 1][0] + 1) * step_ns), (rows(steps[half:]), to)]

    def _rollups(self, p: int, part: _Part, steps: list[Step], idle: bool) -> None:
        """Fold closed steps into the rollup levels; send each bucket that completes and, when
        the partition goes idle (once, not with every heartbeat), the open buckets so far: the
        complete ones replace them in storage."""
        out: list[pl.DataFrame] = []
        for step in steps:
            partial = (
                Rollups._partial(step.frame, part.engine.series.ids(step))
                if step.frame.height
                else None
            )
            for level in part.rollups:
                done = level.add(step, partial)
                if done is not None:
                    out.append(done)
        if idle:
            out += [df for level in part.rollups if (df := level.peek()) is not None]
        todo = deque(df for df in out if df.height)
        while todo:
            df = todo.popleft()
            value = encode_rollups(df)
            if len(value) > self.rollups_limit and df.height > 1:
                # storage upserts rollups by bucket and series: any split of the rows will do
                half = df.height // 2
                todo.extendleft([df.slice(half), df.slice(0, half)])
                self.stats.inc("rollups_messages_split", detail=f"partition {p}")
                continue
            # keyed by partition: its buckets stay in order on one rollups partition
            self.producer.send(self.k.topics.rollups, key=str(p).encode(), value=value)

    def _dead_letter(self, m: Any, err: Exception) -> None:
        send_dead_letter(self.producer, self.k.topics.dead_letter, m, err, self.stats)

    def checkpoint(self, only: list[int] | None = None, commit: bool = True) -> None:
        """Steps flushed, then each partition's state written, then its offset committed. At
        once: for a handover and the final checkpoint (``begin_checkpoint`` is the stream's).

        Inside a rebalance callback (``commit=False``) the consumer cannot block: the state
        record carries the offset, and the next commit catches the group's offsets up.
        """
        todo = [p for p in (only if only is not None else list(self.parts)) if p in self.parts]
        for p in todo:
            if self.saving.pop(p, None) is not None:  # superseded by this one
                self.parts[p].dirty = True
        todo = [p for p in todo if self.parts[p].dirty and self.parts[p].offset is not None]
        if not todo:
            return
        self.producer.flush(timeout=60)  # ProducerFailed after a lost steps message
        saves = []
        for p in todo:
            part = self.parts[p]
            assert part.offset is not None
            saves.append(
                (p, part.offset, self.store.sign(f"agg-{p}", state_record(self._state(p, part))))
            )
            part.dirty = False
        self._save(saves, commit)

    def begin_checkpoint(self, p: int) -> None:
        """The stream's periodic checkpoint of partition ``p``, in two halves so the stream
        does not wait for the serialisation: its state is copied now, its frames serialised on
        a worker thread, and ``finish_checkpoint`` writes it once they are. The steps it
        closed are sent before it is written (the flush there)."""
        part = self.parts.get(p)
        if part is None or p in self.saving or not part.dirty or part.offset is None:
            return
        self.saving[p] = (
            part,
            part.offset,
            self.store.snapshot(self._state(p, part), f"agg-{p}").start(),
        )
        part.dirty = False  # the records read from now on make it dirty again

    def finish_checkpoint(self) -> None:
        """Write the states ``begin_checkpoint`` copied, once serialised."""
        ready = [p for p, (_, _, snap) in self.saving.items() if snap.done()]
        if not ready:
            return
        self.producer.flush(timeout=60)  # the steps each state closed: ProducerFailed if lost
        saves = []
        for p in ready:
            part, offset, snap = self.saving.pop(p)
            if self.parts.get(p) is part:  # still held here
                saves.append((p, offset, snap.signed()))
        self._save(saves, True)

    @staticmethod
    def _state(p: int, part: _Part) -> AggState:
        assert part.offset is not None
        return AggState(
            STATE_VERSION, p, part.engine, part.offset, part.hi, part.rollups, part.forest
        )

    def _save(self, saves: list[tuple[int, int, Signed]], commit: bool) -> None:
        """Write partitions' states (partition, telemetry offset, signed record), then commit
        the offsets (after the broker took the states: the state topic holds them)."""
        futures = []
        for p, offset, rec in saves:
            size = len(rec.value)
            if size > self.store.max_bytes:  # the stream goes on; a restart re-reads more
                self.stats.inc("state_too_large", detail=f"agg-{p}")
                log.error("state of partition %d is %d bytes: not checkpointed", p, size)
                self.parts[p].dirty = True
                continue
            futures.append((p, offset, self.store.save(p, rec)))
        if not futures:
            return
        self.producer.flush(timeout=60)
        for p, _, fut in futures:
            self.store.confirm(p, fut)
        if not commit:
            return
        offsets = {
            TopicPartition(self.k.topics.telemetry, p): OffsetAndMetadata(offset, "", -1)
            for p, offset, _ in futures
        }
        try:
            self.consumer.commit(offsets)
        except KafkaError as e:  # the state record holds the offset; the commit is for lag
            log.warning("offset commit failed (%s); the state topic keeps the offsets", e)
