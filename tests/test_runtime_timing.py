"""The detector runtime's timers on a fake clock, in-process, without a broker: the stages
(``Aggregator``, ``DetectStage``/``DomainStage``) and the service's loops are driven directly
through small stand-ins for kafka-python's consumer and producer and for the state store.

The stand-ins do what the stages rely on and no more: a poll returns the records that have
arrived at once and otherwise waits out its whole timeout (here: moves the fake clock by it), a
consumer's ``highwater`` is the partition's end as last fetched, a producer's future is already
answered. What needs a broker's real behaviour (group rebalances, transactions, fencing) stays
in tests/test_scaleout.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import signal
import threading
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import polars as pl
import pytest
from kafka.errors import KafkaTimeoutError
from kafka.structs import TopicPartition

from detectors.registry import metrics_read
from detectors.windows import AGG_SCHEMA
from rocewatch.config import Config
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology
from rocewatch.runtime.aggregate import Aggregator, forest_window_s
from rocewatch.runtime.detect import DetectStage, DomainStage
from rocewatch.runtime.service import DetectService
from rocewatch.runtime.steps import DomainRoutes, StepsMessage, decode_steps, encode_steps
from rocewatch.runtime.timing import (
    DEAF_S,
    END_EVERY_S,
    HEARTBEAT_S,
    POLL_MS,
    TAKEOVER_RETRY_S,
)
from tests.support.clock import FakeClock

POLL_S = POLL_MS / 1000
EPS = 1e-6  # the fake clock's sums of 0.1 s are not exact

TOPOLOGY = Topology.from_dict(
    {
        "switches": [{"name": "leaf-0", "role": "leaf", "address": "10.0.0.11"}],
        "nodes": [
            {"name": "gpu-0", "nics": [{"nic": "mlx5_0", "switch_port": "leaf-0/Ethernet1"}]}
        ],
    }
)


def config(**kafka: Any) -> Config:
    cfg = Config()
    # unfenced: the detect stage writes through the shared producer (transactions need a broker)
    k = dataclasses.replace(cfg.kafka, fence_detect=False, **kafka)
    return dataclasses.replace(cfg, kafka=k)


# --- stand-ins for kafka-python and the state store -----------------------------------------------


@dataclass
class Record:
    """What the stages read of a kafka-python ``ConsumerRecord``."""

    offset: int
    value: bytes
    key: bytes | None = None


@dataclass
class Sent:
    """A record the producer took, and when (on the fake clock)."""

    at: float
    topic: str
    partition: int | None
    value: bytes


class Answered:
    """A send's future, already answered (as a broker that took the record at once)."""

    def __init__(self, offset: int) -> None:
        self.offset = offset

    def get(self, timeout: float | None = None) -> Answered:
        return self  # (RecordMetadata: the stages read its offset)


class Producer:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.sent: list[Sent] = []

    def send(
        self,
        topic: str,
        key: bytes | None = None,
        value: bytes = b"",
        partition: int | None = None,
        headers: Any = None,
    ) -> Answered:
        self.sent.append(Sent(self.clock.monotonic(), topic, partition, value))
        return Answered(len(self.sent) - 1)

    def flush(self, timeout: float | None = None) -> None:
        pass

    def steps(self, topic: str) -> list[tuple[float, StepsMessage]]:
        """The steps messages sent, decoded, with their send times."""
        return [(s.at, decode_steps(s.value)) for s in self.sent if s.topic == topic]


class StepsConsumer:
    """The detect group's consumer on one steps partition (the only one assigned)."""

    def __init__(self, clock: FakeClock, tp: TopicPartition) -> None:
        self.clock = clock
        self.tp = tp
        self.log: list[bytes] = []
        self.position = 0
        self.assigned: set[TopicPartition] = {tp}

    def append(self, msg: StepsMessage) -> None:
        self.log.append(encode_steps(msg))

    def poll(self, timeout_ms: int = 0, **_: Any) -> dict[TopicPartition, list[Record]]:
        if self.position < len(self.log):
            recs = [Record(o, self.log[o]) for o in range(self.position, len(self.log))]
            self.position = len(self.log)
            return {self.tp: recs}
        self.clock.advance(timeout_ms / 1000)  # nothing came: the poll waited its timeout out
        return {}

    def highwater(self, tp: TopicPartition) -> int:
        return len(self.log)

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def seek_to_beginning(self, tp: TopicPartition) -> None:
        self.position = 0

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.position = offset

    def commit(self, offsets: Any = None) -> None:
        pass


