"""QueueBuildup: a standing egress queue, many times its own normal or near its buffer limit.

A queue that fills in bursts and drains between them is healthy, however deep the bursts (MoE
all-to-all, incast microbursts, DCQCN's sawtooth). A *standing* queue does not drain: every
reading over a window stays high, so the rules read the lowest occupancy of a run of readings,
never the mean or the peak. The readings are ``queue_depth_bytes`` (INT's per-interval mean
occupancy, ``int_queue_mean_bytes``, for queues only INT reports). Three rules:

- **baseline**: every reading of the run at least ``baseline_factor`` times the queue's own
  typical occupancy (the median of its readings over roughly ``baseline_tau_s``), at least
  ``min_fraction`` of the buffer, and above the level its own bursts seldom reach (below), for
  ``standing_s``. The baseline is trusted once learned for ``learn_s`` and ``learn_samples``
  readings. It learns nothing from a queue that is alerting, and a high reading waits for the
  next one: learned if the queue drained (a burst), dropped if not (the start of a run), so a
  fault never becomes its own baseline. A busy uplink's normal is high, so it is judged against
  that.
- **peers**: a queue that appears after its peers learned their normal (same switch role and
  rail, same kind of port: host-facing or fabric-facing, same queue; the whole role's where
  that group is too small) is judged likewise against their median typical occupancy.
- **absolute**: every reading for ``absolute_standing_s`` at or above ``warning_fraction`` of
  the buffer (``critical`` at ``critical_fraction``): no headroom left before PFC XOFF or drops,
  whatever the history. The buffer is the topology's ``buffer_bytes``, else
  ``default_buffer_bytes`` or the largest occupancy seen on that switch if larger.

Bursts and cadence: the queue gauges arrive every 0.1-10 s. At a slow cadence a reading is a
random instant, and a bursty queue's readings land in bursts now and then, independently. A
relative run therefore needs k readings (never fewer than 3), k such that the queue's own past
share of readings at the threshold lines up k times with odds under ``burst_odds``, and no
more than the detection time allows (``TTD_S``, or 3 readings at a slow cadence); bursts too
frequent for that raise the threshold to the level they seldom reach. Each queue's interval is
observed (the median of its last gaps); a run's span must reach ``standing_s`` and 0.8 interval
per reading; a reading more than 2.5 intervals after the previous one breaks it (the queue may
have drained unseen), a lost reading does not. Baselines weigh each reading by the time it
stands for, so they do not depend on the cadence.

A queue the receiver paused (``pfc_rx_pause_us`` on its priority; the queue's name is its
priority, as in SONiC's lossless queues) for ``receiver_pause_fraction`` of the time is held by a
slow receiver, not by its senders: the relative rules leave it to PFCStorm / Straggler; paused
``pause_exempt_fraction`` of the time it is full *because* it is paused and no rule fires.

An alert stays firing while two readings in a row stay at ``exit_ratio`` of the threshold it
fired on (``exit_fraction`` of the buffer for the absolute rule) and clears ``clear_s`` plus 2.5
intervals after that last held (``state.Sustain``): one fault, one alert, at any cadence. Its
severity is the one it fired with (``critical`` for a near-full queue); it is not raised later,
which would replace one alert by another. The evidence names the rule, the baseline and the
threshold.

A healthy step costs a few vectorised updates over its depth readings; thresholds follow the
baselines once a second; only queues above their threshold cost Python work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

import numpy as np

from detectors.base import Finding, StepContext, port_labels
from detectors.baseline import (
    MISSED,
    NS,
    Groups,
    Intervals,
    KeySlots,
    Run,
    Sketch,
    grow,
    queue_groups,
)
from detectors.state import Episode, Key, Row, Sustain, lookup
from detectors.windows import Step
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import QUEUE_BUILDUP
from rocewatch.core.state import Stateful
from rocewatch.core.topology import Topology

MIB = 2**20
DEPTH, INT_MEAN, PEAK, PAUSE = (
    "queue_depth_bytes",
    "int_queue_mean_bytes",
    "queue_peak_bytes",
    "pfc_rx_pause_us",
)
RULE_NONE, RULE_BASELINE, RULE_PEERS = 0, 1, 2
TTD_S = 10.0  # the time a relative rule may take to detect (or 3 readings, if longer)
PENDING_MAX = 256  # readings of one run held back at most
REFRESH_NS = NS  # thresholds follow the baselines once a second


@dataclass(frozen=True)
class QueueBuildupConfig:
    # relative rules: a healthy queue's readings stay within a small multiple of its typical
    # occupancy (bursts drain between readings); a standing queue sits many times above it
    baseline_factor: float = 3.0  # x the queue's own typical (median) occupancy
    peer_factor: float = 3.0  # x its peers' median typical occupancy (a queue new among them)
    # odds that a queue's own bursts, caught by some share of its readings, fill every reading
    # of a run by chance: sets how many readings a run needs
    burst_odds: float = 1e-7
    min_fraction: float = 0.12  # of the buffer: below it a queue has ample headroom anyway
    standing_s: float = 2.0  # every reading this long (longer than any collective's burst)
    receiver_pause_fraction: float = 0.15  # paused that much: a slow receiver, not congestion
    learn_s: float = 10.0  # seconds of readings before a queue's own baseline is trusted
    learn_samples: int = 4  # ... and at least this many readings
    baseline_tau_s: float = 600.0  # the baseline remembers about this much of the past
    min_peers: int = 3  # peers with a trusted baseline, for the peers rule
    # absolute rule: above 80% of the buffer a queue has almost no headroom before PFC XOFF or
    # drops, above 95% none; that needs no history, and less time to matter
    warning_fraction: float = 0.8
    critical_fraction: float = 0.95  # occupancy share of the buffer that makes it critical
    absolute_standing_s: float = 1.0  # every reading this long at the absolute limit
    pause_exempt_fraction: float = 0.5  # of the time paused: full because paused (PFCStorm)
    exit_ratio: float = 0.5  # of a relative threshold: the stay condition once firing
    exit_fraction: float = 0.6  # of the buffer: the absolute rule's stay condition
    clear_s: float = 1.0  # resolves this long (plus 2.5 sampling intervals) after it last held
    # for switches without buffer_bytes (null: not judged); 32 MiB sits between the 16 and
    # 64 MB of current RoCE switches: a guess off by 2x at most
    default_buffer_bytes: int | None = 32 * MIB
    max_entities: int = 10_000
    enabled: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        where = "detectors.queue_buildup"
        if not 0 < self.exit_fraction <= self.warning_fraction <= self.critical_fraction <= 1:
            raise ConfigError(
                f"{where}: need 0 < exit_fraction <= warning_fraction <= critical_fraction <= 1"
            )
        if not 0 < self.min_fraction <= self.warning_fraction:
            raise ConfigError(f"{where}.min_fraction: must be within (0, warning_fraction]")
        if self.baseline_factor <= 1 or self.peer_factor <= 1:
            raise ConfigError(f"{where}: baseline_factor and peer_factor must be > 1")
        if not 0 < self.burst_odds < 1:
            raise ConfigError(f"{where}.burst_odds: must be within (0, 1)")
        if not 0 < self.exit_ratio <= 1:
            raise ConfigError(f"{where}.exit_ratio: must be within (0, 1]")
        for name in ("standing_s", "absolute_standing_s", "baseline_tau_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{where}.{name}: must be > 0")
        if self.learn_s < 0 or self.clear_s < 0:
            raise ConfigError(f"{where}: learn_s and clear_s must be >= 0")
        if self.learn_samples < 2 or self.min_peers < 1:
            raise ConfigError(f"{where}: learn_samples must be >= 2, min_peers >= 1")
        if not 0 < self.receiver_pause_fraction <= self.pause_exempt_fraction <= 1:
            raise ConfigError(
                f"{where}: need 0 < receiver_pause_fraction <= pause_exempt_fraction <= 1"
            )
        if self.default_buffer_bytes is not None and self.default_buffer_bytes <= 0:
            raise ConfigError(f"{where}.default_buffer_bytes: must be > 0")
        if self.max_entities < 1:
            raise ConfigError(f"{where}.max_entities: must be >= 1")


@dataclass
class _Fired:
    """What a queue's alert needs beyond its episode: the rule and its stay threshold."""

    rule: str
    stay_bytes: float
    above: bool = True  # the previous reading was at the stay threshold


