"""What every detector shares: the step context it reads and the findings it returns."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from detectors.windows import WindowEngine
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import Finding
from rocewatch.core.topology import Topology


@dataclass
class StepContext:
    engine: WindowEngine
    topology: Topology
    start: int
    end: int
    # label sets of the alerts firing now, those raised earlier in this step included (the
    # pipeline fills it; None where no alert lifecycle runs)
    firing: Callable[[], Iterable[Mapping[str, str]]] | None = None
    # the RoCE configuration checks' findings now (rocewatch/roce/watch.py: each a
    # ``Finding.to_dict()`` of rocewatch/roce/checks.py plus ``since``); None without configuration
    config_findings: Callable[[], Iterable[Mapping[str, Any]]] | None = None


class Detector(Protocol):
    name: str
    # every metric it reads from the window engine: the scale-out aggregate stage sends the
    # detect stage only the metrics some enabled detector reads
    reads: ClassVar[frozenset[str]]

    # the record types its state holds (rocewatch.core.state.Stateful)
    STATE_TYPES: ClassVar[tuple[type, ...]]

    def evaluate(self, ctx: StepContext) -> list[Finding]:
        """Every condition that holds at the step that just closed."""
        ...

    def state(self) -> dict[str, Any]:
        """What it learned and holds, as data (never its configuration nor topology)."""
        ...

    def restore(self, data: dict[str, Any]) -> None:
        """Lay ``state()`` of an earlier run over this detector, built from today's config."""
        ...


def node_labels(topology: Topology, node: str, nic: str | None = None) -> dict[str, str]:
    """Entity labels for a node (and NIC), with job, tenant and rail where the topology knows."""
    labels = {"node": node}
    if nic is not None:
        labels["nic"] = nic
        rail = topology.nic_rail(node, nic)
        if rail is not None:
            labels["rail"] = str(rail)
    jobs = topology.node_jobs.get(node)
    if jobs:
        labels["job"] = jobs[0]
        tenant = topology.jobs[jobs[0]].tenant
        if tenant:
            labels["tenant"] = str(tenant)
    return labels


def port_labels(topology: Topology, switch: str, port: str) -> dict[str, str]:
    labels = {"switch": switch, "port": port}
    sw = topology.switches.get(switch)
    if sw is not None and sw.rail is not None:
        labels["rail"] = str(sw.rail)
    return labels


def check_positive_numbers(config: Any, where: str, skip: tuple[str, ...] = ("enabled",)) -> None:
    """Every field of a config dataclass (but ``skip``) must be a finite number > 0."""
    for f in dataclasses.fields(config):
        if f.name in skip:
            continue
        v = getattr(config, f.name)
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
            raise ConfigError(f"{where}: {f.name}: {v!r} is not a number")
        if v <= 0:
            raise ConfigError(f"{where}: {f.name}: must be > 0, not {v!r}")


def pct(x: float) -> str:
    return f"{100.0 * x:.1f}%"