class Store:
    """The state store: no state saved yet, and the broker's end offsets of any topic
    (``ends``: telemetry partition -> end offset; other topics end at 0). While ``down``, every
    request fails as kafka-python's do when no broker answers."""

    topic = "rocewatch.state"
    max_bytes = 1 << 20

    def __init__(self, clock: FakeClock, telemetry: str) -> None:
        self.clock = clock
        self.telemetry = telemetry
        self.ends: dict[int, int] = {}
        self.down = False
        self.loads: list[float] = []  # when a stage asked for its state
        self.end_asks: list[float] = []  # when the telemetry end offsets were asked for
        self.written_end: dict[int, int] = {}

    def _reachable(self) -> None:
        if self.down:
            raise KafkaTimeoutError("no broker answered")

    def load_stored(self, partition: int, key: str | None = None, timeout_s: float = 60.0) -> None:
        self.loads.append(self.clock.monotonic())
        self._reachable()
        return None

    def end_offsets(
        self, tps: list[TopicPartition], timeout_ms: int | None = None
    ) -> dict[TopicPartition, int]:
        self._reachable()
        if any(tp.topic == self.telemetry for tp in tps):
            self.end_asks.append(self.clock.monotonic())
        return {
            tp: self.ends.get(tp.partition, 0) if tp.topic == self.telemetry else 0 for tp in tps
        }

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0}


# --- stage 2 --------------------------------------------------------------------------------------


class Detect:
    """A detect stage (one fabric domain) on the fake clock, its steps partition assigned."""

    def __init__(self, n_parts: int, **kafka: Any) -> None:
        self.clock = FakeClock()
        self.cfg = config(**kafka)
        k = self.cfg.kafka
        self.tp = TopicPartition(k.topics.steps, 0)
        self.consumer = StepsConsumer(self.clock, self.tp)
        self.store = Store(self.clock, k.topics.telemetry)
        self.producer = Producer(self.clock)
        self.det = DomainStage(
            self.cfg,
            TOPOLOGY,
            n_parts,
            self.producer,
            self.store,
            1 << 20,
            self.consumer,
            DomainRoutes(TOPOLOGY),
            clock=self.clock,
        )
        # the stage's poll: DetectStage's own, on the stand-in consumer
        self.stage = object.__new__(DetectStage)
        self.stage.consumer, self.stage.shards = self.consumer, [self.det]
        self.step_ns = self.det.step_ns

    def take_over(self) -> None:
        """The group assigns the steps partition (the rebalance listener's call)."""
        self.det.assigned([self.tp])

    def report(
        self, p: int, to_step: int | None, idle: bool = False, offset: int = -1, row: bool = False
    ) -> None:
        """Partition ``p``'s owner closes to ``to_step`` (None: nothing closed yet); with
        ``row``, one row in the step before it (an evaluation starts at the first data)."""
        to = None if to_step is None else to_step * self.step_ns
        rows = one_row(to_step - 1) if row and to_step is not None else None
        self.consumer.append(StepsMessage(p, None, to, idle, [], rows, offset))

    def poll(self) -> None:
        self.stage.poll_once(POLL_MS)

    def run_until(self, t: float, each_second: Any = None) -> None:
        """Poll until the clock reads ``t``, calling ``each_second(second)`` first whenever
        the clock has passed a whole second (an owner's reports between the polls)."""
        last = int(self.clock.monotonic())
        while self.clock.monotonic() < t - EPS:
            now = int(self.clock.monotonic() + EPS)
            if each_second is not None and now != last:
                last = now
                each_second(now)
            self.poll()

    @property
    def closed_step(self) -> int | None:
        """Every step before this has been evaluated (None: none yet)."""
        st = self.det.state
        assert st is not None
        return None if st.closed_ns is None else st.closed_ns // self.step_ns