@dataclass
class QueueBuildupDetector(Stateful):
    topology: Topology
    config: QueueBuildupConfig = field(default_factory=QueueBuildupConfig)
    name: str = "queue_buildup"
    # the record types its state holds (rocewatch.core.state; the checkpoint codec reads no other)
    STATE_TYPES: ClassVar[tuple[type, ...]] = (
        Groups,
        Intervals,
        KeySlots,
        Run,
        Sketch,
        _Fired,
        Episode,
        Sustain,
        Finding,
    )
    # the metrics it reads from the window engine (steps carry no others to the detect stage)
    reads: ClassVar[frozenset[str]] = frozenset({DEPTH, INT_MEAN, PEAK, PAUSE})

    def __post_init__(self) -> None:
        c = self.config
        self.sustain = Sustain(
            min(c.standing_s, c.absolute_standing_s), 0.0, c.clear_s, c.max_entities
        )
        self.slots = KeySlots()
        self.iv = Intervals()
        # occupancy as a share of the queue's buffer (1e-5 .. 1): peers pooled alike whatever
        # their switches' buffers
        self.sketch = Sketch(lo=1e-5, decades=5.0, tau_s=c.baseline_tau_s)
        self.groups = Groups()
        self.switch_of: dict[str, int] = {}
        self.sw = np.zeros(0, dtype=np.int64)  # slot -> switch index
        self.sw_buffer = np.zeros(0)  # switch -> topology buffer (0: unknown)
        self.sw_seen = np.zeros(0)  # switch -> largest occupancy seen
        self.has_depth = np.zeros(0, dtype=bool)  # INT's mean is used only where no gauge is
        self.first_ts = np.zeros(0, dtype=np.int64)  # first reading
        self.peers_since: dict[int, int] = {}  # peer group -> when it had trusted members
        # the readings of a run above the freeze level, not learned yet: (share, seconds)
        self.pending: dict[int, list[tuple[float, float]]] = {}
        self.freeze = np.zeros(0)  # share of the buffer: readings in a run above it wait
        self.rel_thr = np.zeros(0)  # bytes; inf: no relative rule yet
        self.rel_k = np.zeros(0, dtype=np.int64)  # readings a relative run needs
        self.rel_rule = np.zeros(0, dtype=np.int8)
        self.base = np.zeros(0)  # bytes: the normal the relative threshold came from
        self.runs: dict[int, Run] = {}
        self.fired: dict[Key, _Fired] = {}
        self.paused: dict[tuple[str, str, str], tuple[float, int]] = {}  # share, valid until
        self.next_refresh = 0

    @property
    def window_s(self) -> float:
        """Reads only the newest step: the history it needs is its own."""
        return 0.0

    # --- per-slot state ----------------------------------------------------------------------
    def _grow(self) -> None:
        n, have = len(self.slots), len(self.sw)
        if n == have:
            return
        new = np.arange(have, n)
        idx = []
        for dev, _port, _q in self.slots.keys[have:]:
            i = self.switch_of.get(dev)
            if i is None:
                i = self.switch_of[dev] = len(self.switch_of)
                s = self.topology.switches.get(dev)
                self.sw_buffer = np.append(self.sw_buffer, float(s.buffer_bytes or 0) if s else 0)
                self.sw_seen = np.append(self.sw_seen, 0.0)
            idx.append(i)
        self.sw = np.concatenate([self.sw, np.array(idx, dtype=np.int64)])
        self.iv.grow(n)
        self.sketch.grow(n)
        self.has_depth = grow(self.has_depth, n, False)
        self.first_ts = grow(self.first_ts, n, 0)
        self.freeze = grow(self.freeze, n, math.inf)
        self.rel_thr = grow(self.rel_thr, n, math.inf)
        self.rel_k = grow(self.rel_k, n, 3)
        self.rel_rule = grow(self.rel_rule, n, RULE_NONE)
        self.base = grow(self.base, n, math.nan)
        self.groups.assign(new, self.slots.keys, lambda k: queue_groups(self.topology, k))
        self.next_refresh = 0  # new queues: thresholds for them at once

    def buffer(self, slots: np.ndarray) -> np.ndarray:
        """Each slot's buffer (bytes): the topology's, else the default or the largest
        occupancy seen on the switch, whichever is larger (NaN: unknown and no default)."""
        known = self.sw_buffer[self.sw[slots]]
        guess = np.maximum(self.config.default_buffer_bytes or 0, self.sw_seen[self.sw[slots]])
        if not self.config.default_buffer_bytes:
            guess = np.full(len(slots), np.nan)
        return np.where(known > 0, known, guess)

    def _refresh(self, now: int) -> None:
        """Each queue's relative threshold and the readings a run needs, from its learned
        normal (or its peers'), and how often its own past readings reached that threshold."""
        cfg = self.config
        n = len(self.slots)
        # once a second; a large fabric's baselines, which move over minutes, less often
        self.next_refresh = now + REFRESH_NS * max(1, n // 10_000)
        if n == 0:
            return
        all_ = np.arange(n)
        buf = self.buffer(all_)  # NaN where none: no relative rule
        # shares of the buffer until the end, then bytes
        typical = self.sketch.quantile(all_, 0.5)
        trusted = (
            (self.sketch.learned_s >= cfg.learn_s)
            & (self.sketch.samples >= cfg.learn_samples)
            & np.isfinite(typical)
            & np.isfinite(buf)
        )
        thr = np.where(trusted, np.fmax(cfg.min_fraction, cfg.baseline_factor * typical), np.inf)
        # readings in a run above it are not learned (a queue still learning learns them all)
        self.freeze = thr.copy()
        # a run needs enough readings k that bursts (the share f of past readings at the
        # threshold, taken as independent: at a slow cadence a reading is a random instant)
        # fill all k with odds under burst_odds. f is the largest of the queue's own and its
        # peer groups' (all the readings of a group pooled: a MoE job's queues burst alike, and
        # together show it many times sooner), and at least half a reading in all of them, so
        # a short history asks for more readings than a long calm one (two). k is at most what
        # the detection time allows (TTD_S, or 3 readings at a slow cadence); bursts too
        # frequent for that raise the threshold to the level they seldom reach, as far as the
        # history can tell (two readings above it at least).
        iv = np.where(self.iv.interval > 0, self.iv.interval, 1.0)
        k_max = np.maximum(3, np.floor(TTD_S / iv))
        bursts = _Bursts(
            self.sketch, (self.groups.fine[:n], self.groups.coarse[:n]), cfg.burst_odds
        )
        k = bursts.needed(all_, thr)
        over = np.flatnonzero(trusted & (k > k_max))
        if len(over):
            thr[over] = np.fmax(thr[over], bursts.seldom(over, k_max[over]))
            k[over] = bursts.needed(over, thr[over])
        k = np.clip(k, 2, k_max)
        rule = np.where(np.isfinite(thr), RULE_BASELINE, RULE_NONE).astype(np.int8)
        base = np.where(trusted, typical, np.nan)
        # queues without a normal of their own: their peers' (the median of trusted peers')
        # that appeared after those were trusted (one that started with them learns its own:
        # a busy port, high from the first reading, is at its normal)
        lone = np.flatnonzero(~trusted & np.isfinite(buf))
        if len(lone) and trusted.any():
            for ids in (self.groups.fine, self.groups.coarse):
                left = lone[rule[lone] == RULE_NONE]
                for g in np.unique(ids[left]).tolist():
                    m = self.groups.of(g)
                    m = m[trusted[m]]
                    if len(m) < cfg.min_peers:
                        continue
                    since = self.peers_since.setdefault(g, now)
                    later = left[(ids[left] == g) & (self.first_ts[left] > since)]
                    if len(later) == 0:
                        continue
                    med = float(np.median(typical[m]))
                    who = later
                    thr[who] = np.fmax(cfg.min_fraction, cfg.peer_factor * med)
                    rule[who], base[who] = RULE_PEERS, med
                    k[who] = np.minimum(np.median(k[m]), k_max[who])  # as their bursts need
                    # readings far above the peers are not learned: a queue that appears
                    # standing does not make that its normal
                    self.freeze[who] = thr[who]
        self.rel_thr, self.rel_rule = np.where(np.isfinite(thr), thr * buf, np.inf), rule
        self.base = base * buf
        self.rel_k = k.astype(np.int64)

    # --- per step ----------------------------------------------------------------------------
    def evaluate(self, ctx: StepContext) -> list[Finding]:
        cur = ctx.engine.current()
        rows = self._rows(cur, ctx) if cur is not None else []
        if not rows and not self.sustain.episodes:
            return []
        fired = self.sustain.update(ctx.start, ctx.end, rows)
        for k in [k for k in self.fired if k not in self.sustain.episodes]:
            del self.fired[k]  # cleared: a later episode starts afresh
        return [self._finding(k, ep) for k, ep in fired]

    def _readings(self, cur: Step) -> tuple[np.ndarray, ...] | None:
        """(slot, ts, lowest, latest, count) of this step's occupancy readings."""
        parts = []
        depth = cur.get(DEPTH)
        if depth.height:
            s = self.slots.rows_at(cur, DEPTH, depth)
            self._grow()
            self.has_depth[s] = True
            parts.append((s, depth))
        mean = cur.get(INT_MEAN)
        if mean.height:
            s = self.slots.rows_at(cur, INT_MEAN, mean)
            self._grow()
            keep = ~self.has_depth[s]
            if keep.any():
                parts.append((s[keep], mean.filter(keep) if not keep.all() else mean))
        if not parts:
            return None
        slot = np.concatenate([p[0] for p in parts])
        ts = np.concatenate([p[1]["ts"].to_numpy() for p in parts]).astype(np.int64)
        low = np.concatenate([p[1]["min"].to_numpy() for p in parts]).astype(np.float64)
        last = np.concatenate([p[1]["last"].to_numpy() for p in parts]).astype(np.float64)
        high = np.concatenate([p[1]["max"].to_numpy() for p in parts]).astype(np.float64)
        n = np.concatenate([p[1]["n"].to_numpy() for p in parts]).astype(np.int64)
        ok = np.isfinite(low) & np.isfinite(last) & (low >= 0)
        if not ok.all():  # bad readings are skipped
            slot, ts, n = slot[ok], ts[ok], n[ok]
            low, last, high = low[ok], last[ok], high[ok]
        # the buffer is at least what a queue of the switch ever held (peaks included)
        np.maximum.at(self.sw_seen, self.sw[slot], np.nan_to_num(high))
        peak = cur.get(PEAK)
        if peak.height:
            ps = self.slots.rows_at(cur, PEAK, peak)
            self._grow()
            np.maximum.at(self.sw_seen, self.sw[ps], np.nan_to_num(peak["max"].to_numpy()))
        return slot, ts, low, last, n

    def _pause(self, cur: Step) -> None:
        """Remember the queues paused by their receiver for a large share of the time."""
        f = cur.get(PAUSE)
        if f.height == 0:
            return
        dt = f["dt"].to_numpy()
        with np.errstate(divide="ignore", invalid="ignore"):
            share = f["delta"].to_numpy() / (dt * 1e6)
        hot = np.flatnonzero(share >= self.config.receiver_pause_fraction)
        for i in hot.tolist():
            key = (f["device"][i], f["port"][i], f["qual"][i])
            self.paused[key] = (float(share[i]), int(f["ts"][i]) + round(MISSED * dt[i] * NS))
        if self.paused:  # a few queues: those paused lately, until a reading says otherwise
            now = int(f["ts"].max())  # type: ignore[arg-type]
            found = lookup(f, list(self.paused), "rate")
            for k in list(self.paused):
                r = found.get(k)
                if (r is not None and r / 1e6 < self.config.receiver_pause_fraction) or (
                    self.paused[k][1] < now
                ):
                    del self.paused[k]

    def _rows(self, cur: Step, ctx: StepContext) -> list[Row]:
        cfg = self.config
        self._pause(cur)
        got = self._readings(cur)
        if got is None:
            return []
        slot, ts, low, last, n = got
        gap = self.iv.update(slot, ts, n)
        self.first_ts[slot] = np.where(self.first_ts[slot] > 0, self.first_ts[slot], ts)
        if ctx.end >= self.next_refresh:
            self._refresh(ctx.end)
        buf = self.buffer(slot)
        warn = cfg.warning_fraction * buf
        cand = (low >= np.fmin(self.rel_thr[slot], warn)) & np.isfinite(buf)
        # runs end where a reading fell below every threshold
        out = slot[~cand]
        if self.runs:
            ended = np.zeros(len(self.slots), dtype=bool)
            ended[out] = True
            for s in [s for s in self.runs if ended[s]]:
                del self.runs[s]
        tracked = {(k[1], k[2], k[3]): k for k in self.sustain.episodes}
        rows: list[Row] = []
        done: set[int] = set()
        for i in np.flatnonzero(cand).tolist():
            row = self._judge(int(slot[i]), int(ts[i]), float(low[i]), float(buf[i]), tracked)
            if row is not None:
                rows.append(row)
                done.add(int(slot[i]))
        # queues alerting: still at their stay threshold?
        for key, ek in tracked.items():
            s = self.slots.index.get(key, -1)
            if s < 0 or s in done or ek not in self.fired:
                continue
            at = np.flatnonzero(slot == s)
            if len(at) == 0:
                continue
            # two readings in a row at the stay threshold: a burst after the queue drained
            # does not keep its alert alive
            fired, above = self.fired[ek], bool(last[at[0]] >= self.fired[ek].stay_bytes)
            if above and fired.above:
                rows.append(Row(ek, 0, int(ts[int(at[0])]), (), self._iv_ns(s)))
            fired.above = above
        iv = self.iv.interval[slot]
        w = np.where(np.isfinite(gap), np.minimum(gap, np.where(iv > 0, MISSED * iv, gap)), 0.1)
        busy = ~np.isfinite(buf)  # no buffer: nothing to learn for
        # nor from queues alerting, or held by their receiver (a storm's victims, a slow NIC):
        # their depth says how long they were paused, not how they carry traffic
        held = [k for k, (_, until) in self.paused.items() if until >= int(ts.min())]
        keys = [k for k in (*tracked, *held) if k in self.slots.index]
        if keys:
            busy |= np.isin(slot, [self.slots.index[k] for k in keys])
        self._learn(slot, last / buf, w, busy, int(ts.max()))
        return rows

    def _learn(
        self, slot: np.ndarray, value: np.ndarray, w: np.ndarray, busy: np.ndarray, ts: int
    ) -> None:
        """Learn the readings (shares of the buffer) of queues not alerting. Readings above the
        freeze level are held back while they last: learned once a reading below ends their run
        without an alert (bursts, however long, that drained), dropped if the queue alerts (a
        fault must not become its own baseline). The burst statistics need them all: bursts
        that come in pairs line up more often than single ones."""
        hi = value >= self.freeze[slot]
        pend = self.pending
        if pend:
            for s in slot[busy].tolist():
                pend.pop(s, None)
            for s in slot[~hi & ~busy].tolist():
                run = pend.pop(s, None)
                if run:
                    v, wt = zip(*run, strict=True)
                    slots = np.full(len(run), s)
                    self.sketch.add(slots, np.array(v), np.array(wt), ts, distinct=False)
        for i in np.flatnonzero(hi & ~busy).tolist():
            run = pend.setdefault(int(slot[i]), [])
            run.append((float(value[i]), float(w[i])))
            if len(run) > PENDING_MAX:  # high for long, never alerting: its normal
                v0, w0 = run.pop(0)
                self.sketch.add(np.array([slot[i]]), np.array([v0]), np.array([w0]), ts)
        clean = ~hi & ~busy
        self.sketch.add(slot[clean], value[clean], w[clean], ts)

    def _iv_ns(self, s: int) -> int:
        return round(self.iv.interval[s] * NS)

    def _judge(
        self, s: int, ts: int, low: float, buf: float, tracked: dict[tuple[str, str, str], Key]
    ) -> Row | None:
        """Push one high reading into its queue's run; the Row when a rule holds long enough."""
        cfg = self.config
        key = self.slots.keys[s]
        ek: Key = ("queue", *key)
        iv = float(self.iv.interval[s])
        iv_ns = round(iv * NS)
        # a reading may come a tenth of an interval early or late: spans allow a fifth less
        k = int(self.rel_k[s])
        need_rel = round(max(cfg.standing_s, 0.8 * (k - 1) * iv) * NS)
        need_abs = round(max(cfg.absolute_standing_s, 0.8 * iv) * NS)
        run = self.runs.get(s)
        if run is None:
            run = self.runs[s] = Run()
        run.push(ts, ts, low, iv_ns, max(need_rel, need_abs), max(k, 2))
        p = self.paused.get(key)
        paused = p[0] if p is not None and p[1] >= ts else 0.0
        absolute = paused < cfg.pause_exempt_fraction
        relative = paused < cfg.receiver_pause_fraction and self.rel_rule[s] != RULE_NONE
        firing = ek in tracked and self.sustain.episodes[ek].ts != 0
        crit = run.held(cfg.critical_fraction * buf) if absolute else (0, 0, math.nan)
        warn = run.held(cfg.warning_fraction * buf) if absolute else (0, 0, math.nan)
        rel = run.held(float(self.rel_thr[s])) if relative else (0, 0, math.nan)

        def standing(h: tuple[int, int, float], need: int, readings: int) -> bool:
            return h[1] >= readings and h[0] >= need

        if standing(crit, need_abs, 2):
            level, rule, h, stay = 2, "absolute", crit, cfg.exit_fraction * buf
        elif standing(warn, need_abs, 2):
            level, rule, h, stay = 1, "absolute", warn, cfg.exit_fraction * buf
        elif standing(rel, need_rel, k):
            rule = "baseline" if self.rel_rule[s] == RULE_BASELINE else "peers"
            level, h, stay = 1, rel, cfg.exit_ratio * float(self.rel_thr[s])
        else:
            return None
        if firing:
            ep = self.sustain.episodes[ek]
            if ep.severity != "critical":
                level = 1  # the alert keeps the severity it fired with (see the docstring)
        elif level == 1 and crit[1] >= 1:
            return None  # a run at the critical level under way: one alert, at its severity
        if ek not in self.fired:
            self.fired[ek] = _Fired(rule, stay)
        need = need_abs if rule == "absolute" else need_rel
        info = self._info(s, rule, h, need, paused, buf)
        return Row(ek, level, ts, info, iv_ns, h[0])

    def _info(
        self, s: int, rule: str, h: tuple[int, int, float], need: int, paused: float, buf: float
    ) -> _Info:
        return _Info(
            rule,
            h[2],
            h[0] / NS,
            h[1],
            need / NS,
            buf,
            bool(self.sw_buffer[self.sw[s]] > 0),
            int(self.rel_rule[s]),
            float(self.base[s]),
            float(self.rel_thr[s]),
            paused,
            float(self.iv.interval[s]),
        )

    def _finding(self, key: Key, ep: Episode) -> Finding:
        cfg = self.config
        _, dev, port, q = key
        i = ep.info
        assert isinstance(i, _Info)
        labels = port_labels(self.topology, dev, port)
        labels["queue"] = q
        who = f"{dev}/{port} queue {q}"

        def mib(x: float) -> str:
            return "n/a" if not math.isfinite(x) else f"{x / MIB:.1f} MiB"

        buf = i.buffer
        buf_s = mib(buf) + ("" if i.sized else " (assumed: no buffer_bytes in the topology)")
        if i.base_rule == RULE_BASELINE:
            base_s = f"own typical occupancy (median) {mib(i.base)}"
        elif i.base_rule == RULE_PEERS:
            base_s = f"peers' median typical occupancy {mib(i.base)} (own not learned yet)"
        else:
            base_s = "none learned yet"
        if i.rule == "absolute":
            mark = cfg.critical_fraction if ep.severity == "critical" else cfg.warning_fraction
            why = f"at least {mark:.0%} of the buffer"
        else:
            factor = cfg.baseline_factor if i.rule == "baseline" else cfg.peer_factor
            whose = "its own" if i.rule == "baseline" else "the peers'"
            why = (
                f"at least {mib(i.threshold)} (the larger of {factor:g}x {whose} typical "
                f"occupancy, {cfg.min_fraction:.0%} of the buffer, and the level its own bursts "
                "seldom reach)"
            )
        return Finding(
            QUEUE_BUILDUP,
            labels,
            ep.severity,
            ep.ts,
            summary=f"standing queue at {who}: {i.low / buf:.0%} of its buffer",
            description=f"{who} did not drain: all its {i.readings} readings over {i.held:.1f} s "
            f"held at least {mib(i.low)} ({i.low / buf:.0%} of its {mib(buf)} buffer), {why}, "
            "without being paused by its receiver: incast or standing congestion.",
            evidence=f"{who}: rule={i.rule}; occupancy {i.low / buf:.1%} of {buf_s} (lowest of "
            f"{i.readings} readings over {i.held:.1f} s); baseline: {base_s}; threshold {why} "
            f"in every reading for {i.need:.1f} s; received pause {i.paused:.0%} of the time; "
            f"readings every {i.interval:.2g} s",
        )


class _Bursts:
    """How often queues' readings reached a level: each queue's own, and its peer groups'
    (fine and coarse: all their readings pooled). Histograms as tails (the readings at or above
    each bin), so a share above a level is one lookup per queue."""

    def __init__(self, sketch: Sketch, groups: tuple[np.ndarray, ...], odds: float) -> None:
        self.sketch, self.odds = sketch, odds
        self.lower = np.r_[0.0, sketch.upper[:-1]]
        counts = sketch.counts(np.arange(len(groups[0])))
        self.own = np.cumsum(counts[:, ::-1], axis=1)[:, ::-1]  # readings at or above each bin
        self.pools: list[tuple[np.ndarray, np.ndarray]] = []  # (group of each queue, tails)
        for group in groups:
            g = np.maximum(group, 0)
            order = np.argsort(g, kind="stable")
            gs = g[order]
            starts = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1]]) if len(gs) else gs
            pool = np.zeros((int(g.max(initial=0)) + 1, sketch.bins))
            if len(gs):
                pool[gs[starts]] = np.add.reduceat(counts[order], starts, axis=0)
            self.pools.append((g, np.cumsum(pool[:, ::-1], axis=1)[:, ::-1]))

    def _bin(self, level: np.ndarray) -> np.ndarray:
        """The first bin wholly at or above ``level`` (``bins``: none)."""
        return np.searchsorted(self.lower, level, side="left")

    @staticmethod
    def _share(tails: np.ndarray, rows: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, ...]:
        total = tails[rows, 0]
        above = np.where(b < tails.shape[1], tails[rows, np.minimum(b, tails.shape[1] - 1)], 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(total > 0, above / total, 0.0), total

    def needed(self, slots: np.ndarray, level: np.ndarray) -> np.ndarray:
        """Readings in a row that bursts reach ``level`` with odds under ``odds``."""
        b = self._bin(level)
        f, most = self._share(self.own, slots, b)
        for g, tails in self.pools:
            fg, seen = self._share(tails, g[slots], b)
            f, most = np.maximum(f, fg), np.maximum(most, seen)
        f = np.minimum(np.maximum(f, 0.5 / (most + 1)), 1 - 1e-9)
        return np.maximum(np.ceil(math.log(self.odds) / np.log(f)), 2)

    def seldom(self, slots: np.ndarray, k: np.ndarray) -> np.ndarray:
        """The level that bursts reach in k readings in a row with odds under ``odds``: the
        highest of the queue's own and its groups', each as far as its readings can tell (at
        least two readings above it)."""
        q = 1.0 - self.odds ** (1.0 / k)
        out = np.full(len(slots), np.nan)
        for tails in (self.own[slots], *(t[g[slots]] for g, t in self.pools)):
            total = tails[:, 0]
            # the first bin whose readings at or above it are at most the share 1 - q, and at
            # least two readings (the level history can vouch for)
            allowed = np.maximum((1.0 - q) * total, 2.0)
            ok = tails <= allowed[:, None]
            k_bin = np.where(ok.any(axis=1), np.argmax(ok, axis=1), len(self.lower))
            level = np.where(
                k_bin < len(self.lower),
                self.lower[np.minimum(k_bin, len(self.lower) - 1)],
                self.sketch.upper[-1],
            )
            level = np.where(total > 0, level, np.nan)
            out = np.fmax(out, level)
        return out


class _Info(NamedTuple):
    """What an alert says, as of the reading that made it fire."""

    rule: str
    low: float  # bytes: the lowest reading of the run
    held: float  # seconds
    readings: int
    need: float  # seconds the rule asked for
    buffer: float
    sized: bool  # the buffer comes from the topology
    base_rule: int
    base: float  # bytes: the typical occupancy the relative threshold came from
    threshold: float
    paused: float
    interval: float


def build(topology: Topology, config: QueueBuildupConfig | None = None) -> QueueBuildupDetector:
    return QueueBuildupDetector(topology, config or QueueBuildupConfig())


__all__ = ["QueueBuildupConfig", "QueueBuildupDetector", "build"]


# its per-port info records are defined after the detector
QueueBuildupDetector.STATE_TYPES = (*QueueBuildupDetector.STATE_TYPES, _Info)
