"""ECNCongestion: sustained ECN marking on one switch queue or NIC that its peers do not share.

DCQCN marks packets in every burst of a healthy fabric (2-10% of them, more in a burst), and a
busy fabric marks more everywhere at once, so neither a count of marks nor one fabric-wide
median says much. What does not happen in healthy operation is one queue (or the NIC behind it)
marking a large share of what it carries, reading after reading, while its peers do not: its
occupancy sits past the RED profile's Kmin for seconds. The marked share of each reading is
``queue_ecn_marked_pkts`` over ``queue_tx_pkts`` (else the port's ``port_out_pkts``: a lower
bound), or at a NIC ``nic_ecn_marked_pkts`` over the packets received (its RDMA byte counter at
``packet_bytes`` a packet: the agent exports no packet counter); ``np_cnp_sent`` goes into the
evidence. Each reading must mark at least ``min_marked_pps`` (an idle port's few packets say
nothing). A queue that marks while it sends nothing (paused by PFC and filling: it marks what
it takes in) marks all it handles: share 1, not undefined. Three rules:

- **peers**: every reading for ``sustain_s`` marks at least ``peer_factor`` times the median
  share of its peers (the same switch role, rail and kind of port, same queue; a NIC's rail; the
  whole fabric's where that group has fewer than ``min_peers`` reporting), each peer's share
  smoothed over half of ``sustain_s`` so that synchronised collective bursts neither hide nor
  fake one, *and* beyond its own normal: ``normal_factor`` times its learned share once
  trusted, else at least ``new_mark_share`` (a port marking a lot from its first reading may be
  a busy port at its normal). Never below ``min_mark_share``.
- **baseline**: where too few peers report, ``baseline_factor`` times its own learned share and
  at least ``min_mark_share``.
- **absolute**: every reading for ``sustain_s`` marks at least ``absolute_mark_share``: no
  healthy DCQCN loop marks half of its packets for seconds.

The own baseline is the traffic-weighted mean share (an EWMA of marks over an EWMA of packets,
time constant ``baseline_tau_s``, each reading weighing the time it covers), trusted after
``learn_s`` and ``learn_samples`` readings. It learns nothing while the entity alerts, and
readings above 1.5 times that normal wait while they last: learned once the entity is back
below without an alert (a burst), dropped if it alerts, so a fault never becomes its own
baseline.

Cadence: ECN counters arrive every 0.1-5 s, NIC counters every 0.1-2 s. A counter reading says
what its interval held on average: a burst in part of it may lift it (a 1.5 s burst lifts two
1 s readings), so a run's duration counts from the *end* of its first reading, and two readings
are always needed: at 5 s a sustained fault is found at the second reading wholly inside it
(about two intervals after its onset), at 1 s at the third, at 0.1 s after ``sustain_s``.
Denominators may come at another cadence than the marks: the newest fresh one is used. Counter
clears give small deltas (rates.py).

An alert stays firing while its smoothed share stays, two readings in a row,
at least ``exit_ratio`` of the threshold it fired on and 1.25 times its own normal and its
peers' median, and clears ``clear_s`` plus 2.5 intervals after that last held (``state.Sustain``):
one fault, one alert, at any cadence. The evidence names the rule, the baseline, the peers'
median and the threshold.

A healthy step costs a few vectorised updates; only the entities over ``min_mark_share`` (and
their own floor) cost Python work.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from detectors.base import Finding, StepContext, node_labels, port_labels
from detectors.baseline import (
    MISSED,
    NS,
    Groups,
    KeySlots,
    Run,
    grow,
    nic_groups,
    peer_median,
    queue_groups,
)
from detectors.state import Episode, Key, Row, Sustain, lookup
from detectors.windows import Step
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import ECN_CONGESTION
from rocewatch.core.state import Stateful
from rocewatch.core.topology import Topology

QUEUE, NIC = 1, 2
Q_MARKS, Q_TX, P_TX = "queue_ecn_marked_pkts", "queue_tx_pkts", "port_out_pkts"
N_MARKS, N_RDMA, N_BYTES, N_CNP = (
    "nic_ecn_marked_pkts",
    "nic_rx_rdma_bytes",
    "nic_rx_bytes",
    "nic_cnp_sent",
)
SMOOTH = 0.5  # of sustain_s: the time constant of the smoothed share
STAY_OVER = 1.25  # x its own normal and its peers' median: an alert's stay condition
SUSPECT = 1.5  # x the own normal: readings above wait until the entity is back below
PENDING_MAX = 256  # readings of one run held back at most
RDMA_FRESH = NS * 30  # a NIC with an RDMA byte counter this recent is not judged on all bytes


@dataclass(frozen=True)
class EcnCongestionConfig:
    # healthy DCQCN marks 2-10% of packets (bursts more, briefly); a slow receiver ~10%. Beyond
    # 12%, sustained, the queue sits past Kmin most of the time.
    min_mark_share: float = 0.12
    new_mark_share: float = 0.25  # at least this much without a learned normal of its own
    absolute_mark_share: float = 0.5  # half the packets, for seconds: never healthy
    peer_factor: float = 2.0  # peers rule: x the median share of its peers...
    normal_factor: float = 1.5  # ...and x its own learned share (not a busy port's normal)
    baseline_factor: float = 2.5  # baseline rule (too few peers): x its own learned share
    min_peers: int = 3  # peers reporting, else the whole fabric's (then none: no peers rule)
    # an idle port's few packets say nothing: ~0.3 Gb/s of marked 4 KiB packets, far below
    # any real congestion on a 100-800G link
    min_marked_pps: float = 10_000.0
    sustain_s: float = 2.0  # longer than any collective's burst (all-reduce ~0.3 s)
    exit_ratio: float = 0.5  # of the threshold it fired on: the stay condition
    clear_s: float = 1.0  # resolves this long (plus 2.5 sampling intervals) after it last held
    learn_s: float = 10.0  # seconds of readings before the own baseline is trusted
    learn_samples: int = 4  # ... and at least this many readings
    baseline_tau_s: float = 600.0  # the baseline remembers about this much of the past
    packet_bytes: float = 4096.0  # RoCE MTU: received bytes -> packets at a NIC
    queues: bool = True  # judge switch queues
    nics: bool = True  # judge NICs
    max_entities: int = 10_000
    enabled: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        where = "detectors.ecn_congestion"
        if not 0 < self.min_mark_share <= self.new_mark_share <= 1:
            raise ConfigError(f"{where}: need 0 < min_mark_share <= new_mark_share <= 1")
        if not self.min_mark_share <= self.absolute_mark_share <= 1:
            raise ConfigError(f"{where}.absolute_mark_share: must be within [min_mark_share, 1]")
        if min(self.peer_factor, self.normal_factor, self.baseline_factor) <= 1:
            raise ConfigError(f"{where}: peer_factor, normal_factor, baseline_factor must be > 1")
        if not 0 < self.exit_ratio <= 1:
            raise ConfigError(f"{where}.exit_ratio: must be within (0, 1]")
        if self.min_marked_pps < 0:
            raise ConfigError(f"{where}.min_marked_pps: must be >= 0")
        if self.sustain_s <= 0 or self.clear_s < 0 or self.learn_s < 0:
            raise ConfigError(f"{where}: sustain_s must be > 0, clear_s and learn_s >= 0")
        if self.baseline_tau_s <= 0 or self.packet_bytes <= 0:
            raise ConfigError(f"{where}: baseline_tau_s and packet_bytes must be > 0")
        if self.learn_samples < 2 or self.min_peers < 1:
            raise ConfigError(f"{where}: learn_samples must be >= 2, min_peers >= 1")
        if self.max_entities < 1:
            raise ConfigError(f"{where}.max_entities: must be >= 1")


@dataclass
class _Fired:
    rule: str
    stay: float  # marked share
    slot: int
    above: bool = True  # the previous reading was at the stay threshold


@dataclass
class EcnCongestionDetector(Stateful):
    topology: Topology
    config: EcnCongestionConfig = field(default_factory=EcnCongestionConfig)
    name: str = "ecn_congestion"
    # the record types its state holds (rocewatch.core.state; the checkpoint codec reads no other)
    STATE_TYPES: ClassVar[tuple[type, ...]] = (
        Groups,
        KeySlots,
        Run,
        _Fired,
        Episode,
        Sustain,
        Finding,
    )
    # the metrics it reads from the window engine (steps carry no others to the detect stage)
    reads: ClassVar[frozenset[str]] = frozenset(
        {Q_MARKS, Q_TX, P_TX, N_MARKS, N_RDMA, N_BYTES, N_CNP}
    )

    def __post_init__(self) -> None:
        c = self.config
        self.sustain = Sustain(c.sustain_s, 0.0, c.clear_s, c.max_entities)
        self.slots = KeySlots()
        self.groups = Groups()
        self.kind = np.zeros(0, dtype=np.int8)
        self.den = np.zeros(0)  # packets/s of the newest denominator reading
        self.den_until = np.zeros(0, dtype=np.int64)  # ... fresh until
        self.rdma_ts = np.zeros(0, dtype=np.int64)  # NIC: newest RDMA byte reading
        self.port_slot = np.zeros(0, dtype=np.int64)  # queue -> its port's slot (-1: none)
        self.smooth = np.zeros(0)  # marked share, smoothed (what peers see, what stays)
        self.smooth_until = np.zeros(0, dtype=np.int64)
        self.base_marks = np.zeros(0)  # EWMA marks/s
        self.base_pkts = np.zeros(0)  # EWMA packets/s
        self.learned_s = np.zeros(0)
        self.samples = np.zeros(0, dtype=np.int64)
        # the readings of a run above SUSPECT x its normal, not learned yet: marks/s, pkts/s, s
        self.pending: dict[int, list[tuple[float, float, float]]] = {}
        self.runs: dict[int, Run] = {}
        self.fired: dict[Key, _Fired] = {}

    @property
    def window_s(self) -> float:
        """Reads only the newest step: the history it needs is its own."""
        return 0.0

    def _grow(self) -> None:
        n = len(self.slots)
        if n == len(self.kind):
            return
        self.kind = grow(self.kind, n, 0)
        self.den = grow(self.den, n, np.nan)
        self.den_until = grow(self.den_until, n, 0)
        self.rdma_ts = grow(self.rdma_ts, n, 0)
        self.port_slot = grow(self.port_slot, n, -1)
        self.smooth = grow(self.smooth, n, np.nan)
        self.smooth_until = grow(self.smooth_until, n, 0)
        self.base_marks = grow(self.base_marks, n, 0.0)
        self.base_pkts = grow(self.base_pkts, n, 0.0)
        self.learned_s = grow(self.learned_s, n, 0.0)
        self.samples = grow(self.samples, n, 0)

    def _slots(self, cur: Step, metric: str) -> tuple[np.ndarray, Any]:
        f = cur.get(metric)
        s = self.slots.rows_at(cur, metric, f) if f.height else np.zeros(0, dtype=np.int64)
        self._grow()
        return s, f

    # --- per step ----------------------------------------------------------------------------
    def evaluate(self, ctx: StepContext) -> list[Finding]:
        cur = ctx.engine.current()
        rows: list[Row] = []
        if cur is not None:
            self._denominators(cur)
            if self.config.queues:
                rows += self._marks(cur, ctx, Q_MARKS, QUEUE)
            if self.config.nics:
                rows += self._marks(cur, ctx, N_MARKS, NIC)
        if not rows and not self.sustain.episodes:
            return []
        fired = self.sustain.update(ctx.start, ctx.end, rows)
        for k in [k for k in self.fired if k not in self.sustain.episodes]:
            del self.fired[k]  # cleared: a later episode starts afresh
        return [self._finding(k, ep) for k, ep in fired]

    def _denominators(self, cur: Step) -> None:
        """The newest packet rate of every queue, port and NIC that reported one."""
        pb = self.config.packet_bytes
        for metric, per in ((Q_TX, 1.0), (P_TX, 1.0), (N_RDMA, pb), (N_BYTES, pb)):
            s, f = self._slots(cur, metric)
            if len(s) == 0:
                continue
            dt = f["dt"].to_numpy()
            ts = f["ts"].to_numpy()
            with np.errstate(divide="ignore", invalid="ignore"):
                rate = f["delta"].to_numpy() / dt / per
            ok = np.isfinite(rate) & (rate >= 0)
            if metric == N_BYTES:  # all bytes only where no RDMA byte counter reports
                ok &= ts - self.rdma_ts[s] > RDMA_FRESH
            elif metric == N_RDMA:
                self.rdma_ts[s[ok]] = ts[ok]
            s, dt, ts, rate = s[ok], dt[ok], ts[ok], rate[ok]
            self.den[s] = rate
            self.den_until[s] = ts + np.round((MISSED * dt + 0.1) * NS).astype(np.int64)

    def _marks(self, cur: Step, ctx: StepContext, metric: str, kind: int) -> list[Row]:
        cfg = self.config
        s, f = self._slots(cur, metric)
        if len(s) == 0:
            return []
        new = s[self.kind[s] != kind]
        if len(new):
            self.kind[new] = kind
            of: Callable[[tuple[str, str, str]], tuple[Hashable, Hashable]] = (
                (lambda k: queue_groups(self.topology, k))
                if kind == QUEUE
                else (lambda k: nic_groups(self.topology, k))
            )
            self.groups.assign(np.unique(new), self.slots.keys, of)
        ts = f["ts"].to_numpy().astype(np.int64)
        dt = f["dt"].to_numpy()
        n = np.maximum(f["n"].to_numpy().astype(np.int64), 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            marks = f["delta"].to_numpy() / dt
        den = self._den(s, ts, kind)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.minimum(marks / den, 1.0)
        # a queue that marks what it takes in while it sends nothing (paused by PFC, filling)
        # marks all of it: its share is whole, not undefined
        stuck = (den == 0) & (marks > 0) & np.isfinite(marks)
        share = np.where(stuck, 1.0, share)
        valid = np.isfinite(share) & (dt > 0) & ((den > 0) | stuck) & (marks >= 0)
        s, ts, dt, n, marks, den, share = (a[valid] for a in (s, ts, dt, n, marks, den, share))
        if len(s) == 0:
            return []
        # peers see each entity's share smoothed (time-weighted) over half of sustain_s:
        # several collective bursts, yet quick to fall once the marking stops
        old = self.smooth[s]
        a = np.where(np.isnan(old), 1.0, -np.expm1(-dt / (SMOOTH * cfg.sustain_s)))
        self.smooth[s] = np.where(np.isnan(old), share, old + a * (share - old))
        self.smooth_until[s] = ts + np.round((MISSED * dt / n + 0.1) * NS).astype(np.int64)
        trusted = (self.learned_s[s] >= cfg.learn_s) & (self.samples[s] >= cfg.learn_samples)
        with np.errstate(divide="ignore", invalid="ignore"):
            own = np.where(trusted, self.base_marks[s] / self.base_pkts[s], np.nan)
        # the lowest threshold either rule could have (the peers rule's own term)
        lowest = min(cfg.normal_factor, cfg.baseline_factor)
        floor = np.where(trusted, np.fmax(cfg.min_mark_share, lowest * own), cfg.new_mark_share)
        cand = (marks >= cfg.min_marked_pps) & (share >= np.fmin(floor, cfg.absolute_mark_share))
        out = s[~cand]
        if self.runs:
            ended = np.zeros(len(self.slots), dtype=bool)
            ended[out] = True
            for x in [x for x in self.runs if ended[x] and self.kind[x] == kind]:
                del self.runs[x]
        name = "queue" if kind == QUEUE else "nic"
        # the entities alerting, by slot
        tracked = {
            f.slot: k for k, f in self.fired.items() if k[0] == name and k in self.sustain.episodes
        }
        rows: list[Row] = []
        done: set[int] = set()
        idx = np.flatnonzero(cand).tolist()
        peers_valid = self.smooth_until >= ctx.end - NS // 10 if idx else self.smooth_until
        for i in idx:
            x = int(s[i])
            row = self._judge(
                kind,
                x,
                (int(ts[i]), int(dt[i] * NS), int(n[i])),
                float(share[i]),
                (float(marks[i]), float(den[i])),
                float(own[i]) if trusted[i] else math.nan,
                peers_valid,
            )
            if row is not None:
                rows.append(row)
                done.add(x)
        for x, ek in tracked.items():  # alerting entities: still at their stay threshold?
            if x in done:
                continue
            at = np.flatnonzero(s == x)
            if len(at) == 0:
                continue
            # the smoothed share, two readings in a row: a burst after the
            # marking stopped does not keep its alert alive
            i, fired = int(at[0]), self.fired[ek]
            above = bool(self.smooth[x] >= fired.stay)
            if above and fired.above:
                rows.append(Row(ek, 0, int(ts[i]), (), int(dt[i] * NS / n[i]), int(dt[i] * NS)))
            fired.above = above
        if kind == NIC and any(r.level >= 1 for r in rows):
            cnp = lookup(cur.get(N_CNP), [(r.key[1], r.key[2]) for r in rows], "rate")
            rows = [
                r if r.level < 1 else replace(r, info=(*r.info, cnp.get((r.key[1], r.key[2]))))
                for r in rows
            ]
        busy = np.zeros(len(s), dtype=bool)
        if tracked:
            busy = np.isin(s, list(tracked))
        # a reading well above the entity's own normal waits to be learned (a NIC or queue
        # still learning learns every reading)
        hi = trusted & (share >= np.fmax(cfg.min_mark_share, SUSPECT * own))
        self._learn(s, np.stack([marks, den, dt], axis=1), hi, busy)
        return rows

    def _den(self, s: np.ndarray, ts: np.ndarray, kind: int) -> np.ndarray:
        """Each row's newest fresh packet rate: its own, else (a queue) its port's."""
        own = np.where(self.den_until[s] >= ts, self.den[s], np.nan)
        if kind != QUEUE:
            return own
        miss = np.flatnonzero(~np.isfinite(own))
        if len(miss) == 0:
            return own
        ps = self.port_slot[s[miss]]
        for j in np.flatnonzero(ps < 0).tolist():  # queues never matched to their port yet
            dev, port, _q = self.slots.keys[int(s[miss[j]])]
            p = self.slots.index.get((dev, port, ""), -1)
            self.port_slot[s[miss[j]]] = ps[j] = p
        ok = ps >= 0
        got = np.full(len(miss), np.nan)
        got[ok] = np.where(self.den_until[ps[ok]] >= ts[miss[ok]], self.den[ps[ok]], np.nan)
        own[miss] = got
        return own

    def _learn(self, s: np.ndarray, reading: np.ndarray, hi: np.ndarray, busy: np.ndarray) -> None:
        """Learn the readings (marks/s, packets/s, seconds) of entities not alerting. Readings
        well above the entity's own normal are held back while they last: learned once a
        reading below ends their run without an alert (bursts that ended), dropped if the
        entity alerts (a fault must not become its own baseline)."""
        pend = self.pending
        if pend:
            for x in s[busy].tolist():
                pend.pop(x, None)
            for x in s[~hi & ~busy].tolist():
                run = pend.pop(x, None)
                while run:  # oldest first: an EWMA's order matters
                    self._mean(np.array([x]), np.array([run.pop(0)]))
        for i in np.flatnonzero(hi & ~busy).tolist():
            run = pend.setdefault(int(s[i]), [])
            run.append(tuple(reading[i].tolist()))  # type: ignore[arg-type]
            if len(run) > PENDING_MAX:  # high for long, never alerting: its normal
                self._mean(np.array([s[i]]), np.array([run.pop(0)]))
        clean = ~hi & ~busy
        self._mean(s[clean], reading[clean])

    def _mean(self, s: np.ndarray, reading: np.ndarray) -> None:
        """The traffic-weighted mean share, each reading weighing the time it covers; a plain
        mean until ``baseline_tau_s`` has been learned, so a baseline forms in seconds."""
        if len(s) == 0:
            return
        marks, den, dt = reading[:, 0], reading[:, 1], reading[:, 2]
        w = np.minimum(dt, 60.0)
        learned = self.learned_s[s]
        a = np.maximum(w / (learned + w), -np.expm1(-w / self.config.baseline_tau_s))
        self.base_marks[s] += a * (marks - self.base_marks[s])
        self.base_pkts[s] += a * (den - self.base_pkts[s])
        self.learned_s[s] = learned + w
        self.samples[s] += 1

    def _judge(
        self,
        kind: int,
        s: int,
        when: tuple[int, int, int],
        share: float,
        rates: tuple[float, float],
        own: float,
        peers_valid: np.ndarray,
    ) -> Row | None:
        """Push one high reading into its entity's run; the Row when a rule holds long enough."""
        cfg = self.config
        ts, dt_ns, n = when  # the reading's time, interval, and how many the step summed
        key = self.slots.keys[s]
        ek: Key = ("queue", *key) if kind == QUEUE else ("nic", key[0], key[1])
        iv_ns = max(1, dt_ns // n)
        need = round(cfg.sustain_s * NS)
        run = self.runs.get(s)
        if run is None:
            run = self.runs[s] = Run()
        run.push(ts - dt_ns, ts, share, iv_ns, need + iv_ns)
        peers = peer_median(self.groups, s, self.smooth, peers_valid, cfg.min_peers)
        med = peers[0]
        if math.isfinite(med):
            rule = "peers"
            mine = cfg.normal_factor * own if math.isfinite(own) else cfg.new_mark_share
            thr = max(cfg.min_mark_share, cfg.peer_factor * med, mine)
        elif math.isfinite(own):
            rule, thr = "baseline", max(cfg.min_mark_share, cfg.baseline_factor * own)
        else:
            rule, thr = "", math.inf

        def standing(h: tuple[int, int, float]) -> bool:
            return h[1] >= 2 and h[0] >= need

        ab = run.held(cfg.absolute_mark_share)
        rel = run.held(thr) if rule else (0, 0, math.nan)
        if standing(ab):
            rule, h, stay = "absolute", ab, cfg.exit_ratio * cfg.absolute_mark_share
        elif standing(rel):
            h, stay = rel, cfg.exit_ratio * thr
        else:
            return None
        # stays while clearly above its own normal and its peers' (their smoothed shares): a
        # port back at its normal bursts is not still congested
        for level in (own, med):
            if math.isfinite(level):
                stay = max(stay, STAY_OVER * level)
        if ek not in self.fired:
            self.fired[ek] = _Fired(rule, stay, s)
        info = (rule, h[2], rates, h[0] / NS, h[1], dt_ns / NS, own, thr, peers)
        return Row(ek, 1, ts, info, iv_ns, h[0])

    # --- findings ----------------------------------------------------------------------------
    def _finding(self, key: Key, ep: Episode) -> Finding:
        cfg = self.config
        rule, low, (marks, pkts), held, readings, dt, own, thr, peers = ep.info[:9]
        med, npeers, scope = peers
        cnp = ep.info[9] if len(ep.info) > 9 else None
        if key[0] == "queue":
            _, dev, port, q = key
            labels = port_labels(self.topology, dev, port)
            labels["queue"] = q
            who = f"{dev}/{port} queue {q}"
            what = "packets sent"
        else:
            _, dev, port = key
            labels = node_labels(self.topology, dev, port)
            who = f"{dev}/{port}"
            what = f"packets received (~{cfg.packet_bytes:g} B each)"
        own_s = (
            f"own normal {own:.1%} of packets marked"
            if math.isfinite(own)
            else f"own normal not learned yet (then at least {cfg.new_mark_share:.0%})"
        )
        peers_s = (
            f"peers' median {med:.1%} ({npeers} {scope} peers)"
            if math.isfinite(med)
            else "too few peers reporting"
        )
        if rule == "absolute":
            thr_s = f"at least {cfg.absolute_mark_share:.0%} marked"
        elif rule == "peers":
            mine = (
                f"{cfg.normal_factor:g}x own normal"
                if math.isfinite(own)
                else f"{cfg.new_mark_share:.0%} without a learned normal"
            )
            thr_s = (
                f"at least {thr:.1%} marked (the largest of {cfg.min_mark_share:.0%}, "
                f"{cfg.peer_factor:g}x the peers' median, {mine})"
            )
        else:
            thr_s = (
                f"at least {thr:.1%} marked (the larger of {cfg.min_mark_share:.0%} and "
                f"{cfg.baseline_factor:g}x own normal)"
            )
        extra = f", {cnp:,.0f} CNPs sent/s" if cnp is not None else ""
        return Finding(
            ECN_CONGESTION,
            labels,
            ep.severity or "warning",
            ep.ts,
            summary=f"sustained ECN marking at {who}: {low:.0%} of packets or more",
            description=f"{who} marked at least {low:.1%} of its {what} in every reading for "
            f"{held:.1f} s while its peers did not ({peers_s}; {own_s}): standing congestion "
            "(incast or a slow receiver), not DCQCN's normal bursts.",
            evidence=f"{who}: rule={rule}; at least {low:.1%} of {what} ECN-marked in each of "
            f"{readings} readings over {held:.1f} s (latest: {marks:,.0f} marks/s of "
            f"{pkts:,.0f} packets/s over {dt:.2g} s{extra}); baseline: {own_s}; {peers_s}; "
            f"threshold {thr_s} for {cfg.sustain_s:g} s",
        )


def build(topology: Topology, config: EcnCongestionConfig | None = None) -> EcnCongestionDetector:
    return EcnCongestionDetector(topology, config or EcnCongestionConfig())


__all__ = ["EcnCongestionConfig", "EcnCongestionDetector", "build"]