def one_row(step: int) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "step": pl.Series([step], dtype=pl.Int64),
            **{
                c: pl.Series(["leaf-0"] if c == "device" else ["x"]).cast(t)
                if t == pl.String()
                else pl.Series([1.0]).cast(t)
                for c, t in AGG_SCHEMA.items()
            },
        }
    )


def test_an_idle_partition_is_left_out_of_the_watermark_until_a_record_past_its_report():
    """A partition whose owner reported it idle at offset 5 does not hold the others' steps
    back while the broker's end is 5; the moment a record lands past it, a close of another
    partition no longer moves the watermark (the ends are asked again at once, though asked
    less than END_EVERY_S ago), until the owner closes the partition or reports it idle anew."""
    d = Detect(3)
    d.take_over()
    d.store.ends = {0: 100, 1: 100, 2: 5}
    d.report(0, 10, row=True)
    d.report(1, 10)
    d.report(2, None, idle=True, offset=5)
    d.poll()
    assert d.closed_step == 10  # partition 2 left out
    d.poll()
    d.store.ends[2] = 6  # a record for partition 2
    d.report(0, 20)
    d.report(1, 20)
    d.poll()
    assert d.clock.monotonic() - d.store.end_asks[-2] < END_EVERY_S  # asked again regardless
    assert d.closed_step == 10, "a partition with a record past its idle report was left out"
    d.run_until(d.clock.monotonic() + 3.0)
    assert d.closed_step == 10
    d.report(2, 15, offset=6)  # its owner read the record and closed to step 15
    d.poll()
    assert d.closed_step == 15
    d.report(2, 15, idle=True, offset=6)  # and is quiet again
    d.poll()
    assert d.closed_step == 20


def test_idle_reports_are_checked_against_the_brokers_ends_every_END_EVERY_S():
    """While every partition is idle, the telemetry end offsets are asked for once per
    END_EVERY_S of the clock, not per poll; a record that arrives meanwhile ends "all quiet"
    (which lets an idle instance stop) within END_EVERY_S plus a poll."""
    d = Detect(2)
    d.take_over()
    d.store.ends = {0: 7, 1: 9}
    d.report(0, 10, idle=True, offset=7, row=True)
    d.report(1, 10, idle=True, offset=9)
    d.poll()
    assert d.det.all_quiet
    start, asks = d.clock.monotonic(), len(d.store.end_asks)
    d.run_until(start + 2.0)
    asked = len(d.store.end_asks) - asks
    assert 2.0 / END_EVERY_S - 1 <= asked <= 2.0 / END_EVERY_S + 1, asked
    assert d.det.all_quiet
    d.store.ends[1] = 10  # a record arrives; nobody has said so yet
    arrived = d.clock.monotonic()
    while d.det.all_quiet:
        d.poll()
        assert d.clock.monotonic() - arrived <= END_EVERY_S + POLL_S + EPS
    assert d.clock.monotonic() - arrived > 0


def test_a_partition_nobody_reports_for_stall_s_is_dropped_from_the_watermark_not_before():
    """Partition 1's owner goes silent (no steps, no heartbeat) while partition 0's reports
    every HEARTBEAT_S: the stage waits for partition 1 for stall_s, then goes on without it."""
    d = Detect(2)
    d.take_over()
    stall_s = d.det.stall_s
    d.report(0, 10, row=True)
    d.report(1, 10)
    d.poll()
    assert d.closed_step == 10
    silent_from = d.clock.monotonic()  # partition 1's last word
    closes = {"to": 10}

    def p0_reports(second: int) -> None:
        closes["to"] += 10
        d.report(0, closes["to"])

    d.run_until(silent_from + stall_s - POLL_S, p0_reports)
    assert d.closed_step == 10, "dropped before stall_s"
    assert d.det.stats.get("stalled_partition") == 0
    d.run_until(silent_from + stall_s + POLL_S, p0_reports)
    assert d.closed_step == closes["to"], "not dropped after stall_s"
    assert d.det.stats.get("stalled_partition") >= 1


