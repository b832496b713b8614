"""Straggler: a NIC persistently slower than its peers in the same job (or rail).

NCCL rings run at the pace of their slowest member, so one slow NIC (a PCIe link trained down,
a host that cannot drain its receive buffers) costs the whole job. Peers are the NICs of the
job's nodes (topology ``jobs``), or of the rail for NICs in no job. Every ``window_s`` each
NIC's window is compared with its peers' by a robust z-score (median and MAD, which a few
outliers cannot drag along):

- **its own backpressure**: the share of time it asked its leaf to pause
  (``tx_prio<N>_pause_duration``), far above its peers'. On a lossless (PFC) fabric a NIC that
  cannot keep up with what arrives fills its receive buffer and pauses its leaf: the slowness
  is its own;
- **throughput**: its RDMA transmit rate below its peers' (their upper quartile, since with
  few rails the slow NIC's rail, which waits for it, can be half the job; the robust z-score of
  throughput is quoted as evidence);
- **not held by the fabric**: the pause it *receives* (``rx_prio<N>_pause_duration``) is less
  than the pause it asks for. A NIC its leaf holds (a storm's victim, an incast's sender) is
  slow because of someone else.

This is the ``backpressure`` rule. A slow NIC slows its whole rail's ring, so low throughput
alone does not single it out (every NIC of that rail in the job is just as slow: its peers wait,
and ask for nothing), and pressure alone is not slowness. ECN marks on what a NIC receives are
*not* pressure: they say the leaf's queue toward it is congested (incast, or a DCQCN burst),
which happens to NICs that drain at line rate; a ring peer of a straggler caught in such a burst
is slow and marked, and not the straggler (ECN is quoted as evidence). A straggler shows all
three, in ``min_windows`` windows in a row; it resolves after ``clear_windows`` normal ones. A
PCIe link below its maximum is quoted as evidence.

A second, independent rule, ``alone_slow``, finds a straggler that asks for no pause (a
thermally throttled GPU, a host slow at sending, a fabric without PFC): a NIC that **alone** is
steadily slow. In a window it

- sends at most ``alone_throughput_ratio`` (92 %) of its peers' median, with a robust z-score of
  throughput <= -``z_threshold``: a synchronised collective keeps its NICs within 1-2 % of each
  other, so 8 % short is several times any healthy member's spread, while the mildest straggler
  worth finding (10 % slow) clears the line by more than a window's noise; the z-score keeps a
  group whose windows scatter (bursty traffic read at different phases) from electing its low
  end. The z-score is of its share in the window or, if lower, of its median share over its
  look back (below): each NIC's own noise widens one window's spread but averages out over
  several, while a straggler's shortfall stays. The median, not the upper quartile of the first
  rule: a NIC alone slow drags no one;
- sends at most ``alone_throughput_ratio`` of the median of its **ring peers** (the other NICs
  of its rail in the job): if they are as slow, the ring's pace is shared and nothing singles
  the NIC out (the ring waits for someone), so the rule is silent; a NIC with no ring peer is
  not judged by it, nor is a NIC in no job (a rail's NICs outside jobs need not run one
  collective: hosts at other work send at other steady rates, and nothing waits for them);
- is no **victim of a stall**: over its last ``min_windows`` x 2 windows, and at least 2.5 of
  its sampling intervals, its ring peers' median share never fell to the line, and neither half
  of its ring peers nor half of its job's NICs sent, in any window, below 92 % of their own
  median rate over them. A stall (a flapping cable, a storm, a barrier waiting for someone)
  stops a ring or a job for a moment; each NIC's samples catch it whole or split over two as
  its sampling phase falls, so for a sample or two some NICs look slow next to peers that
  caught less of it. A straggler is slow against peers that keep their pace (the matrix's
  false Stragglers were ring members of a flapping cable's NIC, read every second);
- is not held by the fabric: it receives no more pause than it asks for, plus
  ``alone_max_held_share`` (1 % of the time: pause that short explains at most 1 % of lost
  throughput, a tenth of the least shortfall), and its ECN marks are not above its peers'
  (robust z < ``z_threshold``): a congested victim is slow because of someone else;
- is not retransmitting: fewer than ``alone_max_retx_per_s`` (1) retransmissions a second (NAK
  sequence errors, ACK timeouts, RNR and implied NAKs): each go-back-N resends a window's worth,
  so a NIC with a transport fault is slow because of it (TransportErrors finds it), while a
  healthy one retransmits every few minutes;
- is not idle: it sends at least ``alone_min_busy_ratio`` (10 %) of its peers' median, and the
  peers' median is at least ``alone_min_rate_gbps`` (1 Gb/s): a NIC whose job ended, or a job
  between steps, costs nobody time (an idle NIC's background traffic is not a collective).

It must hold in every window of the streak that has a new transmit sample of the NIC (a window
whose only new sample is of another signal neither counts nor breaks it), and the streak needs
as many transmit samples as ``min_windows`` windows normally hold (up to ``min_windows``): at
1 s three, so a stall split over two samples, or one late sample spanning two intervals, is
not steady slowness.

Either rule counts towards the same streak; the evidence names the rule that fired
(``rule=backpressure`` or ``rule=alone_slow``).

Cadence: a window counts for a NIC only when it holds a new sample of it, and a streak must
cover ``min_windows`` windows' worth of time (less half a window) in two samples at least: a
NIC read every second needs three samples, one read every 5 s two (a sample stands for its whole
interval, but one sample alone is one burst). A NIC read less often than the window still
stands, as a peer, for its newest sample while that is fresh.

Cost: a healthy step reads the highest pause share of the step (a column reduction); with
``alone_slow`` off, a window in which no NIC could reach the pressure thresholds and none is
being followed is not evaluated at all (with it on, every window is: slowness needs no pause).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import polars as pl

from detectors.base import Finding, StepContext, check_positive_numbers, node_labels, pct
from detectors.state import MISSED_SAMPLE_INTERVALS, EntitySlots
from detectors.windows import Step
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import STRAGGLER
from rocewatch.core.state import Stateful
from rocewatch.core.topology import Topology

S = 1_000_000_000
PAUSE, ECN, TPUT = "nic_tx_pause_us", "nic_ecn_marked_pkts", "nic_tx_rdma_bytes"
HELD = "nic_rx_pause_us"  # pause the NIC received: its transmit held by its leaf
# retransmissions (go-back-N, timeouts): a NIC that retransmits loses throughput to its
# transport, not to slow work of its own (TransportErrors' fault); alone_slow leaves it alone
RETX = (
    "nic_packet_seq_err",
    "nic_local_ack_timeout",
    "nic_rnr_nak_retry_err",
    "nic_implied_nak_seq_err",
)
BASE = 4  # the signals both rules read; the retransmission counters follow them
SIGNALS = (PAUSE, ECN, TPUT, HELD, *RETX)
K = len(SIGNALS)
ROLL_WINDOWS = 32  # windows of transmit rate kept per NIC for alone_slow (2.5 intervals of 12 s)


@dataclass(frozen=True)
class StragglerConfig:
    enabled: bool = True
    window_s: float = 1.0  # two all-reduce iterations; at most the window engine's history
    min_windows: int = 3  # "persistently": three windows in a row
    clear_windows: int = 2
    z_threshold: float = 3.5  # modified z-score cut-off (Iglewicz & Hoaglin)
    # the NIC asks for pause at least 5% of the time (a healthy NIC: well under 1%, brief
    # all-to-all spikes aside, which min_windows outlasts)
    min_pause_share: float = 0.05
    # RDMA transmit at most 95% of its peers' upper quartile: a synchronised collective keeps
    # its NICs within 1-2% of each other, and a 10% slow NIC must count
    max_throughput_ratio: float = 0.95
    min_peers: int = 4  # NICs with data in the group, itself included
    pause_mad_floor: float = 0.005  # z-score scale floors, so a flat group is not all outliers
    ecn_mad_floor: float = 1_000.0  # ECN-rate z-score scale floor (ECN is evidence only)
    throughput_mad_floor: float = 0.01  # relative to the median
    # the second rule: a NIC that alone is slow, asking for no pause (docs/detection.md)
    alone_slow: bool = True
    # at most 92% of its peers' median and of its ring peers' median: collectives keep NICs
    # within 1-2% of each other, and a 10% straggler must clear the line by more than noise
    alone_throughput_ratio: float = 0.92
    alone_min_busy_ratio: float = 0.1  # below 10% of its peers' median: idle, not slow
    alone_min_rate_gbps: float = 1.0  # peers' median below this: no collective is running
    # pause received beyond what it asks (share of time) that makes it held, not slow itself
    alone_max_held_share: float = 0.01
    # retransmissions a second (NAK sequence errors, ACK timeouts, RNR and implied NAKs) from
    # which a slow NIC is slow because its transport resends: a healthy NIC retransmits every
    # few minutes, and each go-back-N resends a window's worth
    alone_max_retx_per_s: float = 1.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_positive_numbers(self, "straggler", skip=("enabled", "alone_slow"))
        for name in ("min_windows", "clear_windows", "min_peers"):
            if int(getattr(self, name)) != getattr(self, name):
                raise ConfigError(f"straggler: {name}: must be a whole number")
        if not 0 < self.max_throughput_ratio < 1 or not 0 < self.min_pause_share <= 1:
            raise ConfigError(
                "straggler: max_throughput_ratio must be within (0, 1), min_pause_share (0, 1]"
            )
        if not 0 < self.alone_min_busy_ratio < self.alone_throughput_ratio < 1:
            raise ConfigError(
                "straggler: alone_throughput_ratio must be within (0, 1), and "
                "alone_min_busy_ratio below it"
            )
        if self.alone_max_held_share >= 1:
            raise ConfigError("straggler: alone_max_held_share must be below 1")


@dataclass
class _Active:
    ts: int
    evidence: str
    pcie: str
    rule: str = "backpressure"  # (a default: alerts of a checkpoint from before the second rule)


@dataclass
class StragglerDetector(Stateful):
    topology: Topology
    config: StragglerConfig = field(default_factory=StragglerConfig)
    name: str = "straggler"
    # the record types its state holds (rocewatch.core.state; the checkpoint codec reads no other)
    STATE_TYPES: ClassVar[tuple[type, ...]] = (_Active, EntitySlots, Finding)
    # the metrics it reads from the window engine (steps carry no others to the detect stage)
    reads: ClassVar[frozenset[str]] = frozenset(
        {
            *SIGNALS,
            "nic_pcie_speed_gts",
            "nic_pcie_max_speed_gts",
            "nic_pcie_width",
            "nic_pcie_max_width",
        }
    )

    @property
    def window_s(self) -> float:
        """Reads only the newest step: its windows are summed here, per NIC, as steps close."""
        return 0.0

    def _conform(self) -> None:
        """Per-signal arrays of a checkpoint from before the received pause was read get its
        column (empty: it is summed from the next window on)."""
        for name in ("acc_delta", "acc_dt", "last_delta", "last_dt", "last_ts"):
            a = getattr(self, name)
            if a.shape[1] < K:
                pad = np.zeros((a.shape[0], K - a.shape[1]), dtype=a.dtype)
                setattr(self, name, np.concatenate([a, pad], axis=1))

    def __post_init__(self) -> None:
        self.slots = EntitySlots()
        self.group = np.empty(0, dtype=np.int64)  # peer group of each slot (-1: none)
        self.rail = np.empty(0, dtype=np.int64)
        self.group_names: list[str] = []
        self.streak = np.empty(0, dtype=np.int64)  # windows in a row that looked slow
        self.streak_s = np.empty(0)  # ... and the seconds of samples they held
        self.calm = np.empty(0, dtype=np.int64)  # ... that looked normal
        self.active: dict[int, _Active] = {}
        self.next_eval_ns = 0
        self.peak_pause = 0.0  # the highest step pause share since the last window
        # the window being summed: its index (end // window), and per NIC and signal the summed
        # counter increase and interval, and the newest sample time
        self.period = -1
        self.acc_delta = np.zeros((0, K))
        self.acc_dt = np.zeros((0, K))
        self.acc_ts = np.zeros(0, dtype=np.int64)
        # per NIC and signal, its newest sample (counter increase, interval, time), and per
        # NIC its sampling interval (s, smoothed)
        self.last_delta = np.zeros((0, K))
        self.last_dt = np.zeros((0, K))
        self.last_ts = np.zeros((0, K), dtype=np.int64)
        self.interval = np.zeros(0)
        # per NIC and window (the last ROLL_WINDOWS), its transmit rate over its group's median
        # and that median (NaN: none), for the alone_slow rule; roll_at counts the windows
        self.roll = np.full((0, ROLL_WINDOWS), np.nan)
        self.roll_med = np.full((0, ROLL_WINDOWS), np.nan)
        self.roll_at = 0

    def _peer_group(self, node: str, rail: int) -> int:
        """Index of the NIC's peer group (its first job, else its rail); -1 for none."""
        jobs = self.topology.node_jobs.get(node)
        name = f"job:{jobs[0]}" if jobs else (f"rail:{rail}" if rail >= 0 else "")
        if not name:
            return -1
        if name not in self.group_names:
            self.group_names.append(name)
        return self.group_names.index(name)

    def _grow(self) -> None:
        topo = self.topology
        have = len(self.group)
        version = getattr(topo, "jobs_version", 0)
        if version != getattr(self, "_jobs_version", 0):
            # Live job membership changed: every NIC seen so far is regrouped with its new peers.
            self._jobs_version = version
            self.group_names = []
            self.group = np.array(
                [
                    self._peer_group(node, int(self.rail[i]))
                    for i, (node, _nic) in enumerate(self.slots.keys[:have])
                ],
                dtype=np.int64,
            )
        if have == len(self.slots):
            return
        groups, rails = [], []
        for node, nic in self.slots.keys[have:]:  # NICs seen for the first time
            rail = topo.nic_rail(node, nic)
            groups.append(self._peer_group(node, -1 if rail is None else rail))
            rails.append(-1 if rail is None else rail)
        self.group = np.concatenate([self.group, np.array(groups, dtype=np.int64)])
        self.rail = np.concatenate([self.rail, np.array(rails, dtype=np.int64)])
        z = np.zeros(len(groups), dtype=np.int64)
        self.streak = np.concatenate([self.streak, z])
        self.streak_s = np.concatenate([self.streak_s, np.zeros(len(groups))])
        self.calm = np.concatenate([self.calm, z])
        self.acc_delta = np.concatenate([self.acc_delta, np.zeros((len(groups), K))])
        self.acc_dt = np.concatenate([self.acc_dt, np.zeros((len(groups), K))])
        self.acc_ts = np.concatenate([self.acc_ts, z])
        self.last_delta = np.concatenate([self.last_delta, np.zeros((len(groups), K))])
        self.last_dt = np.concatenate([self.last_dt, np.zeros((len(groups), K))])
        self.last_ts = np.concatenate([self.last_ts, np.zeros((len(groups), K), dtype=np.int64)])
        self.interval = np.concatenate([self.interval, np.zeros(len(groups))])
        self.roll = _fit(self.roll, len(self.group), ROLL_WINDOWS)
        self.roll_med = _fit(self.roll_med, len(self.group), ROLL_WINDOWS)

    def evaluate(self, ctx: StepContext) -> list[Finding]:
        cfg = self.config
        if self.acc_delta.shape[1] < K:  # restored from a build that read fewer signals
            self._conform()
        cur = ctx.engine.current()
        if cur is None:
            return []
        f = cur.get(PAUSE)
        if f.height:
            with np.errstate(divide="ignore", invalid="ignore"):
                r = f.get_column("delta").to_numpy() / (f.get_column("dt").to_numpy() * 1e6)
            top = float(np.nanmax(r)) if np.isfinite(r).any() else 0.0
            self.peak_pause = max(self.peak_pause, top)
        w = round(cfg.window_s * S)
        self._accumulate(cur, ctx.end, w)
        if ctx.end < self.next_eval_ns:
            return self._findings()
        self.next_eval_ns = (ctx.end // w + 1) * w
        quiet = self.peak_pause < cfg.min_pause_share
        self.peak_pause = 0.0
        if quiet and not cfg.alone_slow and not self.active and not self.streak.any():
            return []  # no NIC could look pressed in this window: nothing to compare
        self._window(ctx, w)
        return self._findings()

    def _accumulate(self, cur: Step, end: int, w: int) -> None:
        """Add the step's three signals to the window being summed (a new window starts
        empty), and keep each NIC's newest sample of each (a NIC read less often than the
        window has none in most windows)."""
        period = (end - 1) // w
        if period != self.period:
            self.period = period
            self.acc_delta[:] = 0.0
            self.acc_dt[:] = 0.0
            self.acc_ts[:] = 0
        parts, which = [], []
        known = cur.positions[1] if cur.positions is not None else {}
        pos: list[np.ndarray] | None = []
        for i, metric in enumerate(SIGNALS):
            f = cur.get(metric)
            if f.height:
                parts.append(f.select("device", "port", "delta", "dt", "n", "ts"))
                which.append(np.full(f.height, i, dtype=np.int64))
                if pos is not None and metric in known:
                    pos.append(known[metric])
                else:
                    pos = None
        if not parts:
            return
        rows = pl.concat(parts, how="vertical", rechunk=False)
        # the engine's series positions spare hashing the key strings of known series
        at = (
            None
            if pos is None or cur.positions is None
            else (cur.positions[0], np.concatenate(pos))
        )
        slot = self.slots.rows_at(rows, at)
        self._grow()
        n = len(self.slots)
        sig = np.concatenate(which)
        k = slot * K + sig
        delta = np.nan_to_num(rows.get_column("delta").to_numpy().astype(np.float64))
        dt = np.nan_to_num(rows.get_column("dt").to_numpy().astype(np.float64))
        ts = rows.get_column("ts").to_numpy()
        for acc, x in ((self.acc_delta, delta), (self.acc_dt, dt)):
            acc += np.bincount(k, x, minlength=K * n).reshape(n, K)
        # the time, cadence and newness of a NIC's window come from the signals both rules read
        base = sig < BASE
        np.maximum.at(self.acc_ts, slot[base], ts[base])
        has = dt > 0
        self.last_delta[slot[has], sig[has]] = delta[has]
        self.last_dt[slot[has], sig[has]] = dt[has]
        self.last_ts[slot[has], sig[has]] = ts[has]
        iv = np.zeros(n)
        cnt = np.maximum(np.nan_to_num(rows.get_column("n").to_numpy().astype(np.float64)), 1.0)
        np.maximum.at(iv, slot[has & base], dt[has & base] / cnt[has & base])
        seen = iv > 0
        old = self.interval[seen]
        self.interval[seen] = np.where(old > 0, old + 0.25 * (iv[seen] - old), iv[seen])

    def _values(self, end: int, w: int) -> tuple[np.ndarray, np.ndarray]:
        """Each NIC's rate of each signal at this window's end: over its samples in the window,
        or its newest sample where the window holds none (a NIC read less often) while that is
        not stale. NaN where neither, or where it spans more than the NIC's own cadence allows
        (a gap's catch-up is not comparable). Also the newest sample time per NIC."""
        win = w / S
        iv = self.interval[:, None]
        allowed = np.maximum(1.5 * win, MISSED_SAMPLE_INTERVALS * iv)
        use_acc = self.acc_dt >= 0.5 * win
        # only a NIC read at least every other window falls back on its newest sample: a part
        # of a fast NIC's window (a gap) is not comparable with its peers' whole windows
        fresh = (end - self.last_ts) <= (MISSED_SAMPLE_INTERVALS * iv + win) * S
        use_last = ~use_acc & (iv >= 0.5 * win) & fresh & (self.last_dt > 0)
        delta = np.where(use_acc, self.acc_delta, self.last_delta)
        dt = np.where(use_acc, self.acc_dt, self.last_dt)
        ok = (use_acc | use_last) & (dt <= allowed) & (dt > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            val = np.where(ok, delta / dt, np.nan)
        ts = np.maximum(self.acc_ts, self.last_ts[:, :BASE].max(axis=1))
        return val, ts

    def _window(self, ctx: StepContext, w: int) -> None:
        """Compare every NIC's window with its peers'; update streaks and alerts."""
        cfg = self.config
        n = len(self.slots)
        if n == 0:
            return
        val, ts = self._values(ctx.end, w)
        covered = np.isfinite(val)
        pause, ecn, tput, rx_pause = val[:, 0] / 1e6, val[:, 1], val[:, 2], val[:, 3] / 1e6
        retx = np.nansum(val[:, BASE:], axis=1)  # retransmissions a second (0: none read)
        judged = np.zeros(n, dtype=bool)
        cond = np.zeros(n, dtype=bool)
        backpressure = np.zeros(n, dtype=bool)  # the first rule (cond: either)
        alone = np.zeros(n, dtype=bool)  # the second
        # per NIC alone_slow finds: its share of its peers' median, its robust z, its ring
        # peers' median share, and the windows over which its ring and job were steady
        alone_ev: dict[int, tuple[float, float, float, int]] = {}
        share = np.full(n, np.nan)  # each NIC's rate over its group's median, this window
        gmed = np.full(n, np.nan)  # its group's median rate, this window
        stats: dict[int, tuple[float, float, float, float, float]] = {}
        zs = np.full((n, 3), np.nan)
        for g in np.unique(self.group[covered[:, 2] & (self.group >= 0)]).tolist():
            m = np.flatnonzero((self.group == g) & covered[:, 2])  # the group's NICs with data
            if len(m) < cfg.min_peers:
                continue
            zp, med_p = _robust_z(pause[m], cfg.pause_mad_floor)
            ze, med_e = _robust_z(ecn[m], cfg.ecn_mad_floor)
            zt, med_t = _robust_z(tput[m], cfg.throughput_mad_floor, relative=True)
            own = np.nan_to_num(pause[m])
            pressed = (own >= cfg.min_pause_share) & (np.nan_to_num(zp) >= cfg.z_threshold)
            # held by its leaf at least as long as it holds it: slow because of the fabric
            # (a storm's victim, an incast's sender), not at its own work
            pressed &= np.nan_to_num(rx_pause[m]) < own
            # the reference is the peers' upper quartile, not their median: with few rails,
            # the slow NIC's whole rail (which waits for it) can be half of the job
            ref_t = float(np.nanpercentile(tput[m], 75))
            slow = tput[m] <= cfg.max_throughput_ratio * ref_t
            judged[m] = True
            backpressure[m] = pressed & slow
            if med_t > 0:
                share[m], gmed[m] = tput[m] / med_t, med_t
            cond[m] = backpressure[m]
            zs[m] = np.stack([zp, ze, zt], axis=1)
            stats[g] = (med_p, med_e, med_t, float(len(m)), ref_t)
        if cfg.alone_slow:
            self._remember(share, gmed)
            for g in np.unique(self.group[judged]).tolist():
                if not self.group_names[g].startswith("job:"):
                    # a rail's NICs in no job need not run one collective: hosts at other
                    # work send at other steady rates, and nothing waits for the slower ones
                    continue
                m = np.flatnonzero((self.group == g) & judged)
                alone[m] = self._alone(m, share, zs[m], pause, rx_pause, stats[g][2], alone_ev)
                # retransmitting: slow because its transport resends (go-back-N), the
                # TransportErrors' fault, not at its own work
                alone[m] &= retx[m] < cfg.alone_max_retx_per_s
            cond |= alone
        # a window counts for a NIC only with a new sample of it: a NIC read every 5 s is
        # judged once per sample, and its streak counts the seconds its samples cover
        span = self.acc_dt[:, :BASE].max(axis=1)
        new = span > 0
        # alone_slow judges throughput alone: a window counts for it only with a new transmit
        # sample (another signal's newer sample, read at another moment, says nothing of it)
        # and then neither starts nor breaks a streak
        new_t = self.acc_dt[:, 2] > 0
        only_alone = alone & ~backpressure
        span = np.where(only_alone, self.acc_dt[:, 2], span)
        hit = cond & np.where(only_alone, new_t, new)
        seen = judged & new & ~(only_alone & ~new_t)
        self.streak = np.where(hit, self.streak + 1, np.where(seen, 0, self.streak))
        self.streak_s = np.where(hit, self.streak_s + span, np.where(seen, 0.0, self.streak_s))
        self.calm = np.where(hit, 0, np.where(seen, self.calm + 1, self.calm))
        for i in [i for i in self.active if self.calm[i] >= cfg.clear_windows]:
            del self.active[i]
        # min_windows windows' worth of time (less half a window: a window's samples may
        # cover a little less of it), in two samples at least
        held = self.streak_s >= (cfg.min_windows - 0.5) * cfg.window_s
        least = min(2, cfg.min_windows)
        # alone_slow also needs as many samples as min_windows windows normally hold (up to
        # min_windows): one late sample spanning two intervals is one reading, and a stall
        # split over two readings is no steady slowness
        with np.errstate(divide="ignore"):
            per = np.ceil(cfg.min_windows * cfg.window_s / self.interval)
        need = np.maximum(least, np.minimum(cfg.min_windows, np.nan_to_num(per, posinf=1e9)))
        steady = backpressure | (self.streak >= need)
        enter = np.flatnonzero(hit & held & (self.streak >= least) & steady)
        for i in enter.tolist():  # the few stragglers
            if i in self.active:
                continue
            g = int(self.group[i])
            med_p, med_e, med_t, size, ref_t = stats[g]
            node, nic = self.slots.keys[i]
            same_rail = np.flatnonzero(
                (self.group == g) & (self.rail == self.rail[i]) & covered[:, 2]
            )
            ring = float(np.nanmedian(tput[same_rail])) / ref_t if ref_t > 0 else math.nan
            peers = f"{self.group_names[g]} ({int(size)} NICs)"
            rx = pct(np.nan_to_num(rx_pause[i]))
            rule = "backpressure" if backpressure[i] else "alone_slow"
            if rule == "backpressure":
                ev = [
                    f"pause requested {pct(pause[i])} of the time (peer median {pct(med_p)}, "
                    f"robust z {zs[i, 0]:.0f}; thresholds {pct(cfg.min_pause_share)}, "
                    f"z {cfg.z_threshold:g})",
                    f"pause received {rx} of the time (less than it requested: not held by its "
                    "leaf)",
                    f"ECN-marked packets {ecn[i]:,.0f}/s (peer median {med_e:,.0f}/s, z "
                    f"{zs[i, 1]:.0f}; evidence only)",
                    f"RDMA transmit {tput[i] * 8 / 1e9:.1f} Gb/s = "
                    f"{pct(tput[i] / ref_t) if ref_t > 0 else 'n/a'} of the peers' upper "
                    f"quartile {ref_t * 8 / 1e9:.1f} Gb/s (threshold "
                    f"{pct(cfg.max_throughput_ratio)}; median {med_t * 8 / 1e9:.1f} Gb/s, z "
                    f"{zs[i, 2]:.1f})",
                ]
                if self.rail[i] >= 0 and math.isfinite(ring):
                    ev.append(
                        f"its rail {self.rail[i]} runs at {pct(ring)} of that (the ring waits for "
                        "it)"
                    )
            else:
                part, z_t, ring_now, span = alone_ev[i]
                ev = [
                    f"RDMA transmit {tput[i] * 8 / 1e9:.1f} Gb/s = {pct(part)} of the peers' "
                    f"median {med_t * 8 / 1e9:.1f} Gb/s (robust z {z_t:.1f}; thresholds "
                    f"{pct(cfg.alone_throughput_ratio)}, z -{cfg.z_threshold:g})",
                    f"{pct(part / ring_now)} of its ring peers' median (rail {self.rail[i]}, "
                    f"{len(same_rail) - 1} other NICs): it alone is slow, its ring does not "
                    f"share the pace, and neither its ring nor its job stalled over the last "
                    f"{span} windows",
                    f"pause requested {pct(pause[i])}, received {rx} of the time (not held by "
                    "its leaf)",
                    f"ECN-marked packets {ecn[i]:,.0f}/s (peer median {med_e:,.0f}/s, z "
                    f"{zs[i, 1]:.0f}: not congested)",
                ]
            self.active[i] = _Active(
                int(ts[i]),
                f"rule={rule}: {node}/{nic} among {peers}, over {cfg.window_s:g} s windows, "
                f"{int(self.streak[i])} in a row ({self.streak_s[i]:.1f} s of samples): "
                + "; ".join(ev),
                self._pcie(ctx, node, nic),
                rule,
            )

    def _remember(self, share: np.ndarray, gmed: np.ndarray) -> None:
        """Keep this window's share of each NIC (its rate over its group's median) and its
        group's median rate, for the alone_slow rule's look back over its last windows."""
        n, h = len(share), ROLL_WINDOWS
        if self.roll.shape != (n, h) or self.roll_med.shape != (n, h):
            # grown NICs (or a checkpoint of another layout): a new NIC has no history yet
            self.roll = _fit(self.roll, n, h)
            self.roll_med = _fit(self.roll_med, n, h)
        self.roll[:, self.roll_at % h] = share
        self.roll_med[:, self.roll_at % h] = gmed
        self.roll_at += 1

    def _span(self, i: int) -> int:
        """Windows the alone_slow rule looks back over for NIC ``i``: twice ``min_windows``,
        and at least 2.5 of its sampling intervals (a stall lands in one sample or is split
        over two, as the NIC's sampling phase falls)."""
        cfg = self.config
        iv = float(self.interval[i]) if i < len(self.interval) else 0.0
        k = max(2 * cfg.min_windows, math.ceil(2.5 * iv / cfg.window_s))
        return int(min(k, ROLL_WINDOWS, self.roll_at))

    def _recent(self, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The last ``k`` windows' shares and group medians of the NICs ``rows``."""
        h = ROLL_WINDOWS
        cols = (self.roll_at - 1 - np.arange(k)) % h
        return self.roll[np.ix_(rows, cols)], self.roll_med[np.ix_(rows, cols)]

    def _stalled(self, rows: np.ndarray, k: int) -> bool:
        """Whether half of the NICs ``rows`` (or more) sent, in one of the last ``k`` windows
        or the next, below ``alone_throughput_ratio`` of their own median rate over them: a
        stall or a dip they shared (its phase in each NIC's samples puts it in one window or
        the next). A straggler is steadily slow (its own pace is its median); its healthy peers
        keep theirs, and their noise, each NIC's own, does not line up in one window."""
        share, med = self._recent(rows, k)
        rate = share * med
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a NIC with no window: NaN
            ref = np.nanmedian(rate, axis=1)
        ok = np.isfinite(ref) & (ref > 0)
        if not ok.any():
            return False
        with np.errstate(invalid="ignore"):
            dip = rate[ok] <= self.config.alone_throughput_ratio * ref[ok][:, None]
        if dip.shape[1] > 1:
            dip = dip[:, 1:] | dip[:, :-1]
        return bool((2 * dip.sum(axis=0) >= int(ok.sum())).any())

    def _alone(
        self,
        m: np.ndarray,
        share: np.ndarray,
        z: np.ndarray,
        own_pause: np.ndarray,
        rx_pause: np.ndarray,
        med_t: float,
        found: dict[int, tuple[float, float, float, int]],
    ) -> np.ndarray:
        """The alone_slow rule over one peer group's NICs ``m`` (``z``: their robust z-scores
        of pause, ECN and throughput, by position in ``m``; the rest by slot): which of them
        alone is slow in this window. Fills ``found`` (by slot) with the evidence of those.

        A NIC caught in someone else's stall looks alone slow for a sample or two: a ring-wide
        stall (a flap, a storm) shorter than a sample interval lands in one NIC's sample, or is
        split over two, as its sampling phase falls, and a ring peer whose sample straddles it
        less looks normal. So the NIC's ring (its other members' median share, window by
        window, and half of them against their own pace) and its job (half its other NICs
        against their own pace, ``_stalled``) must have kept their pace over the NIC's last
        windows (``_span``): a straggler is slow against a steady ring; a NIC whose dip
        coincides with its ring's or its job's is a victim of whatever stalled them."""
        cfg = self.config
        lim = cfg.alone_throughput_ratio
        out = np.zeros(len(m), dtype=bool)
        if not med_t * 8 >= cfg.alone_min_rate_gbps * 1e9:
            return out  # the job moves next to nothing: no collective runs, nobody waits
        t = share[m]
        pause = np.nan_to_num(own_pause[m])
        # the z-score of its share in this window, or of its median share over its look back:
        # per-NIC noise (a collective's chunks, host jitter) widens one window's spread but
        # averages out over several, while a straggler's shortfall does not
        h = ROLL_WINDOWS
        ks = np.array([self._span(int(i)) for i in m])
        age = (self.roll_at - 1 - np.arange(h)) % h
        recent = np.where(age[None, :] < ks[:, None], self.roll[m], np.nan)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a NIC with no window yet: NaN
            z_span, _ = _robust_z(np.nanmedian(recent, axis=1), cfg.throughput_mad_floor, True)
        zt = np.fmin(np.nan_to_num(z[:, 2], nan=0.0), np.nan_to_num(z_span, nan=0.0))
        with np.errstate(invalid="ignore"):
            cand = (
                (t <= lim)
                & (zt <= -cfg.z_threshold)
                & (t >= cfg.alone_min_busy_ratio)
                # held by its leaf beyond what it asks for: a storm's victim, an incast's sender
                & (np.nan_to_num(rx_pause[m]) <= pause + cfg.alone_max_held_share)
                # marked more than its peers: congested, slow because of someone else
                & (np.nan_to_num(z[:, 1]) < cfg.z_threshold)
            )
        rails = self.rail[m]
        for j in np.flatnonzero(cand).tolist():  # the few candidates
            i = int(m[j])
            ring = m[(rails == rails[j]) & (m != i)]
            if self.rail[i] < 0 or not len(ring) or not np.isfinite(share[ring]).any():
                continue  # no ring peer to compare with
            ring_now = float(np.nanmedian(share[ring]))
            # a ring whose other members are as slow shares one pace: the ring waits for
            # someone, and nothing says it is this NIC
            if not t[j] <= lim * ring_now:
                continue
            k = self._span(i)
            peers, _ = self._recent(ring, k)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a window with no data: NaN
                ring_w = np.nanmedian(peers, axis=0)  # the ring's pace, window by window
            # the ring slowed in one of the windows (a stall, a straggler's ring catching up),
            # or half its other members, or half the job's, dipped below their own pace in one
            # (a flap, a storm, a barrier waiting for someone): its share in them is a matter
            # of sampling phase, and it is a victim of whatever stalled them
            if not np.isfinite(ring_w).all() or (ring_w <= lim).any():
                continue
            if self._stalled(ring, k) or self._stalled(m[m != i], k):
                continue
            out[j] = True
            found[i] = (float(t[j]), float(zt[j]), ring_now, k)
        return out

    def _pcie(self, ctx: StepContext, node: str, nic: str) -> str:
        """The NIC's PCIe link, if the newest step shows it below its maximum (evidence)."""
        cur = ctx.engine.current()
        if cur is None:
            return ""
        got: dict[str, float] = {}
        for m in ("nic_pcie_speed_gts", "nic_pcie_max_speed_gts", "nic_pcie_width"):
            f = cur.get(m)
            if f.height:
                hit = f.filter((pl.col("device") == node) & (pl.col("port") == nic))
                if hit.height:
                    got[m] = float(hit.get_column("last")[0])
        f = cur.get("nic_pcie_max_width")
        if f.height:
            hit = f.filter((pl.col("device") == node) & (pl.col("port") == nic))
            if hit.height:
                got["nic_pcie_max_width"] = float(hit.get_column("last")[0])
        s, ms = got.get("nic_pcie_speed_gts"), got.get("nic_pcie_max_speed_gts")
        wd, mw = got.get("nic_pcie_width"), got.get("nic_pcie_max_width")
        if (s and ms and s < ms) or (wd and mw and wd < mw):
            return f"PCIe link {_gts(s, wd)} below its maximum {_gts(ms, mw)}"
        return ""

    def _findings(self) -> list[Finding]:
        out = []
        for i, act in self.active.items():
            node, nic = self.slots.keys[i]
            labels = node_labels(self.topology, node, nic)
            where = labels.get("job") or (f"rail {labels['rail']}" if "rail" in labels else "")
            extra = {"pcie": act.pcie} if act.pcie else {}
            out.append(
                Finding(
                    STRAGGLER,
                    labels,
                    "warning",
                    act.ts,
                    summary=f"{node}/{nic} is persistently slower than its peers"
                    + (f" in {where}" if where else ""),
                    description=(
                        f"{node}/{nic} cannot keep up with what it receives (it asks its leaf for "
                        "pause, and is not itself held) while sending below its peers; every ring "
                        "it is in waits for it."
                        if act.rule == "backpressure"
                        else f"{node}/{nic} alone sends well below its peers and the other NICs "
                        "of its ring, while the fabric holds it no more than them (no pause "
                        "received, no extra ECN): it is slow at its own work (a throttled GPU, "
                        "a slow host), and every ring it is in waits for it."
                    )
                    + (f" {act.pcie}: a likely cause." if act.pcie else ""),
                    evidence=act.evidence + (f"; {act.pcie}" if act.pcie else ""),
                    extra=extra,
                )
            )
        return out


def _fit(a: np.ndarray, n: int, h: int) -> np.ndarray:
    """``a`` with ``n`` rows of ``h`` columns: rows it lacks are NaN (no history)."""
    out = np.full((n, h), np.nan)
    if a.ndim == 2 and a.shape[1] == h:
        out[: min(n, len(a))] = a[:n]
    return out


def _gts(speed: float | None, width: float | None) -> str:
    return (f"{speed:g}" if speed else "?") + " GT/s" + (f" x{width:g}" if width else "")


def _robust_z(x: np.ndarray, floor: float, relative: bool = False) -> tuple[np.ndarray, float]:
    """Robust z-scores (median and 1.4826 x MAD) of ``x``, with a floor on the scale.

    >>> z, med = _robust_z(np.array([1.0, 1.0, 1.1, 0.9, 5.0]), 0.01)
    >>> med, round(float(z[-1]), 1)
    (1.0, 27.0)
    """
    if not np.isfinite(x).any():
        return np.full(len(x), np.nan), math.nan
    med = float(np.nanmedian(x))
    mad = float(np.nanmedian(np.abs(x - med)))
    scale = max(1.4826 * mad, floor * abs(med) if relative else floor, 1e-12)
    return (x - med) / scale, med


def build(topology: Topology, config: StragglerConfig | None = None) -> StragglerDetector:
    return StragglerDetector(topology, config or StragglerConfig())


__all__ = ["StragglerConfig", "StragglerDetector", "build"]
