"""A simulated run's configuration: the fabric, the workload, the faults, how the sources read.

``SimConfig`` is the one value the simulator runs from; ``config_to_dict``/``config_from_dict``
are its ``scenario.json`` form and ``validate`` lists everything wrong with one at once.

>>> cfg = SimConfig(nodes=2, nics_per_node=2, spines=1, duration_s=0.3)
>>> cfg.n_ticks, cfg.cadenced, config_from_dict(config_to_dict(cfg)) == cfg
(3, False, True)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rocewatch.core.errors import ConfigError
from rocewatch.sim.fabric import NAMINGS, JobSpec
from rocewatch.sim.faults import Fault, fault_from_dict, fault_to_dict

TRAFFICS = ("allreduce", "moe")


@dataclass(frozen=True)
class SimConfig:
    """One simulated run: the fabric, the workload, the faults.

    ``jobs`` empty means two jobs of two tenants over the two halves of the nodes (priority 3).
    ``traffic`` is the default mix: ``"allreduce"`` (NCCL ring bursts, ~60% duty over ~0.5 s
    iterations) or ``"moe"`` (all-to-all bursts, more cross-rail traffic, brief heavy pauses).
    ``out_of_order`` is the share of NIC snapshots delivered 1-2 ticks late (never > 300 ms).
    ``wrap_counter`` starts one busy port's ``in-octets`` just below 2^64 so it wraps.
    ``pod_domains`` names each pod (``nodes_per_leaf`` nodes) a fabric domain in the topology:
    its leaves' ``domain``, which its nodes take (the spines are in none).

    A cadenced run (``cadenced``) keeps the physics on ``interval_s`` ticks and lets every
    device read on its own schedule: the NICs every ``nic_interval_s``, each switch's counters
    every ``switch_interval_s`` and its queue gauges every ``gauge_interval_s``, each device
    from its own phase, each reading up to ``jitter`` of its interval late. Counters are read
    at their true time (the cumulative value interpolated within the tick), gauges as they are
    in that tick. ``sample_loss`` of the readings never arrive (``Simulator.lost``). Agent
    gaps, counter clears and late NIC snapshots (``out_of_order``) work as in default runs.
    """

    nodes: int = 16
    nics_per_node: int = 8
    spines: int = 4
    duration_s: float = 30.0
    interval_s: float = 0.1
    start_ns: int = 1795946400000000000  # 2026-11-29T10:00:00Z
    seed: int = 1
    faults: tuple[Fault, ...] = ()
    jobs: tuple[JobSpec, ...] = ()
    no_agent_nodes: tuple[str, ...] = ()
    traffic: str = "allreduce"
    out_of_order: float = 0.005
    wrap_counter: bool = True
    kubernetes_nodes: tuple[str, ...] = ()
    name: str = "custom"
    nodes_per_leaf: int = 64  # nodes per pod: each pod has a leaf per rail
    pod_domains: bool = False  # the topology names each pod's leaves (and so nodes) a domain
    # --- the fabric's make -------------------------------------------------------------------
    link_gbps: int = 400  # every link's speed
    buffer_mb: int = 64  # every switch's shared buffer
    naming: str = "openconfig"  # port names and switch paths: openconfig | cumulus | sonic
    # --- how each source reads (a run that sets any of these is "cadenced", see below) --------
    nic_interval_s: float | None = None  # the node agents' snapshot interval
    switch_interval_s: float | None = None  # gNMI sample interval of the switch counters
    gauge_interval_s: float | None = None  # queue gauges (None: with the switch counters)
    jitter: float | None = None  # each reading up to this share of its interval late (0.2)
    sample_loss: float = 0.0  # share of readings lost on the way
    # --- healthy noise ---------------------------------------------------------------------
    ber_range: tuple[float, float] = (1e-8, 1e-6)  # per-link healthy pre-FEC BER, log-uniform
    ecn_bursts_per_min: float = 0.0  # DCQCN marking bursts (2-10 %) per switch queue a minute
    ar_reorder: float = 0.0  # share of received packets out of order (adaptive routing)

    @property
    def n_ticks(self) -> int:
        return max(1, round(self.duration_s / self.interval_s))

    @property
    def cadenced(self) -> bool:
        """Whether the sources read on their own schedules (``interval_s`` is then only the
        physics tick) rather than all at every tick a few ms in, as the default runs do."""
        return (
            self.nic_interval_s is not None
            or self.switch_interval_s is not None
            or self.gauge_interval_s is not None
            or self.jitter is not None
            or self.sample_loss > 0
        )


def config_to_dict(cfg: SimConfig) -> dict[str, Any]:
    """The config as JSON-able data (``scenario.json``); ``config_from_dict`` reads it back."""
    d: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if f.name == "faults":
            v = [fault_to_dict(x) for x in v]
        elif f.name == "jobs":
            v = [dict(dataclasses.asdict(j), nodes=list(j.nodes)) for j in v]
        elif isinstance(v, tuple):
            v = list(v)
        d[f.name] = v
    return d


def config_from_dict(d: dict[str, Any]) -> SimConfig:
    names = {f.name for f in dataclasses.fields(SimConfig)}
    kw: dict[str, Any] = {}
    for k, v in d.items():
        if k not in names:
            continue  # written by a newer version; ignore
        if k == "faults":
            v = tuple(fault_from_dict(x) for x in v)
        elif k == "jobs":
            v = tuple(JobSpec(**dict(x, nodes=tuple(x.get("nodes", ())))) for x in v)
        elif isinstance(v, list):
            v = tuple(v)
        kw[k] = v
    return SimConfig(**kw)


def validate(cfg: SimConfig) -> None:
    problems = []
    if cfg.nodes < 1:
        problems.append("nodes must be >= 1")
    if not 1 <= cfg.nics_per_node <= 64:
        problems.append("nics_per_node must be 1..64")
    if cfg.spines < 1:
        problems.append("spines must be >= 1")
    if cfg.nodes_per_leaf < 1:
        problems.append("nodes_per_leaf must be >= 1")
    if cfg.interval_s <= 0 or cfg.duration_s <= 0:
        problems.append("duration_s and interval_s must be > 0")
    elif cfg.duration_s / cfg.interval_s > 10_000_000:
        problems.append("too many ticks")
    if cfg.traffic not in TRAFFICS:
        problems.append(f"traffic {cfg.traffic!r} is not one of {', '.join(TRAFFICS)}")
    if not 0 <= cfg.out_of_order <= 0.5:
        problems.append("out_of_order must be within 0..0.5")
    if cfg.naming not in NAMINGS:
        problems.append(f"naming {cfg.naming!r} is not one of {', '.join(NAMINGS)}")
    if cfg.link_gbps <= 0 or cfg.buffer_mb <= 0:
        problems.append("link_gbps and buffer_mb must be > 0")
    for name in ("nic_interval_s", "switch_interval_s", "gauge_interval_s"):
        v = getattr(cfg, name)
        if v is not None and not cfg.interval_s <= v <= max(cfg.duration_s, cfg.interval_s):
            problems.append(f"{name} must be within interval_s ({cfg.interval_s} s) and the run")
    if cfg.jitter is not None and not 0 <= cfg.jitter <= 0.5:
        problems.append("jitter must be within 0..0.5 of an interval")
    if not 0 <= cfg.sample_loss <= 0.5:
        problems.append("sample_loss must be within 0..0.5")
    lo, hi = cfg.ber_range
    if not 0 < lo <= hi < 1e-3:
        problems.append("ber_range must be two BERs, 0 < low <= high < 1e-3")
    if cfg.ecn_bursts_per_min < 0 or not 0 <= cfg.ar_reorder < 0.01:
        problems.append("ecn_bursts_per_min must be >= 0 and ar_reorder within 0..0.01")
    known = {f"gpu-{i + 1:03d}" for i in range(max(cfg.nodes, 0))}
    for n in (*cfg.no_agent_nodes, *cfg.kubernetes_nodes):
        if n not in known:
            problems.append(f"unknown node {n!r}")
    prios = {j.priority for j in cfg.jobs}
    if len(prios) > 1:
        problems.append("all jobs must share one lossless PFC priority")
    for j in cfg.jobs:
        if j.traffic is not None and j.traffic not in TRAFFICS:
            problems.append(f"job {j.name}: traffic {j.traffic!r} is not one of {TRAFFICS}")
        problems += [f"job {j.name}: unknown node {n!r}" for n in j.nodes if n not in known]
    if problems:
        raise ConfigError("\n".join(problems))


__all__ = ["TRAFFICS", "SimConfig", "config_from_dict", "config_to_dict", "validate"]
