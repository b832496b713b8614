"""Detectors by their config name (the type name in config equals the module name)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from detectors.base import Detector
from detectors.bus_bandwidth_drop import BusBandwidthDropConfig, BusBandwidthDropDetector
from detectors.ecmp_imbalance import EcmpImbalanceConfig, EcmpImbalanceDetector
from detectors.ecn_congestion import EcnCongestionConfig, EcnCongestionDetector
from detectors.fabric_incident import FabricIncidentConfig, FabricIncidentDetector
from detectors.flaky_link import FlakyLinkConfig, FlakyLinkDetector
from detectors.isolation_forest import IsolationForestConfig, IsolationForestDetector
from detectors.pcie_downgrade import PcieDowngradeConfig, PcieDowngradeDetector
from detectors.pfc_storm import PfcStormConfig, PfcStormDetector
from detectors.queue_buildup import QueueBuildupConfig, QueueBuildupDetector
from detectors.roce_config_mismatch import RoceConfigMismatchConfig, RoceConfigMismatchDetector
from detectors.slow_edge import SlowEdgeConfig, SlowEdgeDetector
from detectors.slow_rank import SlowRankConfig, SlowRankDetector
from detectors.straggler import StragglerConfig, StragglerDetector
from detectors.transport_errors import TransportErrorsConfig, TransportErrorsDetector
from rocewatch.core.model import (
    BUS_BANDWIDTH_DROP,
    ECMP_IMBALANCE,
    ECN_CONGESTION,
    FABRIC_INCIDENT,
    FLAKY_LINK,
    PCIE_DOWNGRADE,
    PFC_STORM,
    PORT_ANOMALY,
    QUEUE_BUILDUP,
    ROCE_CONFIG_MISMATCH,
    SLOW_EDGE,
    SLOW_RANK,
    STRAGGLER,
    TRANSPORT_ERRORS,
)
from rocewatch.core.topology import Topology


@dataclass(frozen=True)
class Entry:
    """What the rest of rocewatch knows of one detector: all of it is here.

    ``name`` (the key) is its module's name and its config section (``detectors.<name>``);
    ``config`` its frozen config dataclass, validated when built from the file; ``alertname``
    what it raises (CONTRACTS.md section 6); ``STATE_TYPES`` on the class what its state
    holds. ``reads_alerts``: it reads the alerts firing (``StepContext.firing``) besides
    telemetry, so it runs after every other detector of the step. ``domain_aware``: it is
    told the fabric domain its pipeline runs for (``domain``). ``stage1_feed``: in the
    scale-out service it takes per-window values made by stage 1 (``feed_from_stage1`` /
    ``offer``) instead of reading the steps' rows of its own metrics. Which alert inhibits which
    is not detector knowledge: inhibit rules (rocewatch/alerting/inhibit.py) decide that.
    """

    detector: type[Any]
    config: type[Any]
    alertname: str
    reads_alerts: bool = False
    domain_aware: bool = False
    stage1_feed: bool = False


DETECTORS: dict[str, Entry] = {
    "pfc_storm": Entry(PfcStormDetector, PfcStormConfig, PFC_STORM, domain_aware=True),
    "ecn_congestion": Entry(EcnCongestionDetector, EcnCongestionConfig, ECN_CONGESTION),
    "queue_buildup": Entry(QueueBuildupDetector, QueueBuildupConfig, QUEUE_BUILDUP),
    "transport_errors": Entry(TransportErrorsDetector, TransportErrorsConfig, TRANSPORT_ERRORS),
    "flaky_link": Entry(FlakyLinkDetector, FlakyLinkConfig, FLAKY_LINK),
    "ecmp_imbalance": Entry(EcmpImbalanceDetector, EcmpImbalanceConfig, ECMP_IMBALANCE),
    "pcie_downgrade": Entry(PcieDowngradeDetector, PcieDowngradeConfig, PCIE_DOWNGRADE),
    "straggler": Entry(StragglerDetector, StragglerConfig, STRAGGLER),
    "roce_config_mismatch": Entry(
        RoceConfigMismatchDetector, RoceConfigMismatchConfig, ROCE_CONFIG_MISMATCH
    ),
    "slow_rank": Entry(SlowRankDetector, SlowRankConfig, SLOW_RANK, reads_alerts=True),
    "slow_edge": Entry(SlowEdgeDetector, SlowEdgeConfig, SLOW_EDGE, reads_alerts=True),
    "bus_bandwidth_drop": Entry(
        BusBandwidthDropDetector, BusBandwidthDropConfig, BUS_BANDWIDTH_DROP, reads_alerts=True
    ),
    "fabric_incident": Entry(
        FabricIncidentDetector, FabricIncidentConfig, FABRIC_INCIDENT, reads_alerts=True
    ),
    "isolation_forest": Entry(
        IsolationForestDetector,
        IsolationForestConfig,
        PORT_ANOMALY,
        reads_alerts=True,
        stage1_feed=True,
    ),
}

# the alertname each detector raises (docs/formats.md section 6)
ALERTNAMES: dict[str, str] = {name: e.alertname for name, e in DETECTORS.items()}


def entry_of(det: Any) -> Entry:
    """The registry entry of a built detector (by its ``name``, the config section)."""
    return DETECTORS[det.name]


def _enabled(configs: dict[str, Any]) -> list[tuple[type[Any], Any]]:
    """(class, config) of every enabled detector, in registry order, those that read the
    alerts firing last."""
    out = []
    for name, e in sorted(
        DETECTORS.items(), key=lambda kv: kv[1].reads_alerts
    ):  # (a stable sort: registry order otherwise)
        cls = e.detector
        cfg = configs.get(name) or e.config()
        if getattr(cfg, "enabled", True) is not False:
            out.append((cls, cfg))
    return out


def build_detectors(topology: Topology, configs: dict[str, Any]) -> list[Detector]:
    """One detector per registry entry, configured from ``configs[name]`` (a config dataclass)."""
    return [cls(topology, cfg) for cls, cfg in _enabled(configs)]


def metrics_read(configs: dict[str, Any], fed: bool = False) -> frozenset[str]:
    """Every metric an enabled detector reads (``Detector.reads``): what the detect stage needs
    of a step; the other metrics serve rollups and dashboards only. ``fed``: the isolation
    forest's window values come from the aggregate stage (scale-out), so its own reads count
    only where a rule detector shares them."""
    return frozenset(
        m
        for cls, _ in _enabled(configs)
        if not (fed and DETECTORS[cls.name].stage1_feed)
        for m in cls.reads
    )
