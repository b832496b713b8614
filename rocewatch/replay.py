"""`rocewatch replay`: run recorded telemetry through the live pipeline on telemetry time.

Writes ``alerts.jsonl`` (every alert that fired, final state), ``inhibited.jsonl`` (alerts an
inhibit rule suppressed for their whole life, with ``annotations.inhibited_by``) and
``actions.jsonl``: docs/formats/replay.md; ``config_changes.jsonl``: the RoCE configuration
changes its ``nic_config.jsonl`` / ``switch_config.jsonl`` snapshots showed
(docs/roce_config.md)."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from rocewatch.config import Config
from rocewatch.core.errors import ConfigError
from rocewatch.core.progress import Progress
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology
from rocewatch.pipeline import ROLLUP_S, Output, Pipeline
from rocewatch.roce.watch import load_recorded
from rocewatch.runtime.outputs import OutputWriter
from rocewatch.sources import merged, scenario_sources

log = logging.getLogger(__name__)


@dataclass
class ReplayResult:
    alerts: list[dict[str, Any]]
    actions: list[dict[str, Any]]
    samples: int
    seconds: float
    stats: dict[str, Any] = field(default_factory=dict)
    inhibited: list[dict[str, Any]] = field(default_factory=list)
    config_changes: list[dict[str, Any]] = field(default_factory=list)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("wb") as fh:
        for r in rows:
            fh.write(orjson.dumps(r))
            fh.write(b"\n")
    tmp.replace(path)


def replay(
    scenario: Path,
    out_dir: Path,
    config: Config | None = None,
    show_progress: bool = False,
    store: Any = None,
    model: Path | None = None,
) -> ReplayResult:
    """``model``: an isolation-forest model file to score with instead of learning a baseline."""
    config = config or Config()
    if model is not None:
        from detectors.isolation_forest import IsolationForestConfig

        forest = config.detectors.get("isolation_forest") or IsolationForestConfig()
        forest = dataclasses.replace(forest, model_path=str(model))
        config = dataclasses.replace(
            config, detectors={**config.detectors, "isolation_forest": forest}
        )
    if not scenario.is_dir():
        raise ConfigError(f"{scenario}: not a scenario directory")
    topo_path = scenario / "topology.yaml"
    if not topo_path.exists():
        raise ConfigError(f"{scenario}: no topology.yaml")
    topology = Topology.load(topo_path)
    stats = Stats()
    try:
        sources = scenario_sources(scenario, topology, stats, config.window)
    except OSError as e:  # a recording that cannot be opened (a directory, no permission)
        raise ConfigError(f"{e.filename or scenario}: cannot read: {e.strerror or e}") from e
    if not sources:
        raise ConfigError(f"{scenario}: no telemetry (switch.jsonl, nic.jsonl or int.pcap)")
    out_dir.mkdir(parents=True, exist_ok=True)
    if store is not None and store.topology is None:
        store.topology = topology  # incident graphs follow the pause over its cables
    pipeline = Pipeline(
        topology, config, stats=stats, rollup_s=ROLLUP_S if store is not None else None
    )
    # RoCE configuration snapshots, applied as telemetry time passes them
    load_recorded(pipeline.roce, scenario)
    total = sum(s.bytes_total for s in sources)
    bar = Progress("replay", total, unit="B", enabled=show_progress)
    t0 = time.perf_counter()
    notifier = None
    if config.notify.enabled:
        from rocewatch.runtime.notifier import open_dispatcher

        notifier = open_dispatcher(config, store)
    if notifier is not None:
        notifier.start()

    writer = OutputWriter(store, notifier)
    changes: list[dict[str, Any]] = []

    def sink(out: Output) -> None:
        writer.write(
            out.alerts,
            out.inhibited,
            out.actions,
            out.rollups,
            out.ranks,
            config_changes=out.config_changes,
        )
        changes.extend(c.to_json() for c in out.config_changes)

    try:
        for df, wm in merged(sources, pipeline.engine.lateness_ns()):
            if df.height:
                pipeline.ingest(df)
            if wm >= 0:
                sink(pipeline.advance(wm))
            bar.update(sum(s.position() for s in sources))
        sink(pipeline.finish())
    finally:
        for s in sources:
            s.close()
        bar.close()
        if notifier is not None:
            notifier.stop()
    if notifier is not None:
        if not notifier.drain(config.notify.drain_timeout_s):
            log.warning(
                "notify: %d events still undelivered in the outbox; `rocewatch notify` "
                "delivers them",
                notifier.depth(),
            )
        if notifier.outbox.store is not store:
            notifier.outbox.store.close()
    alerts = [a.to_json() for a in pipeline.all_alerts()]
    inhibited = [a.to_json() for a in pipeline.inhibited_alerts()]
    actions = [a.to_json() for a in pipeline.actions]
    write_jsonl(out_dir / "alerts.jsonl", alerts)
    write_jsonl(out_dir / "inhibited.jsonl", inhibited)
    write_jsonl(out_dir / "actions.jsonl", actions)
    write_jsonl(out_dir / "config_changes.jsonl", changes)
    if store is not None:
        writer.store_final(pipeline.all_alerts() + pipeline.inhibited_alerts())
    return ReplayResult(
        alerts,
        actions,
        pipeline.samples_in,
        time.perf_counter() - t0,
        stats.as_dict(),
        inhibited,
        changes,
    )
