"""The fabric's physics, one tick at a time: what each cable direction carried (bytes,
packets), how long its sender was paused by PFC from the receiver, what the egress queue feeding
it held and marked, the physical-layer errors on it, and the RoCE transport and congestion
control at the NICs, with numpy over whole arrays. The faults (``FaultPlan``) and the healthy
noise (``Noise``) act here; the devices' counters are read off the result
(``rocewatch/sim/counters.py``).

``Baseline`` holds the run's fixed draws (each NIC's rate, each direction's healthy BER, the
jobs' activity per tick, each device's read jitter...); ``Physics.interval`` computes one tick.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from rocewatch.sim.counters import Carried, nic_increments, switch_increments
from rocewatch.sim.fabric import BUFFER_BYTES, LINE_GBPS, Fabric
from rocewatch.sim.faultplan import FaultPlan
from rocewatch.sim.faultplan import overlap as _ov
from rocewatch.sim.links import physical_layer
from rocewatch.sim.noise import Noise, activity
from rocewatch.sim.pfc import fault_pauses, healthy_pauses, storm_pauses, storm_stall
from rocewatch.sim.transport import nic_transport

if TYPE_CHECKING:
    from rocewatch.sim.config import SimConfig

PKT_BYTES = 4150.0  # RoCE v2 frame at a 4096 MTU


class Baseline:
    """A run's fixed draws, from ``rng`` (the set-up stream) in this order: each NIC's rate,
    each direction's healthy BER and stall level, each device's read jitter, each job's
    activity per tick; and what follows from the jobs (MoE directions, ring groups)."""

    def __init__(self, cfg: SimConfig, fab: Fabric, rng: np.random.Generator) -> None:
        n_ticks = cfg.n_ticks
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
        self.act = np.zeros((len(fab.jobs) + 1, n_ticks))  # last row: no job
        for j, tr in enumerate(traffic):
            self.act[j] = activity(rng, tr, n_ticks, T)
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


class Physics:
    """The tick engine of one run: ``interval(rng, k)`` for tick ``k``, with the physics stream
    ``rng``; ``restart()`` before a pass over the run."""

    def __init__(
        self, cfg: SimConfig, fab: Fabric, base: Baseline, plan: FaultPlan, noise: Noise
    ) -> None:
        self.cfg, self.fabric = cfg, fab
        self.base, self.plan, self.noise = base, plan, noise
        self.storm_rng = np.random.default_rng([cfg.seed, 8])

    def restart(self) -> None:
        """Back to the run's start: what only storms draw comes from a stream of its own (the
        rest of a run's noise does not depend on whether or where a storm was), elephant flows
        from theirs."""
        self.storm_rng = np.random.default_rng([self.cfg.seed, 8])
        self.plan.elephants.restart()

    def interval(
        self, rng: np.random.Generator, k: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Counter increments over tick ``k``'s interval, and the gauges read in it (the PCIe
        link's speed and width as a default run's NICs read them, a few ms into the tick)."""
        cfg, fab = self.cfg, self.fabric
        b, plan, noise = self.base, self.plan, self.noise
        T = cfg.interval_s
        T_us = T * 1e6
        t0, t1 = k * T, (k + 1) * T
        E, D, S, L = fab.n_nics, fab.n_dirs, fab.n_spines, fab.n_leaves
        line = b.line_bps * T
        a = b.act[b.nic_job_row, k]

        # --- capacity: PCIe, heat, flaps, the ring waiting for its slowest member, storms -----
        cap = np.ones(E)
        pcie_now = np.stack([np.full(E, fab.pcie_max_gts), np.full(E, float(fab.pcie_max_width))])
        pcie_int: list[tuple[int, float, float]] = []
        for f0, f1, e, c, gts, width in plan.pcie:
            f = _ov(f0, f1, t0, t1)
            if f > 0:
                cap[e] *= 1 - f * (1 - c)
                # how hard the NIC pushes back scales with its shortfall (55 % of line rate:
                # the full effect; a link still faster than the network: none)
                sev = min(1.0, round((1 - c) / 0.45, 6))
                pcie_int.append((e, f * min(1.0, a[e] / 0.5), sev))
            if f0 <= t0 + b.nic_jit[e] < f1:
                pcie_now[:, e] = gts, width
        thermal_int: list[tuple[int, float, float]] = []
        for f0, f1, e, sl in plan.thermal:
            f = _ov(f0, f1, t0, t1)
            if f > 0:
                heat = min(1.0, max(0.0, (t0 + t1) / 2 - f0) / 3.0)  # it heats up over ~3 s
                cap[e] *= 1 - f * sl * heat
                thermal_int.append((e, f * min(1.0, a[e] / 0.5), sl * heat))
        down = np.zeros(E)
        for _f0, _f1, e, _, flaps in plan.flaky_nic:
            down[e] += sum(_ov(s, s + n, t0, t1) for s, n in flaps)
        down = np.minimum(down, 1.0)
        cap *= 1 - down
        gmin = np.ones(b.n_groups)
        np.minimum.at(gmin, b.group, cap)
        ring = gmin[b.group]
        stall, quiet = storm_stall(fab, plan, t0, t1)  # rocewatch/sim/pfc.py
        slow = np.ones(E)
        for f0, f1, e, _ in plan.transport:
            slow[e] -= 0.07 * _ov(f0, f1, t0, t1)

        # --- bytes per direction -------------------------------------------------------------
        base = a * b.rate * ring * stall * slow * T
        tx = base * (1 + 0.01 * rng.standard_normal(E))
        rx = base * (1 + 0.01 * rng.standard_normal(E))
        incast_now: list[tuple[int, np.ndarray, float, float]] = []
        incast_ecn: list[float | None] = []
        for f0, f1, y, snd, fill, ecn in plan.incast:
            f = _ov(f0, f1, t0, t1)
            if f > 0:
                extra = max(0.0, line * 0.97 - rx[y]) * f
                rx[y] += extra
                if len(snd):
                    tx[snd] += extra / len(snd)
                incast_now.append((y, snd, fill, f))
                incast_ecn.append(ecn)
        tenants = plan.tenant_physics.begin(t0, t1)  # one tenant's traffic into another's
        if tenants:
            plan.tenant_physics.transmit(tx, line)
        tx = np.clip(tx, 0, line * 0.99)
        rx = np.clip(rx, 0, line * 0.99)
        by = np.empty(D)
        by[0 : 2 * E : 2] = tx
        by[1 : 2 * E : 2] = rx
        w = np.ones((L, S))
        up_down = np.zeros(2 * fab.n_uplinks)
        for _f0, _f1, lf, sp, _, flaps in plan.flaky_up:
            fd = min(1.0, sum(_ov(s, s + n, t0, t1) for s, n in flaps))
            w[lf, sp] *= 1 - fd
            up_down[2 * (lf * S + sp) : 2 * (lf * S + sp) + 2] = fd
        w *= S / np.maximum(w.sum(axis=1, keepdims=True), 1e-9)
        up_l = np.bincount(fab.nic_leaf, weights=tx * b.up_share, minlength=L)
        dn_l = np.bincount(fab.nic_leaf, weights=rx * b.up_share, minlength=L)
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
        if plan.elephants.phases:  # elephant flows over a leaf's uplinks (sim/ecmp.py)
            up = 1 - up_down[0::2].reshape(L, S)
            plan.elephants.carry(by, up, t0, t1, line, T)
        load = np.minimum(by / line, 1.0)

        # --- PFC: healthy background, then faults ----------------------------------------------
        moe = b.dir_moe
        pf = healthy_pauses(rng, moe, b.dir_switch_rx, load)
        stuck = storm_pauses(rng, plan, pf, t0, t1)
        fault_pauses(rng, fab, b.group, pf, pcie_int, thermal_int, incast_now)
        if tenants:
            plan.tenant_physics.pauses(pf, rng)
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
        B = float(b.buffer_bytes)
        # healthy bursts are as deep as the link is fast, whatever the buffer (which caps them)
        Bh = min(B, BUFFER_BYTES * fab.link_gbps / LINE_GBPS)
        qmax = np.where(moe, 0.25, 0.04)
        depth = Bh * load * rng.random(D) ** 3 * qmax + b.stall_level * pf**4
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
            plan.tenant_physics.queues(depth, peak, pm, B, rng)
        for e, inten, sev in pcie_int:
            d = 2 * e + 1
            depth[d] = max(depth[d], inten * sev * rng.uniform(0.1, 0.2) * B)
            peak[d] = max(peak[d], depth[d])
            pm[d] = max(pm[d], inten * sev * rng.uniform(0.05, 0.1))
        for e, inten, short in thermal_int:
            d = 2 * e + 1
            depth[d] = max(depth[d], inten * short * rng.uniform(0.2, 0.4) * Bh)
            peak[d] = max(peak[d], depth[d])
        if len(noise.ecn_bursts[0]):
            b0, b1, bd, share = noise.ecn_bursts
            on = (b0 < t1) & (b1 > t0)
            if on.any():
                ov = (np.minimum(b1[on], t1) - np.maximum(b0[on], t0)) / T
                np.maximum.at(pm, bd[on], share[on] * ov)
        held = np.flatnonzero(stuck > 0)
        if len(held):
            # a queue a storm pauses sends nothing, so what still arrives (its senders slowed,
            # not yet paused themselves) stands in it: it fills toward the buffer's limit
            depth[held] = np.maximum(depth[held], stuck[held] * b.stuck_fill[held] * B)
            peak[held] = np.maximum(peak[held], depth[held])
        if plan.elephants.hot:
            plan.elephants.queues(depth, peak, pm, B)
        depth = np.minimum(np.rint(depth), B)
        peak = np.minimum(np.rint(peak), B)
        marks = np.minimum(rng.poisson(pkts * np.minimum(pm, 1.0)), np.rint(pkts))
        # the switch queues' own counts: far past the marking threshold, a paused queue marks
        # every packet it takes in (marking on enqueue), though it transmits none of them
        q_marks = marks
        if len(held):
            q_marks = marks.copy()
            q_marks[held] += self.storm_rng.poisson(stuck[held] * by[held] / PKT_BYTES)

        # --- physical layer (rocewatch/sim/links.py) -----------------------------------------
        phy = physical_layer(rng, fab, plan, b.ber, down_dir, t0, t1, T)

        # --- RoCE transport and congestion control at the NICs (rocewatch/sim/transport.py) --
        nt = nic_transport(
            rng,
            self.storm_rng,
            b,
            plan,
            noise,
            a,
            pkts,
            marks,
            quiet,
            incast_now,
            pcie_int,
            thermal_int,
            t0,
            t1,
            T,
        )

        carried = Carried(
            sent=sent,
            pkts=pkts,
            frames=frames,
            pause_us=pause_us,
            q_marks=q_marks,
            drops=drops,
            depth=depth,
            peak=peak,
            fcs=phy.fcs,
            symbol=phy.symbol,
            corrected=phy.corrected,
            uncorrectable=phy.uncorrectable,
            carrier=phy.carrier,
            link_down=phy.link_down,
            warn=nt.warn,
            ecn=nt.ecn,
            cnp=nt.cnp,
            handled=nt.handled,
            transport=nt.counts,
            oob_lam=nt.oob_lam,
        )
        sw, sw_g = switch_increments(fab, carried, rng)
        nic, extra = nic_increments(fab, carried, rng)
        return (sw, sw_g, nic, extra, pcie_now)


__all__ = ["PKT_BYTES", "Baseline", "Physics"]
