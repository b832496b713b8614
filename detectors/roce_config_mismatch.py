"""RoCEConfigMismatch: a RoCE configuration check that fails on a cable, as an alert of its own.

The checks themselves (``rocewatch/roce/checks.py``, the same as ``rocewatch check roce``) run
on the configuration snapshots in the stream (``rocewatch/roce/watch.py``), whenever a snapshot
changes something; this detector reads their current findings from the step
(``StepContext.config_findings``) and raises one alert per finding: one check on one cable,
labelled with ``check`` and both ends (``node``/``nic`` and ``switch``/``port`` for a NIC's
cable, ``switch``/``port`` and ``peer`` for a switch-to-switch cable), its severity the check's
(error -> critical). It fires at the telemetry time of the snapshot that made the finding, and
resolves once a snapshot shows the configuration fixed. It inhibits nothing and drains nothing:
a wrong setting is a cause to fix, not a culprit to take out of service.

``changes_lookback_s`` is read by the pipeline, not by this detector: how long before an alert
(any alert) a configuration change on its entities is named in its annotations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from detectors.base import Finding, StepContext, check_positive_numbers
from rocewatch.core.model import ROCE_CONFIG_MISMATCH
from rocewatch.core.state import Stateful
from rocewatch.core.topology import Topology

ALERTNAME = ROCE_CONFIG_MISMATCH
SEVERITY = {"error": "critical", "warning": "warning", "info": "info"}
LEVELS = ("info", "warning", "error")


@dataclass(frozen=True)
class RoceConfigMismatchConfig:
    enabled: bool = True
    # the least severe check finding raised as an alert: info | warning | error
    min_severity: str = "info"
    # how long before an alert's start a configuration change on its entities is named in it
    changes_lookback_s: float = 600.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        from rocewatch.core.errors import ConfigError

        if self.min_severity not in LEVELS:
            raise ConfigError(
                f"roce_config_mismatch: min_severity: {self.min_severity!r} is not one of "
                f"{', '.join(LEVELS)}"
            )
        check_positive_numbers(self, "roce_config_mismatch", skip=("enabled", "min_severity"))


def end_labels(topology: Topology, ends: list[str]) -> dict[str, str]:
    """Labels naming both ends of a finding's cable ("device/port" each)."""
    labels: dict[str, str] = {}
    named = [e.split("/", 1) for e in ends if e and "/" in e]
    for device, port in named:
        if device in topology.nodes and "node" not in labels:
            labels["node"], labels["nic"] = device, port
        elif "switch" not in labels:
            labels["switch"], labels["port"] = device, port
        else:
            labels["peer"] = f"{device}/{port}"
    return labels


@dataclass
class RoceConfigMismatchDetector(Stateful):
    topology: Topology
    config: RoceConfigMismatchConfig = field(default_factory=RoceConfigMismatchConfig)
    name: str = "roce_config_mismatch"
    reads: ClassVar[frozenset[str]] = frozenset()  # configuration, not telemetry
    STATE_TYPES: ClassVar[tuple[type, ...]] = ()

    def evaluate(self, ctx: StepContext) -> list[Finding]:
        if ctx.config_findings is None:
            return []
        least = LEVELS.index(self.config.min_severity)
        out = []
        for f in ctx.config_findings():
            sev = str(f.get("severity", ""))
            if sev not in LEVELS or LEVELS.index(sev) < least:
                continue
            out.append(self._finding(f, sev))
        return out

    def _finding(self, f: Mapping[str, Any], sev: str) -> Finding:
        ends = [str(e) for e in f.get("ends", ())]
        labels = {"check": str(f["check"]), **end_labels(self.topology, ends)}
        both = " and ".join(e for e in ends if e) or "the fabric"
        return Finding(
            ALERTNAME,
            labels,
            SEVERITY[sev],
            int(f.get("since", 0)),
            f"RoCE configuration mismatch ({f['check']}) between {both}",
            str(f.get("message", "")),
            description=f"{f.get('message', '')}: {f.get('consequence', '')}",
            extra={
                "ends": ", ".join(ends),
                "consequence": str(f.get("consequence", "")),
                "fix": str(f.get("fix", "")),
            },
        )
