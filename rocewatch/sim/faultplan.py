"""The faults applied: each resolved fault compiled, once per run, into what the physics and
the read engines look up every tick (per-kind lists of onset, end and the NICs, cables and
directions it touches), and which NIC readings their agents never send.

A new fault kind lands here (its compiled form) and in ``rocewatch/sim/physics.py`` (what it
does to a tick); its description, resolution and truth stay in ``rocewatch/sim/faults.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from rocewatch.sim.ecmp import Elephants
from rocewatch.sim.fabric import LINE_GBPS, Fabric
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
    storm_hops,
)
from rocewatch.sim.tenants import TenantPhysics

if TYPE_CHECKING:
    from rocewatch.sim.config import SimConfig

PCIE_MAX_GTS = 32.0
# extra out_of_sequence, packet_seq_err, local_ack_timeout, rnr_nak, implied_nak per interval
TRANSPORT_FAULT_RATES = np.array([300.0, 30.0, 4.0, 0.0, 10.0])


def overlap(a: float, b: float, t0: float, t1: float) -> float:
    """Share of [t0, t1) that [a, b) covers (of a tick, the fault window [a, b))."""
    return max(0.0, min(b, t1) - max(a, t0)) / (t1 - t0)


class FaultPlan:
    """``faults`` compiled for ``cfg``'s run on ``fab``: ``ber`` is each direction's healthy
    BER (a bad cable's peak may be a multiple of it), ``act``/``nic_job_row`` each job's
    activity per tick and each NIC's row in it (transport errors given as a rate)."""

    def __init__(
        self,
        cfg: SimConfig,
        fab: Fabric,
        faults: list[Fault],
        ber: np.ndarray,
        act: np.ndarray,
        nic_job_row: np.ndarray,
    ) -> None:
        self.ber = ber
        run = cfg.duration_s
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
        self.elephants = Elephants(fab, cfg.seed)  # rocewatch/sim/ecmp.py
        for f in faults:
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
                    self.flaky_up.append((t0, t1, lf, sp, self.peak_ber(f, c), flaps))
                else:
                    e = fab.nic_index(str(f.node), str(f.nic))
                    self.flaky_nic.append((t0, t1, e, self.peak_ber(f, e), flaps))
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
                    mean_a = float(act[nic_job_row[e]].mean()) or 1.0
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
        self.tenant_physics = TenantPhysics(fab, faults, run)  # rocewatch/sim/tenants.py
        silent = np.zeros(fab.n_nodes, dtype=bool)
        for n in cfg.no_agent_nodes:
            silent[fab.node_index[n]] = True
        self.nic_silent = silent[fab.nic_node]
        self.nic_node = fab.nic_node

    def peak_ber(self, f: FlakyLink, cable: int) -> float:
        """The BER a bad cable's worse direction climbs to; 0 for one that only flaps."""
        if not f.errors:
            return 0.0
        if f.ber_factor is None:
            return f.peak_ber
        own = float(self.ber[2 * cable : 2 * cable + 2].max())
        return min(1e-2, f.ber_factor * own)

    def silenced(self, nics: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Which NIC readings their agent never sends: no agent, or an agent gap."""
        out = self.nic_silent[nics].copy()
        node = self.nic_node[nics]
        for g0, g1, n in self.gaps:
            out |= (node == n) & (t >= g0) & (t < g1)
        return out


__all__ = ["PCIE_MAX_GTS", "TRANSPORT_FAULT_RATES", "FaultPlan", "overlap"]
