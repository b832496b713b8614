"""The detector service: both stages in one process, as members of their consumer groups
(the package's docstring says how the stages work together)."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from kafka import ConsumerRebalanceListener

from actions.api import OperatorApi
from actions.operator import pending_approvals
from rocewatch.bus.publish import WatchedProducer, make_producer
from rocewatch.bus.signing import load_state_keys
from rocewatch.bus.state_store import StateStore
from rocewatch.bus.topics import (
    MAX_MESSAGE_BYTES,
    ensure_detect_topics,
    record_limits,
    wait_for_partitions,
)
from rocewatch.config import Config
from rocewatch.core.errors import (
    ConfigError,
    RocewatchError,
)
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology
from rocewatch.runtime.aggregate import Aggregator
from rocewatch.runtime.detect import DetectStage
from rocewatch.runtime.memory import reclaim
from rocewatch.runtime.steps import DomainRoutes
from rocewatch.runtime.timing import (
    DETECT_JOIN_S,
    POLL_MS,
    STANDBY_POLL_MS,
    SYSTEM_CLOCK,
    Clock,
)

log = logging.getLogger(__name__)


# --- the service ------------------------------------------------------------------------------


class _StageListener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Hands a stage's consumer group's rebalances to the stage (``Aggregator`` or
    ``DetectStage``: each has ``lost``, ``revoked`` and ``assigned``)."""

    def __init__(self, stage: Aggregator | DetectStage) -> None:
        self.stage = stage

    def on_partitions_lost(self, lost: Any) -> None:
        self.stage.lost(list(lost))

    def on_partitions_revoked(self, revoked: Any) -> None:
        self.stage.revoked(list(revoked))

    def on_partitions_assigned(self, assigned: Any) -> None:
        self.stage.assigned(list(assigned))


