"""What the simulator can break, and the ground truth a correct detector should report.

One frozen dataclass per kind. Each has ``onset_s`` (seconds after the start) and
``duration_s`` (``None``: until the end of the run); the entity it hits may be left out and is
then drawn from the seed, avoiding entities other faults already use around the same time (so
faults do not mask each other). ``resolve_faults`` returns the same faults with every entity and
random detail filled in; ``truth`` turns them into the JSON-able ground truth.

``CounterClear`` and ``AgentGap`` are not faults: they exercise counter-reset and missing-data
handling, and a detector must raise nothing for them.

>>> PfcStorm(onset_s=5.0, duration_s=3.0, node="gpu-003", nic="mlx5_2").end_s(30.0)
8.0
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from rocewatch.core.errors import ConfigError
from rocewatch.sim import ecmp
from rocewatch.sim.fabric import Fabric

if TYPE_CHECKING:
    from rocewatch.sim.simulator import SimConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Fault:
    onset_s: float
    duration_s: float | None = None

    kind: ClassVar[str] = "Fault"
    alertname: ClassVar[str | None] = None
    also: ClassVar[tuple[str, ...]] = ()
    is_fault: ClassVar[bool] = True

    def end_s(self, run_s: float) -> float:
        if self.duration_s is None:
            return run_s
        return min(run_s, self.onset_s + self.duration_s)


@dataclass(frozen=True, kw_only=True)
class PfcStorm(Fault):
    """A device keeps sending PFC pause on the job's priority.

    ``origin="nic"`` (the default): a NIC whose receive path stalled (``node``/``nic``; a node
    listed in the config's ``no_agent_nodes`` makes it a dark origin only the switches see).
    The pause spreads hop by hop (leaf, spines, the other leaves, the job's NICs), each hop
    ``hop_delays_s[i]`` (100-300 ms) after the previous one.

    ``origin="switch"``: a leaf (``switch``) that pauses its neighbours (its NICs and the
    spines) while nothing pauses it, e.g. a wedged egress pipeline; the spines then pause the
    other leaves and those their NICs. No node is to blame: the truth has no culprit node.
    """

    node: str | None = None
    nic: str | None = None
    hop_delays_s: tuple[float, ...] | None = None
    origin: str = "nic"
    switch: str | None = None

    kind: ClassVar[str] = "PfcStorm"
    alertname: ClassVar[str | None] = "PFCStorm"


@dataclass(frozen=True, kw_only=True)
class FlakyLink(Fault):
    """A bad cable or optic: BER rising toward ``peak_ber``, CRC/FCS errors, a few flaps.

    A NIC<->leaf cable (``node``/``nic``) unless ``uplink`` is set, then a leaf<->spine cable
    (``switch`` is the leaf, ``spine`` the spine's name).
    """

    node: str | None = None
    nic: str | None = None
    uplink: bool = False
    switch: str | None = None
    spine: str | None = None
    flaps: int = 3
    peak_ber: float = 1e-4
    flap_windows_s: tuple[tuple[float, float], ...] | None = None  # (start, length)
    # the peak as a multiple of the link's own healthy pre-FEC BER (instead of ``peak_ber``)
    ber_factor: float | None = None
    errors: bool = True  # False: the link only flaps, its error counters stay healthy

    kind: ClassVar[str] = "FlakyLink"
    alertname: ClassVar[str | None] = "FlakyLink"
    also: ClassVar[tuple[str, ...]] = ("PortAnomaly", "SlowEdge")


@dataclass(frozen=True, kw_only=True)
class PcieDowngrade(Fault):
    """The NIC's PCIe link trained down (Gen5 32 GT/s -> ``speed_gts``, and/or x16 ->
    ``width`` lanes): a straggler where the link's bandwidth falls below the network's."""

    node: str | None = None
    nic: str | None = None
    speed_gts: float = 16.0
    width: int = 16

    kind: ClassVar[str] = "PcieDowngrade"
    alertname: ClassVar[str | None] = "PCIeDowngrade"
    also: ClassVar[tuple[str, ...]] = (
        "Straggler",
        "PortAnomaly",
        "SlowRank",
        "BusBandwidthDrop",
        "SlowEdge",
    )


@dataclass(frozen=True, kw_only=True)
class EcnIncast(Fault):
    """Incast into one NIC: the leaf's egress queue toward it sits near the buffer limit."""

    node: str | None = None
    nic: str | None = None
    senders: int = 8
    fill: float | None = None  # share of the queue's buffer held, 0.85..0.98
    sender_nics: tuple[str, ...] | None = None  # "node/nic"
    ecn: float | None = None  # share of the queue's packets marked (None: 0.4..0.7)

    kind: ClassVar[str] = "EcnIncast"
    alertname: ClassVar[str | None] = "ECNCongestion"
    also: ClassVar[tuple[str, ...]] = ("QueueBuildup", "PortAnomaly")


@dataclass(frozen=True, kw_only=True)
class QueueBuildup(EcnIncast):
    """A standing queue: the leaf's egress queue toward one NIC holds ``fill`` of the buffer
    (incast the congestion control does not tame); the physics of ``EcnIncast``."""

    kind: ClassVar[str] = "QueueBuildup"
    alertname: ClassVar[str | None] = "QueueBuildup"
    also: ClassVar[tuple[str, ...]] = ("ECNCongestion", "PortAnomaly")


@dataclass(frozen=True, kw_only=True)
class TenantIncast(Fault):
    """One job's all-to-all fills the uplink queues of a leaf that other jobs' rings cross:
    the leaf marks and holds (PFC) every NIC below it, the other jobs' included. The victim
    and aggressor jobs and tenants are in the truth; a leaf whose other jobs belong to the
    aggressor's own tenant names no aggressor. Physics and truth: rocewatch/sim/tenants.py.

    ``job`` is the aggressor (None: the config's first job); ``switch`` the leaf (None: the
    first leaf with NICs of that job and of another).
    """

    job: str | None = None
    switch: str | None = None
    fill: float | None = None  # share of each uplink queue's buffer held, 0.85..0.95
    ecn: float | None = None  # share of the queue's packets marked (None: 0.3..0.6)

    kind: ClassVar[str] = "TenantIncast"
    alertname: ClassVar[str | None] = "ECNCongestion"
    also: ClassVar[tuple[str, ...]] = ("QueueBuildup", "PortAnomaly")


@dataclass(frozen=True, kw_only=True)
class TransportErrors(Fault):
    """RoCE transport trouble on one NIC: out-of-sequence, NAK sequence errors, ACK timeouts."""

    node: str | None = None
    nic: str | None = None
    scale: float = 1.0
    # errors per second (all transport counters together, averaged over the job's traffic)
    # instead of ``scale``
    rate_per_s: float | None = None

    kind: ClassVar[str] = "TransportErrors"
    alertname: ClassVar[str | None] = "TransportErrors"
    also: ClassVar[tuple[str, ...]] = ("PortAnomaly",)


@dataclass(frozen=True, kw_only=True)
class Straggler(Fault):
    """A NIC that runs ``slow`` (0.1 = 10 %) below line rate once it heats up (thermal
    throttling, reached over ~3 s): it pauses its leaf when it cannot drain what arrives, and
    its job's ring waits for it. Its PCIe link stays as it was."""

    node: str | None = None
    nic: str | None = None
    slow: float = 0.25

    kind: ClassVar[str] = "Straggler"
    alertname: ClassVar[str | None] = "Straggler"
    also: ClassVar[tuple[str, ...]] = ("PortAnomaly", "SlowRank", "BusBandwidthDrop")


@dataclass(frozen=True, kw_only=True)
class SlowGpu(Fault):
    """The GPU beside ``nic`` (same rail index) on ``node`` runs slow (clocks throttled, a
    bad HBM row remapped): its rank starts every collective ``lag_us`` late while the fabric
    stays clean. Only the job's NCCL telemetry shows it (rocewatch/sim/nccl.py)."""

    node: str | None = None
    nic: str | None = None
    lag_us: float = 300.0

    kind: ClassVar[str] = "SlowGpu"
    alertname: ClassVar[str | None] = "SlowRank"


@dataclass(frozen=True, kw_only=True)
class EcmpCollision(Fault):
    """Static ECMP hashes two of a leaf's elephant flows onto one uplink while another uplink of
    its group carries none (rocewatch/sim/ecmp.py): ``flows`` flows (default one per spine),
    each wanting ``demand`` of an uplink's line rate. ``flow_list`` is drawn when resolved."""

    switch: str | None = None  # the leaf
    flows: int | None = None
    demand: float = 0.95
    flow_list: tuple[Any, ...] | None = None  # ecmp.Flow, resolved

    kind: ClassVar[str] = "EcmpCollision"
    alertname: ClassVar[str | None] = "ECMPImbalance"
    also: ClassVar[tuple[str, ...]] = ("ECNCongestion", "PortAnomaly")


@dataclass(frozen=True, kw_only=True)
class SprayedElephants(EcmpCollision):
    """The same elephant flows on an adaptive-routing fabric: sprayed packet by packet over
    every uplink, balanced by construction. Not a fault: a detector must raise nothing."""

    kind: ClassVar[str] = "SprayedElephants"
    alertname: ClassVar[str | None] = None
    also: ClassVar[tuple[str, ...]] = ()
    is_fault: ClassVar[bool] = False


@dataclass(frozen=True, kw_only=True)
class CounterClear(Fault):
    """All counters of a switch (``target="switch"``) or a NIC drop to 0 at ``onset_s``."""

    target: str = "switch"
    switch: str | None = None
    node: str | None = None
    nic: str | None = None

    kind: ClassVar[str] = "CounterClear"
    is_fault: ClassVar[bool] = False


@dataclass(frozen=True, kw_only=True)
class AgentGap(Fault):
    """A node's agent sends nothing for ``duration_s`` (counters keep counting meanwhile)."""

    node: str | None = None

    kind: ClassVar[str] = "AgentGap"
    is_fault: ClassVar[bool] = False


FAULT_KINDS: dict[str, type[Fault]] = {
    c.kind: c
    for c in (
        PfcStorm,
        FlakyLink,
        PcieDowngrade,
        EcnIncast,
        QueueBuildup,
        TenantIncast,
        TransportErrors,
        Straggler,
        SlowGpu,
        EcmpCollision,
        SprayedElephants,
        CounterClear,
        AgentGap,
    )
}


def fault_to_dict(f: Fault) -> dict[str, Any]:
    d: dict[str, Any] = {"kind": f.kind}
    for fld in dataclasses.fields(f):
        v = getattr(f, fld.name)
        if isinstance(f, EcmpCollision) and fld.name == "flow_list":
            v = None if v is None else [dataclasses.asdict(x) for x in v]
        if isinstance(v, tuple):
            v = [list(x) if isinstance(x, tuple) else x for x in v]
        d[fld.name] = v
    return d


def fault_from_dict(d: dict[str, Any]) -> Fault:
    d = dict(d)
    cls = FAULT_KINDS.get(str(d.pop("kind", "")))
    if cls is None:
        raise ConfigError(f"unknown fault kind in {d!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    kw = {}
    for k, v in d.items():
        if k not in names:
            raise ConfigError(f"{cls.kind}: unknown field {k!r}")
        if issubclass(cls, EcmpCollision) and k == "flow_list" and v is not None:
            v = tuple(ecmp.Flow(**x) for x in v)
        elif isinstance(v, list):
            v = tuple(tuple(x) if isinstance(x, list) else x for x in v)
        kw[k] = v
    return cls(**kw)


# --- resolution ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hop:
    """One step of a storm's spread: ``pausers`` start pausing ``paused`` at ``delay_s``."""

    delay_s: float
    pausers: tuple[dict[str, str], ...]
    paused: tuple[dict[str, str], ...]
    dirs: np.ndarray  # the paused directions (their senders are the paused entities)


class _Picker:
    """Draws entities for faults, avoiding what overlapping faults already use."""

    def __init__(self, fab: Fabric, cfg: SimConfig) -> None:
        self.fab = fab
        self.cfg = cfg
        self.busy: list[tuple[float, float, set[int], set[int]]] = []  # t0, t1, nodes, rails
        self.used_nodes: set[int] = set()
        self.used_rails: set[int] = set()
        silent = {fab.node_index[n] for n in cfg.no_agent_nodes if n in fab.node_index}
        self.in_job = [i for i in range(fab.n_nodes) if fab.job_of_node[i] >= 0 and i not in silent]
        if not self.in_job:
            self.in_job = [i for i in range(fab.n_nodes) if i not in silent] or [0]

    def _taken(self, t0: float, t1: float) -> tuple[set[int], set[int]]:
        nodes: set[int] = set()
        rails: set[int] = set()
        for a, b, ns, rs in self.busy:
            if a < t1 + 1.0 and t0 < b + 1.0:
                nodes |= ns
                rails |= rs
        return nodes, rails

    def nic(self, rng: np.random.Generator, t0: float, t1: float) -> int:
        fab = self.fab
        nodes, rails = self._taken(t0, t1)
        tiers = [
            [n for n in self.in_job if n not in nodes and n not in self.used_nodes],
            [n for n in self.in_job if n not in nodes],
            self.in_job,
        ]
        cand = next(t for t in tiers if t)
        node = int(rng.choice(cand))
        rtiers = [
            [r for r in range(fab.n_rails) if r not in rails and r not in self.used_rails],
            [r for r in range(fab.n_rails) if r not in rails],
            list(range(fab.n_rails)),
        ]
        rail = int(rng.choice(next(t for t in rtiers if t)))
        return node * fab.n_rails + rail

    def leaf(self, rng: np.random.Generator, t0: float, t1: float) -> int:
        fab = self.fab
        _, rails = self._taken(t0, t1)
        free = [
            lf
            for lf in range(fab.n_leaves)
            if lf // fab.n_pods not in rails and lf // fab.n_pods not in self.used_rails
        ]
        return int(rng.choice(free or list(range(fab.n_leaves))))

    def claim(self, t0: float, t1: float, nodes: set[int], rails: set[int]) -> None:
        self.busy.append((t0, t1, nodes, rails))
        self.used_nodes |= nodes
        self.used_rails |= rails


def _check_nic(fab: Fabric, kind: str, node: str | None, nic: str | None) -> None:
    if node is not None and node not in fab.node_index:
        raise ConfigError(f"{kind}: unknown node {node!r}")
    if nic is not None and nic not in fab.rail_nics:
        raise ConfigError(f"{kind}: unknown NIC {nic!r}")


def resolve_faults(cfg: SimConfig, fab: Fabric) -> list[Fault]:
    """The config's faults with every entity and random detail drawn from the seed.

    Faults are resolved first (in order), then the non-faults, so counter clears and agent gaps
    land away from real faults. Faults that would start after the end of the run are left out.
    """
    run = cfg.duration_s
    pick = _Picker(fab, cfg)
    order = [i for i, f in enumerate(cfg.faults) if f.is_fault]
    order += [i for i, f in enumerate(cfg.faults) if not f.is_fault]
    out: dict[int, Fault] = {}
    for i in order:
        f = cfg.faults[i]
        rng = np.random.default_rng([cfg.seed, 7919, i])
        t0, t1 = f.onset_s, f.end_s(run)
        if t0 < 0:
            raise ConfigError(f"{f.kind}: onset {t0} s is before the start")
        if t0 >= run:  # a shortened run: the fault never happens, so it is not in the truth
            log.info("%s at %.2f s is after the end of the run (%.2f s): left out", f.kind, t0, run)
            continue
        nic_fault = PfcStorm | FlakyLink | PcieDowngrade | EcnIncast | TransportErrors | Straggler
        nic_fault |= SlowGpu
        on_switch = (isinstance(f, FlakyLink) and f.uplink) or (
            isinstance(f, PfcStorm) and f.origin == "switch"
        )
        if isinstance(f, PfcStorm) and f.origin not in ("nic", "switch"):
            raise ConfigError(f"PfcStorm: origin {f.origin!r} is not 'nic' or 'switch'")
        if isinstance(f, nic_fault) and not on_switch:
            _check_nic(fab, f.kind, f.node, f.nic)
            e = pick.nic(rng, t0, t1)
            node = f.node or fab.nodes[int(fab.nic_node[e])]
            nic = f.nic or fab.rail_nics[int(fab.nic_rail[e])]
            e = fab.nic_index(node, nic)
            affected = {int(fab.nic_node[e])}
            if isinstance(f, PfcStorm) and fab.nic_job[e] >= 0:
                affected = {int(x) for x in np.flatnonzero(fab.job_of_node == fab.nic_job[e])}
            pick.claim(t0, t1, affected, {int(fab.nic_rail[e])})
            f = dataclasses.replace(f, node=node, nic=nic)  # type: ignore[call-arg]
        if isinstance(f, PfcStorm):
            if f.origin == "switch":
                if f.switch is not None and f.switch not in fab.leaves:
                    raise ConfigError(f"PfcStorm: {f.switch!r} is not a leaf")
                leaf = fab.leaves.index(f.switch) if f.switch else pick.leaf(rng, t0, t1)
                jobs = set(fab.nic_job[fab.nics_on_leaf(leaf)].tolist()) - {-1}
                nodes = {i for i in range(fab.n_nodes) if int(fab.job_of_node[i]) in jobs}
                pick.claim(t0, t1, nodes, {leaf // fab.n_pods})
                f = dataclasses.replace(f, switch=fab.leaves[leaf])
            drawn = tuple(float(x) for x in np.round(rng.uniform(0.1, 0.3, 3), 3))
            delays = f.hop_delays_s or drawn
            if len(delays) != 3 or not all(0 < d <= 1.0 for d in delays):
                raise ConfigError("PfcStorm: hop_delays_s needs three delays in (0, 1] s")
            f = dataclasses.replace(f, hop_delays_s=tuple(delays))
        elif isinstance(f, FlakyLink):
            if f.uplink:
                if f.switch is not None and f.switch not in fab.leaves:
                    raise ConfigError(f"FlakyLink: {f.switch!r} is not a leaf")
                if f.spine is not None and f.spine not in fab.spines:
                    raise ConfigError(f"FlakyLink: {f.spine!r} is not a spine")
                leaf = fab.leaves.index(f.switch) if f.switch else pick.leaf(rng, t0, t1)
                spine = fab.spines.index(f.spine) if f.spine else int(rng.integers(fab.n_spines))
                pick.claim(t0, t1, set(), {leaf // fab.n_pods})
                f = dataclasses.replace(f, switch=fab.leaves[leaf], spine=fab.spines[spine])
            if f.flap_windows_s is None:
                # a cable that only flaps has nothing to show before its first flap: it
                # flaps from the start; one going bad shows errors first, flaps later
                flaps = _flaps(rng, t0, t1, f.flaps, later=f.errors)
                f = dataclasses.replace(f, flap_windows_s=flaps)
        elif isinstance(f, EcnIncast):
            assert f.node is not None and f.nic is not None
            e = fab.nic_index(f.node, f.nic)
            fill = f.fill if f.fill is not None else round(float(rng.uniform(0.86, 0.97)), 3)
            if f.sender_nics is None:
                peers = [int(x) for x in fab.nics_on_leaf(int(fab.nic_leaf[e])) if x != e]
                chosen = sorted(rng.choice(peers, size=min(f.senders, len(peers)), replace=False))
                senders = tuple("{node}/{nic}".format(**fab.nic_labels(int(x))) for x in chosen)
            else:
                senders = f.sender_nics
            f = dataclasses.replace(f, fill=fill, sender_nics=senders)
        elif isinstance(f, TenantIncast):
            from rocewatch.sim.tenants import resolve_incast  # (it imports this module)

            if f.switch is None:  # a leaf on a rail no overlapping fault uses, where it fits
                _, busy = pick._taken(t0, t1)
                free = [lf for lf in range(fab.n_leaves) if lf // fab.n_pods not in busy]
                f = resolve_incast(fab, f, rng, prefer=[int(x) for x in rng.permutation(free)])
            else:
                f = resolve_incast(fab, f, rng)
            pick.claim(t0, t1, set(), {fab.leaves.index(str(f.switch)) // fab.n_pods})
        elif isinstance(f, EcmpCollision):
            if f.switch is not None and f.switch not in fab.leaves:
                raise ConfigError(f"{f.kind}: {f.switch!r} is not a leaf")
            if not 0 < f.demand <= 1:
                raise ConfigError(f"{f.kind}: demand must be within (0, 1]")
            leaf = fab.leaves.index(f.switch) if f.switch else pick.leaf(rng, t0, t1)
            pick.claim(t0, t1, set(), {leaf // fab.n_pods})
            flows = f.flow_list or ecmp.draw_flows(
                fab, leaf, f.flows or fab.n_spines, rng, collide=f.is_fault
            )
            f = dataclasses.replace(f, switch=fab.leaves[leaf], flow_list=tuple(flows))
        elif isinstance(f, CounterClear):
            if f.target == "switch":
                if f.switch is not None and f.switch not in fab.switch_index:
                    raise ConfigError(f"CounterClear: unknown switch {f.switch!r}")
                if f.switch is None:
                    leaf = pick.leaf(rng, t0 - 2.0, t0 + 2.0)
                    pick.claim(t0, t0, set(), {leaf // fab.n_pods})
                    f = dataclasses.replace(f, switch=fab.leaves[leaf])
            elif f.target == "nic":
                _check_nic(fab, f.kind, f.node, f.nic)
                e = pick.nic(rng, t0 - 2.0, t0 + 2.0)
                node = f.node or fab.nodes[int(fab.nic_node[e])]
                nic = f.nic or fab.rail_nics[int(fab.nic_rail[e])]
                pick.claim(t0, t0, {fab.node_index[node]}, set())
                f = dataclasses.replace(f, node=node, nic=nic)
            else:
                raise ConfigError(f"CounterClear: target {f.target!r} is not 'switch' or 'nic'")
        elif isinstance(f, AgentGap):
            if f.node is not None and f.node not in fab.node_index:
                raise ConfigError(f"AgentGap: unknown node {f.node!r}")
            if f.node is None:
                e = pick.nic(rng, t0, t1)
                f = dataclasses.replace(f, node=fab.nodes[int(fab.nic_node[e])])
            assert f.node is not None
            pick.claim(t0, t1, {fab.node_index[f.node]}, set())
        out[i] = f
    return [out[i] for i in range(len(cfg.faults)) if i in out]


def _flaps(
    rng: np.random.Generator, t0: float, t1: float, n: int, later: bool = True
) -> tuple[tuple[float, float], ...]:
    """``n`` flaps of ~1 s in the later 60% of the fault (``later``; else over all of it),
    ~2 s apart where room allows."""
    lo, hi = t0 + (0.4 if later else 0.0) * (t1 - t0), t1 - 1.5
    if n <= 0 or hi <= lo:
        return ()
    n = max(1, min(n, int((hi - lo) / 1.8) + 1))
    slots = np.linspace(lo, hi, n + 1)
    out = []
    for a, b in itertools.pairwise(slots):
        start = float(rng.uniform(a, a + 0.2 * (b - a)))
        length = min(float(rng.uniform(0.8, 1.3)), 0.6 * float(b - a))
        out.append((round(start, 3), round(length, 3)))
    return tuple(out)


def storm_hops(fab: Fabric, storm: PfcStorm) -> list[Hop]:
    """How the pause spreads from the origin NIC, hop by hop, with the entities each hop pauses.

    1. the origin pauses its leaf port; 2. the leaf pauses the spines (its uplinks) and the
    job's other NICs on that leaf; 3. the spines pause the uplinks of the other leaves that
    carry the job; 4. those leaves pause the job's NICs below them. Every paused entity only
    pauses others because it is paused; the origin is not paused. A switch origin: see
    ``switch_storm_hops``.
    """
    if storm.origin == "switch":
        return switch_storm_hops(fab, storm)
    assert storm.node is not None and storm.nic is not None and storm.hop_delays_s is not None
    x = fab.nic_index(storm.node, storm.nic)
    leaf = int(fab.nic_leaf[x])
    job = int(fab.nic_job[x])
    same_job = (fab.nic_job == job) if job >= 0 else np.zeros(fab.n_nics, dtype=bool)
    d1, d2, d3 = storm.hop_delays_s
    hops: list[Hop] = [Hop(0.0, (fab.nic_labels(x),), (fab.port_labels(x),), np.array([2 * x + 1]))]

    local = [int(e) for e in np.flatnonzero(same_job & (fab.nic_leaf == leaf)) if e != x]
    ups = [fab.uplink_port(leaf, s) for s in range(fab.n_spines)]
    sps = [fab.spine_port(leaf, s) for s in range(fab.n_spines)]
    hops.append(
        Hop(
            d1,
            tuple(fab.port_labels(p) for p in ups + local),
            tuple(fab.port_labels(p) for p in sps) + tuple(fab.nic_labels(e) for e in local),
            np.array(
                [2 * int(fab.port_cable[p]) + 1 for p in ups] + [2 * e for e in local], dtype=int
            ),
        )
    )
    # only leaves with members of the job send traffic toward the origin
    job_leaves = set(np.unique(fab.nic_leaf[same_job]).tolist())
    others = [lf for lf in range(fab.n_leaves) if lf != leaf and lf in job_leaves]
    far_sp = [fab.spine_port(lf, s) for lf in others for s in range(fab.n_spines)]
    far_up = [fab.uplink_port(lf, s) for lf in others for s in range(fab.n_spines)]
    hops.append(
        Hop(
            d1 + d2,
            tuple(fab.port_labels(p) for p in far_sp),
            tuple(fab.port_labels(p) for p in far_up),
            np.array([2 * int(fab.port_cable[p]) for p in far_up], dtype=int),
        )
    )
    far = [int(e) for e in np.flatnonzero(same_job & (fab.nic_leaf != leaf))]
    hops.append(
        Hop(
            d1 + d2 + d3,
            tuple(fab.port_labels(e) for e in far),
            tuple(fab.nic_labels(e) for e in far),
            np.array([2 * e for e in far], dtype=int),
        )
    )
    return hops


def switch_storm_hops(fab: Fabric, storm: PfcStorm) -> list[Hop]:
    """How the pause spreads from a leaf that pauses everything it receives from.

    1. the leaf pauses its NICs and the spines (every port it has); 2. the spines, their
    queues toward the leaf stuck, pause the uplinks of the other leaves that carry jobs with
    NICs on it; 3. those leaves pause those jobs' NICs below them. The leaf itself is never
    paused.
    """
    assert storm.switch is not None and storm.hop_delays_s is not None
    leaf = fab.leaves.index(storm.switch)
    d1, d2, _ = storm.hop_delays_s
    mine = [int(e) for e in fab.nics_on_leaf(leaf)]
    ups = [fab.uplink_port(leaf, s) for s in range(fab.n_spines)]
    sps = [fab.spine_port(leaf, s) for s in range(fab.n_spines)]
    hops: list[Hop] = [
        Hop(
            0.0,
            tuple(fab.port_labels(p) for p in mine + ups),
            tuple(fab.nic_labels(e) for e in mine) + tuple(fab.port_labels(p) for p in sps),
            np.array(
                [2 * e for e in mine] + [2 * int(fab.port_cable[p]) + 1 for p in ups], dtype=int
            ),
        )
    ]
    jobs = set(fab.nic_job[mine].tolist()) - {-1}
    in_jobs = np.isin(fab.nic_job, sorted(jobs))
    others = [lf for lf in np.unique(fab.nic_leaf[in_jobs]).tolist() if lf != leaf]
    far_sp = [fab.spine_port(lf, s) for lf in others for s in range(fab.n_spines)]
    far_up = [fab.uplink_port(lf, s) for lf in others for s in range(fab.n_spines)]
    hops.append(
        Hop(
            d1,
            tuple(fab.port_labels(p) for p in far_sp),
            tuple(fab.port_labels(p) for p in far_up),
            np.array([2 * int(fab.port_cable[p]) for p in far_up], dtype=int),
        )
    )
    far = [int(e) for e in np.flatnonzero(in_jobs & (fab.nic_leaf != leaf))]
    hops.append(
        Hop(
            d1 + d2,
            tuple(fab.port_labels(e) for e in far),
            tuple(fab.nic_labels(e) for e in far),
            np.array([2 * e for e in far], dtype=int),
        )
    )
    return hops


# --- ground truth --------------------------------------------------------------------------------


def truth(
    cfg: SimConfig,
    fab: Fabric,
    faults: list[Fault],
    wrap: dict[str, Any] | None,
    sampling: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ground truth of a run (see ``Simulator.truth``); ``sampling``: how each source was
    read (cadenced runs only), added as it is."""
    ns = 1_000_000_000
    start = cfg.start_ns
    out_faults: list[dict[str, Any]] = []
    not_faults: list[dict[str, Any]] = []
    prio = str(fab.priority)

    def at(s: float) -> int:
        return start + round(s * ns)

    counts: dict[str, int] = {}
    for f in faults:
        counts[f.kind] = counts.get(f.kind, 0) + 1
        fid = f"{f.kind}-{counts[f.kind]}"
        t0, t1 = at(f.onset_s), at(f.end_s(cfg.duration_s))
        if isinstance(f, CounterClear):
            labels = (
                {"switch": str(f.switch)}
                if f.target == "switch"
                else {"node": str(f.node), "nic": str(f.nic)}
            )
            not_faults.append({"id": fid, "kind": f.kind, "at_ns": t0, "labels": labels})
            continue
        if isinstance(f, EcmpCollision):
            entry = ecmp.truth_entry(fab, fab.leaves.index(str(f.switch)), f.flow_list or ())
            if not f.is_fault:  # sprayed: balanced, nothing to find
                not_faults.append(
                    {"id": fid, "kind": f.kind, "onset_ns": t0, "end_ns": t1, **entry}
                )
                continue
            out_faults.append(
                {
                    "id": fid,
                    "kind": f.kind,
                    "alertname": f.alertname,
                    "also": list(f.also),
                    "onset_ns": t0,
                    "end_ns": t1,
                    **entry,
                }
            )
            continue
        if isinstance(f, AgentGap):
            not_faults.append(
                {
                    "id": fid,
                    "kind": f.kind,
                    "onset_ns": t0,
                    "end_ns": t1,
                    "labels": {"node": str(f.node)},
                }
            )
            continue
        d: dict[str, Any] = {
            "id": fid,
            "kind": f.kind,
            "alertname": f.alertname,
            "also": list(f.also),
            "onset_ns": t0,
            "end_ns": t1,
        }
        details: dict[str, Any] = {}
        if isinstance(f, FlakyLink) and f.uplink:
            leaf, spine = fab.leaves.index(str(f.switch)), fab.spines.index(str(f.spine))
            a = fab.port_labels(fab.uplink_port(leaf, spine))
            b = fab.port_labels(fab.spine_port(leaf, spine))
            d.update(labels=a, match=[a, b], culprit_node=None, victims=[])
        elif isinstance(f, TenantIncast):
            from rocewatch.sim.tenants import incast_truth

            fields = incast_truth(fab, f, prio)
            details.update(fields.pop("details"))
            d.update(fields)
        elif isinstance(f, PfcStorm) and f.origin == "switch":
            # no node to blame: the origin alert names the switch (and its ports)
            leaf = fab.leaves.index(str(f.switch))
            hops = storm_hops(fab, f)
            sw = {"switch": str(f.switch)}
            d.update(
                labels=sw,
                match=[sw],
                priority=prio,
                role="origin",
                culprit_node=None,
                origin_ports=[
                    fab.port_labels(int(p)) for p in np.flatnonzero(fab.port_switch == leaf)
                ],
                victims=[v for h in hops for v in h.paused],
            )
            details["origin"] = "switch"
            details["propagation"] = _propagation(hops, t0)
        else:
            nic_kinds = PfcStorm | FlakyLink | PcieDowngrade | EcnIncast | TransportErrors
            assert isinstance(f, nic_kinds | Straggler | SlowGpu)
            e = fab.nic_index(str(f.node), str(f.nic))
            nic_l, port_l = fab.nic_labels(e), fab.port_labels(e)
            node = nic_l["node"]
            if isinstance(f, PfcStorm):
                hops = storm_hops(fab, f)
                d.update(
                    labels=nic_l,
                    match=[nic_l],
                    priority=prio,
                    role="origin",
                    culprit_node=node,
                    origin_port=port_l,
                    victims=[v for h in hops for v in h.paused],
                )
                details["agent"] = node not in cfg.no_agent_nodes
                details["propagation"] = _propagation(hops, t0)
            elif isinstance(f, FlakyLink):
                d.update(labels=port_l, match=[port_l, nic_l], culprit_node=node, victims=[])
                details["cable"] = [port_l, nic_l]
            elif isinstance(f, EcnIncast):
                q = {**port_l, "queue": prio}
                d.update(labels=q, match=[q, port_l, nic_l], culprit_node=None, victims=[])
                details.update(fill=f.fill, senders=list(f.sender_nics or ()))
                if f.ecn is not None:
                    details["ecn"] = f.ecn
            else:  # PCIe downgrade, stragglers, transport errors: the NIC itself
                d.update(labels=nic_l, match=[nic_l, {"node": node}], culprit_node=node, victims=[])
        if isinstance(f, FlakyLink):
            details["flaps"] = [
                {"down_ns": at(s), "up_ns": at(s + length)} for s, length in f.flap_windows_s or ()
            ]
            details["peak_ber"] = f.peak_ber
            if f.ber_factor is not None:
                details["ber_factor"] = f.ber_factor
            if not f.errors:
                details["errors"] = False
        if isinstance(f, PcieDowngrade):
            details.update(speed_gts=f.speed_gts, max_speed_gts=fab.pcie_max_gts)
            if f.width != fab.pcie_max_width:
                details.update(width=f.width, max_width=fab.pcie_max_width)
        if isinstance(f, Straggler):
            details["slow"] = f.slow
        if isinstance(f, TransportErrors) and f.rate_per_s is not None:
            details["rate_per_s"] = f.rate_per_s
        d["details"] = details
        out_faults.append(d)
    for n in cfg.no_agent_nodes:
        not_faults.append({"id": f"NoAgent-{n}", "kind": "NoAgent", "labels": {"node": n}})
    if wrap is not None:
        not_faults.append(wrap)
    return {
        "version": 1,
        "scenario": cfg.name,
        "topology_fabric": f"sim-{fab.n_nodes}x{fab.n_rails}",
        "start_ns": start,
        "end_ns": at(cfg.duration_s),
        "interval_ns": round(cfg.interval_s * ns),
        "priority": prio,
        "queue_share_bytes": fab.buffer_bytes,
        "match_rule": "an alert hits a fault when its alertname is 'alertname' or in 'also', "
        "it overlaps [onset_ns, end_ns], and its labels contain every key/value "
        "of one of the 'match' label sets",
        "faults": out_faults,
        "not_faults": not_faults,
        **({"sampling": sampling} if sampling is not None else {}),
    }


def _propagation(hops: list[Hop], t0: int) -> list[dict[str, Any]]:
    return [
        {
            "hop": i + 1,
            "onset_ns": t0 + round(h.delay_s * 1_000_000_000),
            "pausers": list(h.pausers),
            "paused": list(h.paused),
        }
        for i, h in enumerate(hops)
    ]
