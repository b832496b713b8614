"""Named scenarios: ready-made ``SimConfig``s for demos, replays, benchmarks and tests.

Fault times scale with the run's length (laid out for 30 s) so they stay apart in time; the
simulator draws the entities from the seed so faults also stay apart in nodes and rails.

>>> cfg = default_scenario(nodes=16, duration_s=30, seed=1)
>>> [type(f).__name__ for f in cfg.faults][:5]
['PfcStorm', 'FlakyLink', 'PcieDowngrade', 'EcnIncast', 'TransportErrors']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from rocewatch.sim.fabric import JobSpec, node_name
from rocewatch.sim.faults import (
    AgentGap,
    CounterClear,
    EcmpCollision,
    EcnIncast,
    Fault,
    FlakyLink,
    PcieDowngrade,
    PfcStorm,
    SprayedElephants,
    TenantIncast,
    TransportErrors,
)
from rocewatch.sim.simulator import SimConfig

Scale = Callable[[float], float]


def laid_out(
    name: str,
    nodes: int,
    duration_s: float,
    seed: int,
    faults: Callable[[Scale], tuple[Fault, ...]],
    **kw: Any,
) -> SimConfig:
    """A scenario whose fault times are laid out for 30 s: ``faults(at)`` builds the faults,
    ``at(t)`` scaling a 30 s time to this run's length, kept on round times."""
    s = duration_s / 30.0

    def at(t: float) -> float:
        return round(t * s, 1)

    return SimConfig(
        nodes=nodes,
        duration_s=float(duration_s),
        seed=seed,
        name=name,
        faults=faults(at),
        **kw,
    )


def default_scenario(nodes: int = 16, duration_s: float = 30, seed: int = 1) -> SimConfig:
    """One fault of each real kind, spread over time and entities, plus two counter clears
    and an agent gap (not faults) and a counter that wraps.

    Timeline at 30 s: storm 5-8 s, flaky cable 9-18 s, PCIe downgrade 12 s to the end,
    ECN incast 19-24 s, transport errors 24-29 s; a switch's counters clear at 15.05 s, a
    NIC's at 21 s; one node's agent is silent 7-9 s. The first 5 s are a healthy baseline.
    """
    return laid_out(
        "default",
        nodes,
        duration_s,
        seed,
        lambda at: (
            PfcStorm(onset_s=at(5.0), duration_s=at(3.0)),
            FlakyLink(onset_s=at(9.0), duration_s=at(9.0)),
            PcieDowngrade(onset_s=at(12.0)),
            EcnIncast(onset_s=at(19.0), duration_s=at(5.0)),
            TransportErrors(onset_s=at(24.0), duration_s=at(5.0)),
            CounterClear(onset_s=at(15.0) + 0.05, target="switch"),  # between two reads
            CounterClear(onset_s=at(21.0), target="nic"),
            AgentGap(onset_s=at(7.0), duration_s=at(2.0)),
        ),
    )


def demo_scenario(nodes: int = 64, seed: int = 7) -> SimConfig:
    """The default scenario at demo scale: 64 nodes x 8 NICs, 40 s."""
    cfg = default_scenario(nodes=nodes, duration_s=40, seed=seed)
    return _renamed(cfg, "demo")


def healthy_scenario(nodes: int = 16, duration_s: float = 30, seed: int = 1) -> SimConfig:
    """No faults: NCCL all-reduce traffic only (the false-positive baseline)."""
    return SimConfig(nodes=nodes, duration_s=float(duration_s), seed=seed, name="healthy")


def moe_scenario(nodes: int = 16, duration_s: float = 30, seed: int = 1) -> SimConfig:
    """No faults: MoE all-to-all bursts, with brief heavy pauses and deep queues that are
    still healthy (never two consecutive intervals paused >= 99%)."""
    return SimConfig(
        nodes=nodes, duration_s=float(duration_s), seed=seed, traffic="moe", name="moe"
    )


