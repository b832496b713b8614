"""Detectors by their config name (the type name in config equals the module name)."""

from __future__ import annotations

from typing import Any

from detectors.base import Detector
from detectors.pfc_storm import PfcStormConfig, PfcStormDetector
from rocewatch.topology import Topology

DETECTORS: dict[str, tuple[type[Any], type[Any]]] = {
    "pfc_storm": (PfcStormDetector, PfcStormConfig),
}


def build_detectors(topology: Topology, configs: dict[str, Any]) -> list[Detector]:
    """One detector per registry entry, configured from ``configs[name]`` (a config dataclass)."""
    out: list[Detector] = []
    for name, (cls, cfg_cls) in DETECTORS.items():
        cfg = configs.get(name) or cfg_cls()
        if getattr(cfg, "enabled", True) is False:
            continue
        out.append(cls(topology, cfg))
    return out