def test_a_stage_that_hears_no_partition_for_DEAF_S_judges_none_ownerless():
    """Nothing from any partition for longer than stall_s (the broker, or this stage's link to
    it, away): the stage is the one not hearing, drops no partition, and each one's silence
    counts from the first word after the spell."""
    d = Detect(2)
    d.take_over()
    stall_s = d.det.stall_s
    assert stall_s > DEAF_S
    d.report(0, 10, row=True)
    d.report(1, 10)
    d.poll()
    deaf_from = d.clock.monotonic()
    d.run_until(deaf_from + stall_s + 10.0)
    assert d.closed_step == 10 and d.det.stats.get("stalled_partition") == 0
    back = d.clock.monotonic()  # partition 0's owner is heard again; partition 1's is not
    closes = {"to": 10}

    def p0_reports(second: int) -> None:
        closes["to"] += 10
        d.report(0, closes["to"])

    p0_reports(0)
    d.run_until(back + stall_s - 2 * POLL_S, p0_reports)
    assert d.closed_step == 10, "partition 1's silence counted from before the deaf spell"
    d.run_until(back + stall_s + POLL_S, p0_reports)
    assert d.closed_step == closes["to"]


def test_a_takeover_that_met_an_unreachable_broker_is_retried_after_TAKEOVER_RETRY_S():
    """The group gives this instance the stage while no broker answers: the takeover fails,
    is counted, and is tried again TAKEOVER_RETRY_S later (not on every poll), as long as the
    group still gives the stage; once the broker answers, the stage is taken."""
    d = Detect(2)
    d.store.down = True
    t0 = d.clock.monotonic()
    d.take_over()
    assert not d.det.active and d.det.holds.get("detect_takeover_failed") == 1
    d.run_until(t0 + 1.5 * TAKEOVER_RETRY_S)  # one retry in there, still failing
    d.store.down = False
    d.run_until(t0 + 2 * TAKEOVER_RETRY_S - POLL_S)
    assert not d.det.active
    d.run_until(t0 + 2 * TAKEOVER_RETRY_S + POLL_S)
    assert d.det.active
    tries = [t - t0 for t in d.store.loads]
    assert tries == pytest.approx([0, TAKEOVER_RETRY_S, 2 * TAKEOVER_RETRY_S], abs=POLL_S + EPS)
    assert d.det.holds.get("detect_takeover_failed") == 2


def test_a_checkpoint_that_cannot_reach_the_broker_retakes_the_stage_after_a_session():
    """A checkpoint that meets no broker leaves whether this instance still holds the stage in
    doubt: it drops the stage and takes it back from its checkpoint a session timeout (plus a
    second) later if the group still gives it the stage, not sooner (that would fence a
    rightful new holder)."""
    d = Detect(1, session_timeout_ms=6000)
    d.take_over()
    d.report(0, 10, row=True)
    d.poll()
    assert d.det.active and d.closed_step == 10
    d.store.down = True
    t0 = d.clock.monotonic()
    d.det.checkpoint()
    assert not d.det.active and d.det.holds.get("detect_broker_unreachable") == 1
    d.store.down = False
    wait = 6.0 + 1.0
    d.run_until(t0 + wait - POLL_S)
    assert not d.det.active
    d.run_until(t0 + wait + POLL_S)
    assert d.det.active and d.det.holds.get("detect_stage_retaken") == 1


# --- stage 1 --------------------------------------------------------------------------------------