def dark_storm_scenario(nodes: int = 16, duration_s: float = 20, seed: int = 1) -> SimConfig:
    """A PFC storm from a node whose agent sends nothing: only the switches see it."""
    origin = node_name(2)
    return SimConfig(
        nodes=nodes,
        duration_s=float(duration_s),
        seed=seed,
        name="dark_storm",
        no_agent_nodes=(origin,),
        faults=(
            PfcStorm(onset_s=duration_s / 4, duration_s=duration_s / 4, node=origin, nic="mlx5_1"),
        ),
    )


def uplink_flaky_scenario(nodes: int = 16, duration_s: float = 30, seed: int = 1) -> SimConfig:
    """A flaky leaf<->spine cable: FCS errors and flaps at both switch ends, no NIC involved."""
    return SimConfig(
        nodes=nodes,
        duration_s=float(duration_s),
        seed=seed,
        name="uplink_flaky",
        faults=(FlakyLink(onset_s=duration_s / 5, duration_s=duration_s / 2, uplink=True),),
    )


def ecmp_collision_scenario(
    nodes: int = 8, duration_s: float = 30, seed: int = 1, adaptive: bool = False, **kw: Any
) -> SimConfig:
    """Elephant flows over one leaf's uplinks from 8 s to 24 s (at 30 s): static ECMP hashes
    two onto one uplink and none onto another (``EcmpCollision``); ``adaptive``: the same
    flows sprayed by adaptive routing (``SprayedElephants``: balanced, no fault)."""
    kind = SprayedElephants if adaptive else EcmpCollision
    return laid_out(
        "ecmp_adaptive" if adaptive else "ecmp_collision",
        nodes,
        duration_s,
        seed,
        lambda at: (kind(onset_s=at(8.0), duration_s=at(16.0)),),
        **kw,
    )


def ecmp_adaptive_scenario(nodes: int = 8, duration_s: float = 30, seed: int = 1) -> SimConfig:
    """``ecmp_collision_scenario``'s flows on an adaptive-routing fabric: sprayed, balanced."""
    return ecmp_collision_scenario(nodes, duration_s, seed, adaptive=True)


def overlap_scenario(nodes: int = 16, duration_s: float = 30, seed: int = 1) -> SimConfig:
    """Five faults that overlap in time on different entities (laid out for 30 s): a storm
    5-13 s, a flaky cable 7-19 s, transport errors 10-18 s, an incast 12-20 s and a PCIe
    downgrade from 15 s; the simulator draws the entities apart (other job, other rails)."""
    return laid_out(
        "overlap",
        nodes,
        duration_s,
        seed,
        lambda at: (
            PfcStorm(onset_s=at(5.0), duration_s=at(8.0)),
            FlakyLink(onset_s=at(7.0), duration_s=at(12.0)),
            TransportErrors(onset_s=at(10.0), duration_s=at(8.0)),
            EcnIncast(onset_s=at(12.0), duration_s=at(8.0)),
            PcieDowngrade(onset_s=at(15.0)),
        ),
    )


def mixed_tenants_scenario(nodes: int = 16, duration_s: float = 30, seed: int = 1) -> SimConfig:
    """Two tenants on one fabric, team-a training with all-reduce, team-b with MoE all-to-all;
    a storm in team-a's job (laid out for 30 s: 6-10 s) and a flaky cable in team-b's (14-24 s)."""
    names = [node_name(i) for i in range(nodes)]
    half = nodes // 2
    return laid_out(
        "mixed_tenants",
        nodes,
        duration_s,
        seed,
        lambda at: (
            PfcStorm(onset_s=at(6), duration_s=at(4), node=names[1]),
            FlakyLink(onset_s=at(14), duration_s=at(10), node=names[-2]),
        ),
        jobs=(
            JobSpec("llm-train-a", "team-a", tuple(names[:half]), traffic="allreduce"),
            JobSpec("moe-train-b", "team-b", tuple(names[half:]), traffic="moe"),
        ),
    )


