"""Stage 2, detect: per fabric domain, assemble each step from every telemetry partition, run
the detectors, alert lifecycle and policy, and publish alerts and actions once."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from kafka import KafkaConsumer
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata, TopicPartition

from actions.executors import Executor
from actions.membership import LiveJobs, build_live_jobs
from actions.operator import MemoryCommands, apply_pending
from actions.routing import RoutingExecutor
from rocewatch.bus.poll import poll_group
from rocewatch.bus.signing import SignatureError
from rocewatch.bus.state_store import StateStore
from rocewatch.bus.topics import GROUP_METADATA_MAX_AGE_MS, MAX_MESSAGE_BYTES
from rocewatch.bus.transactions import DetectWriter, FencedExecutor, TransactionFailed
from rocewatch.config import Config
from rocewatch.core.checkpoint import CheckpointError
from rocewatch.core.errors import BadInput, Fenced, RetryableError, RocewatchError
from rocewatch.core.keys import KEYS
from rocewatch.core.model import Alert
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology
from rocewatch.pipeline import Output, Pipeline
from rocewatch.runtime import stage1_feed
from rocewatch.runtime.aggregate import STATE_VERSION
from rocewatch.runtime.assembly import StepAssembly
from rocewatch.runtime.config_feed import ConfigFeed
from rocewatch.runtime.delivery import Published, output_partitions, send_events
from rocewatch.runtime.detect_checkpoint import StageCheckpoints
from rocewatch.runtime.detect_state import DETECT_STATE_KIND, DetectState, load_detect_state
from rocewatch.runtime.kube import kube_api, kube_nodes
from rocewatch.runtime.outputs import OutputWriter
from rocewatch.runtime.steps import DomainRoutes, decode_steps
from rocewatch.runtime.timing import SYSTEM_CLOCK, TAKEOVER_RETRY_S, Clock

__all__ = [
    "DETECT_STATE_KIND",
    "DetectStage",
    "DetectState",
    "DomainStage",
    "kube_api",
    "kube_nodes",
    "load_detect_state",
]

log = logging.getLogger(__name__)


class DomainStage:
    """Stage 2 for one fabric domain (steps partition ``shard``): assemble its steps from
    every telemetry partition and run the detectors on them. ``DetectStage`` holds the
    consumer this reads through and one of these per domain."""

    def __init__(
        self,
        cfg: Config,
        topology: Topology,
        n_parts: int,
        producer: Any,
        store: StateStore,
        batch_size: int,
        consumer: Any,
        routes: DomainRoutes,
        shard: int = 0,
        db: Any = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.cfg = cfg
        # stall and deaf rules, end-offset cadence, takeover retries and the fence's time
        self.clock = clock
        self.k = cfg.kafka
        self.topology = topology
        self.n_parts = n_parts
        self.store = store
        self.consumer = consumer
        self.routes = routes
        self.shard = shard
        self.tp = TopicPartition(self.k.topics.steps, shard)
        # one domain keeps the names a single detect stage always had; with several, each
        # domain's state, transactional id and pipeline are its own
        self.domain: str | None = routes.names[shard] if routes.n > 1 else None
        self.name = "detect stage" if self.domain is None else f"detect stage {self.domain!r}"
        suffix = "" if self.domain is None else f"@{self.domain}"
        self.state_key = "detect" + suffix
        self.writer = DetectWriter(self.k, producer, n_parts, batch_size, suffix, clock)
        self.stats = Stats()  # the detect pipeline's (a restored stage brings its own)
        # what happened to this instance's hold on the stage (lost, fenced, taken back): its
        # own, kept across restores
        self.holds = Stats()
        self.refused: int | None = None  # the offset of the state record refused (not read again)
        self.active = False
        self.closing = False
        self.group_changed = self.clock.monotonic()  # the last (re)assignment, for --max-idle
        self.state: DetectState | None = None
        self.published = Published()  # what was published after the checkpoint taken over
        # which steps may close, and their rows from every telemetry partition
        self.assembly = StepAssembly(cfg, n_parts, consumer, store, self.tp, self.stats, clock)
        # live job membership (squeue, pods) while this instance runs the detect stage; the
        # topology file's jobs are the fallback
        self.static_jobs = list(topology.jobs.values())
        self.live_jobs: LiveJobs | None = None
        # operators' commands (`rocewatch approve`, `undrain`) arrive in the storage database;
        # the instance running the node's domain's detect stage carries them out
        self.db = db
        # the one writer of outputs to the storage database (None: no storage): the inhibited
        # alerts (the published ones reach it through the sink, as everything published)
        self.outputs: OutputWriter | None = None
        self.steps_evaluated = 0
        self.alerts_sent = 0
        self.actions_sent = 0
        # the drains waiting for approval, as the policy left them after its last step (for
        # the operator API's thread; None while this instance does not run the stage)
        self.pending_snapshot: list[str] | None = None
        # after a fence: when to take the stage back if the group still gives it to this
        # instance (nobody else holds it: the fence came from a transaction timeout, say)
        self.retake_at: float | None = None
        self.routing: RoutingExecutor | None = None
        # the RoCE configuration records of this domain's devices (the configuration topic)
        self.config_feed = ConfigFeed(self.k, topology, self.domain)
        self.checkpoints = StageCheckpoints(
            self.writer,
            store,
            consumer,
            self.tp,
            n_parts,
            self.state_key,
            self.name,
            self._output_tps,
            lambda: self.stats,
        )

    @property
    def step_ns(self) -> int:
        return round(self.cfg.window.step_s * 1e9)

    @property
    def all_quiet(self) -> bool:
        """Every telemetry partition idle and read to its end (as of the last step closed)."""
        return self.assembly.all_quiet

    @property
    def stall_s(self) -> float:
        """A partition silent this long has no owner (``StepAssembly``)."""
        return self.assembly.stall_s

    @property
    def latencies(self) -> Any:
        return self.assembly.latencies

    # --- assignment ------------------------------------------------------------------------------
    def assigned(self, tps: list[TopicPartition]) -> None:
        self.group_changed = self.clock.monotonic()
        self.retake_at = None
        if not tps:
            return
        try:
            self._take_over(tps)
        except (RetryableError, TransactionFailed, KafkaError) as e:
            # called in the group's rebalance (kafka-python turns a listener's error into an
            # error of the poll, which would stop the instance) or in a retake; a broker
            # restarting or a coordinator not yet loaded is worth waiting out: the group still
            # gives this instance the stage, so it tries again while it does
            self.holds.inc("detect_takeover_failed")
            self._drop(f"{self.name} not taken over ({e}); trying again")
            self.retake_at = self.clock.monotonic() + TAKEOVER_RETRY_S

    def _take_over(self, tps: list[TopicPartition]) -> None:
        self.writer.start()  # fences the previous holder and aborts what it left open
        routing = RoutingExecutor(self.cfg.executors)
        executor = FencedExecutor(routing, self.writer.fence)
        # the pipeline is built from today's configuration and topology, and the state record's
        # data laid over it: an edited configuration file is what runs after a restart
        st = self._restore(self._new_pipeline(executor))
        if st is None:
            # (a refused state too: the steps before its offset make the pipeline's state
            # again, and what was published after its output offsets is not suppressed)
            pipe = self._new_pipeline(executor)
            st = DetectState(STATE_VERSION, pipe, {}, {}, {}, None, 0, {})
            self.consumer.seek_to_beginning(tps[0])
        else:
            self.consumer.seek(tps[0], st.offset)
            self._load_suppressions(st)
        resume = {tps[0]: OffsetAndMetadata(st.offset, "", -1)}
        with contextlib.suppress(KafkaError, RocewatchError):  # the first write meets it again
            self.writer.warm(resume)
        self.state = st
        self.pending_snapshot = st.pipeline.policy.pending()
        self.live_jobs = build_live_jobs(
            st.pipeline.topology, self.cfg.membership, kube_api(self.cfg), static=self.static_jobs
        )
        if self.cfg.policy.mode != "dry-run":
            # the Kubernetes executor's background work: the healthy condition on the nodes it
            # watches, the drains (evictions) of an earlier holder, uncordons by hand
            routing.watch(kube_nodes(st.pipeline.topology, self.domain))
        self.routing = routing
        self.config_feed.start()
        self.active = True
        self.assembly.restart(st)
        log.info("%s active (steps offset %d)", self.name, st.offset)

    def _new_pipeline(self, executor: Executor) -> Pipeline:
        """This domain's pipeline as today's configuration and topology make it, with fresh
        counters (a restored state adds its own)."""
        self.stats = self.assembly.stats = Stats()
        pipe = Pipeline(
            self.topology,
            self.cfg,
            executor=executor,
            stats=self.stats,
            rollup_s=None,  # the scale-out path stores no metrics: no rollups to compute
            retain=False,
            domain=self.domain,
        )
        # a detector fed by stage 1 (the isolation forest: ``FeatureFeed``) takes its window
        # values from there: the steps do not carry its own metrics
        stage1_feed.feed_from_stage1(pipe)
        return pipe

    def _restore(self, pipe: Pipeline) -> DetectState | None:
        rec = self.store.load_stored(self.n_parts, key=self.state_key)
        if rec is None or rec.offset == self.refused:  # (refused already: counted once)
            return None
        try:
            return load_detect_state(self.store.open(rec), pipe)
        except (CheckpointError, SignatureError) as e:  # damaged, foreign or forged
            # nothing of it is run
            self.refused = rec.offset
            self.holds.inc("checkpoint_rejected")
            if isinstance(e, SignatureError):
                self.holds.inc("state_mac_rejected")
            log.error(
                "state record %s/%d@%d rejected (%s); the %s starts afresh from the first step",
                self.store.topic,
                self.n_parts,
                rec.offset,
                e,
                self.name,
            )
            return None

    def revoked(self, tps: list[TopicPartition]) -> None:
        if self.active and tps and not self.closing:
            self.checkpoint(commit=False)
            self._drop(f"{self.name} handed over")

    def lost(self, tps: list[TopicPartition]) -> None:
        """Evicted from the group (a stall past the session timeout): another instance may
        hold the stage already, so nothing is written; it resumes from the last checkpoint."""
        if self.active and tps and not self.closing:
            self.holds.inc("detect_stage_lost")
            self._drop(f"{self.name} lost (evicted from the group); its unsaved state is dropped")

    def _drop(self, why: str) -> None:
        self.active = False
        if self.routing is not None:
            self.routing.close()  # its evictions go on with the next holder
            self.routing = None
        self.state = None
        self.config_feed.close()
        self.checkpoints.saving = None
        self.pending_snapshot = None
        self.live_jobs = None
        self.writer.close()
        log.info(why)

    def _fenced(self, e: Fenced) -> None:
        self.holds.inc("detect_stage_fenced")
        log.warning("%s: this instance's unsaved detect state is dropped", e)
        self._drop(f"{self.name} handed over (fenced)")
        self._retake_later()

    def _retake_later(self) -> None:
        # a stalled instance learns from the group within a session timeout that the stage is
        # gone (and is assigned anew); if the group still gives it the stage after that, the
        # fence came from elsewhere and nobody runs the stage: it takes the stage back
        self.retake_at = self.clock.monotonic() + self.k.session_timeout_ms / 1000.0 + 1.0

    def _maybe_retake(self) -> None:
        if self.retake_at is None or self.clock.monotonic() < self.retake_at:
            return
        self.retake_at = None
        tps = [tp for tp in self.consumer.assignment() if tp == self.tp]
        if tps:
            self.holds.inc("detect_stage_retaken")
            log.warning(
                "fenced, but the group still gives this instance the detect stage: "
                "taking it back from its checkpoint"
            )
            self.assigned(tps)

    def _guarded(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, the stage dropped if fenced, or started again from its checkpoint
        if a transaction failed otherwise (what it held was aborted, so it is made again) or
        the broker could not be asked (end offsets during a broker restart, say)."""
        try:
            return fn(*args)
        except Fenced as e:
            self._fenced(e)
        except (TransactionFailed, KafkaError) as e:
            # what the transaction held is aborted, and whether this instance still holds the
            # stage is in doubt: a broker can answer a commit that another holder's epoch bump
            # fenced with UNKNOWN_SERVER_ERROR instead of PRODUCER_FENCED. Taking the stage
            # back at once would fence a rightful new holder, so the stage waits for the
            # group, as after a fence, and starts again from its checkpoint if still assigned.
            # (a broker that cannot be asked at all, restarting say, is waited out the same way)
            failed = isinstance(e, TransactionFailed)
            self.holds.inc("detect_transaction_failed" if failed else "detect_broker_unreachable")
            log.error("%s: the %s starts again from its checkpoint", e, self.name)
            self._drop(f"{self.name} stopped ({'transaction failed' if failed else 'broker'})")
            self._retake_later()
        return None

    def _output_tps(self) -> list[TopicPartition]:
        return output_partitions(self.cfg, self.store)

    def _load_suppressions(self, st: DetectState) -> None:
        """Read what was published after the checkpoint: it must not be published again."""
        self.published = Published()
        tps = self._output_tps()
        ends = self.store.end_offsets(tps)
        starts = {tp: st.out_ends.get((tp.topic, tp.partition), 0) for tp in tps}
        if not any(start < ends.get(tp, 0) for tp, start in starts.items()):
            return
        if self.published.read_back(self.cfg, starts, ends):
            raise RetryableError("could not read back the events published after the state")
        log.info(
            "after the takeover, %d already-published events will not be sent again",
            self.published.total(),
        )

    # --- the loop --------------------------------------------------------------------------------
    def handle(self, msgs: list[Any]) -> int:
        """This domain's records of one poll (none: time has passed), then every step the
        watermark now allows evaluated; how many moved a partition on."""
        return int(self._guarded(self._handle, msgs) or 0)

    def _handle(self, msgs: list[Any]) -> int:
        st = self.state
        if st is None or not self.active:
            self._maybe_retake()
            return 0
        if self.live_jobs is not None:  # answers are applied here, in the stage's thread
            self.live_jobs.maybe_refresh()
        # the configuration read so far, before the steps it may concern close
        self.config_feed.poll(st.pipeline, st.config_offsets)
        n = 0
        now = self.clock.monotonic()
        if msgs:
            for m in msgs:
                st.offset = m.offset + 1
                try:
                    msg = decode_steps(m.value or b"", KEYS)
                except BadInput as e:
                    self.stats.inc("bad_steps_message", detail=str(e)[:80])
                    continue
                n += self.assembly.take(st, msg, now)
        self._advance(st, now)
        return n

    def _advance(self, st: DetectState, now: float) -> None:
        self.assembly.all_quiet = False
        self._advance_steps(st, now)
        if self.all_quiet:
            # every partition read to its end and idle: telemetry time stands still, so alerts
            # held for a late inhibiting source are decided now (as replay's end decides them)
            out = st.pipeline.decide_held()
            if out.alerts or out.inhibited or out.actions:
                self._emit(out)

    def _advance_steps(self, st: DetectState, now: float) -> None:
        steps = self.assembly.close(st, now)
        if steps is None:
            return
        self._emit(st.pipeline.evaluate(steps))
        self.steps_evaluated += len(steps)
        assert st.closed_ns is not None
        self.assembly.evaluated(st.closed_ns)

    def apply_operator_commands(self) -> int:
        """Carry out the operators' pending commands (while this instance runs the detect
        stage), publish what they decided, and checkpoint at once: a takeover then finds the
        policy as the commands, already marked done, left it."""
        return int(self._guarded(self._apply_operator_commands) or 0)

    def _apply_operator_commands(self) -> int:
        st = self.state
        if st is None or not self.active or self.db is None:
            return 0
        try:
            n = apply_pending(st.pipeline.policy, [self.db], accept=self._owns_node)
            if n:
                self._emit(st.pipeline.operator_tick())
                self._checkpoint(True)
        except RetryableError as e:
            log.warning("operator commands: %s; trying again later", e)
            return 0
        return n

    def _owns_node(self, node: str) -> bool:
        """Commands about a node go to its domain's policy."""
        return self.domain is None or self.topology.domain_of(node) == self.domain

    def _emit(self, out: Output) -> None:
        if self.state is not None and out.actions:
            self.pending_snapshot = self.state.pipeline.policy.pending()
        n_alerts, n_actions = send_events(self.writer, self.cfg, out, self.published)
        if n_alerts or n_actions:
            self.writer.commit()  # visible now (read committed), not at the next checkpoint
        if out.inhibited and self.outputs is not None:
            # inhibited alerts are stored, never published (docs/alerting.md): straight to the
            # database, an idempotent upsert, so a step evaluated again after a takeover is no
            # harm; with the published events' times (as JSON keeps them), as the sink stores
            try:
                self.outputs.write(inhibited=[Alert.from_json(a.to_json()) for a in out.inhibited])
            except RetryableError as e:
                self.stats.inc("inhibited_not_stored", len(out.inhibited))
                log.warning("inhibited alerts not stored: %s", e)
        if out.ranks and self.outputs is not None:  # NCCL ranks: straight to the database
            try:
                self.outputs.write(ranks=out.ranks)
            except RetryableError as e:
                self.stats.inc("ranks_not_stored", len(out.ranks))
                log.warning("NCCL ranks not stored: %s", e)
        if out.config_changes and self.outputs is not None:  # an idempotent upsert, as ranks
            try:
                self.outputs.write(config_changes=out.config_changes)
            except RetryableError as e:
                self.stats.inc("config_changes_not_stored", len(out.config_changes))
                log.warning("configuration changes not stored: %s", e)
        self.alerts_sent += n_alerts
        self.actions_sent += n_actions

    def checkpoint(self, commit: bool = True) -> None:
        """Alerts and actions flushed, then the state written, then the steps offset committed
        (fenced: the state and the offset in one transaction). At once: for a handover, a
        final checkpoint and the operators' commands (``begin_checkpoint`` is the stream's)."""
        self._guarded(self._checkpoint, commit)

    def _checkpoint(self, commit: bool) -> None:
        st = self.state
        if st is None or not self.active:
            self.checkpoints.saving = None
            return
        self.checkpoints.now(st, commit)

    def begin_checkpoint(self) -> None:
        """The stream's periodic checkpoint, in two halves so the stream does not wait for the
        state's serialisation: the state is copied now (its outputs flushed first, as for
        ``checkpoint``), its frames serialised on a worker thread, and ``finish_checkpoint``
        writes it once they are. The steps evaluated meanwhile are after its offset: a
        restart from it evaluates them again, and what they published is suppressed, as for
        any step after a checkpoint."""
        self._guarded(self._begin_checkpoint)

    def _begin_checkpoint(self) -> None:
        st = self.state
        if st is None or not self.active:
            return
        self.checkpoints.begin(st)

    def finish_checkpoint(self) -> None:
        """Write the state ``begin_checkpoint`` copied, once serialised."""
        if self.checkpoints.ready():
            self._guarded(self._finish_checkpoint)

    def _finish_checkpoint(self) -> None:
        self.checkpoints.finish(self.state if self.active else None)