class DetectService:
    """Both stages in one process: run as many instances as there are cores to spare."""

    def __init__(
        self, cfg: Config, topology: Topology | None = None, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        # the state topic's keys first: without one, nothing is started (not even a broker
        # connection), with one line saying so
        keys = load_state_keys(cfg.kafka.state_signing)
        if topology is None:
            if not cfg.topology:
                raise ConfigError("detect needs 'topology' (a topology file) in its config")
            topology = Topology.load(cfg.topology)
        log.info(
            "topology %s: %d switches, %d nodes",
            topology.fabric,
            len(topology.switches),
            len(topology.nodes),
        )
        self.cfg = cfg
        # one clock for both stages and what they own: the service's timers (checkpoint and
        # idle cadence) and theirs (heartbeats, idle release, stall, takeover retries)
        self.clock = clock
        k = cfg.kafka
        self.routes = DomainRoutes(topology)
        self.n_parts = ensure_detect_topics(k, self.routes.n)
        t = k.topics
        limits = record_limits(k, [t.steps, t.rollups, t.state])
        # a batch of several records must fit each topic's limit too (kafka-python splits a
        # refused batch, but its flush then fails); one larger record goes alone
        batch = max(16 << 10, min(1 << 20, *limits.values()))
        # no codec of Kafka's: what this producer carries (steps, rollups, state records) is
        # zstd-compressed Arrow already, and lz4 over it saved no bytes but cost CPU in the
        # sender thread, the broker's validation and the consumers' fetch parsing
        self.producer = WatchedProducer(
            make_producer(
                k, max_request_size=MAX_MESSAGE_BYTES, batch_size=batch, compression_type=None
            )
        )
        self.store = StateStore(k, self.producer, limits[t.state], keys=keys)
        self.agg = Aggregator(
            cfg, self.n_parts, self.producer, self.store, limits, self.routes, clock
        )
        self.det = DetectStage(
            cfg, topology, self.n_parts, self.producer, self.store, batch, self.routes, clock
        )
        self.stop_event = threading.Event()
        self.detect_error: BaseException | None = None
        self.detect_input = -float("inf")  # when the detect stage last took records
        # CPU seconds of each stage's thread over the last run (the summary reports them)
        self.agg_cpu_s = 0.0
        self.detect_cpu_s = 0.0
        self.subscribed = False
        self.metrics: Any = None
        if cfg.metrics_port:
            from rocewatch.core.metrics import ServiceMetrics

            self.metrics = ServiceMetrics(cfg.metrics_port)
        self.summary_path = Path(cfg.state_dir) / f"scaleout-{os.getpid()}.json"
        # every instance serves the operator API: commands go to the database, where the
        # instance running the detect stage picks them up (as `rocewatch approve` does)
        self.api: OperatorApi | None = None
        if cfg.api.listen:
            self.api = OperatorApi(
                cfg.api, self.det.commands, self.det.db, pending=self.pending
            ).start()
        # storage and notifications of what the detect stage publishes (rocewatch.event_sink):
        # in a thread of this process unless a separate `rocewatch sink` is configured
        from rocewatch import event_sink  # (which imports this module's rollups codec)

        self.sink: Any = None
        self.sink_error: BaseException | None = None
        self.sink_started = False
        if event_sink.wanted(cfg):
            self.sink = event_sink.EventSink(cfg, metrics=self.metrics)

    def pending(self) -> list[str]:
        """Drains waiting for approval: live for the domains whose detect stage this
        instance runs, else from the actions stored in the database (the sink stores them)."""
        snap = self.det.pending_snapshot()
        if (snap is not None and all(d.active for d in self.det.shards)) or self.det.db is None:
            return snap or []
        held = {d.domain for d in self.det.shards if d.active}
        topo = self.det.shards[0].topology
        stored = [
            a.node
            for a in pending_approvals(self.det.db.actions())
            if snap is None or topo.domain_of(a.node) not in held
        ]
        return sorted(set(stored) | set(snap or []))

    def run(self, max_idle_s: float = 0.0) -> None:
        """The aggregate stage in this thread and the detect stage in its own
        (``_detect_loop``). Each blocks on its own consumer until records come: neither waits
        out the other's poll, and a quiet instance polls each consumer ten times a second, not
        twenty-five (a kafka-python poll costs about a millisecond of CPU, records or not)."""
        k = self.cfg.kafka
        if not self.subscribed:
            self.subscribe()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop_event.set())
        log.info("scale-out detect on %s as groups %s-agg/-detect", k.topics.telemetry, k.group_id)
        self.detect_error = None
        detect = threading.Thread(target=self._detect_loop, name="rocewatch-detect", daemon=True)
        sink: threading.Thread | None = None
        if self.sink is not None:
            self.sink_started = True
            sink = threading.Thread(target=self._sink_loop, name="rocewatch-sink", daemon=True)
            sink.start()
        last_input = self.clock.monotonic()
        next_metrics = self.clock.monotonic()
        next_save = next_metrics + k.commit_interval_s
        turn = 0
        cpu0 = time.thread_time()
        detect.start()
        try:
            while not self.stop_event.is_set():
                self.producer.check()
                n = self.agg.poll_once(POLL_MS)
                self.agg.finish_checkpoint()
                now = self.clock.monotonic()
                if self.metrics is not None and now >= next_metrics:
                    next_metrics = now + 0.5
                    self.metrics.update_scaleout(self)
                if n or not self.agg.consumer.assignment():
                    last_input = now  # idle time counts from the group join, not before it
                # a rebalance is activity: a member joining or leaving restarts the idle clock
                last_input = max(
                    last_input, self.agg.group_changed, self.det.group_changed, self.detect_input
                )
                if now >= next_save:
                    # one partition's state at a time, spread over the interval: each is still
                    # saved once per interval, and the stream pauses for one piece at a time
                    # (the detect stage saves its own, in its thread)
                    pieces = sorted(self.agg.parts)
                    if pieces:
                        self.agg.begin_checkpoint(pieces[turn % len(pieces)])
                    turn += 1
                    next_save = now + k.commit_interval_s / max(1, len(pieces))
                # (and not before this instance's partitions are reported idle: their last
                # steps are closed then, which a recent stall can put off by partition_idle_s)
                quiet = now - last_input
                late = quiet >= max_idle_s + k.partition_idle_s + 5
                # the detect stage too: on a loaded machine it can be steps behind when stage 1
                # goes idle, busy with one poll's steps for longer than max_idle_s (stopped
                # then, the tail of the stream was never evaluated: alerts left firing)
                if (
                    max_idle_s
                    and quiet >= max_idle_s
                    and (self.agg.all_idle() or late)
                    and (self.det.caught_up() or late)
                ):
                    break
            self._stop_detect(detect)
            self.agg_cpu_s = time.thread_time() - cpu0
            self.checkpoint()
            if self.sink_error is not None:  # detection's state is saved: the restart goes on
                raise self.sink_error
            if self.metrics is not None:
                self.metrics.update_scaleout(self)
                self.metrics.update_detect_stage(self.det)
        finally:
            self.stop_event.set()
            detect.join(DETECT_JOIN_S)
            try:
                self.close()
            finally:
                if sink is not None:
                    self._stop_sink(sink)

    def _sink_loop(self) -> None:
        """The embedded sink's thread. An error stops the instance (``run`` raises it): a
        detector that goes on without storing or notifying would fail silently."""
        try:
            self.sink.run()
        except BaseException as e:
            self.sink_error = e
            self.stop_event.set()

    def _stop_sink(self, sink: threading.Thread) -> None:
        """After the final checkpoint: the sink stores what was published, then stops."""
        from rocewatch.event_sink import FINISH_S

        self.sink.finish()
        sink.join(FINISH_S + self.cfg.notify.drain_timeout_s + 10)
        if sink.is_alive():
            self.sink.stop_event.set()
            log.warning("the sink did not finish in time: the next start stores the rest")
            sink.join(10)

    def _detect_loop(self) -> None:
        """The detect stage's thread: steps in, alerts and actions out, the operators'
        commands carried out, its state saved once per commit interval. An error stops the
        instance (``run`` raises it); the final checkpoint is ``run``'s, once this has ended."""
        k = self.cfg.kafka
        next_commands = self.clock.monotonic()
        next_save = next_commands + k.commit_interval_s
        cpu0 = time.thread_time()
        try:
            while not self.stop_event.is_set():
                if self.det.poll_once(POLL_MS if self.det.active else STANDBY_POLL_MS):
                    self.detect_input = self.clock.monotonic()
                self.det.finish_checkpoint()
                now = self.clock.monotonic()
                if now >= next_commands:
                    next_commands = now + 0.5
                    self.det.apply_operator_commands()
                    if self.metrics is not None:
                        self.metrics.update_detect_stage(self.det)
                if now >= next_save:
                    next_save = now + k.commit_interval_s
                    self.det.begin_checkpoint()
        except BaseException as e:  # handed to run(), which raises it
            self.detect_error = e
            self.stop_event.set()
        finally:
            self.detect_cpu_s = time.thread_time() - cpu0

    def _stop_detect(self, detect: threading.Thread) -> None:
        """End the detect stage's thread; its error, if it stopped the instance, is raised."""
        self.stop_event.set()
        detect.join(DETECT_JOIN_S)
        if self.detect_error is not None:
            raise self.detect_error
        if detect.is_alive():
            raise RocewatchError(f"the detect stage did not stop within {DETECT_JOIN_S:.0f} s")

    def subscribe(self) -> None:
        """Join both groups once the topics' partitions are known (else the first assignment
        would be empty until the next metadata refresh)."""
        k = self.cfg.kafka
        self.subscribed = True
        wait_for_partitions(self.agg.consumer, k.topics.telemetry)
        wait_for_partitions(self.det.consumer, k.topics.steps)
        self.agg.consumer.subscribe([k.topics.telemetry], listener=_StageListener(self.agg))
        self.det.consumer.subscribe([k.topics.steps], listener=_StageListener(self.det))

    def checkpoint(self) -> None:
        self.agg.checkpoint()
        self.det.checkpoint()
        freed, ms = reclaim()  # see rocewatch.runtime.memory: the soak's memory stays flat with it
        log.debug("reclaimed %d objects in %.0f ms", freed, ms)

    def summary(self) -> dict[str, Any]:
        lat = self.det.latencies()
        return {
            "pid": os.getpid(),
            "samples": self.agg.samples,
            "steps_evaluated": self.det.steps_evaluated,
            "alerts_sent": self.det.alerts_sent,
            "actions_sent": self.det.actions_sent,
            # CPU seconds of the aggregate stage's thread and the detect stage's (the Kafka
            # clients' own threads are in neither), and the fabric domains evaluated here
            "agg_cpu_s": round(self.agg_cpu_s, 3),
            "detect_cpu_s": round(self.detect_cpu_s, 3),
            "domains_held": sorted((d.domain or "") for d in self.det.shards if d.steps_evaluated),
            "latencies": lat,  # [CreateTime ns, seconds to evaluation], by CreateTime
            "stats": Stats.merged(self.agg.stats, *self.det.all_stats()).as_dict(),
        }

    def close(self) -> None:
        # the final checkpoint is done: leaving the groups must not write state again
        self.agg.closing = True
        self.det.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.api is not None:
            self.api.close()
        try:
            self.summary_path.parent.mkdir(parents=True, exist_ok=True)
            self.summary_path.write_text(json.dumps(self.summary()))
        finally:
            try:
                self.agg.consumer.close(autocommit=False)
                self.det.consumer.close(autocommit=False)
            finally:
                self.det.close_writers()
                self.producer.finish()
                self.store.close()
                if self.det.db is not None:
                    self.det.db.close()
                if self.sink is not None and not self.sink_started:  # else run() stops it
                    self.sink.close()