def subtle_scenario(nodes: int = 16, duration_s: float = 30, seed: int = 1) -> SimConfig:
    """Weaker versions of every fault (laid out for 30 s): a 0.6 s storm at 4 s, a cable at
    1e-5 peak BER that never flaps (8-18 s), a Gen4 -> Gen3 PCIe downgrade from 12 s (8 GT/s),
    incast from 3 senders (19-24 s), transport errors at a fifth of the default rate (24-29 s)."""
    return laid_out(
        "subtle",
        nodes,
        duration_s,
        seed,
        lambda at: (
            PfcStorm(onset_s=at(4.0), duration_s=0.6),
            FlakyLink(onset_s=at(8.0), duration_s=at(10.0), peak_ber=1e-5, flaps=0),
            PcieDowngrade(onset_s=at(12.0), speed_gts=8.0),
            EcnIncast(onset_s=at(19.0), duration_s=at(5.0), senders=3),
            TransportErrors(onset_s=at(24.0), duration_s=at(5.0), scale=0.2),
        ),
    )


def two_storms_scenario(nodes: int = 16, duration_s: float = 30, seed: int = 1) -> SimConfig:
    """Two PFC storms at once, one in each tenant's job (laid out for 30 s: 5-11 s and 7-13 s):
    two origins, each paused fabric's victims kept apart."""
    return laid_out(
        "two_storms",
        nodes,
        duration_s,
        seed,
        lambda at: (
            PfcStorm(onset_s=at(5), duration_s=at(6)),
            PfcStorm(onset_s=at(7), duration_s=at(6)),
        ),
    )


def tenant_incast_scenario(
    nodes: int = 8, duration_s: float = 30, seed: int = 1, same_tenant: bool = False
) -> SimConfig:
    """Two pods of ``nodes // 2`` nodes (2 NICs each, 2 spines): team-a's MoE job runs on all
    but the last node of each pod, a ring job on those two (team-b's, or ``same_tenant``
    team-a's own); 10-18 s (laid out for 30 s) the MoE job's all-to-all fills the uplinks
    of its rail-0 leaf in pod 0 that the ring crosses (``TenantIncast``)."""
    half = max(2, nodes // 2)
    names = [node_name(i) for i in range(2 * half)]
    ring = (names[half - 1], names[-1])
    a2a = tuple(n for n in names if n not in ring)
    jobs = (
        JobSpec("moe-a", "team-a", a2a, traffic="moe"),
        JobSpec("ring-b", "team-a" if same_tenant else "team-b", ring, traffic="allreduce"),
    )
    return laid_out(
        "tenant_incast_same" if same_tenant else "tenant_incast",
        2 * half,
        duration_s,
        seed,
        lambda at: (
            TenantIncast(onset_s=at(10.0), duration_s=at(8.0), job="moe-a", switch="leaf-r0-p0"),
        ),
        nics_per_node=2,
        spines=2,
        nodes_per_leaf=half,
        jobs=jobs,
    )


def _renamed(cfg: SimConfig, name: str) -> SimConfig:
    return dataclasses.replace(cfg, name=name)


SCENARIOS: dict[str, Callable[..., SimConfig]] = {
    "default": default_scenario,
    "demo": demo_scenario,
    "healthy": healthy_scenario,
    "moe": moe_scenario,
    "dark_storm": dark_storm_scenario,
    "uplink_flaky": uplink_flaky_scenario,
    "ecmp_collision": ecmp_collision_scenario,
    "ecmp_adaptive": ecmp_adaptive_scenario,
    "overlap": overlap_scenario,
    "mixed_tenants": mixed_tenants_scenario,
    "two_storms": two_storms_scenario,
    "subtle": subtle_scenario,
    "tenant_incast": tenant_incast_scenario,
}
