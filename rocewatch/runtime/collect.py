"""`rocewatch collect` and `rocewatch topology discover`: the gNMI collector as a program."""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from collector.gnmi.client import Collector
from collector.gnmi.config import GnmiConfig, SubscriptionConfig, TargetConfig, gnmi_config
from collector.gnmi.lldp import cabling_problems, discover
from collector.output import LinesOutput, json_lines
from rocewatch.config import Config
from rocewatch.core.errors import ConfigError
from rocewatch.core.topology import Topology

log = logging.getLogger(__name__)


def parse_targets(specs: list[str]) -> list[TargetConfig]:
    """``NAME=HOST:PORT`` (or ``HOST:PORT``, named by itself) from the command line."""
    out = []
    for s in specs:
        name, sep, addr = s.partition("=")
        if not sep:
            name, addr = s, s
        out.append(TargetConfig(name, addr, target=name if sep else None))
    return out


def _targets(
    cfg: Config, topology: Topology | None, extra: list[str]
) -> tuple[GnmiConfig, list[TargetConfig]]:
    gcfg = gnmi_config(cfg.gnmi)
    targets = {t.name: t for t in gcfg.all_targets(topology)}
    for t in parse_targets(extra):
        targets[t.name] = gcfg.resolved(t)
    if not targets:
        raise ConfigError(
            "no gNMI targets: list them under gnmi.targets, pass --target NAME=HOST:PORT, "
            "or set gnmi.targets_from_topology with switch addresses in the topology"
        )
    return gcfg, list(targets.values())


def _discard(df: pl.DataFrame) -> None:
    pass


def run_collect(
    cfg: Config,
    topology: Topology | None,
    extra_targets: list[str],
    out: Path | None,
    duration: float = 0.0,
    cabling_every_s: float = 30.0,
    shard_group: str | None = None,
) -> int:
    """Collect until ``duration`` seconds pass (0: until SIGTERM/SIGINT); returns 0.

    With ``shard_group``, this instance collects only its share of the targets, shared with the
    other instances of the group through Kafka (collector/gnmi/shard.py).
    """
    gcfg, targets = _targets(cfg, topology, extra_targets)
    publisher: Any = None
    events: LinesOutput[list[dict[str, Any]]] | None = None
    sink: Callable[[pl.DataFrame], None]
    if out is not None:
        # gnmic's event format, which replay reads; the samples themselves go nowhere
        events = LinesOutput(out, json_lines)
        sink = _discard
    else:
        from rocewatch.bus.publish import TelemetryPublisher
        from rocewatch.bus.topics import ensure_topics

        ensure_topics(cfg.kafka)
        sink = publisher = TelemetryPublisher(cfg.kafka, source="gnmi")

    registry = None
    if cfg.metrics_port:
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry()
        if publisher is not None:
            from rocewatch.core.metrics import ReadOnScrape

            registry.register(ReadOnScrape(publisher.readings))
        start_http_server(cfg.metrics_port, registry=registry)
    shard = None
    if shard_group:
        from collector.gnmi.shard import KafkaSharding

        col = Collector(gcfg, sink, [], event_sink=events, registry=registry)
        shard = KafkaSharding(cfg.kafka, col, targets, shard_group)
    else:
        col = Collector(gcfg, sink, targets, event_sink=events, registry=registry)
    # the switches' RoCE configuration, on a subscription of its own, to kafka.topics.config
    config_col: Any = None
    config_out: Any = None
    if gcfg.config_subscription is not None:
        if out is not None or shard is not None:
            log.warning("gnmi.config_subscription: sent to Kafka only, and not with --shard-group")
        else:
            from collector.gnmi.config_events import config_collector

            config_col, config_out = config_collector(gcfg, targets, cfg.kafka)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    reported: set[str] = set()
    t_end = time.monotonic() + duration if duration > 0 else None
    log.info("collecting from %d gNMI targets", len(targets))
    col.start()
    if config_col is not None:
        config_col.start()
    try:
        next_check = time.monotonic() + min(cabling_every_s, 1.0)
        while not stop.wait(0.0 if shard is not None else 0.5):
            if shard is not None:
                shard.poll(500)
            now = time.monotonic()
            if t_end is not None and now >= t_end:
                break
            if topology is not None and now >= next_check:
                next_check = now + cabling_every_s
                for line in cabling_problems(topology, col.lldp):
                    if line not in reported:
                        reported.add(line)
                        col.stats.inc("cabling_mismatches")
                        log.warning("miscabled: %s", line)
            col.export_unknown_paths()
    finally:
        if shard is not None:
            shard.close()
        col.stop()
        if config_col is not None:
            config_col.stop()
            config_out.close()
        if publisher is not None:
            publisher.close()
        if events is not None:
            events.close()
    for name, h in sorted(col.health().items()):
        print(
            f"{name}: {h.state}, {h.updates} updates, {h.subscribes} subscribes, "
            f"{h.reconnects} reconnects{', last error: ' + h.last_error if h.last_error else ''}"
        )
    if topology is not None:
        for line in cabling_problems(topology, col.lldp):
            print(f"miscabled: {line}")
    unknown = col.stats.detail.get("gnmi_unknown_paths", Counter())
    if unknown:
        print(
            "unknown paths (counted, skipped): "
            + ", ".join(f"{p}={n}" for p, n in unknown.most_common(10))
        )
    return 0


def run_discover(
    cfg: Config,
    topology: Topology | None,
    extra_targets: list[str],
    out: Path,
    timeout: float = 30.0,
) -> int:
    """Subscribe ONCE to every target's LLDP neighbours and write a topology file."""
    gcfg, targets = _targets(cfg, topology, extra_targets)
    once = SubscriptionConfig(
        name="lldp", mode="once", paths=("/lldp/interfaces/interface/neighbors",)
    )
    targets = [dataclasses.replace(t, subscription=once) for t in targets]
    col = Collector(gcfg, lambda df: None, targets)
    col.start()
    ended = col.wait(timeout)
    col.stop()
    failed = [h for h in col.health().values() if h.state != "done"]
    for h in failed:
        print(f"{h.name}: no LLDP answer ({h.last_error or 'timed out'})")
    if not ended and len(failed) == len(targets):
        raise ConfigError("no target answered the LLDP subscription")
    doc = discover(
        col.lldp,
        {t.name: t.address for t in targets},
        fabric=topology.fabric if topology else "discovered",
        base=topology,
    )
    Topology.from_dict(doc)  # what we write must load
    out.write_text(yaml.safe_dump(doc, sort_keys=False, width=120))
    print(
        f"wrote {out}: {len(doc['switches'])} switches, {len(doc['links'])} links, "
        f"{len(doc['nodes'])} nodes"
    )
    if topology is not None:
        for line in cabling_problems(topology, col.lldp):
            print(f"differs from the topology in use: {line}")
    return 0 if not failed else 1
