"""Detectors by their config name (the type name in config equals the module name)."""

from __future__ import annotations

from typing import Any

from detectors.base import Detector
from detectors.ecn_congestion import EcnCongestionConfig, EcnCongestionDetector
from detectors.fabric_incident import FabricIncidentConfig, FabricIncidentDetector
from detectors.flaky_link import FlakyLinkConfig, FlakyLinkDetector
from detectors.isolation_forest import IsolationForestConfig, IsolationForestDetector
from detectors.pcie_downgrade import PcieDowngradeConfig, PcieDowngradeDetector
from detectors.pfc_storm import PfcStormConfig, PfcStormDetector
from detectors.queue_buildup import QueueBuildupConfig, QueueBuildupDetector
from detectors.straggler import StragglerConfig, StragglerDetector
from detectors.transport_errors import TransportErrorsConfig, TransportErrorsDetector
from rocewatch.topology import Topology

DETECTORS: dict[str, tuple[type[Any], type[Any]]] = {
    "pfc_storm": (PfcStormDetector, PfcStormConfig),
    "ecn_congestion": (EcnCongestionDetector, EcnCongestionConfig),
    "queue_buildup": (QueueBuildupDetector, QueueBuildupConfig),
    "transport_errors": (TransportErrorsDetector, TransportErrorsConfig),
    "flaky_link": (FlakyLinkDetector, FlakyLinkConfig),
    "pcie_downgrade": (PcieDowngradeDetector, PcieDowngradeConfig),
    "straggler": (StragglerDetector, StragglerConfig),
    "fabric_incident": (FabricIncidentDetector, FabricIncidentConfig),
    "isolation_forest": (IsolationForestDetector, IsolationForestConfig),
}

# Detectors that read the alerts firing (``StepContext.firing``) besides telemetry: they run
# after every other detector of the step, whatever their place above, so they see this step's
# alerts. Which alert silences which other is not detector knowledge: inhibit rules
# (rocewatch/alerting/inhibit.py, docs/alerting.md) decide what is notified and drained on.
READS_ALERTS = frozenset({"fabric_incident", "isolation_forest"})

# the alertname each detector raises (docs/formats.md section 6)
ALERTNAMES: dict[str, str] = {
    "pfc_storm": "PFCStorm",
    "ecn_congestion": "ECNCongestion",
    "queue_buildup": "QueueBuildup",
    "transport_errors": "TransportErrors",
    "flaky_link": "FlakyLink",
    "pcie_downgrade": "PCIeDowngrade",
    "straggler": "Straggler",
    "fabric_incident": "FabricIncident",
    "isolation_forest": "PortAnomaly",
}


def _enabled(configs: dict[str, Any]) -> list[tuple[type[Any], Any]]:
    """(class, config) of every enabled detector, in registry order, those that read the
    alerts firing last."""
    out = []
    for _, (cls, cfg_cls) in sorted(
        DETECTORS.items(), key=lambda kv: kv[0] in READS_ALERTS
    ):  # (a stable sort: registry order otherwise)
        cfg = configs.get(cls.name) or cfg_cls()
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
        if not (fed and cls is IsolationForestDetector)
        for m in cls.reads
    )
