"""The fabric simulator: NCCL-like traffic over a RoCE v2 fabric, with faults, vectorised per tick.

Every tick (one sampling period) the engine computes, with numpy over whole arrays, what each
cable direction carried in that interval (bytes, packets), how long its sender was paused by
PFC from the receiver, what the egress queue feeding it held and marked, and the physical-layer
errors on it; each switch port and NIC reads its counters off the directions it sends and
receives on, so both ends of a cable always agree (the NIC's ``tx_prio3_pause_duration`` is its
leaf port's ``pfc_rx_pause_us``). Counters are cumulative 64-bit values; a device reads them at
its own jitter of a few ms into the tick, interpolated within the interval, so rates computed
from ``ts`` are exact.

Randomness comes only from ``numpy.random.default_rng`` seeded with ``SimConfig.seed``; the same
config gives the same telemetry, byte for byte.

>>> sim = Simulator(SimConfig(nodes=2, nics_per_node=2, spines=1, duration_s=0.3))
>>> frames = list(sim.ticks())
>>> len(frames), frames[0].columns
(3, ['ts', 'device', 'port', 'qual', 'metric', 'value', 'raw'])
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from rocewatch.core.errors import ConfigError
from rocewatch.core.model import METRICS, SAMPLE_SCHEMA, Scope
from rocewatch.core.topology import Topology
from rocewatch.sim.ecmp import Elephants
from rocewatch.sim.fabric import BUFFER_BYTES, LINE_GBPS, NAMINGS, Fabric, JobSpec
from rocewatch.sim.faults import (
    AgentGap,
    CounterClear,
    EcmpCollision,
    EcnIncast,
    Fault,
    FlakyLink,
    PcieDowngrade,
    PfcStorm,
    Straggler,
    TransportErrors,
    fault_from_dict,
    fault_to_dict,
    resolve_faults,
    storm_hops,
    truth,
)
from rocewatch.sim.tenants import TenantPhysics

NS = 1_000_000_000
LINE_BPS = LINE_GBPS * 1e9 / 8  # bytes per second at line rate
PKT_BYTES = 4150.0  # RoCE v2 frame at a 4096 MTU
TRAFFICS = ("allreduce", "moe")
PCIE_MAX_GTS = 32.0
# extra out_of_sequence, packet_seq_err, local_ack_timeout, rnr_nak, implied_nak per interval
TRANSPORT_FAULT_RATES = np.array([300.0, 30.0, 4.0, 0.0, 10.0])
STORM_ORIGIN_TIMEOUTS = 3.0  # local ACK timeouts per interval at a storm's origin (30/s)
U64 = np.uint64

SW_COUNTERS = (
    "port_in_fcs_errors",
    "port_in_errors",
    "port_in_discards",
    "port_carrier_transitions",
    "port_in_octets",
    "port_out_octets",
    "port_in_pkts",
    "port_out_pkts",
    "pfc_rx_pause_frames",
    "pfc_tx_pause_frames",
    "pfc_rx_pause_us",
    "pfc_tx_pause_us",
    "queue_ecn_marked_pkts",
    "queue_tx_pkts",
    "queue_dropped_pkts",
)
SW_GAUGES = ("queue_depth_bytes", "queue_peak_bytes")
NIC_COUNTERS = (
    "nic_rx_pause_frames",
    "nic_tx_pause_frames",
    "nic_rx_pause_us",
    "nic_tx_pause_us",
    "nic_tx_pause_storm_warnings",
    "nic_tx_pause_storm_errors",
    "nic_rx_crc_errors",
    "nic_rx_symbol_errors",
    "nic_rx_corrected_bits",
    "nic_rx_uncorrectable",
    "nic_link_down_events",
    "nic_rx_bytes",
    "nic_tx_bytes",
    "nic_rx_rdma_bytes",
    "nic_tx_rdma_bytes",
    "nic_ecn_marked_pkts",
    "nic_cnp_sent",
    "nic_cnp_handled",
    "nic_out_of_sequence",
    "nic_packet_seq_err",
    "nic_local_ack_timeout",
    "nic_rnr_nak_retry_err",
    "nic_implied_nak_seq_err",
)
NIC_GAUGES = (
    "nic_link_speed_mbps",
    "nic_pcie_speed_gts",
    "nic_pcie_max_speed_gts",
    "nic_pcie_width",
    "nic_pcie_max_width",
)
# driver counters with no canonical name: written to nic.jsonl only ("unknown counters are kept")
NIC_EXTRA = (("ethtool", "rx_discards_phy"), ("hw_counters", "out_of_buffer"))

_SC = {m: i for i, m in enumerate(SW_COUNTERS)}
_NC = {m: i for i, m in enumerate(NIC_COUNTERS)}


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


def _validate(cfg: SimConfig) -> None:
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


@dataclass
class Late:
    """NIC snapshots read at an earlier tick, delivered now."""

    nics: np.ndarray
    ts: np.ndarray
    c: np.ndarray
    x: np.ndarray
    g: np.ndarray


@dataclass
class Tick:
    """Everything every device read at one sampling instant (arrays, before any formatting)."""

    k: int
    sw_ts: np.ndarray  # (switches,) int64 read time of each switch
    sw_c: np.ndarray  # (len(SW_COUNTERS), ports) uint64
    sw_g: np.ndarray  # (len(SW_GAUGES), ports) float64
    nic_ts: np.ndarray  # (nics,) int64
    nic_c: np.ndarray  # (len(NIC_COUNTERS), nics) uint64
    nic_x: np.ndarray  # (len(NIC_EXTRA), nics) uint64
    nic_g: np.ndarray  # (len(NIC_GAUGES), nics) float64
    emit: np.ndarray  # indices of the NICs whose snapshot arrives now, in order
    late: list[Late] = field(default_factory=list)


@dataclass
class Readings:
    """What the devices read during one physics tick, rows in the order they arrive.

    Switch counter rows (one per port of each switch poll, polls in time order), queue gauge
    rows (``gauges_with_counters``: the very rows of the counters, read in the same poll), and
    NIC snapshots (on time in time order, then late ones read in earlier ticks).
    """

    k: int
    sw_port: np.ndarray  # (n,) port of each switch counter row
    sw_ts: np.ndarray  # (n,) int64
    sw_c: np.ndarray  # (len(SW_COUNTERS), n) uint64
    g_port: np.ndarray  # (m,) port of each queue gauge row
    g_ts: np.ndarray  # (m,) int64
    sw_g: np.ndarray  # (len(SW_GAUGES), m) float64
    nic: np.ndarray  # (q,) NIC of each snapshot
    nic_ts: np.ndarray  # (q,) int64
    nic_c: np.ndarray  # (len(NIC_COUNTERS), q) uint64
    nic_x: np.ndarray  # (len(NIC_EXTRA), q) uint64
    nic_g: np.ndarray  # (len(NIC_GAUGES), q) float64
    gauges_with_counters: bool

    @classmethod
    def from_tick(cls, t: Tick, port_switch: np.ndarray) -> Readings:
        """A default run's tick: every switch polled once (polls in time order), the NICs
        whose snapshots arrive now."""
        order = np.argsort(t.sw_ts, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        rows = np.argsort(rank[port_switch], kind="stable")
        ts = t.sw_ts[port_switch[rows]]
        emit = t.emit[np.argsort(t.nic_ts[t.emit], kind="stable")]
        nics = [emit, *(x.nics for x in t.late)]
        return cls(
            t.k,
            rows,
            ts,
            t.sw_c[:, rows],
            rows,
            ts,
            t.sw_g[:, rows],
            np.concatenate(nics),
            np.concatenate([t.nic_ts[emit], *(x.ts for x in t.late)]),
            np.concatenate([t.nic_c[:, emit], *(x.c for x in t.late)], axis=1),
            np.concatenate([t.nic_x[:, emit], *(x.x for x in t.late)], axis=1),
            np.concatenate([t.nic_g[:, emit], *(x.g for x in t.late)], axis=1),
            True,
        )


@dataclass
class Schedule:
    """When one source's devices read, over the whole run: flat arrays in time order."""

    interval_s: float
    t: np.ndarray  # seconds after the start
    dev: np.ndarray  # the device (NIC or switch index)
    lost: np.ndarray  # bool: the reading never arrives
    bounds: np.ndarray  # (n_ticks + 1,): the first reading of each physics tick

    @classmethod
    def draw(
        cls,
        rng: np.random.Generator,
        n_dev: int,
        interval_s: float,
        jitter: float,
        loss: float,
        run_s: float,
        tick_s: float,
        n_ticks: int,
    ) -> Schedule:
        """Each device from its own phase, every reading up to ``jitter`` intervals late."""
        phase = rng.uniform(0.0, interval_s, n_dev)
        n = np.maximum(np.ceil((run_s - phase) / interval_s), 0).astype(np.int64)
        dev = np.repeat(np.arange(n_dev), n)
        kth = np.arange(len(dev)) - np.repeat(np.cumsum(n) - n, n)
        t = phase[dev] + kth * interval_s + rng.uniform(0.0, jitter * interval_s, len(dev))
        lost = rng.random(len(dev)) < loss
        keep = t < run_s
        t, dev, lost = t[keep], dev[keep], lost[keep]
        order = np.argsort(t, kind="stable")
        t, dev, lost = t[order], dev[order], lost[order]
        bounds = np.searchsorted(t, np.arange(n_ticks + 1) * tick_s, side="left")
        return cls(interval_s, t, dev, lost, bounds)


