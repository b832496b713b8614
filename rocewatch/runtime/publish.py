"""Recorded telemetry onto the telemetry topic, as the collectors would send it: the
`rocewatch publish` command (a scenario directory, replay's input, streamed to Kafka)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from rocewatch.bus.publish import TelemetryPublisher, time_slices
from rocewatch.bus.topics import ensure_topics
from rocewatch.config import Config
from rocewatch.core.errors import ConfigError
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology
from rocewatch.sources import merged, scenario_sources

log = logging.getLogger(__name__)


def publish_scenario(scenario: Path, cfg: Config, rate: float = 0.0) -> int:
    """Send a scenario directory's recorded telemetry to Kafka (the collectors' side)."""
    topology = Topology.load(scenario / "topology.yaml")
    stats = Stats()
    sources = scenario_sources(scenario, topology, stats)
    if not sources:
        raise ConfigError(f"{scenario}: no telemetry to publish")
    ensure_topics(cfg.kafka)
    pub = TelemetryPublisher(cfg.kafka, source=f"publish:{scenario.name}")
    t_wall0 = time.monotonic()
    t_tel0: int | None = None
    try:
        for df, _wm in merged(sources, 0):
            if df.height == 0:
                continue
            if rate <= 0:
                pub.publish(df)
                continue
            # paced one time slice at a time, as collectors send: a whole read-ahead batch
            # (seconds of telemetry) at once, then silence, would let partitions go idle and
            # flush between batches, and the next batch's first samples would come late
            for part in time_slices(df):
                lo = int(part["ts"].min())  # type: ignore[arg-type]
                t_tel0 = lo if t_tel0 is None else t_tel0
                ahead = (lo - t_tel0) / 1e9 / rate - (time.monotonic() - t_wall0)
                if ahead > 0:
                    time.sleep(ahead)
                pub.publish(part)
        pub.close()
    finally:
        for s in sources:
            s.close()
    if stats.counts:
        log.info("publish skipped input: %s", dict(stats.counts))
    if pub.dropped_samples:
        log.warning(
            "publish buffer was full: dropped %d samples in %d messages",
            pub.dropped_samples,
            pub.dropped_messages,
        )
    return pub.samples - pub.dropped_samples
