"""TransportErrors: RoCE retransmissions and sequence errors on a NIC, beyond its baseline.

Two signals per NIC (``/sys/class/infiniband/<nic>/ports/<p>/hw_counters``), each judged on
the NIC's own samples, at whatever interval the agent reads them:

- ``out_of_sequence`` has a healthy baseline (adaptive routing reorders packets). A sample's
  rate is *hot* at ``oos_factor`` times the larger of the NIC's own baseline (an EWMA with time
  constant ``baseline_tau_s``, each sample weighted by the time it covers, frozen while the NIC
  is suspect so a fault never becomes its own baseline) and the fabric's (an EWMA of the median
  of every NIC's latest rate, taken every ``baseline_every_s``), and at least ``oos_min_pps``.
  A NIC with less than ``baseline_min_s`` (and ``baseline_min_samples`` samples) of history of
  its own is judged on the errors below alone.
- ``packet_seq_err``, ``local_ack_timeout_err``, ``rnr_nak_retry_err`` and
  ``implied_nak_seq_err`` should be ~0: each is a retransmission (go-back-N) or a timeout, and
  a lossless fabric loses a frame only to a bit error that FEC could not correct. Two rules:

  - **rate**: their summed rate is hot at ``error_min_rate`` per second, counted over two
    seconds (two samples, if the NIC is read less often);
  - **baseline**: the errors counted over the last ``evidence_window_s`` (at least two of the
    NIC's intervals) are at least ``min_errors``, ``error_factor`` times the NIC's baseline
    rate, and too many for that baseline by chance (Poisson tail at most ``error_p_value``).
    A mild fault (one or two retransmissions a second against a baseline of one a minute) is
    found by its count long before its rate would reach ``error_min_rate``, and a stray error
    or two is never enough. The baseline is the NIC's own errors per second of its history
    (counts and time decayed with ``error_tau_s``, learned only from samples that left the
    window while the NIC was not suspect), with ``error_prior_s`` seconds of its rail peers'
    pooled rate as prior (a NIC with a short history is judged as its peers are), and never
    below ``error_floor_rate``.

  Both count in bins of a second (or of a sample, if longer), no bin for more than the next
  largest, and need errors in two samples spread over ``sustain_s``: one loss's burst, or a
  flap's, is one moment, not a rate. Only NICs that had an error lately keep their samples (a
  few).

Every rule holds two samples (``out_of_sequence``: two hot samples in a row), so a NIC fires
at its first hot row once the condition held ``sustain_s`` (``Sustain``: dips of ``gap_s``
tolerated, plus one missed sample and jitter at the NIC's own sampling interval; a sample read
back as cold is a dip): a NIC read every 5 s fires on its second hot sample. Once firing it
stays while the errors' plain rate over the last ``window_s`` is at least ``exit_ratio`` of
``error_min_rate``, or while the errors counted over the time the fault's own rate (as it
fired) takes for three times ``min_errors`` are likelier at that rate than at the baseline, or
``out_of_sequence`` is at ``exit_ratio`` of its threshold; it clears ``clear_s`` after that
last held (plus two and a half sampling intervals while no sample says otherwise). A cleared
alert's errors are dropped: neither evidence for a new alert nor learned. A counter reset
yields a small delta, never a spike (detectors/rates.py), and an agent gap one sample over the
gap, so neither can fire.

A healthy step costs one vectorised update of the baselines (NumPy over entity slots) and a
filter per error counter.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import polars as pl

from detectors.base import Finding, StepContext, node_labels
from detectors.state import (
    COLD,
    NS,
    EntitySlots,
    Episode,
    Key,
    Row,
    Sustain,
    counter_timing,
)
from detectors.windows import Step
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import TRANSPORT_ERRORS
from rocewatch.core.state import Stateful
from rocewatch.core.topology import Topology

OOS = "nic_out_of_sequence"
ERRORS = (
    ("nic_packet_seq_err", "NAK sequence errors"),
    ("nic_local_ack_timeout", "local ACK timeouts"),
    ("nic_rnr_nak_retry_err", "RNR NAK retries exceeded"),
    ("nic_implied_nak_seq_err", "implied NAK sequence errors"),
)
# a NIC's latest reading counts (for the fabric median, or as its current out_of_sequence
# rate between its samples) until this many of its intervals passed without a new one
STALE_INTERVALS = 2.5
# of the stay threshold: a NIC whose error rate reaches this has every sample followed
FOLLOW = 0.5
PRUNE_S = 0.5  # how often samples that left every window are dropped (and learned)


@dataclass(frozen=True)
class TransportErrorsConfig:
    # adaptive routing reorders in bursts of up to ~10x a NIC's usual rate while paths
    # rebalance; a lossy path reorders everything behind each lost packet until go-back-N
    # resends it, 100x and more: out_of_sequence alone needs 30x
    oos_factor: float = 30.0
    oos_min_pps: float = 200.0
    # every retransmission or ACK timeout stalls a queue pair; a few per second, sustained, is
    # a fault (healthy NICs see one every few minutes)
    error_min_rate: float = 5.0
    window_s: float = 1.0  # errors are counted over this (and at least the newest sample)
    # the baseline rule: errors counted over this window (and at least two of the NIC's
    # intervals), short enough to decide within the 10 s a fault may take to be found
    evidence_window_s: float = 8.0
    min_errors: int = 5  # several events: one stray error (or a burst of one loss) is no rate
    error_factor: float = 3.0  # times the baseline rate (errors are burstier than Poisson)
    # chance of that many errors from a healthy NIC at its baseline: about one per million
    # windows, so a 1,000-NIC fabric judged every 8 s sees one false count in months
    error_p_value: float = 1e-6
    # no healthy lossless fabric retransmits more than about once a minute per NIC (a link at
    # the operators' post-FEC BER limit, 1e-12, loses a frame every few seconds at 400G:
    # FlakyLink's case): the baseline is never taken below that
    error_floor_rate: float = 1.0 / 60.0
    error_tau_s: float = 600.0  # a NIC's error baseline forgets on this time constant
    error_prior_s: float = 60.0  # its rail peers' pooled rate counts as this much history
    exit_ratio: float = 0.5  # of a threshold: the stay condition once firing
    sustain_s: float = 2.0
    gap_s: float = 0.1
    clear_s: float = 0.5
    baseline_tau_s: float = 60.0
    baseline_every_s: float = 1.0  # how often the fabric median is taken
    baseline_min_s: float = 10.0  # history a NIC needs before its own baseline judges it
    baseline_min_samples: int = 3  # ... and samples
    baseline_forget_s: float = 3600.0  # a NIC unseen this long loses its baseline
    max_entities: int = 10_000
    enabled: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        where = "detectors.transport_errors"
        if self.oos_factor < 1 or self.oos_min_pps < 0 or self.error_min_rate <= 0:
            raise ConfigError(
                f"{where}: oos_factor must be >= 1, oos_min_pps >= 0, error_min_rate > 0"
            )
        if not 0 < self.exit_ratio <= 1:
            raise ConfigError(f"{where}.exit_ratio: must be within (0, 1]")
        if self.window_s <= 0 or self.sustain_s <= 0 or self.gap_s < 0 or self.clear_s < 0:
            raise ConfigError(f"{where}: window_s, sustain_s must be > 0; gap_s, clear_s >= 0")
        if self.baseline_tau_s <= 0 or self.baseline_every_s <= 0 or self.baseline_forget_s <= 0:
            raise ConfigError(f"{where}: baseline times must be > 0")
        if self.baseline_min_s < 0 or self.baseline_min_samples < 0 or self.max_entities < 1:
            raise ConfigError(
                f"{where}: baseline_min_s, baseline_min_samples >= 0, max_entities >= 1"
            )
        if self.evidence_window_s <= 0 or self.min_errors < 1 or self.error_factor < 1:
            raise ConfigError(
                f"{where}: evidence_window_s must be > 0, min_errors >= 1, error_factor >= 1"
            )
        if not 0 < self.error_p_value < 1 or self.error_floor_rate <= 0:
            raise ConfigError(f"{where}: error_p_value must be within (0, 1), error_floor_rate > 0")
        if self.error_tau_s <= 0 or self.error_prior_s < 0:
            raise ConfigError(f"{where}: error_tau_s must be > 0, error_prior_s >= 0")


class _Errors:
    """One NIC's recent error-counter samples: per counter, (ts, delta, dt) newest last, with
    their running sums (so a step costs what it adds and drops, not what is kept)."""

    __slots__ = ("samples", "sum_d", "sum_t")

    def __init__(self) -> None:
        self.samples: list[deque[tuple[int, float, float]]] = [deque() for _ in ERRORS]
        self.sum_d = [0.0] * len(ERRORS)
        self.sum_t = [0.0] * len(ERRORS)

    def add(self, i: int, ts: int, delta: float, dt: float) -> None:
        self.samples[i].append((ts, delta, dt))
        self.sum_d[i] += delta
        self.sum_t[i] += dt

    def rates(self, window_s: float, end: int) -> list[float]:
        """Each counter's rate over its samples of the last ``window_s`` (at least its newest
        one), taken over at least ``window_s`` (a NIC not followed keeps only its samples with
        errors: one stray error is not a rate)."""
        since = end - round(window_s * NS)
        out = []
        for d in self.samples:
            x = t = 0.0
            for k, (ts, delta, dt) in enumerate(reversed(d)):
                if k and ts <= since:
                    break
                x += delta
                t += dt
            out.append(x / max(window_s, t))
        return out

    def evidence(self, window_s: float, end: int, bin_s: float) -> tuple[float, float, int, float]:
        """The errors of every counter counted in samples of the last ``window_s``: (count,
        the seconds those samples reach back over, at least ``window_s``; the samples with
        errors; the seconds from the start of the first of those to the last). No ``bin_s``
        of samples counts for more than the next largest: a sustained rate spreads its errors
        over time, one moment's burst (a single loss, a flap) does not, and is not a rate."""
        since = end - round(window_s * NS)
        first, last, width = end, 0, max(1, round(bin_s * NS))
        per: dict[int, float] = {}
        samples = set()
        for d in self.samples:
            for ts, delta, dt in reversed(d):
                if ts <= since:
                    break
                if delta > 0:
                    per[ts // width] = per.get(ts // width, 0.0) + delta
                    samples.add(ts)
                    first = min(first, ts - round(dt * NS))
                    last = max(last, ts)
        top = sorted(per.values(), reverse=True)[:2]
        count = sum(per.values()) - (top[0] - top[1] if len(top) > 1 else top[0] if top else 0.0)
        spread = max(0.0, (last - first) / NS)
        return count, max(window_s, (end - first) / NS), len(samples), spread

    def span(self) -> float:
        """The longest time (s) a counter's kept samples cover."""
        return max(self.sum_t)

    def prune(self, horizon: int, stale: int) -> tuple[bool, float]:
        """Keep each counter's samples newer than ``horizon`` and its newest one unless older
        than ``stale``; return whether any error is left to follow, and the errors dropped."""
        dropped = 0.0
        for i, d in enumerate(self.samples):
            while d and (d[0][0] <= horizon and len(d) > 1):
                _, x, t = d.popleft()
                self.sum_d[i] -= x
                self.sum_t[i] -= t
                dropped += x
            if d and d[-1][0] < stale:
                dropped += sum(x for _, x, _ in d)
                d.clear()
            if not d:
                self.sum_d[i] = self.sum_t[i] = 0.0
        return any(x >= 0.5 for x in self.sum_d), dropped

    def __getstate__(self) -> tuple[object, ...]:
        return (self.samples, self.sum_d, self.sum_t)

    def __setstate__(self, state: tuple[object, ...]) -> None:
        self.samples, self.sum_d, self.sum_t = state  # type: ignore[assignment]


def poisson_tail(count: float, mean: float) -> float:
    """P(X >= count) for X ~ Poisson(mean): how likely that many errors are by chance.

    >>> round(poisson_tail(5, 0.2), 8), poisson_tail(0, 3.0), poisson_tail(3, 0.0)
    (2.26e-06, 1.0, 0.0)
    """
    c = math.ceil(count)
    if c <= 0:
        return 1.0
    if mean <= 0:
        return 0.0
    if mean >= c:
        return 1.0  # at least as likely as not: never evidence (only compared with small p)
    term = math.exp(-mean + c * math.log(mean) - math.lgamma(c + 1))
    total, k = term, c
    while term > total * 1e-12 and k < c + 10_000:  # terms fall at least by mean / k < 1
        k += 1
        term *= mean / k
        total += term
    return min(1.0, total)


@dataclass
class TransportErrorsDetector(Stateful):
    topology: Topology
    config: TransportErrorsConfig = field(default_factory=TransportErrorsConfig)
    name: str = "transport_errors"
    # the record types its state holds (rocewatch.core.state; the checkpoint codec reads no other)
    STATE_TYPES: ClassVar[tuple[type, ...]] = (EntitySlots, Episode, Sustain, _Errors, Finding)
    # the metrics it reads from the window engine (steps carry no others to the detect stage)
    reads: ClassVar[frozenset[str]] = frozenset({OOS, *(m for m, _ in ERRORS)})

    def __post_init__(self) -> None:
        c = self.config
        # every rule needs two samples (one NIC sample read every few seconds averages a burst,
        # an MoE all-to-all's reordering, over its whole interval): out_of_sequence two hot
        # samples in a row (``oos_streak``), the error rules errors in two bins of samples
        self.sustain = Sustain(c.sustain_s, c.gap_s, c.clear_s, c.max_entities)
        self.fabric_oos: float | None = None  # EWMA of the fabric's median out_of_sequence rate
        self.next_baseline = 0
        self.next_forget = 0
        self.next_prune = 0
        # per NIC slot: its out_of_sequence baseline and latest reading
        self.slots = EntitySlots()
        self.ewma = np.empty(0)  # nan: none yet
        self.learned_s = np.empty(0)  # seconds of history in the baseline
        self.learned_n = np.empty(0, dtype=np.int64)
        self.seen = np.empty(0, dtype=np.int64)  # newest reading's time
        self.last_rate = np.empty(0)  # newest reading's rate
        self.interval = np.empty(0)  # sampling interval (s), smoothed
        self.oos_streak = np.empty(0, dtype=np.int64)  # hot out_of_sequence samples in a row
        # the NICs with errors lately, and their samples (``following``: the same, by slot)
        self.errors: dict[tuple[str, str], _Errors] = {}
        self.following = np.empty(0, dtype=bool)
        # per NIC slot: its error baseline, errors and seconds of history (both decayed), and
        # its rail (-1: none); per rail (the last: NICs in none), the pooled rate
        self.err_count = np.empty(0)
        self.err_time = np.empty(0)
        self.rail = np.empty(0, dtype=np.int64)
        self.pooled = np.zeros(1)

    @property
    def window_s(self) -> float:
        """Reads only the newest step: the windows it needs are its own."""
        return 0.0

    def evaluate(self, ctx: StepContext) -> list[Finding]:
        cur = ctx.engine.current()
        rows: list[Row] = []
        if cur is not None:
            fresh = self._errors(cur, ctx.end)
            rows = self._rows(cur, ctx.end, fresh)
            if ctx.end >= self.next_baseline:
                self._fabric(ctx.end)
        if not rows and not self.sustain.episodes:
            return []
        before = {k for k, ep in self.sustain.episodes.items() if ep.ts}
        firing = self.sustain.update(ctx.start, ctx.end, rows)
        for k in before - {k for k, _ in firing}:
            # an alert that cleared: its errors were the fault's, neither evidence for a new
            # alert (the window still holds them) nor anything its baseline should learn
            key = (k[1], k[2])
            if self.errors.pop(key, None) is not None:
                self.following[self.slots.index[key]] = False
        return [self._finding(k, ep) for k, ep in firing]

    # --- the error counters ----------------------------------------------------------------------
    def _errors(self, cur: Step, end: int) -> dict[tuple[str, str], tuple[int, int, int]]:
        """Add this step's error samples of the NICs with errors (and of those followed);
        return, per NIC with a new sample, (newest ts, sample interval, span) in ns."""
        cfg = self.config
        fresh: dict[tuple[str, str], tuple[int, int, int]] = {}
        known = cur.positions
        suspects = self._suspects() if self.sustain.episodes else None
        timed: list[tuple[np.ndarray, np.ndarray]] = []  # (slots, seconds) of this step's samples
        for i, (metric, _) in enumerate(ERRORS):
            f = cur.get(metric)
            if f.height == 0:
                continue
            at = (known[0], known[1][metric]) if known is not None and metric in known[1] else None
            slot = self.slots.rows_at(f, at)
            self._grow()
            dt = f.get_column("dt").to_numpy().astype(np.float64)
            # every NIC's history in seconds, for its error baseline (its errors are learned
            # as they leave the evidence window, below)
            timed.append((slot, np.nan_to_num(dt)))
            delta = np.nan_to_num(f.get_column("delta").to_numpy().astype(np.float64))
            want = delta >= 0.5  # counts: any error at all
            if not want.any() and not self.errors and suspects is None:
                continue  # the healthy fast path
            want |= self.following[slot]
            if suspects is not None:
                want |= np.isin(slot, suspects)  # their samples are news, errors or not
            idx = np.flatnonzero(want & (np.nan_to_num(dt) > 0))
            if len(idx) == 0:
                continue
            iv, held = counter_timing(f)
            ts = f.get_column("ts").to_numpy()
            for j in idx.tolist():  # NICs with errors, and those followed: a few
                key = self.slots.keys[int(slot[j])]
                e = self.errors.get(key)
                if e is None:
                    e = self.errors[key] = _Errors()
                e.add(i, int(ts[j]), float(delta[j]), float(dt[j]))
                t, _, _ = fresh.get(key, (0, 0, 0))
                if ts[j] >= t:
                    fresh[key] = (int(ts[j]), int(iv[j]), int(held[j]))
        suspect = set() if suspects is None else set(suspects.tolist())
        if timed:
            covered = np.zeros(len(self.slots))
            for sl, secs in timed:  # one row per NIC and counter: slots unique within a frame
                covered[sl] = np.maximum(covered[sl], secs)
            if suspects is not None:
                covered[suspects[(suspects >= 0) & (suspects < len(covered))]] = 0.0
            self.err_time[: len(covered)] += covered
        if end < self.next_prune:
            return fresh  # the windows filter by time: old samples may wait a little
        self.next_prune = end + round(PRUNE_S * NS)
        for key in list(self.errors):
            e = self.errors[key]
            # a NIC that stopped reporting: its last samples mean nothing after a while
            newest = max((d[-1][2] for d in e.samples if d), default=cfg.window_s)
            horizon = end - round(self._evidence_s(newest) * NS)
            stale = end - round((self._evidence_s(newest) + STALE_INTERVALS * newest) * NS)
            left, dropped = e.prune(horizon, stale)
            j = self.slots.index[key]
            if dropped and j not in suspect:
                self.err_count[j] += dropped  # a suspect NIC's errors never become its normal
            if not left:
                del self.errors[key]
                self.following[j] = False
        return fresh

    def _evidence_s(self, interval_s: float) -> float:
        """The baseline rule's window for a NIC read every ``interval_s``: two samples at
        least (and a little jitter)."""
        return max(self.config.evidence_window_s, 2.2 * interval_s)

    def _follow(self, key: tuple[str, str], err_rate: float) -> None:
        """Follow a NIC's every error sample (zeros too, so its rate is exact) while its rate
        is within reach of the stay threshold; a NIC with stray errors is not followed."""
        cfg = self.config
        i = self.slots.index.get(key)
        if i is not None:
            self.following[i] = err_rate >= FOLLOW * cfg.exit_ratio * cfg.error_min_rate

    # --- per step ------------------------------------------------------------------------------
    def _rows(
        self, cur: Step, end: int, fresh: dict[tuple[str, str], tuple[int, int, int]]
    ) -> list[Row]:
        cfg = self.config
        oos = cur.get(OOS)
        cand: dict[tuple[str, str], tuple[float, int, int, int]] = {}
        if oos.height:
            cand = self._oos(cur, oos, end)
        fabric = self.fabric_oos or 0.0
        rows = []
        # NICs with a new sample in this step whose out_of_sequence or errors are at least warm,
        # and suspect NICs with a new sample (a cold one says the condition ended: news)
        suspects = {k[1:] for k in self.sustain.episodes}
        for key in sorted({*cand, *(k for k in fresh if k in self.errors or k in suspects)}):
            e = self.errors.get(key)
            sums = e.rates(cfg.window_s, end) if e is not None else [0.0] * len(ERRORS)
            err_rate, err_spread = self._error_rate(e, end)
            self._follow(key, max(err_rate, sum(sums)))
            i = self.slots.index.get(key, -1)
            count, base_err, p_err, window, spread = self._baseline_rule(e, i, end)
            mine = None
            if i >= 0 and self._ready(i):
                mine = float(self.ewma[i])
            base = max(fabric, mine or 0.0)
            # a NIC still learning its own baseline is judged on its errors alone: a path that
            # always reorders more than its peers is that NIC's normal, not a fault
            thr = max(cfg.oos_min_pps, cfg.oos_factor * base) if mine is not None else math.inf
            if key in cand:
                r, ts, iv, held = cand[key]
            else:
                r = self._current_rate(i, end)
                ts, iv, held = fresh[key]
            if key in fresh and fresh[key][0] > ts:
                ts, iv, held = fresh[key]
            stays = False
            ep = self.sustain.episodes.get(("nic", *key))
            if ep is not None and ep.ts and e is not None and len(ep.info) > 8:
                # once firing, the errors are counted over the time the fault's own rate (as
                # it fired) takes for three times min_errors: a strong fault's end shows at
                # once, a mild one's only after seconds of silence, which it has by chance;
                # and it stays while that count is likelier at that rate than at the baseline
                fired = (
                    ep.info[6]
                    if ep.info[6] >= cfg.error_min_rate
                    else ep.info[8][0] / max(ep.info[8][1], 1e-9)
                )
                want = 3 * cfg.min_errors / max(fired, 1e-9)
                count, base_err, p_err, window, spread = self._baseline_rule(e, i, end, want)
                stays = count >= cfg.exit_ratio * cfg.min_errors and (
                    fired <= base_err
                    or count >= window * (fired - base_err) / math.log(fired / base_err)
                )
            counted = count >= cfg.min_errors and count >= cfg.error_factor * base_err * window
            by_count = counted and p_err <= cfg.error_p_value
            # once firing, the errors' plain rate over the last second (at least the newest
            # sample) says whether they go on: the burst-proof count is for starting an alert,
            # and would hold one for two seconds after a strong fault's end
            now = sum(sums) if ep is not None and ep.ts else err_rate
            oos_hot = r >= thr and i >= 0 and self.oos_streak[i] >= 2
            hot = oos_hot or now >= cfg.error_min_rate or by_count
            warm = (
                hot
                or r >= cfg.exit_ratio * thr
                or sum(sums) >= cfg.exit_ratio * cfg.error_min_rate
                or stays
            )
            if warm:
                span = self._error_span(e)
                if by_count and not oos_hot:
                    # the errors came over that span: the condition held over it
                    held = max(held, round(spread * NS))
                elif err_rate >= cfg.error_min_rate and not oos_hot:
                    held = max(held, round(err_spread * NS))
                evidence = (count, window, base_err, p_err, self._rate_parts(i))
                info = (r, thr, base, mine, fabric, tuple(sums), err_rate, span, evidence)
                rows.append(Row(("nic", *key), int(hot), ts, info, interval=iv, held=held))
            elif key in suspects:
                rows.append(Row(("nic", *key), COLD, ts, (), interval=iv, held=held))
        return rows

    def _error_rate(self, e: _Errors | None, end: int) -> tuple[float, float]:
        """The rate rule's errors per second (every counter), and the seconds they came over:
        counted over two seconds, or two of the NIC's samples if longer, in bins of a second
        or a sample, no bin for more than the next largest (one moment's burst is no rate)."""
        if e is None:
            return 0.0, 0.0
        cfg = self.config
        newest = max((d[-1][2] for d in e.samples if d), default=cfg.window_s)
        w = max(2 * cfg.window_s, 2.2 * newest)
        count, window, _, spread = e.evidence(w, end, max(cfg.window_s, newest))
        return count / window, spread

    def _baseline_rule(
        self, e: _Errors | None, i: int, end: int, window_s: float | None = None
    ) -> tuple[float, float, float, float, float]:
        """The baseline rule's figures for NIC slot ``i``: (errors counted, its baseline rate,
        the chance of that count at that rate, the window and the span the errors came over
        in seconds), over the evidence window or ``window_s`` within it (at least two of the
        NIC's intervals)."""
        if e is None or i < 0:
            return 0.0, 0.0, 1.0, 0.0, 0.0
        cfg = self.config
        newest = max((d[-1][2] for d in e.samples if d), default=cfg.window_s)
        full = self._evidence_s(newest)
        if window_s is not None:
            full = min(full, max(window_s, cfg.window_s, 2.2 * newest))
        # bins of a second, or of one sample if longer
        count, window, samples, spread = e.evidence(full, end, max(cfg.window_s, newest))
        base = self._error_baseline(i)
        if samples < 2 or spread < cfg.sustain_s:
            # errors in one sample, or within less than sustain_s, are one moment's (a burst
            # from one loss, a flap): no rate, however many
            return count, base, 1.0, window, spread
        return count, base, poisson_tail(count, base * window), window, spread

    def _error_baseline(self, i: int) -> float:
        """NIC slot ``i``'s healthy error rate: its own history, with its rail's pooled rate
        as ``error_prior_s`` of prior history, never below ``error_floor_rate``."""
        cfg = self.config
        weight = float(self.err_time[i]) + cfg.error_prior_s
        own = float(self.err_count[i]) + cfg.error_prior_s * self._rail_rate(i)
        return max(cfg.error_floor_rate, own / weight if weight > 0 else 0.0)

    def _rail_rate(self, i: int) -> float:
        """The pooled error rate of NIC slot ``i``'s rail (of the NICs in none, or the
        fabric's, for a rail not pooled yet)."""
        r = int(self.rail[i])
        return float(self.pooled[r] if 0 <= r < len(self.pooled) - 1 else self.pooled[-1])

    def _rate_parts(self, i: int) -> tuple[float, float, float]:
        """(own rate, seconds of own history, the rail's pooled rate) for the evidence."""
        if i < 0:
            return 0.0, 0.0, 0.0
        t = float(self.err_time[i])
        own = float(self.err_count[i]) / t if t > 0 else 0.0
        return own, t, self._rail_rate(i)

    def _rail(self, key: tuple[str, str]) -> int:
        rail = self.topology.nic_rail(*key)
        return -1 if rail is None else int(rail)

    def _ready(self, i: int) -> bool:
        cfg = self.config
        return bool(
            self.learned_s[i] >= cfg.baseline_min_s
            and self.learned_n[i] >= cfg.baseline_min_samples
            and math.isfinite(self.ewma[i])
        )

    def _current_rate(self, i: int, end: int) -> float:
        """A NIC's newest out_of_sequence rate, while it is not stale."""
        if i < 0 or self.seen[i] == 0:
            return 0.0
        if end - self.seen[i] > STALE_INTERVALS * self.interval[i] * NS + NS:
            return 0.0
        return float(self.last_rate[i])

    def _error_span(self, e: _Errors | None) -> float:
        """The seconds the error rate was taken over (for the evidence)."""
        return max(self.config.window_s, e.span()) if e is not None else 0.0

    # --- out_of_sequence and its baselines --------------------------------------------------------
    def _grow(self) -> None:
        """Every per-slot array as long as the slots (each on its own: a checkpoint from an
        older build restores the arrays it knew, and the ones added since start empty)."""
        n = len(self.slots)
        if len(self.ewma) == len(self.err_time) == len(self.oos_streak) == len(self.rail) == n:
            return  # the usual step: no new NIC
        for name, fill, dtype in (
            ("ewma", np.nan, np.float64),
            ("learned_s", 0, np.float64),
            ("learned_n", 0, np.int64),
            ("seen", 0, np.int64),
            ("last_rate", 0, np.float64),
            ("interval", 0, np.float64),
            ("following", False, np.bool_),
            ("oos_streak", 0, np.int64),
            ("err_count", 0, np.float64),
            ("err_time", 0, np.float64),
        ):
            a = getattr(self, name)
            if len(a) < n:
                setattr(self, name, np.concatenate([a, np.full(n - len(a), fill, dtype=dtype)]))
        if len(self.rail) < n:
            new = [self._rail(k) for k in self.slots.keys[len(self.rail) :]]
            self.rail = np.concatenate([self.rail, np.array(new, dtype=np.int64)])

    def _oos(
        self, cur: Step, oos: pl.DataFrame, end: int
    ) -> dict[tuple[str, str], tuple[float, int, int, int]]:
        """Judge this step's out_of_sequence samples against the baselines, then fold the
        clean ones in; return the NICs at least warm: (rate, ts, interval, span)."""
        cfg = self.config
        known = cur.positions
        at = (known[0], known[1][OOS]) if known is not None and OOS in known[1] else None
        slot = self.slots.rows_at(oos, at)
        self._grow()
        dt = oos.get_column("dt").to_numpy().astype(np.float64)
        ok = np.isfinite(dt) & (dt > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            r = oos.get_column("delta").to_numpy().astype(np.float64) / dt
        ok &= np.isfinite(r)
        ts = oos.get_column("ts").to_numpy()
        n = np.maximum(oos.get_column("n").to_numpy().astype(np.float64), 1.0)
        ewma = self.ewma[slot]
        ready = (
            (self.learned_s[slot] >= cfg.baseline_min_s)
            & (self.learned_n[slot] >= cfg.baseline_min_samples)
            & np.isfinite(ewma)
        )
        base = np.maximum(self.fabric_oos or 0.0, np.nan_to_num(ewma))
        thr = np.where(ready, np.maximum(cfg.oos_min_pps, cfg.oos_factor * base), np.inf)
        warm = ok & (r >= cfg.exit_ratio * thr)
        hot = ok & (r >= thr)
        # the latest reading of every NIC, and its interval
        s, iv = slot[ok], dt[ok] / n[ok]
        self.oos_streak[s] = np.where(hot[ok], self.oos_streak[s] + n[ok].astype(np.int64), 0)
        prev = self.interval[s]
        self.interval[s] = np.where(prev > 0, prev + 0.25 * (iv - prev), iv)
        self.seen[s] = ts[ok]
        self.last_rate[s] = r[ok]
        # learn from clean readings only, and never while the NIC is suspect
        learn = ok & ~hot
        if self.sustain.episodes:
            learn &= ~np.isin(slot, self._suspects())
        s, x, w = slot[learn], r[learn], dt[learn]
        alpha = -np.expm1(-w / cfg.baseline_tau_s)
        old = self.ewma[s]
        self.ewma[s] = np.where(np.isnan(old), x, old + alpha * (x - old))
        self.learned_s[s] += w
        self.learned_n[s] += 1
        out: dict[tuple[str, str], tuple[float, int, int, int]] = {}
        pick = warm
        if self.sustain.episodes:  # a suspect NIC's sample is news either way
            pick = warm | (ok & np.isin(slot, self._suspects()))
        idx = np.flatnonzero(pick)
        if len(idx):
            iv_ns, held_ns = counter_timing(oos)
            for j in idx.tolist():  # the few NICs reordering beyond their threshold
                key = self.slots.keys[int(slot[j])]
                out[key] = (float(r[j]), int(ts[j]), int(iv_ns[j]), int(held_ns[j]))
        return out

    def _suspects(self) -> np.ndarray:
        """The slots of the NICs with an episode (pending or firing)."""
        index = self.slots.index
        return np.array(
            [index.get((k[1], k[2]), -1) for k in self.sustain.episodes if k[0] == "nic"],
            dtype=np.int64,
        )

    def _fabric(self, end: int) -> None:
        """Fold the median of every NIC's latest rate into the fabric's baseline."""
        cfg = self.config
        self.next_baseline = end + round(cfg.baseline_every_s * NS)
        if len(self.seen) == 0:
            return
        alive = (self.seen > 0) & (
            end - self.seen <= (STALE_INTERVALS * self.interval + cfg.baseline_every_s) * NS
        )
        if not alive.any():
            return
        # an EWMA of the median: one moment's fabric-wide burst barely moves it
        m = float(np.median(self.last_rate[alive]))
        alpha = -math.expm1(-cfg.baseline_every_s / cfg.baseline_tau_s)
        self.fabric_oos = (
            m if self.fabric_oos is None else self.fabric_oos + alpha * (m - self.fabric_oos)
        )
        self._pool()
        if end >= self.next_forget:  # NICs gone from the fabric: forget them now and then
            self.next_forget = end + 60 * NS
            gone = (self.seen > 0) & (self.seen < end - round(cfg.baseline_forget_s * NS))
            self.ewma[gone] = np.nan
            self.learned_s[gone] = 0.0
            self.learned_n[gone] = 0

    def _pool(self) -> None:
        """Decay every NIC's error history and pool it per rail (suspect NICs left out)."""
        cfg = self.config
        keep = math.exp(-cfg.baseline_every_s / cfg.error_tau_s)
        self.err_count *= keep
        self.err_time *= keep
        n = len(self.err_time)
        if n == 0:
            return
        use = np.ones(n, dtype=bool)
        if self.sustain.episodes:
            s = self._suspects()
            use[s[s >= 0]] = False
        rails = np.where(self.rail >= 0, self.rail, -1)
        top = int(rails.max()) + 1 if n else 0
        group = np.where(rails >= 0, rails, top)  # the last group: NICs in no rail
        cnt = np.bincount(group[use], self.err_count[use], minlength=top + 1)
        tim = np.bincount(group[use], self.err_time[use], minlength=top + 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            pooled = np.where(tim > 0, cnt / tim, np.nan)
        # a rail with no history yet (or NICs in none) takes the fabric's pooled rate
        total = float(self.err_time[use].sum())
        fabric = float(self.err_count[use].sum()) / total if total > 0 else 0.0
        self.pooled = np.where(np.isfinite(pooled), pooled, fabric)

    # --- findings -------------------------------------------------------------------------------
    def _finding(self, key: Key, ep: Episode) -> Finding:
        cfg = self.config
        _, dev, port = key
        rate, thr, base, own, fabric, sums, err_rate, span = ep.info[:8]
        # (an episode from a checkpoint before the baseline rule has no count)
        count, window, base_err, p_err, parts = (
            ep.info[8] if len(ep.info) > 8 else (0.0, 0.0, 0.0, 1.0, (0.0, 0.0, 0.0))
        )
        who = f"{dev}/{port}"
        counts = ", ".join(
            f"{x:,.1f}/s {label}" for (_, label), x in zip(ERRORS, sums, strict=True) if x > 0
        )
        if own is None:
            oos = f"out_of_sequence {rate:,.0f}/s (not judged: its own baseline is still learning)"
        else:
            oos = (
                f"out_of_sequence {rate:,.0f}/s (threshold {thr:,.0f}/s = max({cfg.oos_min_pps:g}"
                f"/s, {cfg.oos_factor:g}x baseline: own {own:,.0f}/s, fabric median "
                f"{fabric:,.0f}/s))"
            )
        rules = []
        if rate >= thr:
            rules.append("out_of_sequence")
        if err_rate >= cfg.error_min_rate:
            rules.append("error_rate")
        by_count = count >= cfg.min_errors and p_err <= cfg.error_p_value
        if by_count:
            rules.append("error_baseline")
        own_e, own_t, rail_e = parts
        baseline = (
            f"{count:,.0f} retransmission errors in {window:.3g} s = "
            f"{count / max(window, 1e-9):,.2f}/s against a baseline of {base_err:,.3f}/s "
            f"(own {own_e:,.3f}/s over {own_t:,.0f} s, "
            f"rail peers {rail_e:,.3f}/s as {cfg.error_prior_s:g} s of prior, floor "
            f"{cfg.error_floor_rate:.3g}/s): chance {p_err:.2g} (threshold {cfg.error_p_value:g}"
            f", at least {cfg.min_errors} errors and {cfg.error_factor:g}x the baseline)"
        )
        evidence = (
            f"{who}: rule={'+'.join(rules) or 'sustained'}; {oos}; retransmission errors "
            f"{err_rate:,.1f}/s over {span:.3g} s ({counts or 'none'}; threshold "
            f"{cfg.error_min_rate:g}/s); {baseline}; held {cfg.sustain_s:g} s"
        )
        what = []
        if rate >= thr:
            what.append(f"out-of-sequence packets {rate / max(base, 1e-9):,.0f}x baseline")
        if err_rate >= cfg.error_min_rate:
            what.append(f"{err_rate:,.0f} retransmission errors/s")
        elif by_count:
            what.append(
                f"{count / max(window, 1e-9):,.1f} retransmission errors/s, "
                f"{count / max(window, 1e-9) / max(base_err, 1e-12):,.0f}x its baseline"
            )
        summary = f"RoCE transport errors on {who}: " + (" and ".join(what) or "sustained")
        return Finding(
            TRANSPORT_ERRORS,
            node_labels(self.topology, dev, port),
            ep.severity,
            ep.ts,
            summary=summary,
            description=f"{who} kept retransmitting or receiving out of order, beyond its own "
            "and its peers' baseline: a lossy path, a misbehaving peer or a NIC fault slows "
            "every queue pair on it.",
            evidence=evidence,
        )


def build(
    topology: Topology, config: TransportErrorsConfig | None = None
) -> TransportErrorsDetector:
    return TransportErrorsDetector(topology, config or TransportErrorsConfig())


__all__ = ["TransportErrorsConfig", "TransportErrorsDetector", "build"]
