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

A slow NIC slows its whole rail's ring, so low throughput alone does not single it out (every
NIC of that rail in the job is just as slow: its peers wait, and ask for nothing), and pressure
alone is not slowness. ECN marks on what a NIC receives are *not* pressure: they say the leaf's
queue toward it is congested (incast, or a DCQCN burst), which happens to NICs that drain at
line rate; a ring peer of a straggler caught in such a burst is slow and marked, and not the
straggler (ECN is quoted as evidence). A straggler shows all three, in ``min_windows`` windows
in a row; it resolves after ``clear_windows`` normal ones. A PCIe link below its maximum is
quoted as evidence.

Cadence: a window counts for a NIC only when it holds a new sample of it, and a streak must
cover ``min_windows`` windows' worth of time (less half a window) in two samples at least: a
NIC read every second needs three samples, one read every 5 s two (a sample stands for its whole
interval, but one sample alone is one burst). A NIC read less often than the window still
stands, as a peer, for its newest sample while that is fresh.

Cost: a healthy step reads the highest pause share and ECN rate of the step (two column
reductions); if no NIC could reach the pressure thresholds in a window and none is being
followed, the window is not evaluated at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import polars as pl

from detectors.base import Finding, StepContext, check_positive_numbers, node_labels, pct
from detectors.state import MISSED_SAMPLE_INTERVALS, EntitySlots
from detectors.windows import Step
from rocewatch.errors import ConfigError
from rocewatch.topology import Topology

S = 1_000_000_000
PAUSE, ECN, TPUT = "nic_tx_pause_us", "nic_ecn_marked_pkts", "nic_tx_rdma_bytes"
HELD = "nic_rx_pause_us"  # pause the NIC received: its transmit held by its leaf
SIGNALS = (PAUSE, ECN, TPUT, HELD)
K = len(SIGNALS)


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

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_positive_numbers(self, "straggler")
        for name in ("min_windows", "clear_windows", "min_peers"):
            if int(getattr(self, name)) != getattr(self, name):
                raise ConfigError(f"straggler: {name}: must be a whole number")
        if not 0 < self.max_throughput_ratio < 1 or not 0 < self.min_pause_share <= 1:
            raise ConfigError(
                "straggler: max_throughput_ratio must be within (0, 1), min_pause_share (0, 1]"
            )


@dataclass
class _Active:
    ts: int
    evidence: str
    pcie: str


@dataclass
class StragglerDetector:
    topology: Topology
    config: StragglerConfig = field(default_factory=StragglerConfig)
    name: str = "straggler"
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

    def __setstate__(self, d: dict[str, object]) -> None:
        self.__dict__.update(d)
        if "streak_s" not in d:  # a checkpoint from before streaks counted time
            self.streak_s = self.streak * float(self.config.window_s)
        if "last_ts" not in d:  # a checkpoint from before the newest samples were kept
            n = len(self.acc_ts)
            self.last_delta, self.last_dt = np.zeros((n, K)), np.zeros((n, K))
            self.last_ts = np.zeros((n, K), dtype=np.int64)
            self.interval = np.zeros(n)
        self._conform()

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
        if quiet and not self.active and not self.streak.any():
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
        np.maximum.at(self.acc_ts, slot, ts)
        has = dt > 0
        self.last_delta[slot[has], sig[has]] = delta[has]
        self.last_dt[slot[has], sig[has]] = dt[has]
        self.last_ts[slot[has], sig[has]] = ts[has]
        iv = np.zeros(n)
        cnt = np.maximum(np.nan_to_num(rows.get_column("n").to_numpy().astype(np.float64)), 1.0)
        np.maximum.at(iv, slot[has], dt[has] / cnt[has])
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
        ts = np.maximum(self.acc_ts, self.last_ts.max(axis=1))
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
        judged = np.zeros(n, dtype=bool)
        cond = np.zeros(n, dtype=bool)
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
            cond[m] = pressed & slow
            zs[m] = np.stack([zp, ze, zt], axis=1)
            stats[g] = (med_p, med_e, med_t, float(len(m)), ref_t)
        # a window counts for a NIC only with a new sample of it: a NIC read every 5 s is
        # judged once per sample, and its streak counts the seconds its samples cover
        span = self.acc_dt.max(axis=1)
        new = span > 0
        hit, seen = cond & new, judged & new
        self.streak = np.where(hit, self.streak + 1, np.where(seen, 0, self.streak))
        self.streak_s = np.where(hit, self.streak_s + span, np.where(seen, 0.0, self.streak_s))
        self.calm = np.where(hit, 0, np.where(seen, self.calm + 1, self.calm))
        for i in [i for i in self.active if self.calm[i] >= cfg.clear_windows]:
            del self.active[i]
        # min_windows windows' worth of time (less half a window: a window's samples may
        # cover a little less of it), in two samples at least
        held = self.streak_s >= (cfg.min_windows - 0.5) * cfg.window_s
        enter = np.flatnonzero(hit & held & (self.streak >= min(2, cfg.min_windows)))
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
            ev = [
                f"pause requested {pct(pause[i])} of the time (peer median {pct(med_p)}, "
                f"robust z {zs[i, 0]:.0f}; thresholds {pct(cfg.min_pause_share)}, "
                f"z {cfg.z_threshold:g})",
                f"pause received {pct(np.nan_to_num(rx_pause[i]))} of the time (less than it "
                "requested: not held by its leaf)",
                f"ECN-marked packets {ecn[i]:,.0f}/s (peer median {med_e:,.0f}/s, z "
                f"{zs[i, 1]:.0f}; evidence only)",
                f"RDMA transmit {tput[i] * 8 / 1e9:.1f} Gb/s = {pct(tput[i] / ref_t)} of the "
                f"peers' upper quartile {ref_t * 8 / 1e9:.1f} Gb/s (threshold "
                f"{pct(cfg.max_throughput_ratio)}; median {med_t * 8 / 1e9:.1f} Gb/s, z "
                f"{zs[i, 2]:.1f})",
            ]
            if self.rail[i] >= 0 and math.isfinite(ring):
                ev.append(
                    f"its rail {self.rail[i]} runs at {pct(ring)} of that (the ring waits for it)"
                )
            self.active[i] = _Active(
                int(ts[i]),
                f"{node}/{nic} among {peers}, over {cfg.window_s:g} s windows, "
                f"{int(self.streak[i])} in a row ({self.streak_s[i]:.1f} s of samples): "
                + "; ".join(ev),
                self._pcie(ctx, node, nic),
            )

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
                    "Straggler",
                    labels,
                    "warning",
                    act.ts,
                    summary=f"{node}/{nic} is persistently slower than its peers"
                    + (f" in {where}" if where else ""),
                    description=f"{node}/{nic} cannot keep up with what it receives (it asks its "
                    "leaf for pause, and is not itself held) while sending below its peers; "
                    "every ring it is in waits for it."
                    + (f" {act.pcie}: a likely cause." if act.pcie else ""),
                    evidence=act.evidence + (f"; {act.pcie}" if act.pcie else ""),
                    extra=extra,
                )
            )
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
