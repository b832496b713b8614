"""Step assembly for a domain's detect stage: the steps messages of every telemetry partition
merged into whole steps, and the rules that say how far the stage may evaluate (a partition's
close, its idle reports, its silence), with the latency of what was evaluated."""

from __future__ import annotations

import heapq
import logging
from collections import deque
from typing import Any

import polars as pl
from kafka.errors import KafkaError
from kafka.structs import TopicPartition

from detectors.windows import Step
from rocewatch.config import Config
from rocewatch.core.keys import KEYS, is_coded
from rocewatch.core.stats import Stats
from rocewatch.runtime import stage1_feed
from rocewatch.runtime.detect_state import DetectState
from rocewatch.runtime.steps import StepsMessage, coded_step
from rocewatch.runtime.timing import DEAF_S, END_EVERY_S, SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)


class StepAssembly:
    """What one domain's stage has heard from each telemetry partition and which steps it may
    close. ``consumer`` (its ``highwater`` of the steps partition ``tp``) and ``store`` (its
    ``end_offsets``) are asked; ``stats`` counts bad and late rows (the stage's pipeline's)."""

    def __init__(
        self,
        cfg: Config,
        n_parts: int,
        consumer: Any,
        store: Any,
        tp: TopicPartition | None,
        stats: Stats,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.n_parts = n_parts
        self.consumer = consumer
        self.store = store
        self.tp = tp
        self.stats = stats
        self.clock = clock
        self.step_ns = round(cfg.window.step_s * 1e9)
        self.max_steps_per_close = cfg.window.max_steps_per_close
        self.telemetry_topic = cfg.kafka.topics.telemetry
        self.stall_s = max(20.0, 3 * cfg.kafka.session_timeout_ms / 1000.0)
        self.seen: dict[int, float] = {}
        self.idle_offset: dict[int, int] = {}  # the owner's read offset in its idle report
        self.all_quiet = False  # every telemetry partition idle and read to its end
        self.ends: dict[int, int] = {}  # telemetry end offsets, asked at most every END_EVERY_S
        self.ends_at = -float("inf")
        self.moved_at = -float("inf")  # when a steps message last moved a partition's close
        self.started = self.clock.monotonic()
        self.heard = self.started  # when a steps message (any partition's) last came
        # (CreateTime ns, seconds to evaluation) of telemetry records, for the benchmark
        self.latencies: deque[tuple[int, float]] = deque(maxlen=100_000)
        self.lat_pending: list[tuple[int, list[int]]] = []  # a heap on closed time

    def restart(self, st: DetectState) -> None:
        """A takeover: every partition the state knows counts as heard now."""
        self.started = self.heard = self.clock.monotonic()
        self.seen = {p: self.started for p in st.part_closed}

    def take(self, st: DetectState, msg: StepsMessage, now: float) -> bool:
        """Apply one steps message; True when it moved the partition on (not a heartbeat)."""
        p = msg.partition
        if not 0 <= p < self.n_parts:
            self.stats.inc("bad_steps_message", detail=f"partition {p}")
            return False
        if msg.idle:
            self.idle_offset[p] = msg.offset
        if now - self.heard >= DEAF_S:  # the first word after a deaf spell (``target``)
            self.seen = {q: now for q in self.seen}
            self.started = now
        self.seen[p] = self.heard = now
        was_idle = st.part_idle.get(p)
        st.part_idle[p] = msg.idle
        prev = st.part_closed.get(p)
        if msg.sent and msg.closed_to is not None:
            heapq.heappush(self.lat_pending, (msg.closed_to, msg.sent))
        if msg.forest is not None:
            stage1_feed.offer(st.pipeline, p, msg.forest, self.stats)
        if msg.closed_to is None or (prev is not None and msg.closed_to <= prev):
            # nothing new: a heartbeat, a re-emission after a restart, an empty idle report
            return bool(msg.idle and not was_idle)
        st.part_closed[p] = msg.closed_to
        self.moved_at = self.clock.monotonic()
        rows = msg.rows
        if rows is None or rows.height == 0:
            return True
        assert isinstance(rows, pl.DataFrame)  # decode_steps gives a frame (codes or strings)
        # the usual message is one step, none of it sent before or late: then nothing is
        # filtered or split (each costs a query per message, more than the rows' own work)
        step = pl.col("step")
        steps = rows.get_column("step")
        if steps.null_count():  # no owner sends these: a foreign or damaged message
            self.stats.inc("bad_steps_message", detail="rows without a step")
            rows = rows.filter(step.is_not_null())
            if not rows.height:
                return True
            steps = rows.get_column("step")
        first, last = int(steps.min()), int(steps.max())  # type: ignore[arg-type]
        if prev is not None and first < prev // self.step_ns:
            rows = rows.filter(step >= prev // self.step_ns)  # steps sent before a restart
        if st.closed_ns is not None and first < st.closed_ns // self.step_ns:
            late = rows.filter(step < st.closed_ns // self.step_ns)
            if late.height:
                self.stats.inc("late_step_rows", late.height, detail=f"partition {p}")
                rows = rows.filter(step >= st.closed_ns // self.step_ns)
        if first == last and rows.height:
            by_step = {(first,): rows}
        else:
            by_step = rows.partition_by("step", as_dict=True, maintain_order=True)
        for (idx,), frame in by_step.items():
            slot = st.buffer.setdefault(int(idx), {})  # type: ignore[call-overload]
            old = slot.get(p)
            slot[p] = frame if old is None else KEYS.concat([old, frame])
        return True

    def target(self, st: DetectState, now: float) -> int | None:
        """How far every live partition has closed (None: wait for a partition to report)."""
        live: list[int] = []
        # silence means "no owner" only once this stage has read everything sent so far:
        # a detect stage behind on the steps topic has simply not read the reports yet
        hw = self.consumer.highwater(self.tp)
        behind = hw is None or st.offset < hw
        # nothing from any partition, though each owner reports every HEARTBEAT_S: the broker
        # (or this stage's link to it) is away, and a partition's silence counts from its return
        # (a broker restart longer than stall_s made every partition stalled, and the steps
        # of the ones behind late: late_step_rows in test_scale_out_broker_restart_...)
        if behind or now - self.heard >= DEAF_S:
            self.seen = {p: now for p in self.seen}
            self.started = now
        idle = [p for p in range(self.n_parts) if st.part_idle.get(p)]
        quiet = set(self.still_quiet(idle, now)) if idle else set()
        self.all_quiet = len(quiet) == self.n_parts
        for p in range(self.n_parts):
            if p in quiet:
                continue
            if now - self.seen.get(p, self.started) >= self.stall_s:
                if p in st.part_closed or p in self.seen:
                    self.stats.inc("stalled_partition", detail=str(p))
                continue  # nobody has owned it for longer than a failover takes
            if p not in st.part_closed:
                return None
            live.append(st.part_closed[p])
        if live:
            return min(live)
        return max(st.part_closed.values()) if st.part_closed else None

    def still_quiet(self, idle: list[int], now: float) -> list[int]:
        """Of the partitions reported idle, those the broker holds nothing new for.

        An idle report is old news once records arrive: the owner says so with its next
        message, but that can come after other partitions have closed steps past the new
        records (an owner busy with the detect stage reads late). So the telemetry end offsets
        are asked for (at most every END_EVERY_S, one request): a partition with records past
        the offset of its idle report holds the watermark again. Unknown ends trust no report.

        They are asked again whenever a steps message has moved a partition's close since: a
        burst (a publisher catching up) can close another partition's step within moments of
        records reaching the idle one, and every record published before the samples that
        closed that step is in the broker by the time its steps message is read.
        """
        if now - self.ends_at >= END_EVERY_S or self.ends_at <= self.moved_at:
            tps = [TopicPartition(self.telemetry_topic, p) for p in range(self.n_parts)]
            asked = self.clock.monotonic()
            try:
                got = self.store.end_offsets(tps, timeout_ms=2000)
            except KafkaError as e:
                log.info("telemetry end offsets unknown (%s): idle reports not trusted", e)
                return []
            self.ends = {tp.partition: int(off) for tp, off in got.items()}
            self.ends_at = asked
        return [
            p
            for p in idle
            if self.idle_offset.get(p, -1) >= 0 and self.ends.get(p, 1 << 62) <= self.idle_offset[p]
        ]

    def close(self, st: DetectState, now: float) -> list[Step] | None:
        """The whole steps the watermark now allows, taken out of the buffer and marked
        evaluated in ``st`` (None: none to close)."""
        target = self.target(st, now)
        if target is None:
            return None
        boundary = (target // self.step_ns) * self.step_ns
        if st.closed_ns is None:
            if not st.buffer:
                return None
            st.closed_ns = min(st.buffer) * self.step_ns
        if boundary <= st.closed_ns:
            return None
        lo, hi = st.closed_ns // self.step_ns, boundary // self.step_ns
        if hi - lo <= self.max_steps_per_close:
            indices: list[int] = list(range(lo, hi))
        else:  # a long silence: only the steps that hold data
            indices = sorted(i for i in st.buffer if lo <= i < hi)
        steps = []
        for idx in indices:
            slot = st.buffer.pop(idx, None)
            start, end = idx * self.step_ns, (idx + 1) * self.step_ns
            if not slot:
                steps.append(Step(start, end))
                continue
            # merged in partition order: the same step whoever aggregated what
            frame = KEYS.concat([slot[p] for p in sorted(slot)]).drop("step")
            if is_coded(frame):
                steps.append(coded_step(st.pipeline.engine.series, start, end, frame))
            else:  # rows restored from a checkpoint, or with a null key: strings
                steps.append(Step(start, end, frame=frame))
        st.closed_ns = boundary
        return steps

    def evaluated(self, closed_ns: int) -> None:
        """The steps up to ``closed_ns`` were evaluated: the latency of the records they held."""
        t = round(self.clock.time() * 1e9)
        while self.lat_pending and self.lat_pending[0][0] <= closed_ns:
            for sent in heapq.heappop(self.lat_pending)[1]:
                self.latencies.append((sent, (t - sent) / 1e9))
