"""The pipeline every mode runs: samples -> windows -> detectors -> grouping -> alert lifecycle
-> inhibition -> policy.

Live (Kafka), replay (files), the demo (in-process simulator) and each fabric domain's detect
stage in scale-out differ only in their sources and in how they move the watermark; what
happens to the samples is this file.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from actions.executors import DryRunExecutor, Executor
from actions.policy import DrainPolicy
from detectors.base import Detector, Finding, StepContext
from detectors.lifecycle import AlertLifecycle
from detectors.rates import series_ids
from detectors.registry import DETECTORS, build_detectors
from detectors.windows import Step, WindowEngine
from rocewatch.alerting.group import StormGrouper, views
from rocewatch.alerting.inhibit import INHIBITED_BY, Inhibitor
from rocewatch.alerting.interference import InterferenceAttributor
from rocewatch.alerting.job_paths import JOIN, JobPaths
from rocewatch.config import Config
from rocewatch.core import rollups
from rocewatch.core.checkpoint import StateTypes
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import SERIES_KEY, Action, Alert
from rocewatch.core.roce import ConfigChange
from rocewatch.core.state import StateMismatch
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology
from rocewatch.roce.watch import ConfigWatch

log = logging.getLogger(__name__)

# the layout of ``Pipeline.state()``; a state of another version is refused (the caller starts
# afresh from its committed offsets)
PIPELINE_STATE_VERSION = 2

ROLLUP_S = 10  # the rollups the services store, when they have storage
COARSE_ROLLUP_S = 60


@dataclass
class Output:
    """What one advance produced: alert events (firing and resolved) to notify and store,
    events of inhibited alerts (``inhibited_by`` annotation: to store, never to notify),
    actions, metric rollups."""

    alerts: list[Alert] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    rollups: list[pl.DataFrame] = field(default_factory=list)
    steps: int = 0
    inhibited: list[Alert] = field(default_factory=list)
    # NCCL ranks newly placed or moved (rocewatch/alerting/job_paths.py), for storage
    ranks: list[dict[str, Any]] = field(default_factory=list)
    # RoCE configuration changes the snapshots applied in these steps showed
    config_changes: list[ConfigChange] = field(default_factory=list)

    def extend(self, other: Output) -> None:
        self.alerts += other.alerts
        self.config_changes += other.config_changes
        self.actions += other.actions
        self.rollups += other.rollups
        self.steps += other.steps
        self.inhibited += other.inhibited
        self.ranks += other.ranks


class Rollups:
    """Per-series rollups of each step's values (rates for counters) at a fixed resolution.

    Steps are folded into a running partial aggregate every few steps, so the state a
    checkpoint carries stays the size of one frame per series, not one per step.
    """

    COMPACT_EVERY = 10

    def __init__(self, resolution_s: int) -> None:
        self.resolution_ns = resolution_s * 1_000_000_000
        self.resolution_s = resolution_s
        self.bucket: int | None = None
        self.parts: list[pl.DataFrame] = []  # partial aggregates: sum, max, min, last, count

    def state(self) -> dict[str, object]:
        """Its open bucket, as data (the series ids are a cache, rebuilt when folding)."""
        return {
            "resolution_s": self.resolution_s,
            "bucket": self.bucket,
            "parts": [p.drop("sid", strict=False) for p in self.parts],
        }

    def restore(self, data: Mapping[str, Any]) -> None:
        """Take back the open bucket of ``state()``, if kept at this resolution."""
        if data.get("resolution_s") == self.resolution_s:
            self.bucket = data["bucket"]
            self.parts = list(data["parts"])

    @staticmethod
    def _partial(frame: pl.DataFrame, sid: np.ndarray | None = None) -> pl.DataFrame:
        """A step's rows as partial aggregates, with each row's series id (``sid``, the rate
        engine's hash of the series key; hashed here when not given)."""
        return frame.select(
            *SERIES_KEY,
            pl.col("last").alias("sum"),
            pl.col("last").alias("max"),
            pl.col("last").alias("min"),
            pl.col("last"),
            pl.lit(1, dtype=pl.Int64).alias("count"),
            pl.Series("sid", series_ids(frame) if sid is None else sid, dtype=pl.UInt64),
        )

    @staticmethod
    def _fold(parts: list[pl.DataFrame]) -> pl.DataFrame:
        # grouped by the 64-bit series id rather than the four strings (half the time); the
        # groups, their order and the rows in each are the same, so the sums are too
        parts = [
            p if "sid" in p.columns else p.with_columns(pl.Series("sid", series_ids(p)))
            for p in parts
        ]
        return (
            pl.concat(parts, how="vertical")
            .group_by("sid", maintain_order=True)
            .agg(
                *(pl.col(k).first() for k in SERIES_KEY),
                pl.col("sum").sum(),
                pl.col("max").max(),
                pl.col("min").min(),
                pl.col("last").last(),
                pl.col("count").sum(),
            )
            .select(*SERIES_KEY, "sum", "max", "min", "last", "count", "sid")
        )

    def add(self, step: Step, partial: pl.DataFrame | None = None) -> pl.DataFrame | None:
        """Fold ``step`` in (``partial``: its ``_partial`` frame, if the caller has it)."""
        b = step.start // self.resolution_ns
        out = None
        if self.bucket is not None and b != self.bucket:
            out = self.flush()
        self.bucket = b
        if step.frame.height:
            self.parts.append(partial if partial is not None else self._partial(step.frame))
            if len(self.parts) > self.COMPACT_EVERY:
                self.parts = [self._fold(self.parts)]
        return out

    def flush(self) -> pl.DataFrame | None:
        df = self.peek()
        self.parts = []
        return df

    def peek(self) -> pl.DataFrame | None:
        """The open bucket's rollups so far, kept open: a provisional row that the complete
        bucket replaces when it is written later (storage upserts by bucket and series)."""
        if self.bucket is None or not self.parts:
            return None
        df = (
            self._fold(self.parts)  # into a new frame: the parts stay as they are
            .with_columns(
                (pl.col("sum") / pl.col("count")).alias("mean"),
                pl.lit(self.bucket * self.resolution_ns, dtype=pl.Int64).alias("bucket_start_ns"),
                pl.lit(self.resolution_s, dtype=pl.Int64).alias("resolution_s"),
            )
            .select(list(rollups.ROLLUP_SCHEMA))
        )
        return df


def _lookback_s(config: Config) -> float:
    """How long before an alert a configuration change on its entities is named in it
    (``detectors.roce_config_mismatch.changes_lookback_s``)."""
    from detectors.roce_config_mismatch import RoceConfigMismatchConfig

    cfg = config.detectors.get("roce_config_mismatch") or RoceConfigMismatchConfig()
    return float(cfg.changes_lookback_s)


class Pipeline:
    def __init__(
        self,
        topology: Topology,
        config: Config | None = None,
        executor: Executor | None = None,
        stats: Stats | None = None,
        rollup_s: int | None = 10,
        retain: bool = True,
        domain: str | None = None,
    ) -> None:
        """``retain=False`` (the long-running service) keeps no list of past alerts and actions:
        they are emitted once and stored; replay and the demo retain them for their output.

        ``domain`` (the scale-out detect stage of a fabric split into domains): the steps hold
        this domain's devices and the cable ends facing it from other domains, so findings
        about a device of another domain are left to that domain's pipeline, and findings
        about no device (a scope such as a rail or the fabric) carry a ``domain`` label.
        """
        self.config = config or Config()
        self.topology = topology
        self.stats = stats or Stats()
        self.engine = WindowEngine(self.config.window, self.stats)
        self.detectors: list[Detector] = build_detectors(topology, self.config.detectors)
        # detectors that declare their longest window (window_s) let the engine keep less
        self.engine.keep_history(
            max(
                (
                    float(getattr(d, "window_s", self.config.window.history_s))
                    for d in self.detectors
                ),
                default=self.config.window.history_s,
            )
        )
        self.retain = retain
        self.lifecycle = AlertLifecycle(self.config.lifecycle, retain=retain)
        self.policy = DrainPolicy(self.config.policy, topology, executor or DryRunExecutor())
        self.domain = domain
        self.policy.domain = domain
        # a detector that keeps track of the fabric domain learns the one it runs for
        for det in self.detectors:
            if DETECTORS[det.name].domain_aware:
                det.domain = domain  # type: ignore[attr-defined]
        self.grouper = StormGrouper(topology, self.config.lifecycle.resolve_after_s)
        self.inhibitor = Inhibitor(self.config.inhibit)
        # victims and aggressors of congestion between tenants (rocewatch/alerting/interference)
        self.interference = InterferenceAttributor(
            topology, self.config.interference, self.config.lifecycle.resolve_after_s
        )
        # the NCCL rank join on alerts: fabric alerts name the jobs behind them, job alerts the
        # fabric on their path (rocewatch/alerting/job_paths.py)
        self.job_paths = JobPaths(topology)
        # RoCE configuration snapshots: change events, the checks' findings, alert annotations
        self.roce = ConfigWatch(topology, _lookback_s(self.config), stats=self.stats)
        self.actions: list[Action] = []
        self.rollups: Rollups | None = None
        self.rollups_coarse: Rollups | None = None
        self.set_rollups(rollup_s)
        self.detector_seconds = 0.0
        self.samples_in = 0
        # restored alerts that today's configuration no longer raises: resolved at the next step
        self._orphans: list[str] = []

    def set_rollups(self, rollup_s: int | None) -> None:
        """Metric rollups at ``rollup_s`` seconds plus a coarser level for dashboards over long
        ranges (storage keeps both), or none. Levels already at that resolution keep their
        partial aggregates (a restored pipeline)."""
        if rollup_s and self.rollups is not None and self.rollups.resolution_s == rollup_s:
            return
        self.rollups = Rollups(rollup_s) if rollup_s else None
        self.rollups_coarse = (
            Rollups(COARSE_ROLLUP_S) if rollup_s and rollup_s < COARSE_ROLLUP_S else None
        )

    # --- input -----------------------------------------------------------------------------------
    def ingest(self, samples: pl.DataFrame) -> None:
        self.samples_in += samples.height
        self.engine.add(samples)

    def ingest_config(self, kind: str, docs: list[Any]) -> None:
        """RoCE configuration records (``kind`` nic: ``nic_config.jsonl`` snapshots; switch:
        gnmic events of ``switch_config.jsonl``), applied on telemetry time as steps close."""
        add = self.roce.add_nic if kind == "nic" else self.roce.add_switch
        for d in docs:
            add(d)

    def advance(self, watermark_ns: int) -> Output:
        """Close and evaluate every step the watermark has passed."""
        return self._run(self.engine.close_until(watermark_ns))

    def finish(self) -> Output:
        out = self._run(self.engine.finish())
        out.config_changes += self.roce.advance(None)  # what came after the last step
        # the stream ended: alerts held for a late inhibiting source are decided now
        out.extend(self.decide_held())
        for level in self._rollup_levels():
            last = level.flush()
            if last is not None:
                out.rollups.append(last)
        return out

    def decide_held(self) -> Output:
        """Decide every alert held for a late inhibiting source now, as the input has ended
        or gone quiet (telemetry time no longer moves, so its wait would never end)."""
        out = Output()
        shown, hidden = self._alerting()[1].flush(self.lifecycle)
        for ev in shown:
            self.policy.on_alert(ev, self.policy.now)
        out.alerts += shown
        out.inhibited += hidden
        return out

    # --- evaluation ------------------------------------------------------------------------------
    def evaluate(self, steps: list[Step]) -> Output:
        """Evaluate steps closed elsewhere (the scale-out path), in time order."""
        return self._run(steps)

    def _run(self, steps: list[Step]) -> Output:
        out = Output()
        t0 = time.process_time()
        for step in steps:
            self.engine.enter(step)
            out.ranks += self.job_paths.learn(step.get(JOIN))
            out.config_changes += self.roce.advance(step.end)
            ctx = StepContext(
                self.engine,
                self.topology,
                step.start,
                step.end,
                firing=self._firing_labels,
                config_findings=self.roce.current,
            )
            events: list[Alert] = []
            if self._orphans:
                events += [
                    self.lifecycle.resolve(fp, step.end)
                    for fp in self._orphans
                    if fp in self.lifecycle.firing
                ]
                self._orphans = []
            domain = self.domain
            grouper, inhibitor = self._alerting()
            for det in self.detectors:
                # one alert per fault: grouped before the domain filter, so a storm's victims
                # are traced to their origin over everything this pipeline sees
                found = grouper.group(step.end, det.evaluate(ctx))
                if domain is not None:
                    found = self._in_domain(domain, found)
                found = self.interference.annotate(
                    self.engine, step.end, self.config.window.step_s, found
                )
                events += self.lifecycle.update(det.name, step.end, found)
            if events:
                self.job_paths.annotate(events, self.lifecycle.firing, self._firing_labels)
            if self.roce.recent:  # the configuration changes seen before each new alert
                self.roce.annotate(events, self.lifecycle.firing)
                self.roce.prune(step.end)
            # inhibited alerts are stored, never notified nor drained on
            shown, hidden = inhibitor.update(step.end, events, self.lifecycle)
            for ev in shown:
                self.policy.on_alert(ev, step.end)
            actions, incidents = self.policy.tick(step.end)
            for inc in incidents:
                self.lifecycle.add_external(inc)
            out.alerts += shown + list(incidents)
            out.inhibited += hidden
            out.actions += actions
            if self.retain:
                self.actions += actions
            levels = self._rollup_levels()
            # one partial frame per step, shared by every level
            partial = (
                Rollups._partial(step.frame, self.engine.series.ids(step))
                if levels and step.frame.height
                else None
            )
            for level in levels:
                r = level.add(step, partial)
                if r is not None:
                    out.rollups.append(r)
        out.steps = len(steps)
        self.detector_seconds += time.process_time() - t0
        return out

    def _in_domain(self, domain: str, found: list[Finding]) -> list[Finding]:
        """The findings this domain's pipeline speaks for: about a switch (its ``switch``
        label) or a node of the domain, or about no device (then labelled with the domain)."""
        mine = []
        for f in found:
            device = f.labels.get("switch") or f.labels.get("node")
            if device is None:
                mine.append(dataclasses.replace(f, labels={**f.labels, "domain": domain}))
            elif self.topology.domain_of(device) == domain:
                mine.append(f)
        return mine

    # --- state ---------------------------------------------------------------------------------
    @staticmethod
    def state_types() -> StateTypes:
        """The record types a pipeline's state may hold: those every part declares (each
        registered detector's, the window engine's, the lifecycle's, grouping's, inhibition's)."""
        parts: list[Any] = [
            WindowEngine,
            AlertLifecycle,
            StormGrouper,
            Inhibitor,
            JobPaths,
            ConfigWatch,
            *(e.detector for e in DETECTORS.values()),
        ]
        # (and the actions it retains, as the lifecycle retains its alerts)
        return StateTypes([Action, *(t for part in parts for t in part.STATE_TYPES)])

    def state(self) -> dict[str, Any]:
        """Every part's state, as data (never the parts: they are built from the configuration
        and topology at every start; ``restore`` lays this over them)."""
        return {
            "version": PIPELINE_STATE_VERSION,
            "engine": self.engine.state(),
            "detectors": {d.name: d.state() for d in self.detectors},
            "lifecycle": self.lifecycle.state(),
            "grouper": self.grouper.state(),
            "inhibitor": self.inhibitor.state(),
            "interference": self.interference.state(),
            "job_paths": self.job_paths.state(),
            "policy": self.policy.state(),
            "roce_config": self.roce.state(),
            "rollups": [r.state() for r in self._rollup_levels()],
            "stats": {
                "counts": dict(self.stats.counts),
                "detail": {k: dict(d) for k, d in self.stats.detail.items()},
            },
            "samples_in": self.samples_in,
            "detector_seconds": self.detector_seconds,
            # retained (replay, the demo) as the lifecycle's history is: empty in a service
            "actions": list(self.actions),
        }

    def restore(self, data: Mapping[str, Any]) -> dict[str, int]:
        """Lay ``state()`` of an earlier run over this pipeline, built from today's configuration
        and topology. What the configuration no longer has is dropped: the state of a detector
        now disabled (its open alerts resolve at the next step), the alerts and held drains of
        nodes and switches no longer in the topology. A detector newly enabled, a node newly
        added start fresh. Returns what was dropped, counted (also in ``stats``).

        ``StateMismatch`` (a ``ValueError``) for a state of another layout or step length: the
        caller starts afresh."""
        if data.get("version") != PIPELINE_STATE_VERSION:
            raise StateMismatch(f"pipeline state version {data.get('version')!r}")
        self.engine.restore(data["engine"])
        dropped: dict[str, int] = {}
        states = data["detectors"]
        enabled = {d.name for d in self.detectors}
        for det in self.detectors:
            st = states.get(det.name)
            if st is not None:
                det.restore(st)
        if n := len(set(states) - enabled):
            dropped["state_ignored_disabled_detectors"] = n
        self.lifecycle.restore(data["lifecycle"])
        self.grouper.restore(data["grouper"])
        self.inhibitor.restore(data["inhibitor"])
        if "interference" in data:  # (a checkpoint from before it had none)
            self.interference.restore(data["interference"])
        if "job_paths" in data:
            self.job_paths.restore(data["job_paths"])
        else:  # written before the join on alerts: its firing alerts get what it adds
            self.job_paths.fill(self.lifecycle.firing, self._firing_labels)
        if "roce_config" in data:  # (a state from before configuration was streamed has none)
            self.roce.restore(data["roce_config"])
        try:
            self.policy.restore(data["policy"])
        except ConfigError as e:
            raise StateMismatch(str(e)) from e
        for level, st in zip(self._rollup_levels(), data.get("rollups") or [], strict=False):
            level.restore(st)
        st_stats = data.get("stats") or {}
        self.stats.counts.update(st_stats.get("counts", {}))
        for k, d in (st_stats.get("detail") or {}).items():
            self.stats.detail.setdefault(k, Counter()).update(d)
        if self.retain:
            self.actions = list(data.get("actions") or [])
        self.samples_in = int(data.get("samples_in", 0))
        self.detector_seconds = float(data.get("detector_seconds", 0.0))
        # alerts whose detector is off now, or whose entity left the topology, resolve at the
        # next step (their resolution is notified: they are not silently forgotten)
        for fp, owner in self.lifecycle.owner.items():
            a = self.lifecycle.firing.get(fp)
            gone = a is not None and not self._in_topology(a.labels)
            if (owner in DETECTORS and owner not in enabled) or gone:
                self._orphans.append(fp)
        if self._orphans:
            dropped["restored_alerts_resolved"] = len(self._orphans)
        if n := self.policy.forget_nodes(set(self.topology.nodes)):
            dropped["restored_drains_dropped"] = n
        for k, n in dropped.items():
            self.stats.inc(k, n)
        if dropped:
            log.info(
                "restored state: dropped what today's configuration no longer has: %s", dropped
            )
        return dropped

    def _in_topology(self, labels: Mapping[str, str]) -> bool:
        """Whether the node or switch an alert is about is in the topology (an alert about
        no device, a scope, always is)."""
        node, switch = labels.get("node"), labels.get("switch")
        if node is not None and node not in self.topology.nodes:
            return False
        return switch is None or switch in self.topology.switches

    def operator_tick(self) -> Output:
        """Let the policy act at once on an operator's command, without waiting for telemetry."""
        out = Output()
        actions, incidents = self.policy.tick(self.policy.now)
        for inc in incidents:
            self.lifecycle.add_external(inc)
        out.alerts += list(incidents)
        out.actions += actions
        if self.retain:
            self.actions += actions
        return out

    def _rollup_levels(self) -> list[Rollups]:
        levels = [self.rollups, self.rollups_coarse]
        return [r for r in levels if r is not None]

    def _alerting(self) -> tuple[StormGrouper, Inhibitor]:
        """The grouping and inhibition stages."""
        return self.grouper, self.inhibitor

    def _firing_labels(self) -> list[Mapping[str, str]]:
        """The alerts firing now as the detectors that read them know them: a grouped alert
        (a storm's victims, a switch's origin ports) as one label set per member."""
        out: list[Mapping[str, str]] = []
        for a in self.lifecycle.firing.values():
            by = a.annotations.get(INHIBITED_BY)
            if by is None:
                out += views(a.labels, a.annotations)
            else:  # explained by another alert: said so, for who counts faults (incidents)
                out += [{**v, INHIBITED_BY: by} for v in views(a.labels, a.annotations)]
        return out

    def all_alerts(self) -> list[Alert]:
        """Every alert instance that fired, in its current state, by start time, but those
        inhibited for their whole life (``inhibited_alerts``): what ``alerts.jsonl`` holds."""
        return [a for a in self.lifecycle.all_alerts() if INHIBITED_BY not in a.annotations]

    def inhibited_alerts(self) -> list[Alert]:
        """Alert instances inhibited for their whole life so far (``inhibited.jsonl``)."""
        return [a for a in self.lifecycle.all_alerts() if INHIBITED_BY in a.annotations]