class TelemetryConsumer:
    """The aggregate group's consumer on telemetry partitions that have no records; ``ends``:
    each partition's end as last fetched (None: not fetched yet)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.ends: dict[int, int | None] = {}
        self._paused: set[TopicPartition] = set()

    def poll(self, timeout_ms: int = 0, **_: Any) -> dict[TopicPartition, list[Any]]:
        self.clock.advance(timeout_ms / 1000)
        return {}

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.ends.get(tp.partition)

    def end_offsets(self, tps: list[TopicPartition], timeout_ms: int | None = None) -> Any:
        return {tp: self.ends.get(tp.partition) or 0 for tp in tps}

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def pause(self, *tps: TopicPartition) -> None:
        self._paused.update(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self._paused.difference_update(tps)

    def seek_to_beginning(self, tp: TopicPartition) -> None:
        pass

    def seek(self, tp: TopicPartition, offset: int) -> None:
        pass


def aggregator(n_parts: int) -> tuple[Aggregator, FakeClock, TelemetryConsumer, Producer]:
    """An ``Aggregator`` as ``__init__`` makes it, but on stand-ins (its own KafkaConsumer
    would connect) and a fake clock, with telemetry partitions 0..n_parts-1 assigned."""
    clock = FakeClock()
    cfg = config()
    agg = object.__new__(Aggregator)
    agg.cfg, agg.k, agg.n_parts, agg.routes, agg.clock = cfg, cfg.kafka, n_parts, None, clock
    agg.producer = producer = Producer(clock)
    agg.store = Store(clock, cfg.kafka.topics.telemetry)
    agg.forest_s = forest_window_s(cfg)
    agg.detect_metrics = metrics_read(cfg.detectors, fed=agg.forest_s is not None)
    agg.stats, agg.parts, agg.retired, agg.saving = Stats(), {}, {}, {}
    agg.closing, agg.samples = False, 0
    agg.group_changed, agg.disrupted_at = clock.monotonic(), -float("inf")
    agg.steps_limit = agg.rollups_limit = 1 << 20
    agg.consumer = consumer = TelemetryConsumer(clock)
    agg.assigned([TopicPartition(cfg.kafka.topics.telemetry, p) for p in range(n_parts)])
    return agg, clock, consumer, producer


def test_an_owned_partition_reports_every_HEARTBEAT_S_and_no_more_often():
    """A partition with nothing to close still reports (stage 2 tells a quiet owner from
    none): at least once per HEARTBEAT_S plus a poll, never twice within HEARTBEAT_S."""
    agg, clock, _, producer = aggregator(2)
    t0 = clock.monotonic()
    while clock.monotonic() < t0 + 10.0:
        agg.poll_once(POLL_MS)
    steps = producer.steps(agg.k.topics.steps)
    for p in (0, 1):
        times = [at for at, msg in steps if msg.partition == p]
        assert times[0] - t0 <= POLL_S + EPS
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert gaps and all(HEARTBEAT_S - EPS <= g <= HEARTBEAT_S + POLL_S + EPS for g in gaps)
        assert 10.0 - times[-1] + t0 <= HEARTBEAT_S + POLL_S + EPS
    assert not any(msg.idle for _, msg in steps)  # never fetched: not known to be read to end


def test_a_partition_read_to_its_end_is_reported_idle_after_idle_flush_s_not_before():
    """Silent since its assignment and read to its end (the broker's end offset confirms the
    fetcher's), a partition is reported idle idle_flush_s later, once; its heartbeats say so
    from then on. One whose fetcher still shows records to read never is."""
    agg, clock, consumer, producer = aggregator(2)
    consumer.ends = {0: 0}  # partition 1: nothing fetched yet
    t0 = clock.monotonic()
    while clock.monotonic() < t0 + 3 * agg.k.idle_flush_s:
        agg.poll_once(POLL_MS)
    steps = producer.steps(agg.k.topics.steps)
    idle0 = [at for at, msg in steps if msg.partition == 0 and msg.idle]
    assert idle0, "never reported idle"
    assert agg.k.idle_flush_s - EPS <= idle0[0] - t0 <= agg.k.idle_flush_s + POLL_S + EPS
    assert not [m for at, m in steps if m.partition == 0 and at < idle0[0] and m.idle]
    assert all(m.idle for at, m in steps if m.partition == 0 and at > idle0[0])
    assert not any(m.idle for _, m in steps if m.partition == 1)
    assert agg.parts[0].idle and not agg.parts[1].idle and not agg.all_idle()


# --- the service's loops --------------------------------------------------------------------------


class QuietDetect:
    """The detect stage as the service's loop sees it: polls that wait out their timeout on the
    fake clock; what the loop asks of it is noted."""

    def __init__(self, clock: FakeClock, stop: Any, until: float) -> None:
        self.clock, self.stop, self.until = clock, stop, until
        self.active = True
        self.checkpoints: list[float] = []
        self.commands: list[float] = []
        self.polls = 0

    def poll_once(self, timeout_ms: int) -> int:
        self.polls += 1
        self.clock.advance(timeout_ms / 1000)
        if self.clock.monotonic() >= self.until:
            self.stop.set()
        return 1  # a step came with every poll: checkpoints are still per interval

    def finish_checkpoint(self) -> None:
        pass

    def begin_checkpoint(self) -> None:
        self.checkpoints.append(self.clock.monotonic())

    def apply_operator_commands(self) -> int:
        self.commands.append(self.clock.monotonic())
        return 0


def test_the_detect_stage_checkpoints_once_per_commit_interval_not_per_step():
    """The detect stage's loop starts a checkpoint once per commit interval of the clock
    (however many steps came) and looks for operators' commands twice a second."""
    clock = FakeClock()
    cfg = config(commit_interval_s=5.0)
    svc = object.__new__(DetectService)
    svc.cfg, svc.clock, svc.metrics = cfg, clock, None
    svc.stop_event, svc.detect_error, svc.detect_input = threading.Event(), None, -float("inf")
    t0 = clock.monotonic()
    svc.det = det = QuietDetect(clock, svc.stop_event, t0 + 30.0)
    svc._detect_loop()
    assert svc.detect_error is None and det.polls >= 300
    since = [t - t0 for t in det.checkpoints]
    assert len(since) == 5, since  # at 5, 10, 15, 20 and 25 s (the final one is run()'s)
    gaps = [b - a for a, b in itertools.pairwise([0.0, *since])]
    assert all(5.0 - EPS <= g <= 5.0 + POLL_S + EPS for g in gaps), since
    # the operators' commands are looked at twice a second, not per poll
    assert 2 * 30 - 2 <= len(det.commands) <= 2 * 30 + 1
    assert svc.detect_input == pytest.approx(t0 + 30.0, abs=POLL_S + EPS)


class Closable:
    """A client the service only closes (or checks) at the end."""

    def __init__(self) -> None:
        self.closed = False

    def close(self, **_: Any) -> None:
        self.closed = True

    def check(self) -> None:
        pass

    def finish(self) -> None:
        self.closed = True

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition("telemetry", 0)}


