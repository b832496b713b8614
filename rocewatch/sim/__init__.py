"""The fabric simulator: telemetry of a RoCE v2 GPU fabric with injected faults and ground truth.

>>> from rocewatch.sim import SimConfig, Simulator, PfcStorm
>>> sim = Simulator(SimConfig(nodes=4, duration_s=1.0, faults=(PfcStorm(onset_s=0.2),)))
>>> [f["kind"] for f in sim.truth()["faults"]]
['PfcStorm']
"""

from rocewatch.sim.fabric import Fabric, JobSpec, build_topology
from rocewatch.sim.faults import (
    FAULT_KINDS,
    AgentGap,
    CounterClear,
    EcnIncast,
    Fault,
    FlakyLink,
    PcieDowngrade,
    PfcStorm,
    QueueBuildup,
    SlowGpu,
    Straggler,
    TenantIncast,
    TransportErrors,
)
from rocewatch.sim.simulator import (
    Readings,
    SimConfig,
    Simulator,
    Tick,
    config_from_dict,
    config_to_dict,
)
from rocewatch.sim.writers import write_scenario

__all__ = [
    "FAULT_KINDS",
    "AgentGap",
    "CounterClear",
    "EcnIncast",
    "Fabric",
    "Fault",
    "FlakyLink",
    "JobSpec",
    "PcieDowngrade",
    "PfcStorm",
    "QueueBuildup",
    "Readings",
    "SimConfig",
    "Simulator",
    "SlowGpu",
    "Straggler",
    "TenantIncast",
    "Tick",
    "TransportErrors",
    "build_topology",
    "config_from_dict",
    "config_to_dict",
    "write_scenario",
]