class DetectStage:
    """Stage 2 of an instance: one consumer in the detect group (``<group_id>-detect``) on the
    steps topic, and a ``DomainStage`` per steps partition, that is per fabric domain. The group
    spreads the partitions over the instances, so a fabric of several domains runs its
    detect stage on as many cores; each domain's stage fails over on its own."""

    def __init__(
        self,
        cfg: Config,
        topology: Topology,
        n_parts: int,
        producer: Any,
        store: StateStore,
        batch_size: int,
        routes: DomainRoutes,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        k = cfg.kafka
        self.routes = routes
        self.closing = False
        self.db: Any = None
        if cfg.storage_url:
            from storage.store import Store

            self.db = Store(cfg.storage_url)
            self.db.create_schema()
        # operators' commands: from the database (CLI, API of any instance) or, without one,
        # from this instance's API (which then reaches only the domains it evaluates)
        self.commands: Any = self.db if self.db is not None else MemoryCommands()
        self.consumer = KafkaConsumer(
            **k.client_kwargs(),
            group_id=k.group_id + "-detect",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=200,
            fetch_max_bytes=MAX_MESSAGE_BYTES,
            max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
            session_timeout_ms=k.session_timeout_ms,
            heartbeat_interval_ms=max(1000, k.session_timeout_ms // 4),
            metadata_max_age_ms=GROUP_METADATA_MAX_AGE_MS,
        )
        self.shards = [
            DomainStage(
                cfg,
                topology,
                n_parts,
                producer,
                store,
                batch_size,
                self.consumer,
                routes,
                i,
                clock=clock,
            )
            for i in range(routes.n)
        ]
        for det in self.shards:
            det.db = self.commands
            det.outputs = None if self.db is None else OutputWriter(self.db)

    # --- assignment ------------------------------------------------------------------------------
    def _mine(self, tps: list[TopicPartition]) -> list[tuple[DomainStage, list[TopicPartition]]]:
        # (a steps partition past the domains, from a topology that had more, is not read)
        return [(d, [tp for tp in tps if tp == d.tp]) for d in self.shards]

    def assigned(self, tps: list[TopicPartition]) -> None:
        for det, mine in self._mine(tps):
            det.assigned(mine)
        if self.routes.n > 1:
            held = sorted(d.name for d in self.shards if d.active)
            log.info("detect stages held here: %s", ", ".join(held) or "none")
        elif not any(d.active for d in self.shards):
            # (every member logs its part of each rebalance: which instance runs the stage
            # can be told from any instance's log)
            log.info("detect stage on standby: another instance runs it")

    def revoked(self, tps: list[TopicPartition]) -> None:
        for det, mine in self._mine(tps):
            det.revoked(mine)

    def lost(self, tps: list[TopicPartition]) -> None:
        for det, mine in self._mine(tps):
            det.lost(mine)

    # --- the loop --------------------------------------------------------------------------------
    def poll_once(self, timeout_ms: int) -> int:
        """One poll of the steps topic; each domain takes its records (and evaluates what its
        watermark allows, records or not)."""
        recs = poll_group(self.consumer, timeout_ms)
        return sum(det.handle(recs.get(det.tp, [])) for det in self.shards)

    def apply_operator_commands(self) -> int:
        return sum(det.apply_operator_commands() for det in self.shards)

    def checkpoint(self, commit: bool = True) -> None:
        for det in self.shards:
            det.checkpoint(commit)

    def begin_checkpoint(self) -> None:
        for det in self.shards:
            det.begin_checkpoint()

    def finish_checkpoint(self) -> None:
        for det in self.shards:
            det.finish_checkpoint()

    # --- what the service reads ------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return any(d.active for d in self.shards)

    @property
    def group_changed(self) -> float:
        return max(d.group_changed for d in self.shards)

    @property
    def steps_evaluated(self) -> int:
        return sum(d.steps_evaluated for d in self.shards)

    def caught_up(self) -> bool:
        """Every detect stage held here has evaluated its steps to where the telemetry ends
        (every partition idle and read to its end): an idle stop loses none of them."""
        return all(d.all_quiet for d in self.shards if d.active)

    @property
    def alerts_sent(self) -> int:
        return sum(d.alerts_sent for d in self.shards)

    @property
    def actions_sent(self) -> int:
        return sum(d.actions_sent for d in self.shards)

    def latencies(self) -> list[tuple[int, float]]:
        return sorted(x for d in self.shards for x in d.latencies)

    def all_stats(self) -> list[Stats]:
        return [s for d in self.shards for s in (d.stats, d.holds)]

    def pending_snapshot(self) -> list[str] | None:
        """Drains waiting for approval in the domains this instance runs (None: it runs none)."""
        snaps = [d.pending_snapshot for d in self.shards if d.pending_snapshot is not None]
        if not snaps:
            return None
        return sorted({n for snap in snaps for n in snap})

    def close(self) -> None:
        self.closing = True
        for d in self.shards:
            d.closing = True

    def close_writers(self) -> None:
        for d in self.shards:
            d.writer.close()
            d.config_feed.close()