class StreamingAggregate:
    """Stage 1 as the service's loop sees it: ``n_parts`` partitions whose records come with
    every poll until ``quiet_from``, then none (each poll then waits out its timeout)."""

    def __init__(
        self, clock: FakeClock, stop: threading.Event, n_parts: int, quiet_from: float
    ) -> None:
        self.clock, self.stop, self.quiet_from = clock, stop, quiet_from
        self.parts = dict.fromkeys(range(n_parts))
        self.consumer = Closable()
        self.group_changed = clock.monotonic()
        self.stats, self.samples, self.closing = Stats(), 0, False
        self.saves: list[tuple[float, int]] = []  # (when, partition) of each periodic checkpoint
        self.final = False

    def poll_once(self, timeout_ms: int) -> int:
        if self.clock.monotonic() < self.quiet_from:
            self.clock.advance(0.01)  # records: the poll returns at once, their work takes time
            return 100
        self.clock.advance(timeout_ms / 1000)
        if self.clock.monotonic() > self.quiet_from + 120:  # the loop did not stop: fail, not hang
            self.stop.set()
        return 0

    def finish_checkpoint(self) -> None:
        pass

    def begin_checkpoint(self, p: int) -> None:
        self.saves.append((self.clock.monotonic(), p))

    def all_idle(self) -> bool:
        return self.clock.monotonic() >= self.quiet_from + 2.0  # idle_flush_s after the last

    def checkpoint(self) -> None:
        self.final = True


