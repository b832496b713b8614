"""The fabric simulator: NCCL-like traffic over a RoCE v2 fabric, with faults, vectorised per tick.

``Simulator`` wires the simulator's parts together, one job per module of ``rocewatch/sim``:
``config`` (``SimConfig``), ``fabric`` (the topology), ``faults`` (what a fault is, where it
lands, the truth), ``faultplan`` (the faults compiled for the tick engine), ``noise`` (the
workload's rhythm, healthy noise), ``physics`` (one tick: capacity, traffic, queues) with
``pfc`` (pauses, storms), ``links`` (the physical layer), ``transport`` (at the NICs) and
``tenants`` (one tenant's traffic into another's), ``counters`` (what each device counts, read
off the physics), ``clock`` (a default run's reads, a few ms into each tick), ``cadence`` (a
cadenced run's reads on each source's own schedule), ``readings`` (what was read, as arrays)
and ``frames`` (as SAMPLE_SCHEMA frames). A new fault kind is compiled in ``faultplan`` and
acts in ``physics`` or the module of the layer it hits.

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

from collections.abc import Iterator
from typing import Any

import numpy as np
import polars as pl

from rocewatch.core.topology import Topology
from rocewatch.sim import cadence, clock
from rocewatch.sim.cadence import Cadence
from rocewatch.sim.config import TRAFFICS, SimConfig, config_from_dict, config_to_dict, validate
from rocewatch.sim.counters import (
    NIC_COUNTERS,
    NIC_EXTRA,
    NIC_GAUGES,
    NS,
    SW_COUNTERS,
    SW_GAUGES,
    U64,
    initial_counters,
    place_wrap,
)
from rocewatch.sim.fabric import Fabric
from rocewatch.sim.faultplan import PCIE_MAX_GTS, TRANSPORT_FAULT_RATES, FaultPlan
from rocewatch.sim.faults import resolve_faults, truth
from rocewatch.sim.frames import FrameLayout
from rocewatch.sim.noise import Noise
from rocewatch.sim.physics import PKT_BYTES, Baseline, Physics
from rocewatch.sim.readings import Late, Readings, Tick
from rocewatch.sim.transport import STORM_ORIGIN_TIMEOUTS


class Simulator:
    """Simulates ``cfg``; ``ticks()`` yields one SAMPLE_SCHEMA frame per sampling instant."""

    def __init__(self, cfg: SimConfig) -> None:
        validate(cfg)
        self.cfg = cfg
        self.fabric = fab = Fabric(cfg)
        self.topology = Topology.from_dict(fab.topology_dict())
        self.faults = resolve_faults(cfg, fab)
        self.n_ticks = cfg.n_ticks
        self.interval_ns = round(cfg.interval_s * NS)
        # the set-up stream, drawn in this order: the baseline, the counters' start, the wrap
        rng = np.random.default_rng([cfg.seed, 1])
        self.baseline = base = Baseline(cfg, fab, rng)
        self.sw_init, self.nic_init, self.nic_x_init = initial_counters(
            rng, fab.n_ports, fab.n_nics
        )
        self.wrap: dict[str, Any] | None = None
        if cfg.wrap_counter:
            self.wrap = place_wrap(cfg, fab, self.faults, rng, base.line_bps, self.sw_init)
        self.plan = FaultPlan(cfg, fab, self.faults, base.ber, base.act, base.nic_job_row)
        noise = Noise(cfg, fab, np.random.default_rng([cfg.seed, 5]))
        self.physics = Physics(cfg, fab, base, self.plan, noise)
        self.layout = FrameLayout(fab)
        self.cadence: Cadence | None = None
        if cfg.cadenced:
            self.cadence = Cadence(cfg, fab, np.random.default_rng([cfg.seed, 3]))

    def lost(self) -> dict[str, dict[str, list[int]]]:
        """The readings lost on the way (cadenced runs): per source (``nic``, ``switch``,
        ``gauge``) and device (``node/nic`` or the switch), their read times in ns."""
        if self.cadence is None:
            return {}
        return cadence.lost(self.cfg, self.fabric, self.cadence.schedules, self.plan)

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
        return self.layout.readings_frame(r)

    def frame(self, t: Tick) -> pl.DataFrame:
        """A default run's tick ``t`` as a SAMPLE_SCHEMA frame, late NIC snapshots last."""
        return self.layout.frame(t)

    # --- the engines -----------------------------------------------------------------------------
    def readings(self) -> Iterator[Readings]:
        """A cadenced run's readings, physics tick by physics tick (see ``SimConfig``)."""
        return cadence.readings(self)

    def steps(self) -> Iterator[Tick]:
        """The raw readings, tick by tick (what ``ticks`` and the file writers format)."""
        return clock.steps(self)


__all__ = [
    "NIC_COUNTERS",
    "NIC_EXTRA",
    "NIC_GAUGES",
    "NS",
    "PCIE_MAX_GTS",
    "PKT_BYTES",
    "STORM_ORIGIN_TIMEOUTS",
    "SW_COUNTERS",
    "SW_GAUGES",
    "TRAFFICS",
    "TRANSPORT_FAULT_RATES",
    "U64",
    "Late",
    "Readings",
    "SimConfig",
    "Simulator",
    "Tick",
    "config_from_dict",
    "config_to_dict",
]