def _ov(a: float, b: float, t0: float, t1: float) -> float:
    """Share of [t0, t1) that [a, b) covers."""
    return max(0.0, min(b, t1) - max(a, t0)) / (t1 - t0)


def _qual(metric: str, prio: str) -> str:
    scope = METRICS[metric].scope
    return prio if scope in (Scope.PRIORITY, Scope.QUEUE, Scope.NIC_PRIORITY) else ""


class Simulator:
    """Simulates ``cfg``; ``ticks()`` yields one SAMPLE_SCHEMA frame per sampling instant."""

    def __init__(self, cfg: SimConfig) -> None:
        _validate(cfg)
        self.cfg = cfg
        self.fabric = fab = Fabric(cfg)
        self.topology = Topology.from_dict(fab.topology_dict())
        self.faults = resolve_faults(cfg, fab)
        self.n_ticks = cfg.n_ticks
        self.interval_ns = round(cfg.interval_s * NS)
        self._static(np.random.default_rng([cfg.seed, 1]))
        self._storm_rng = np.random.default_rng([cfg.seed, 8])  # steps() starts it afresh
        self._frame_layout()
        self.schedules: dict[str, Schedule] = {}
        if cfg.cadenced:
            self._schedules(np.random.default_rng([cfg.seed, 3]))

    # --- set-up ----------------------------------------------------------------------------------
    def _static(self, rng: np.random.Generator) -> None:
        cfg, fab = self.cfg, self.fabric
        E, D, T = fab.n_nics, fab.n_dirs, cfg.interval_s
        self.line_bps = fab.link_gbps * 1e9 / 8  # bytes per second at line rate
        self.buffer_bytes = fab.buffer_bytes
        self.rate = self.line_bps * rng.uniform(0.88, 0.91, E)
        lo, hi = (math.log10(x) for x in cfg.ber_range)
        self.ber = 10.0 ** rng.uniform(lo, hi, D)  # each link direction its own baseline
        self.stall_level = self.buffer_bytes * rng.uniform(0.30, 0.40, D)
        # how full a queue a storm keeps paused gets (of the buffer): drawn from a stream of its
        # own, so runs without storms are what they were
        self.stuck_fill = np.random.default_rng([cfg.seed, 6]).uniform(0.6, 0.9, D)
        jmax = min(0.004, 0.3 * T)
        self.sw_jit = rng.uniform(0.15, 0.85, len(fab.switches)) * jmax
        node_jit = rng.uniform(0.15, 0.85, fab.n_nodes) * jmax
        self.nic_jit = node_jit[fab.nic_node] + 0.00005 * fab.nic_rail * (jmax > 0.001)

        traffic = [j.traffic or cfg.traffic for j in fab.jobs]
        self.act = np.zeros((len(fab.jobs) + 1, self.n_ticks))  # last row: no job
        for j, tr in enumerate(traffic):
            self.act[j] = _activity(rng, tr, self.n_ticks, T)
        nic_moe = np.array(
            [fab.nic_job[e] >= 0 and traffic[fab.nic_job[e]] == "moe" for e in range(E)], dtype=bool
        )
        pods = fab.n_pods
        self.up_share = np.where(nic_moe, 0.45, 0.12) + 0.3 * (pods - 1) / pods
        leaf_moe = np.bincount(fab.nic_leaf, weights=nic_moe, minlength=fab.n_leaves) > 0
        self.dir_moe = np.concatenate(
            [np.repeat(nic_moe, 2), np.repeat(leaf_moe[fab.uplink_leaf], 2)]
        )
        self.dir_switch_rx = fab.dir_switch_rx
        self.nic_job_row = np.where(fab.nic_job >= 0, fab.nic_job, len(fab.jobs))
        k = fab.n_rails
        self.group = np.where(
            fab.nic_job >= 0, fab.nic_job * k + fab.nic_rail, len(fab.jobs) * k + np.arange(E)
        )
        self.n_groups = int(self.group.max()) + 1
        self.group_size = np.bincount(self.group, minlength=self.n_groups).astype(float)

        # initial counter values: devices have been up for a while
        P = fab.n_ports
        up_s = rng.uniform(3600, 30 * 86400, (1, P))
        scale = np.zeros((len(SW_COUNTERS), 1))
        for m, v in (
            ("port_in_octets", 2e9),
            ("port_out_octets", 2e9),
            ("port_in_pkts", 5e5),
            ("port_out_pkts", 5e5),
            ("queue_tx_pkts", 5e5),
            ("pfc_rx_pause_frames", 2),
            ("pfc_tx_pause_frames", 2),
            ("pfc_rx_pause_us", 50),
            ("pfc_tx_pause_us", 50),
            ("queue_ecn_marked_pkts", 50),
            ("port_carrier_transitions", 1e-6),
        ):
            scale[_SC[m]] = v
        self.sw_init = np.floor(scale * up_s * rng.uniform(0.5, 1.0, (len(SW_COUNTERS), P))).astype(
            U64
        )
        up_n = rng.uniform(3600, 30 * 86400, (1, E))
        nscale = np.zeros((len(NIC_COUNTERS), 1))
        for m, v in (
            ("nic_rx_bytes", 2e9),
            ("nic_tx_bytes", 2e9),
            ("nic_rx_rdma_bytes", 1.9e9),
            ("nic_tx_rdma_bytes", 1.9e9),
            ("nic_rx_pause_frames", 2),
            ("nic_tx_pause_frames", 1),
            ("nic_rx_pause_us", 50),
            ("nic_tx_pause_us", 20),
            ("nic_rx_corrected_bits", 2e5),
            ("nic_ecn_marked_pkts", 50),
            ("nic_cnp_sent", 25),
            ("nic_cnp_handled", 25),
            ("nic_out_of_sequence", 20),
            ("nic_link_down_events", 1e-6),
        ):
            nscale[_NC[m]] = v
        self.nic_init = np.floor(
            nscale * up_n * rng.uniform(0.5, 1.0, (len(NIC_COUNTERS), E))
        ).astype(U64)
        self.nic_x_init = np.floor(rng.uniform(0, 50, (len(NIC_EXTRA), E))).astype(U64)

        self.wrap: dict[str, Any] | None = None
        if cfg.wrap_counter:
            self._place_wrap(rng)
        self._compile_faults()
        self._noise(np.random.default_rng([cfg.seed, 5]))

    def _place_wrap(self, rng: np.random.Generator) -> None:
        """Start one busy leaf port's in-octets just below 2^64, so it wraps early in the run."""
        fab, cfg = self.fabric, self.cfg
        busy: set[int] = set()
        busy_leaves: set[int] = set()
        for f in self.faults:
            node = getattr(f, "node", None)
            if node in fab.node_index:
                busy.add(fab.node_index[node])
            if isinstance(f, PfcStorm) and f.origin == "switch":
                busy_leaves.add(fab.leaves.index(str(f.switch)))
            elif isinstance(f, PfcStorm):
                e = fab.nic_index(str(f.node), str(f.nic))
                busy |= {int(i) for i in np.flatnonzero(fab.job_of_node == fab.nic_job[e])}
        busy |= {fab.node_index[n] for n in cfg.no_agent_nodes}
        cand = [
            e
            for e in range(fab.n_nics)
            if fab.nic_job[e] >= 0
            and int(fab.nic_node[e]) not in busy
            and int(fab.nic_leaf[e]) not in busy_leaves
        ]
        if not cand:
            return
        e = int(rng.choice(cand))
        ahead = int(self.line_bps * 0.5 * max(0.2 * cfg.duration_s, cfg.interval_s * 3))
        start = (1 << 64) - ahead
        self.sw_init[_SC["port_in_octets"], e] = U64(start)
        self.wrap = {
            "id": "CounterWrap-1",
            "kind": "CounterWrap",
            "labels": fab.port_labels(e),
            "metric": "port_in_octets",
            "initial_raw": start,
            "note": f"starts at 2^64 - {ahead} bytes: wraps once the port received that",
        }

    def _peak_ber(self, f: FlakyLink, cable: int) -> float:
        """The BER a bad cable's worse direction climbs to; 0 for one that only flaps."""
        if not f.errors:
            return 0.0
        if f.ber_factor is None:
            return f.peak_ber
        own = float(self.ber[2 * cable : 2 * cable + 2].max())
        return min(1e-2, f.ber_factor * own)

    def _noise(self, rng: np.random.Generator) -> None:
        """Healthy noise drawn up front from its own stream (runs without it draw nothing):
        DCQCN marking bursts of 2-10 % on switch egress queues, lasting 0.2-3 s, and per-NIC
        reordering from adaptive routing with bursts (1-5 s, 3-10x) about once a minute."""
        cfg, fab = self.cfg, self.fabric
        run = cfg.duration_s
        dirs = fab.port_out_dir
        n = rng.poisson(cfg.ecn_bursts_per_min / 60.0 * run, len(dirs))
        bd = np.repeat(dirs, n)
        b0 = rng.uniform(0.0, run, len(bd))
        b1 = b0 + 10.0 ** rng.uniform(np.log10(0.2), np.log10(3.0), len(bd))
        self.ecn_bursts = (b0, b1, bd, rng.uniform(0.02, 0.10, len(bd)))
        self.ar_base: np.ndarray | None = None
        if cfg.ar_reorder > 0:
            E = fab.n_nics
            self.ar_base = cfg.ar_reorder * 10.0 ** rng.uniform(-0.5, 0.5, E)
            m = rng.poisson(run / 60.0, E)
            ne = np.repeat(np.arange(E), m)
            a0 = rng.uniform(0.0, run, len(ne))
            a1 = a0 + rng.uniform(1.0, 5.0, len(ne))
            self.ar_bursts = (a0, a1, ne, rng.uniform(3, 10, len(ne)))

    def _ar_factor(self, t0: float, t1: float) -> np.ndarray:
        out = np.ones(self.fabric.n_nics)
        a0, a1, ne, x = self.ar_bursts
        on = (a0 < t1) & (a1 > t0)
        if on.any():
            np.maximum.at(out, ne[on], x[on])
        return out

    def _compile_faults(self) -> None:
        fab, run = self.fabric, self.cfg.duration_s
        Flaps = tuple[tuple[float, float], ...]
        self.storms: list[
            tuple[float, float, int, int, list[tuple[float, np.ndarray]], np.ndarray]
        ] = []
        self.flaky_nic: list[tuple[float, float, int, float, Flaps]] = []
        self.flaky_up: list[tuple[float, float, int, int, float, Flaps]] = []
        self.pcie: list[tuple[float, float, int, float, float, int]] = []
        self.thermal: list[tuple[float, float, int, float]] = []
        self.incast: list[tuple[float, float, int, np.ndarray, float, float | None]] = []
        self.transport: list[tuple[float, float, int, float]] = []
        # storms from a switch: t0, t1, the leaf's NICs (stalled at once), the NICs of the jobs
        # it carries (stalled from the first hop), hops as for NIC storms
        self.sw_storms: list[tuple[float, float, np.ndarray, np.ndarray, list[Any]]] = []
        self.clears: list[tuple[float, str, np.ndarray]] = []
        self.gaps: list[tuple[float, float, int]] = []
        self.elephants = Elephants(fab, self.cfg.seed)  # rocewatch/sim/ecmp.py
        for f in self.faults:
            t0, t1 = f.onset_s, f.end_s(run)
            if isinstance(f, EcmpCollision):
                uplinks = tuple(x.uplink for x in f.flow_list or ())
                leaf = fab.leaves.index(str(f.switch))
                self.elephants.add(t0, t1, leaf, uplinks, f.demand, sprayed=not f.is_fault)
            if isinstance(f, PfcStorm) and f.origin == "switch":
                leaf = fab.leaves.index(str(f.switch))
                mine = fab.nics_on_leaf(leaf)
                jobs = sorted(set(fab.nic_job[mine].tolist()) - {-1})
                hops = [(h.delay_s, h.dirs) for h in storm_hops(fab, f)]
                in_jobs = np.flatnonzero(np.isin(fab.nic_job, jobs))
                self.sw_storms.append((t0, t1, mine, in_jobs, hops))
            elif isinstance(f, PfcStorm):
                x = fab.nic_index(str(f.node), str(f.nic))
                hops = [(h.delay_s, h.dirs) for h in storm_hops(fab, f)]
                warn = t0 + 0.1 + np.arange(max(0.0, np.ceil(t1 - t0)))
                self.storms.append((t0, t1, x, int(fab.nic_job[x]), hops, warn[warn < t1]))
            elif isinstance(f, FlakyLink):
                flaps = f.flap_windows_s or ()
                # peak BER: absolute, or a multiple of the cable's own baseline; 0: no errors
                if f.uplink:
                    lf, sp = fab.leaves.index(str(f.switch)), fab.spines.index(str(f.spine))
                    c = fab.n_nics + lf * fab.n_spines + sp
                    self.flaky_up.append((t0, t1, lf, sp, self._peak_ber(f, c), flaps))
                else:
                    e = fab.nic_index(str(f.node), str(f.nic))
                    self.flaky_nic.append((t0, t1, e, self._peak_ber(f, e), flaps))
            elif isinstance(f, PcieDowngrade):
                # what the trained-down link carries against what the network delivers; the
                # constant makes Gen4 x16 (16 GT/s) carry 55 % of a 400G link, as measured
                lanes = f.speed_gts * f.width / (PCIE_MAX_GTS * 16)
                cap = min(1.0, 1.1 * lanes * (LINE_GBPS / fab.link_gbps))
                e = fab.nic_index(str(f.node), str(f.nic))
                self.pcie.append((t0, t1, e, cap, f.speed_gts, f.width))
            elif isinstance(f, Straggler):
                e = fab.nic_index(str(f.node), str(f.nic))
                self.thermal.append((t0, t1, e, float(f.slow)))
            elif isinstance(f, EcnIncast):
                y = fab.nic_index(str(f.node), str(f.nic))
                snd = np.array(
                    [fab.nic_index(*s.split("/", 1)) for s in f.sender_nics or ()], dtype=int
                )
                self.incast.append((t0, t1, y, snd, float(f.fill or 0.9), f.ecn))
            elif isinstance(f, TransportErrors):
                e = fab.nic_index(str(f.node), str(f.nic))
                scale = f.scale
                if f.rate_per_s is not None:
                    # the fault's rates at full activity, scaled to the job's mean activity
                    mean_a = float(self.act[self.nic_job_row[e]].mean()) or 1.0
                    per_s = float(TRANSPORT_FAULT_RATES.sum()) / 0.1 * (0.3 + 0.7 * mean_a)
                    scale = f.rate_per_s / per_s
                self.transport.append((t0, t1, e, scale))
            elif isinstance(f, CounterClear):
                if f.target == "switch":
                    cols = np.flatnonzero(fab.port_switch == fab.switch_index[str(f.switch)])
                    self.clears.append((t0, "switch", cols))
                else:
                    e = fab.nic_index(str(f.node), str(f.nic))
                    self.clears.append((t0, "nic", np.array([e])))
            elif isinstance(f, AgentGap):
                self.gaps.append((t0, t1, fab.node_index[str(f.node)]))
        self.tenant_physics = TenantPhysics(fab, self.faults, run)
        silent = np.zeros(fab.n_nodes, dtype=bool)
        for n in self.cfg.no_agent_nodes:
            silent[fab.node_index[n]] = True
        self.nic_silent = silent[fab.nic_node]

    def _frame_layout(self) -> None:
        fab = self.fabric
        prio = str(fab.priority)
        P, E = fab.n_ports, fab.n_nics
        sw_dev = np.array(fab.switches, dtype=object)[fab.port_switch]
        sw_port = np.array(fab.port_name, dtype=object)
        nic_dev = np.array(fab.nodes, dtype=object)[fab.nic_node]
        nic_port = np.array(fab.rail_nics, dtype=object)[fab.nic_rail]
        self._nic_dev, self._nic_port = nic_dev, nic_port
        self._nic_metric_rows = NIC_COUNTERS + NIC_GAUGES
        self._nic_qual = [_qual(m, prio) for m in self._nic_metric_rows]
        parts = [
            (sw_dev, sw_port, SW_COUNTERS, P),
            (nic_dev, nic_port, NIC_COUNTERS, E),
            (sw_dev, sw_port, SW_GAUGES, P),
            (nic_dev, nic_port, NIC_GAUGES, E),
        ]
        dev, port, qual, metric = [], [], [], []
        for d, p, ms, n in parts:
            for m in ms:
                dev.append(d)
                port.append(p)
                qual.append(np.full(n, _qual(m, prio), dtype=object))
                metric.append(np.full(n, m, dtype=object))
        self._static_cols = pl.DataFrame(
            {
                "device": np.concatenate(dev).tolist(),
                "port": np.concatenate(port).tolist(),
                "qual": np.concatenate(qual).tolist(),
                "metric": np.concatenate(metric).tolist(),
            },
            schema={"device": pl.String, "port": pl.String, "qual": pl.String, "metric": pl.String},
        )
        n_sw = len(fab.switches)
        # row -> index into concat(sw_ts, nic_ts)
        self._row_dev = np.concatenate(
            [
                np.tile(fab.port_switch, len(SW_COUNTERS)),
                n_sw + np.tile(np.arange(E), len(NIC_COUNTERS)),
                np.tile(fab.port_switch, len(SW_GAUGES)),
                n_sw + np.tile(np.arange(E), len(NIC_GAUGES)),
            ]
        )
        self._n_counter_rows = P * len(SW_COUNTERS) + E * len(NIC_COUNTERS)
        self._n_rows = self._n_counter_rows + P * len(SW_GAUGES) + E * len(NIC_GAUGES)
        self._row_nic = np.full(self._n_rows, -1)
        a = P * len(SW_COUNTERS)
        self._row_nic[a : self._n_counter_rows] = np.tile(np.arange(E), len(NIC_COUNTERS))
        b = self._n_counter_rows + P * len(SW_GAUGES)
        self._row_nic[b:] = np.tile(np.arange(E), len(NIC_GAUGES))

    def _schedules(self, rng: np.random.Generator) -> None:
        cfg, fab = self.cfg, self.fabric
        jit = 0.2 if cfg.jitter is None else cfg.jitter
        tick = cfg.interval_s

        def draw(n: int, every: float | None) -> Schedule:
            return Schedule.draw(
                rng, n, every or tick, jit, cfg.sample_loss, cfg.duration_s, tick, self.n_ticks
            )

        self.schedules["nic"] = draw(fab.n_nics, cfg.nic_interval_s)
        self.schedules["switch"] = draw(len(fab.switches), cfg.switch_interval_s)
        if cfg.gauge_interval_s is not None:
            self.schedules["gauge"] = draw(len(fab.switches), cfg.gauge_interval_s)
        ps = np.argsort(fab.port_switch, kind="stable")
        self._ports_sorted = ps
        self._ports_start = np.searchsorted(fab.port_switch[ps], np.arange(len(fab.switches)))
        self._ports_count = np.bincount(fab.port_switch, minlength=len(fab.switches))

    def _silenced(self, nics: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Which NIC readings their agent never sends: no agent, or an agent gap."""
        out = self.nic_silent[nics].copy()
        node = self.fabric.nic_node[nics]
        for g0, g1, n in self.gaps:
            out |= (node == n) & (t >= g0) & (t < g1)
        return out

    def lost(self) -> dict[str, dict[str, list[int]]]:
        """The readings lost on the way (cadenced runs): per source (``nic``, ``switch``,
        ``gauge``) and device (``node/nic`` or the switch), their read times in ns."""
        fab = self.fabric
        out: dict[str, dict[str, list[int]]] = {}
        for src, sch in self.schedules.items():
            keep = sch.lost.copy()
            if src == "nic":
                keep &= ~self._silenced(sch.dev, sch.t)
            by: dict[str, list[int]] = {}
            for d, t in zip(sch.dev[keep].tolist(), sch.t[keep].tolist(), strict=True):
                if src == "nic":
                    name = "{node}/{nic}".format(**fab.nic_labels(d))
                else:
                    name = fab.switches[d]
                by.setdefault(name, []).append(self.cfg.start_ns + round(t * NS))
            out[src] = by
        return out

    def sampling(self) -> dict[str, Any] | None:
        """How the sources read (cadenced runs; None for default runs), as the truth has it."""
        cfg = self.cfg
        if not cfg.cadenced:
            return None
        sw = cfg.switch_interval_s or cfg.interval_s
        return {
            "physics_tick_s": cfg.interval_s,
            "nic_interval_s": cfg.nic_interval_s or cfg.interval_s,
            "switch_interval_s": sw,
            "gauge_interval_s": cfg.gauge_interval_s or sw,
            "jitter": 0.2 if cfg.jitter is None else cfg.jitter,
            "sample_loss": cfg.sample_loss,
            "lost": self.lost(),
        }

    # --- public ----------------------------------------------------------------------------------
    def truth(self) -> dict[str, Any]:
        """Ground truth: the faults with the labels a hit must carry, and the non-faults.

        ``faults[i]``: ``id``, ``kind``, ``alertname`` (and ``also``: other alertnames that
        count as a hit), ``onset_ns``/``end_ns``, ``labels`` (the entity), ``match`` (label
        sets any of which an alert may carry to hit it, e.g. either end of a cable),
        ``culprit_node`` (the node a correct policy may drain; null for congestion),
        ``victims`` (entities a storm paused, which must not be blamed) and ``details``.
        ``not_faults``: counter clears, agent gaps, silent nodes and the counter that wraps.
        """
        return truth(self.cfg, self.fabric, self.faults, self.wrap, self.sampling())

    def ticks(self) -> Iterator[pl.DataFrame]:
        """One frame per sampling instant (per physics tick in a cadenced run), SAMPLE_SCHEMA
        columns, late NIC snapshots included."""
        if self.cfg.cadenced:
            for r in self.readings():
                yield self.readings_frame(r)
            return
        for t in self.steps():
            yield self.frame(t)

    def all_readings(self) -> Iterator[Readings]:
        """Every tick's readings, whatever the run's kind (what the file writers format)."""
        if self.cfg.cadenced:
            yield from self.readings()
            return
        for t in self.steps():
            yield Readings.from_tick(t, self.fabric.port_switch)

    def readings_frame(self, r: Readings) -> pl.DataFrame:
        """``r`` as a SAMPLE_SCHEMA frame: counters, then gauges, each metric by metric."""
        fab = self.fabric
        P, E = fab.n_ports, fab.n_nics
        nsc, nnc, nsg, nng = len(SW_COUNTERS), len(NIC_COUNTERS), len(SW_GAUGES), len(NIC_GAUGES)
        a = P * nsc
        b = self._n_counter_rows
        c = b + P * nsg
        idx = np.concatenate(
            [
                (np.arange(nsc)[:, None] * P + r.sw_port[None, :]).ravel(),
                a + (np.arange(nnc)[:, None] * E + r.nic[None, :]).ravel(),
                b + (np.arange(nsg)[:, None] * P + r.g_port[None, :]).ravel(),
                c + (np.arange(nng)[:, None] * E + r.nic[None, :]).ravel(),
            ]
        )
        tiles = ((r.sw_ts, nsc), (r.nic_ts, nnc), (r.g_ts, nsg), (r.nic_ts, nng))
        ts = np.concatenate([np.tile(x, n) for x, n in tiles])
        raw = np.concatenate([r.sw_c.ravel(), r.nic_c.ravel()])
        value = np.concatenate([raw.astype(np.float64), r.sw_g.ravel(), r.nic_g.ravel()])
        n_g = len(idx) - len(raw)
        raw_s = pl.concat(
            [pl.Series("raw", raw, dtype=pl.UInt64), pl.Series("raw", [None] * n_g, pl.UInt64)]
        )
        return (
            self._static_cols[idx]
            .with_columns(pl.Series("ts", ts, dtype=pl.Int64), pl.Series("value", value), raw_s)
            .select(list(SAMPLE_SCHEMA))
        )

    def frame(self, t: Tick) -> pl.DataFrame:
        fab = self.fabric
        ts_dev = np.concatenate([t.sw_ts, t.nic_ts])
        ts = ts_dev[self._row_dev]
        raw = np.concatenate([t.sw_c.ravel(), t.nic_c.ravel()])
        value = np.concatenate([raw.astype(np.float64), t.sw_g.ravel(), t.nic_g.ravel()])
        n_g = self._n_rows - self._n_counter_rows
        nulls = pl.Series("raw", [None], dtype=pl.UInt64).extend_constant(None, n_g - 1)
        raw_s = pl.concat([pl.Series("raw", raw, dtype=pl.UInt64), nulls])
        df = self._static_cols.with_columns(
            pl.Series("ts", ts, dtype=pl.Int64), pl.Series("value", value), raw_s
        ).select(list(SAMPLE_SCHEMA))
        if len(t.emit) != fab.n_nics:
            emitted = np.zeros(fab.n_nics + 1, dtype=bool)
            emitted[t.emit] = True
            emitted[-1] = True  # switch rows (row_nic == -1)
            df = df.filter(pl.Series(emitted[self._row_nic]))
        if t.late:
            df = pl.concat([df, *(self._late_frame(x) for x in t.late)])
        return df

    def _late_frame(self, late: Late) -> pl.DataFrame:
        n = len(late.nics)
        m = len(self._nic_metric_rows)
        raw = late.c.ravel()
        value = np.concatenate([raw.astype(np.float64), late.g.ravel()])
        return pl.DataFrame(
            {
                "ts": np.tile(late.ts, m),
                "device": np.tile(self._nic_dev[late.nics], m).tolist(),
                "port": np.tile(self._nic_port[late.nics], m).tolist(),
                "qual": np.repeat(np.array(self._nic_qual, dtype=object), n).tolist(),
                "metric": np.repeat(np.array(self._nic_metric_rows, dtype=object), n).tolist(),
                "value": value,
                "raw": pl.concat(
                    [
                        pl.Series(raw, dtype=pl.UInt64),
                        pl.Series([None] * (n * len(NIC_GAUGES)), dtype=pl.UInt64),
                    ]
                ),
            },
            schema=SAMPLE_SCHEMA,
        )

    # --- the engine ------------------------------------------------------------------------------
    def readings(self) -> Iterator[Readings]:
        """A cadenced run's readings, physics tick by physics tick (see ``SimConfig``)."""
        cfg, fab = self.cfg, self.fabric
        if not cfg.cadenced:
            raise ConfigError("readings() needs a cadenced run (set a source's interval)")
        rng = np.random.default_rng([cfg.seed, 2])  # the physics, as in a default run
        self._storm_rng = np.random.default_rng([cfg.seed, 8])
        self.elephants.restart()
        late_rng = np.random.default_rng([cfg.seed, 4])
        T = cfg.interval_s
        sw_cum = self.sw_init.copy()
        nic_cum = self.nic_init.copy()
        x_cum = self.nic_x_init.copy()
        sw_off = np.zeros_like(sw_cum)
        nic_off = np.zeros_like(nic_cum)
        x_off = np.zeros_like(x_cum)
        max_delay = min(2, int((0.3 - 0.01) / T))
        pending: list[tuple[int, tuple[np.ndarray, ...]]] = []
        g_static = np.zeros((len(NIC_GAUGES), 1))
        g_static[:, 0] = (
            fab.link_gbps * 1000,
            fab.pcie_max_gts,
            fab.pcie_max_gts,
            fab.pcie_max_width,
            fab.pcie_max_width,
        )
        nsch, ssch = self.schedules["nic"], self.schedules["switch"]
        gsch = self.schedules.get("gauge")
        for k in range(self.n_ticks):
            t0 = k * T
            sw_inc, sw_g, nic_inc, x_inc, _ = self._interval(rng, k)
            clears = [(tc, what, cols) for tc, what, cols in self.clears if t0 <= tc < t0 + T]
            nclears = [((tc - t0) / T, cols) for tc, what, cols in clears if what == "nic"]
            sclears = [((tc - t0) / T, cols) for tc, what, cols in clears if what == "switch"]

            # --- NIC snapshots
            i0, i1 = int(nsch.bounds[k]), int(nsch.bounds[k + 1])
            e, tt = nsch.dev[i0:i1], nsch.t[i0:i1]
            fr = np.clip((tt - t0) / T, 0.0, 1.0)
            nc = _read(nic_cum, nic_inc, nic_off, e, fr, nclears)
            nx = _read(x_cum, x_inc, x_off, e, fr, nclears)
            ng = np.repeat(g_static, len(e), axis=1)
            for f0, f1, pe, _c, gts, width in self.pcie:
                hit = (e == pe) & (tt >= f0) & (tt < f1)
                ng[1, hit], ng[3, hit] = gts, width
            ok = ~(nsch.lost[i0:i1] | self._silenced(e, tt))
            ts = cfg.start_ns + np.rint(tt * NS).astype(np.int64)
            delay = np.zeros(len(e), dtype=np.int64)
            if max_delay >= 1 and cfg.out_of_order > 0 and len(e):
                delay = np.where(
                    late_rng.random(len(e)) < cfg.out_of_order,
                    late_rng.integers(1, max_delay + 1, len(e)),
                    0,
                )
            if k == self.n_ticks - 1:
                delay[:] = 0
            now = ok & (delay == 0)
            parts: list[tuple[np.ndarray, ...]] = [
                (e[now], ts[now], nc[:, now], nx[:, now], ng[:, now])
            ]
            for d in range(1, max_delay + 1):
                sel = ok & (delay == d)
                if sel.any():
                    pending.append(
                        (
                            min(k + d, self.n_ticks - 1),
                            (e[sel], ts[sel], nc[:, sel], nx[:, sel], ng[:, sel]),
                        )
                    )
            parts += [x for due, x in pending if due == k]
            pending = [(due, x) for due, x in pending if due != k]

            # --- switch polls: every port of the switch, counters (and gauges) at once
            j0, j1 = int(ssch.bounds[k]), int(ssch.bounds[k + 1])
            keep = ~ssch.lost[j0:j1]
            sw_dev, sw_t = ssch.dev[j0:j1][keep], ssch.t[j0:j1][keep]
            rows, row_t = self._poll_rows(sw_dev, sw_t)
            sc = _read(sw_cum, sw_inc, sw_off, rows, np.clip((row_t - t0) / T, 0.0, 1.0), sclears)
            sw_ts = cfg.start_ns + np.rint(row_t * NS).astype(np.int64)
            if gsch is None:
                g_rows, g_ts = rows, sw_ts
            else:
                h0, h1 = int(gsch.bounds[k]), int(gsch.bounds[k + 1])
                gk = ~gsch.lost[h0:h1]
                g_rows, g_t = self._poll_rows(gsch.dev[h0:h1][gk], gsch.t[h0:h1][gk])
                g_ts = cfg.start_ns + np.rint(g_t * NS).astype(np.int64)
            # counters past a clear count from it
            for tc, what, cols in clears:
                off = sw_off if what == "switch" else nic_off
                cum, inc = (sw_cum, sw_inc) if what == "switch" else (nic_cum, nic_inc)
                c = (tc - t0) / T
                off[:, cols] = cum[:, cols] + np.floor(inc[:, cols] * c).astype(U64)
                if what == "nic":
                    x_off[:, cols] = x_cum[:, cols] + np.floor(x_inc[:, cols] * c).astype(U64)
            sw_cum += sw_inc
            nic_cum += nic_inc
            x_cum += x_inc
            yield Readings(
                k,
                rows,
                sw_ts,
                sc,
                g_rows,
                g_ts,
                sw_g[:, g_rows],
                np.concatenate([p[0] for p in parts]),
                np.concatenate([p[1] for p in parts]),
                np.concatenate([p[2] for p in parts], axis=1),
                np.concatenate([p[3] for p in parts], axis=1),
                np.concatenate([p[4] for p in parts], axis=1),
                gsch is None,
            )

    def _poll_rows(self, dev: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The port rows of switch polls (every port of each switch, in port order)."""
        cnt = self._ports_count[dev]
        first = np.repeat(self._ports_start[dev], cnt)
        within = np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        return self._ports_sorted[first + within], np.repeat(t, cnt)

    def steps(self) -> Iterator[Tick]:
        """The raw readings, tick by tick (what ``ticks`` and the file writers format)."""
        cfg, fab = self.cfg, self.fabric
        rng = np.random.default_rng([cfg.seed, 2])
        # what only storms draw comes from a stream of its own: the rest of a run's noise does
        # not depend on whether (or where) a storm was
        self._storm_rng = np.random.default_rng([cfg.seed, 8])
        self.elephants.restart()
        T, T_ns = cfg.interval_s, self.interval_ns
        E = fab.n_nics
        sw_cum = self.sw_init.copy()
        nic_cum = self.nic_init.copy()
        x_cum = self.nic_x_init.copy()
        sw_off = np.zeros_like(sw_cum)
        nic_off = np.zeros_like(nic_cum)
        x_off = np.zeros_like(x_cum)
        max_delay = min(2, int((0.3 - 0.01) / T))
        pending: list[tuple[int, Late]] = []
        gauges_static = np.zeros((len(NIC_GAUGES), E))
        gauges_static[0] = fab.link_gbps * 1000
        gauges_static[2] = fab.pcie_max_gts
        gauges_static[3] = fab.pcie_max_width
        gauges_static[4] = fab.pcie_max_width
        for k in range(self.n_ticks):
            t0 = k * T
            sw_inc, sw_g, nic_inc, x_inc, pcie_now = self._interval(rng, k)
            j_sw = self.sw_jit + rng.uniform(-0.0002, 0.0002, len(self.sw_jit)) * (T > 0.01)
            j_nic = self.nic_jit + rng.uniform(-0.0001, 0.0001, E) * (T > 0.01)
            fs, fn = j_sw[fab.port_switch] / T, j_nic / T
            sw_r = sw_cum + np.floor(sw_inc * fs).astype(U64) - sw_off
            nic_r = nic_cum + np.floor(nic_inc * fn).astype(U64) - nic_off
            x_r = x_cum + np.floor(x_inc * fn).astype(U64) - x_off
            for tc, what, cols in self.clears:
                if not t0 <= tc < t0 + T:
                    continue
                c = (tc - t0) / T
                if what == "switch":
                    sw_off[:, cols] = sw_cum[:, cols] + np.floor(sw_inc[:, cols] * c).astype(U64)
                    after = cols[fs[cols] >= c]
                    sw_r[:, after] = (
                        sw_cum[:, after]
                        + np.floor(sw_inc[:, after] * fs[after]).astype(U64)
                        - sw_off[:, after]
                    )
                else:
                    nic_off[:, cols] = nic_cum[:, cols] + np.floor(nic_inc[:, cols] * c).astype(U64)
                    x_off[:, cols] = x_cum[:, cols] + np.floor(x_inc[:, cols] * c).astype(U64)
                    if fn[cols[0]] >= c:
                        nic_r[:, cols] = (
                            nic_cum[:, cols]
                            + np.floor(nic_inc[:, cols] * fn[cols]).astype(U64)
                            - nic_off[:, cols]
                        )
                        x_r[:, cols] = (
                            x_cum[:, cols]
                            + np.floor(x_inc[:, cols] * fn[cols]).astype(U64)
                            - x_off[:, cols]
                        )
            sw_cum += sw_inc
            nic_cum += nic_inc
            x_cum += x_inc
            base_ns = cfg.start_ns + k * T_ns
            sw_ts = base_ns + np.rint(j_sw * NS).astype(np.int64)
            nic_ts = base_ns + np.rint(j_nic * NS).astype(np.int64)
            nic_g = gauges_static.copy()
            nic_g[1] = pcie_now[0]
            nic_g[3] = pcie_now[1]
            # who talks: silent nodes, agent gaps, late snapshots
            emit = ~self.nic_silent
            for g0, g1, node in self.gaps:
                if g0 <= t0 + j_nic[node * fab.n_rails] < g1:
                    emit[node * fab.n_rails : (node + 1) * fab.n_rails] = False
            late_now = [x for due, x in pending if due == k]
            pending = [(due, x) for due, x in pending if due != k]
            if max_delay >= 1 and cfg.out_of_order > 0:
                delay = np.where(
                    rng.random(E) < cfg.out_of_order, rng.integers(1, max_delay + 1, E), 0
                )
                delay[~emit] = 0
                if k + 1 < self.n_ticks:
                    for d in range(1, max_delay + 1):
                        idx = np.flatnonzero(delay == d)
                        if len(idx):
                            pending.append(
                                (
                                    min(k + d, self.n_ticks - 1),
                                    Late(
                                        idx, nic_ts[idx], nic_r[:, idx], x_r[:, idx], nic_g[:, idx]
                                    ),
                                )
                            )
                            emit[idx] = False
            if k == self.n_ticks - 1:
                late_now += [x for _, x in pending]
            yield Tick(
                k, sw_ts, sw_r, sw_g, nic_ts, nic_r, x_r, nic_g, np.flatnonzero(emit), late_now
            )

    def _interval(
        self, rng: np.random.Generator, k: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Counter increments over tick ``k``'s interval, and the gauges read in it (the PCIe
        link's speed and width as a default run's NICs read them, a few ms into the tick)."""
        cfg, fab = self.cfg, self.fabric
        T = cfg.interval_s
        T_us = T * 1e6
        per_tick = T / 0.1  # rates below are per 100 ms
        t0, t1 = k * T, (k + 1) * T
        E, D, P, S, L = fab.n_nics, fab.n_dirs, fab.n_ports, fab.n_spines, fab.n_leaves
        line = self.line_bps * T
        a = self.act[self.nic_job_row, k]

        # --- capacity: PCIe, heat, flaps, the ring waiting for its slowest member, storms -----
        cap = np.ones(E)
        pcie_now = np.stack([np.full(E, fab.pcie_max_gts), np.full(E, float(fab.pcie_max_width))])
        pcie_int: list[tuple[int, float, float]] = []
        for f0, f1, e, c, gts, width in self.pcie:
            f = _ov(f0, f1, t0, t1)
            if f > 0:
                cap[e] *= 1 - f * (1 - c)
                # how hard the NIC pushes back scales with its shortfall (55 % of line rate:
                # the full effect; a link still faster than the network: none)
                sev = min(1.0, round((1 - c) / 0.45, 6))
                pcie_int.append((e, f * min(1.0, a[e] / 0.5), sev))
            if f0 <= t0 + self.nic_jit[e] < f1:
                pcie_now[:, e] = gts, width
        thermal_int: list[tuple[int, float, float]] = []
        for f0, f1, e, sl in self.thermal:
            f = _ov(f0, f1, t0, t1)
            if f > 0:
                heat = min(1.0, max(0.0, (t0 + t1) / 2 - f0) / 3.0)  # it heats up over ~3 s
                cap[e] *= 1 - f * sl * heat
                thermal_int.append((e, f * min(1.0, a[e] / 0.5), sl * heat))
        down = np.zeros(E)
        for _f0, _f1, e, _, flaps in self.flaky_nic:
            down[e] += sum(_ov(s, s + n, t0, t1) for s, n in flaps)
        down = np.minimum(down, 1.0)
        cap *= 1 - down
        gmin = np.ones(self.n_groups)
        np.minimum.at(gmin, self.group, cap)
        ring = gmin[self.group]
        stall = np.ones(E)
        quiet: list[tuple[int, float]] = []  # storm origins: (NIC, share of the interval)
        for s0, s1, x, job, hops, _w in self.storms:
            f = _ov(s0 + hops[1][0], s1 + hops[1][0], t0, t1)
            if f > 0 and job >= 0:
                stall[fab.nic_job == job] *= 1 - 0.98 * f
            f = _ov(s0, s1, t0, t1)
            if f > 0:
                quiet.append((x, f))
        for s0, s1, mine, in_jobs, hops in self.sw_storms:
            st = np.ones(E)
            st[in_jobs] = 1 - 0.98 * _ov(s0 + hops[1][0], s1 + hops[1][0], t0, t1)
            st[mine] = np.minimum(st[mine], 1 - 0.98 * _ov(s0, s1, t0, t1))
            stall *= st
        slow = np.ones(E)
        for f0, f1, e, _ in self.transport:
            slow[e] -= 0.07 * _ov(f0, f1, t0, t1)

        # --- bytes per direction -------------------------------------------------------------
        base = a * self.rate * ring * stall * slow * T
        tx = base * (1 + 0.01 * rng.standard_normal(E))
        rx = base * (1 + 0.01 * rng.standard_normal(E))
        incast_now: list[tuple[int, np.ndarray, float, float]] = []
        incast_ecn: list[float | None] = []
        for f0, f1, y, snd, fill, ecn in self.incast:
            f = _ov(f0, f1, t0, t1)
            if f > 0:
                extra = max(0.0, line * 0.97 - rx[y]) * f
                rx[y] += extra
                if len(snd):
                    tx[snd] += extra / len(snd)
                incast_now.append((y, snd, fill, f))
                incast_ecn.append(ecn)
        tenants = self.tenant_physics.begin(t0, t1)  # one tenant's traffic into another's
        if tenants:
            self.tenant_physics.transmit(tx, line)
        tx = np.clip(tx, 0, line * 0.99)
        rx = np.clip(rx, 0, line * 0.99)
        by = np.empty(D)
        by[0 : 2 * E : 2] = tx
        by[1 : 2 * E : 2] = rx
        w = np.ones((L, S))
        up_down = np.zeros(2 * fab.n_uplinks)
        for _f0, _f1, lf, sp, _, flaps in self.flaky_up:
            fd = min(1.0, sum(_ov(s, s + n, t0, t1) for s, n in flaps))
            w[lf, sp] *= 1 - fd
            up_down[2 * (lf * S + sp) : 2 * (lf * S + sp) + 2] = fd
        w *= S / np.maximum(w.sum(axis=1, keepdims=True), 1e-9)
        up_l = np.bincount(fab.nic_leaf, weights=tx * self.up_share, minlength=L)
        dn_l = np.bincount(fab.nic_leaf, weights=rx * self.up_share, minlength=L)
        by[2 * E :: 2] = (up_l[:, None] * w / S * (1 + 0.05 * rng.standard_normal((L, S)))).ravel()
        by[2 * E + 1 :: 2] = (
            dn_l[:, None] * w / S * (1 + 0.05 * rng.standard_normal((L, S)))
        ).ravel()
        by = np.maximum(by, 0) + rng.uniform(0.5e6, 2e6, D) * T  # plus a little non-RDMA traffic
        down_dir = np.concatenate([np.repeat(down, 2), up_down])
        by *= 1 - down_dir
        for x, f in quiet:
            # a storm's origin NIC, its receive path stalled, gets no ACK back and sends
            # nothing at all while it pauses the fabric (the rest of its job only slows down)
            by[2 * x] *= 1 - f
        if self.elephants.phases:  # elephant flows over a leaf's uplinks (sim/ecmp.py)
            up = 1 - up_down[0::2].reshape(L, S)
            self.elephants.carry(by, up, t0, t1, line, T)
        load = np.minimum(by / line, 1.0)

        # --- PFC: healthy background, then faults ----------------------------------------------
        moe = self.dir_moe
        mean = np.where(self.dir_switch_rx, 0.006, 0.002) * np.where(moe, 3.0, 1.0)
        pf = np.where(
            rng.random(D) < 0.35 * load,
            np.minimum(rng.exponential(1.0, D) * mean, np.where(moe, 0.15, 0.05)),
            0.0,
        )
        spike = moe & (rng.random(D) < 0.02 * load)
        pf = np.where(spike, rng.uniform(0.3, 0.6, D), pf)
        stuck = np.zeros(D)  # share of the interval each direction is held by a storm
        for s0, s1, _x, _job, hops, _w in self.storms:
            for delay, dirs in hops:
                f = _ov(s0 + delay, s1 + delay, t0, t1)
                if f > 0 and len(dirs):
                    pf[dirs] = f * rng.uniform(0.996, 1.0, len(dirs)) + (1 - f) * pf[dirs]
                    stuck[dirs] = np.maximum(stuck[dirs], f)
        for s0, s1, _mine, _in_jobs, hops in self.sw_storms:
            for delay, dirs in hops:
                f = _ov(s0 + delay, s1 + delay, t0, t1)
                if f > 0 and len(dirs):
                    pf[dirs] = f * rng.uniform(0.996, 1.0, len(dirs)) + (1 - f) * pf[dirs]
                    stuck[dirs] = np.maximum(stuck[dirs], f)
        for e, inten, sev in pcie_int:
            pf[2 * e + 1] = max(pf[2 * e + 1], inten * sev * rng.uniform(0.2, 0.4))
            peers = np.flatnonzero(
                (self.group == self.group[e]) & (fab.nic_leaf == fab.nic_leaf[e])
            )
            peers = peers[peers != e]
            pf[2 * peers] = np.maximum(
                pf[2 * peers], inten * sev * rng.uniform(0.05, 0.15, len(peers))
            )
        for e, inten, short in thermal_int:
            # a NIC that drains slower than its link delivers pauses for its shortfall
            pf[2 * e + 1] = max(pf[2 * e + 1], inten * short * rng.uniform(0.8, 1.2))
        for _y, snd, _fill, f in incast_now:
            pf[2 * snd] = np.maximum(pf[2 * snd], f * rng.uniform(0.02, 0.12, len(snd)))
        if tenants:
            self.tenant_physics.pauses(pf, rng)
        pf *= 1 - down_dir
        # a queue paused for (nearly) the whole interval sends nothing at all
        passed = np.where(pf >= 0.99, 0.0, 1.0 - pf)
        sent = by * passed
        pkts = by / PKT_BYTES
        pkts = (pkts + pkts[np.arange(D) ^ 1] / 32) * passed  # data plus the reverse's ACKs
        pause_us = np.rint(pf * T_us)
        # a pause frame is refreshed before its quanta (512 bit times each) run out
        frames = rng.poisson(pf * T_us / (40.0 * LINE_GBPS / fab.link_gbps))

        # --- egress queues (switch side of each direction) -------------------------------------
        B = float(self.buffer_bytes)
        # healthy bursts are as deep as the link is fast, whatever the buffer (which caps them)
        Bh = min(B, BUFFER_BYTES * fab.link_gbps / LINE_GBPS)
        qmax = np.where(moe, 0.25, 0.04)
        depth = Bh * load * rng.random(D) ** 3 * qmax + self.stall_level * pf**4
        peak = np.maximum(depth, Bh * load * rng.random(D) * qmax * 1.5)
        pm = np.where(moe, 6e-3, 2e-4) * load**2 * rng.lognormal(0.0, 0.5, D)
        drops = np.zeros(D)
        for (y, _snd, fill, f), ecn in zip(incast_now, incast_ecn, strict=True):
            d = 2 * y + 1
            depth[d] = f * fill * B * (1 + 0.004 * rng.standard_normal()) + (1 - f) * depth[d]
            peak[d] = max(depth[d], min(B, depth[d] * (1 + 0.02 * rng.random())))
            mark = rng.uniform(0.4, 0.7) if ecn is None else ecn * rng.uniform(0.9, 1.1)
            pm[d] = f * mark + (1 - f) * pm[d]
            if fill > 0.95:
                drops[d] = rng.poisson(f * pkts[d] * 2e-5)
        if tenants:
            self.tenant_physics.queues(depth, peak, pm, B, rng)
        for e, inten, sev in pcie_int:
            d = 2 * e + 1
            depth[d] = max(depth[d], inten * sev * rng.uniform(0.1, 0.2) * B)
            peak[d] = max(peak[d], depth[d])
            pm[d] = max(pm[d], inten * sev * rng.uniform(0.05, 0.1))
        for e, inten, short in thermal_int:
            d = 2 * e + 1
            depth[d] = max(depth[d], inten * short * rng.uniform(0.2, 0.4) * Bh)
            peak[d] = max(peak[d], depth[d])
        if len(self.ecn_bursts[0]):
            b0, b1, bd, share = self.ecn_bursts
            on = (b0 < t1) & (b1 > t0)
            if on.any():
                ov = (np.minimum(b1[on], t1) - np.maximum(b0[on], t0)) / T
                np.maximum.at(pm, bd[on], share[on] * ov)
        held = np.flatnonzero(stuck > 0)
        if len(held):
            # a queue a storm pauses sends nothing, so what still arrives (its senders slowed,
            # not yet paused themselves) stands in it: it fills toward the buffer's limit
            depth[held] = np.maximum(depth[held], stuck[held] * self.stuck_fill[held] * B)
            peak[held] = np.maximum(peak[held], depth[held])
        if self.elephants.hot:
            self.elephants.queues(depth, peak, pm, B)
        depth = np.minimum(np.rint(depth), B)
        peak = np.minimum(np.rint(peak), B)
        marks = np.minimum(rng.poisson(pkts * np.minimum(pm, 1.0)), np.rint(pkts))
        # the switch queues' own counts: far past the marking threshold, a paused queue marks
        # every packet it takes in (marking on enqueue), though it transmits none of them
        q_marks = marks
        if len(held):
            q_marks = marks.copy()
            q_marks[held] += self._storm_rng.poisson(stuck[held] * by[held] / PKT_BYTES)

        # --- physical layer ---------------------------------------------------------------------
        ber = self.ber.copy()
        carrier = np.zeros(fab.n_cables)
        link_down = np.zeros(E)
        for f0, f1, e, peak_ber, flaps in self.flaky_nic:
            f = _ov(f0, f1, t0, t1)
            if f > 0 and peak_ber > 0:
                pair = np.array([2 * e, 2 * e + 1])
                ber[pair] = (
                    f * _ramp(rng, self.ber[pair], peak_ber, (t0 + t1) / 2 - f0, f1 - f0)
                    + (1 - f) * ber[pair]
                )
            starts = sum(1 for s, _ in flaps if t0 <= s < t1)
            ends = sum(1 for s, n in flaps if t0 <= s + n < t1)
            carrier[e] += starts + ends
            link_down[e] += starts
        for f0, f1, lf, sp, peak_ber, flaps in self.flaky_up:
            f = _ov(f0, f1, t0, t1)
            c = E + lf * S + sp
            if f > 0 and peak_ber > 0:
                pair = np.array([2 * c, 2 * c + 1])
                ber[pair] = (
                    f * _ramp(rng, self.ber[pair], peak_ber, (t0 + t1) / 2 - f0, f1 - f0)
                    + (1 - f) * ber[pair]
                )
            carrier[c] += sum(1 for s, _ in flaps if t0 <= s < t1)
            carrier[c] += sum(1 for s, n in flaps if t0 <= s + n < t1)
        up = 1 - down_dir
        corrected = rng.poisson(ber * fab.link_gbps * 1e9 * T * up)
        lam_unc = 20.0 * (ber / 1e-4) ** 3 * up * (per_tick * fab.link_gbps / LINE_GBPS)
        uncorrectable = rng.poisson(lam_unc)
        fcs = rng.poisson(0.9 * lam_unc)
        symbol = rng.poisson(3.0 * lam_unc)

        # --- RoCE transport and congestion control at the NICs --------------------------------
        rxp = pkts[1 : 2 * E : 2]
        lam = np.stack(
            [
                rxp * 2e-6,
                rxp * 2e-9,
                np.full(E, 2e-4 * per_tick),
                np.full(E, 1e-5 * per_tick),
                rxp * 3e-9,
            ]
        )
        if self.ar_base is not None:
            # adaptive routing sprays a flow over the spines: some packets arrive out of order
            lam[0] += rxp * self.ar_base * self._ar_factor(t0, t1)
        for f0, f1, e, scale in self.transport:
            f = _ov(f0, f1, t0, t1)
            if f > 0:
                lam[:, e] += f * scale * (0.3 + 0.7 * a[e]) * TRANSPORT_FAULT_RATES * per_tick
        oos, seq, ack, rnr, imp = rng.poisson(lam)
        for x, f in quiet:
            # the origin processes no ACK while its receive path is stalled: its requests
            # time out (a few queue pairs, each at its retransmission timeout)
            ack[x] += self._storm_rng.poisson(f * STORM_ORIGIN_TIMEOUTS * per_tick)
        ecn = marks[1 : 2 * E : 2]
        cnp = np.minimum(np.rint(ecn * rng.uniform(0.4, 0.6, E)), T / 50e-6 * 16)
        handled = np.bincount(self.group, weights=cnp, minlength=self.n_groups)[self.group]
        handled = handled / self.group_size[self.group] * rng.uniform(0.9, 1.1, E)
        for y, snd, _fill, _f in incast_now:
            if len(snd):
                handled[snd] += cnp[y] / len(snd)
        warn = np.zeros(E)
        for _s0, _s1, x, _job, _hops, wt in self.storms:
            warn[x] += np.count_nonzero((wt >= t0) & (wt < t1))
        oob_lam = np.full(E, 0.02)
        for e, inten, sev in pcie_int:
            oob_lam[e] += 500 * inten * sev
        for e, inten, short in thermal_int:
            oob_lam[e] += 500 * inten * short / 0.45

        # --- assemble per-port and per-NIC increments ----------------------------------------
        o, i = fab.port_out_dir, fab.port_in_dir
        sent_i = np.rint(sent)
        pkts_i = np.rint(pkts)
        sw = np.empty((len(SW_COUNTERS), P))
        sw[0] = fcs[i]
        sw[1] = fcs[i]
        sw[2] = rng.poisson(1e-4, P)
        sw[3] = carrier[fab.port_cable]
        sw[4] = sent_i[i]
        sw[5] = sent_i[o]
        sw[6] = pkts_i[i]
        sw[7] = pkts_i[o]
        sw[8] = frames[o]
        sw[9] = frames[i]
        sw[10] = pause_us[o]
        sw[11] = pause_us[i]
        sw[12] = q_marks[o]
        sw[13] = np.rint(pkts[o] * 0.985)
        sw[14] = drops[o]
        sw_g = np.stack([depth[o], peak[o]])
        n_rx, n_tx = slice(1, 2 * E, 2), slice(0, 2 * E, 2)
        nic = np.empty((len(NIC_COUNTERS), E))
        nic[0] = frames[n_tx]
        nic[1] = frames[n_rx]
        nic[2] = pause_us[n_tx]
        nic[3] = pause_us[n_rx]
        nic[4] = warn
        nic[5] = 0
        nic[6] = fcs[n_rx]
        nic[7] = symbol[n_rx]
        nic[8] = corrected[n_rx]
        nic[9] = uncorrectable[n_rx]
        nic[10] = link_down
        nic[11] = sent_i[n_rx]
        nic[12] = sent_i[n_tx]
        nic[13] = np.rint(sent[n_rx] * 0.985)
        nic[14] = np.rint(sent[n_tx] * 0.985)
        nic[15] = ecn
        nic[16] = cnp
        nic[17] = np.rint(handled)
        nic[18:23] = np.stack([oos, seq, ack, rnr, imp])
        extra = np.stack([rng.poisson(1e-3, E), rng.poisson(oob_lam)])
        return (sw.astype(U64), sw_g, nic.astype(U64), extra.astype(U64), pcie_now)


def _read(
    cum: np.ndarray,
    inc: np.ndarray,
    off: np.ndarray,
    cols: np.ndarray,
    frac: np.ndarray,
    clears: list[tuple[float, np.ndarray]],
) -> np.ndarray:
    """Cumulative counters of ``cols`` read ``frac`` of the way through a tick whose increments
    are ``inc``; a clear ``(at, cleared)`` ``at`` that share of the tick restarts the columns
    it hits from that moment."""
    out = cum[:, cols] + np.floor(inc[:, cols] * frac).astype(U64) - off[:, cols]
    for at, cleared in clears:
        hit = np.isin(cols, cleared) & (frac >= at)
        if hit.any():
            cc = cols[hit]
            base = cum[:, cc] + np.floor(inc[:, cc] * at).astype(U64)
            out[:, hit] = cum[:, cc] + np.floor(inc[:, cc] * frac[hit]).astype(U64) - base
    return out


def _ramp(
    rng: np.random.Generator, base: np.ndarray, peak: float, since: float, length: float
) -> np.ndarray:
    """A bad cable's BER: from the link's baseline up to ``peak`` (log scale) over the first
    2 s (or 30% of the fault), then around the peak."""
    r = min(1.0, max(0.0, since / max(min(2.0, 0.3 * length), 1e-3)))
    return base * (peak / base) ** r * rng.lognormal(0.0, 0.2, len(base))


def _activity(rng: np.random.Generator, traffic: str, n_ticks: int, T: float) -> np.ndarray:
    """Share of each tick a job spends communicating.

    all-reduce: iterations of ~0.5 s with ~60% of the time in NCCL collectives; MoE: ~0.12 s
    layers whose all-to-all dispatch/combine bursts take ~35% of the time.
    """
    period, duty = (0.5, 0.6) if traffic == "allreduce" else (0.12, 0.35)
    run = n_ticks * T
    n = int(run / (period * 0.9)) + 4
    per = period * rng.uniform(0.95, 1.05) * rng.uniform(0.97, 1.03, n)
    starts = np.concatenate([[-rng.uniform(0, period)], per[:-1]]).cumsum()
    comm = per * np.clip(duty + 0.04 * rng.standard_normal(n), 0.2, 0.9)
    sub = 50
    t = (np.arange(n_ticks * sub) + 0.5) * (T / sub)
    idx = np.searchsorted(starts, t, side="right") - 1
    pos = t - starts[idx]
    active = pos >= per[idx] - comm[idx]
    return active.reshape(n_ticks, sub).mean(axis=1)


__all__ = [
    "NIC_COUNTERS",
    "NIC_EXTRA",
    "NIC_GAUGES",
    "SW_COUNTERS",
    "SW_GAUGES",
    "SimConfig",
    "Simulator",
    "Tick",
    "config_from_dict",
    "config_to_dict",
]