class StandbyDetect:
    """A detect stage that runs no domain here: its thread's polls wait on the stop event (real
    time, not the fake clock the aggregate stage moves)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.active, self.group_changed, self.shards, self.db = False, -float("inf"), [], None
        self.consumer = Closable()
        self.steps_evaluated = self.alerts_sent = self.actions_sent = 0

    def poll_once(self, timeout_ms: int) -> int:
        self.stop.wait(timeout_ms / 1000)
        return 0

    def caught_up(self) -> bool:
        return True

    def latencies(self) -> list[tuple[int, float]]:
        return []

    def all_stats(self) -> list[Stats]:
        return []

    def finish_checkpoint(self) -> None:
        pass

    def begin_checkpoint(self) -> None:
        pass

    def checkpoint(self) -> None:
        pass

    def apply_operator_commands(self) -> int:
        return 0

    def close(self) -> None:
        pass

    def close_writers(self) -> None:
        pass


def test_the_aggregate_stage_saves_each_partition_once_per_interval_and_stops_when_idle(tmp_path):
    """The service's loop spreads stage 1's checkpoints over the commit interval (one
    partition at a time, each once per interval, while records stream), and with
    ``--max-idle`` stops max_idle_s after the last record once every partition is idle."""
    clock = FakeClock()
    cfg = dataclasses.replace(config(commit_interval_s=4.0), state_dir=str(tmp_path))
    svc = object.__new__(DetectService)
    svc.cfg, svc.clock, svc.subscribed, svc.stop_event = cfg, clock, True, threading.Event()
    svc.detect_error, svc.detect_input, svc.metrics, svc.api = None, -float("inf"), None, None
    svc.sink, svc.sink_error, svc.sink_started = None, None, False
    svc.producer, svc.store = Closable(), Closable()
    svc.summary_path = tmp_path / "summary.json"
    t0 = clock.monotonic()
    svc.agg = agg = StreamingAggregate(clock, svc.stop_event, 4, quiet_from=t0 + 20.0)
    svc.det = StandbyDetect(svc.stop_event)
    term = signal.getsignal(signal.SIGTERM)
    try:
        svc.run(max_idle_s=3.0)
    finally:
        signal.signal(signal.SIGTERM, term)
    stopped = clock.monotonic() - t0
    assert 20.0 + 3.0 - EPS <= stopped <= 20.0 + 3.0 + POLL_S + EPS, stopped
    assert agg.final and svc.producer.closed
    streaming = [(t - t0, p) for t, p in agg.saves if t - t0 < 20.0]
    assert [p for _, p in streaming][:8] == [0, 1, 2, 3, 0, 1, 2, 3]
    for p in range(4):
        times = [t for t, q in streaming if q == p]
        assert len(times) >= 4
        # each partition once per interval (on the 0.01 s steps of the streaming polls)
        assert all(4.0 - EPS <= b - a <= 4.0 + 0.05 for a, b in itertools.pairwise(times)), times


def test_a_member_without_the_detect_stage_says_so_at_each_assignment(caplog):
    """Each member logs its part of every detect-group assignment (the one domain's stage:
    active, or on standby), so the logs tell which instance runs it."""
    stage = object.__new__(DetectStage)
    taken: list[list[TopicPartition]] = []
    shard = SimpleNamespace(tp=TopicPartition("steps", 0), active=False, assigned=taken.append)
    stage.routes, stage.shards = SimpleNamespace(n=1), [shard]
    with caplog.at_level(logging.INFO, logger="rocewatch.runtime.detect"):
        stage.assigned([])
    assert "detect stage on standby" in caplog.text and taken == [[]]
    caplog.clear()
    shard.active = True  # (as DomainStage.assigned leaves it when it took the partition)
    with caplog.at_level(logging.INFO, logger="rocewatch.runtime.detect"):
        stage.assigned([shard.tp])
    assert "standby" not in caplog.text and taken[-1] == [shard.tp]
