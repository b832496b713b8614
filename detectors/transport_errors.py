"""TransportErrors: RoCE retransmissions and sequence errors on a NIC, beyond its baseline.

Two signals per NIC (``/sys/class/infiniband/<nic>/ports/<p>/hw_counters``):

- ``out_of_sequence`` has a healthy baseline (adaptive routing reorders packets). Its rate in
  the step is *hot* at ``oos_factor`` times the larger of the NIC's own baseline (an EWMA with
  time constant ``baseline_tau_s``, sampled every ``baseline_every_s`` and frozen while the NIC
  is suspect, so a fault never becomes its own baseline) and the fabric's (an EWMA of the median
  over all NICs), and at least ``oos_min_pps``. A NIC with fewer than
  ``baseline_min_samples`` samples of its own is judged on the errors below alone.
- ``packet_seq_err``, ``local_ack_timeout_err``, ``rnr_nak_retry_err`` and
  ``implied_nak_seq_err`` should be ~0: each is a retransmission (go-back-N) or a timeout.
  Their sum over the last ``window_s`` is hot at ``error_min_rate`` per second. The sliding
  sums are kept per NIC only for NICs that had an error in the window (a few).

A NIC fires once hot for ``sustain_s`` (dips of ``gap_s`` tolerated), stays firing while either
signal is at least ``exit_ratio`` of its threshold and clears ``clear_s`` after that last held.
A counter reset yields a small delta, never a spike (detectors/rates.py), so it cannot fire.

A healthy step costs one vectorised filter per counter, plus the baseline update once per
``baseline_every_s``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar

import polars as pl

from detectors.base import Finding, StepContext, node_labels
from detectors.state import NKEY, NS, Episode, Key, Row, Sustain, lookup, over
from detectors.windows import Step
from rocewatch.errors import ConfigError
from rocewatch.topology import Topology

OOS = "nic_out_of_sequence"
ERRORS = (
    ("nic_packet_seq_err", "NAK sequence errors"),
    ("nic_local_ack_timeout", "local ACK timeouts"),
    ("nic_rnr_nak_retry_err", "RNR NAK retries exceeded"),
    ("nic_implied_nak_seq_err", "implied NAK sequence errors"),
)
_NIC_SCHEMA: dict[str, pl.DataType] = {"device": pl.String(), "port": pl.String()}
_BASE_SCHEMA: dict[str, pl.DataType] = {
    "device": pl.String(),
    "port": pl.String(),
    "ewma": pl.Float64(),
    "n": pl.Int64(),
    "seen": pl.Int64(),
}


@dataclass(frozen=True)
class TransportErrorsConfig:
    # adaptive routing keeps out_of_sequence within a small multiple of its usual rate; a lossy
    # path or a NIC retransmitting multiplies it by 100
    oos_factor: float = 10.0
    oos_min_pps: float = 200.0
    # every retransmission or ACK timeout stalls a queue pair; a few per second, sustained, is
    # a fault (healthy NICs see one every few minutes)
    error_min_rate: float = 5.0
    window_s: float = 1.0  # the sliding window the error rate is counted over
    exit_ratio: float = 0.5  # of a threshold: the stay condition once firing
    sustain_s: float = 2.0
    gap_s: float = 0.1
    clear_s: float = 0.5
    baseline_tau_s: float = 60.0
    baseline_every_s: float = 1.0
    baseline_min_samples: int = 10
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
        if self.baseline_min_samples < 0 or self.max_entities < 1:
            raise ConfigError(f"{where}: baseline_min_samples >= 0, max_entities >= 1")


@dataclass
class TransportErrorsDetector:
    topology: Topology
    config: TransportErrorsConfig = field(default_factory=TransportErrorsConfig)
    name: str = "transport_errors"
    # the metrics it reads from the window engine (steps carry no others to the detect stage)
    reads: ClassVar[frozenset[str]] = frozenset({OOS, *(m for m, _ in ERRORS)})

    def __post_init__(self) -> None:
        c = self.config
        self.sustain = Sustain(c.sustain_s, c.gap_s, c.clear_s, c.max_entities)
        self.baseline = pl.DataFrame(schema=_BASE_SCHEMA)  # per NIC out_of_sequence EWMA
        self.fabric_oos: float | None = None  # EWMA of the fabric's median out_of_sequence rate
        self.next_baseline = 0
        self.learned = 0
        # the error window: per step, the NICs with errors and what each counter added
        self.recent: deque[tuple[int, list[tuple[Key, int, float]]]] = deque()
        self.sums: dict[Key, list[float]] = {}

    @property
    def window_s(self) -> float:
        """Reads only the newest step: the windows it needs are its own."""
        return 0.0

    def evaluate(self, ctx: StepContext) -> list[Finding]:
        cur = ctx.engine.current()
        rows: list[Row] = []
        if cur is not None:
            self._errors(cur, ctx.end)
            rows = self._rows(cur)
            if ctx.end >= self.next_baseline:
                self._learn(cur, ctx.end)
        if not rows and not self.sustain.episodes:
            return []
        return [self._finding(k, ep) for k, ep in self.sustain.update(ctx.start, ctx.end, rows)]

    # --- the error window ----------------------------------------------------------------------
    def _errors(self, cur: Step, end: int) -> None:
        """Slide the per-NIC error sums: add this step's errors, drop the oldest step's."""
        win = self.config.window_s
        added: list[tuple[Key, int, float]] = []
        for i, (metric, _) in enumerate(ERRORS):
            # a long interval (an agent gap) holds errors from before the window: pro-rate them
            added += [
                (("nic", r["device"], r["port"]), i, r["delta"] * min(1.0, win / r["dt"]))
                for r in over(cur.get(metric), 0.5, rate=False)  # counts: any error at all
                if r["dt"]
            ]
        if added:
            self.recent.append((end, added))
            for key, i, x in added:
                self.sums.setdefault(key, [0.0] * len(ERRORS))[i] += x
        horizon = end - round(win * NS)
        while self.recent and self.recent[0][0] <= horizon:
            _, old = self.recent.popleft()
            for key, i, x in old:
                s = self.sums.get(key)
                if s is None:
                    continue
                s[i] -= x
                if sum(s) < 1e-9:
                    del self.sums[key]

    # --- per step ------------------------------------------------------------------------------
    def _rows(self, cur: Step) -> list[Row]:
        cfg = self.config
        oos = cur.get(OOS)
        floor = cfg.exit_ratio * max(cfg.oos_min_pps, cfg.oos_factor * (self.fabric_oos or 0))
        cand = over(oos, floor)
        err_min = cfg.exit_ratio * cfg.error_min_rate * cfg.window_s
        errs = [k[1:] for k, s in self.sums.items() if sum(s) >= err_min]
        if not cand and not errs:
            return []
        keys = sorted({*((r["device"], r["port"]) for r in cand), *errs})
        rate = lookup(oos, keys, "rate")
        tss = lookup(oos, keys, "ts")
        own = lookup(self.baseline, keys, "ewma")
        n = lookup(self.baseline, keys, "n")
        fabric = self.fabric_oos or 0.0
        rows = []
        for dev, port in keys:
            ts = tss.get((dev, port))
            if ts is None:
                continue  # no reading of this NIC in the step
            mine = own.get((dev, port))
            if (n.get((dev, port)) or 0) < cfg.baseline_min_samples:
                mine = None
            base = max(fabric, mine or 0.0)
            # a NIC still learning its own baseline is judged on its errors alone: a path that
            # always reorders more than its peers is that NIC's normal, not a fault
            thr = max(cfg.oos_min_pps, cfg.oos_factor * base) if mine is not None else math.inf
            r = rate.get((dev, port)) or 0.0
            key: Key = ("nic", dev, port)
            sums = self.sums.get(key, [0.0] * len(ERRORS))
            err_rate = sum(sums) / cfg.window_s
            hot = r >= thr or err_rate >= cfg.error_min_rate
            warm = r >= cfg.exit_ratio * thr or err_rate >= cfg.exit_ratio * cfg.error_min_rate
            if warm:
                info = (r, thr, base, mine, fabric, tuple(sums), err_rate)
                rows.append(Row(key, int(hot), int(ts), info))
        return rows

    # --- baselines ------------------------------------------------------------------------------
    def _learn(self, cur: Step, end: int) -> None:
        """Fold this step's out_of_sequence rates into the per-NIC and fabric baselines."""
        cfg = self.config
        self.next_baseline = end + round(cfg.baseline_every_s * NS)
        f = cur.get(OOS)
        if f.height == 0:
            return
        f = f.select(*NKEY, (pl.col("delta") / pl.col("dt")).alias("r"))  # null without a dt
        med = f["r"].median()
        if med is None:
            return
        alpha = min(1.0, cfg.baseline_every_s / cfg.baseline_tau_s)
        # an EWMA of the median: one step's fabric-wide burst barely moves it
        m = float(med)  # type: ignore[arg-type]
        self.fabric_oos = (
            m if self.fabric_oos is None else self.fabric_oos + alpha * (m - self.fabric_oos)
        )
        if self.sustain.episodes:  # a suspect NIC's baseline is frozen
            sus = pl.DataFrame(
                [k[1:] for k in self.sustain.episodes if k[0] == "nic"],
                schema=_NIC_SCHEMA,
                orient="row",
            )
            f = f.join(sus, on=NKEY, how="anti")
        r, ewma = pl.col("r"), pl.col("ewma")
        self.baseline = self.baseline.join(f, on=NKEY, how="full", coalesce=True).select(
            *NKEY,
            pl.when(ewma.is_null())
            .then(r)
            .when(r.is_null())
            .then(ewma)
            .otherwise(ewma + alpha * (r - ewma))
            .alias("ewma"),
            (pl.col("n").fill_null(0) + r.is_not_null().cast(pl.Int64)).alias("n"),
            pl.when(r.is_not_null()).then(end).otherwise(pl.col("seen")).alias("seen"),
        )
        self.learned += 1
        if self.learned % 60 == 0:  # NICs gone from the fabric: forget them now and then
            forget = end - round(cfg.baseline_forget_s * NS)
            self.baseline = self.baseline.filter(pl.col("seen") >= forget)

    # --- findings -------------------------------------------------------------------------------
    def _finding(self, key: Key, ep: Episode) -> Finding:
        cfg = self.config
        _, dev, port = key
        rate, thr, base, own, fabric, sums, err_rate = ep.info
        who = f"{dev}/{port}"
        counts = ", ".join(
            f"{x:,.0f} {label}" for (_, label), x in zip(ERRORS, sums, strict=True) if x >= 0.5
        )
        if own is None:
            oos = f"out_of_sequence {rate:,.0f}/s (not judged: its own baseline is still learning)"
        else:
            oos = (
                f"out_of_sequence {rate:,.0f}/s (threshold {thr:,.0f}/s = max({cfg.oos_min_pps:g}"
                f"/s, {cfg.oos_factor:g}x baseline: own {own:,.0f}/s, fabric median "
                f"{fabric:,.0f}/s))"
            )
        evidence = (
            f"{who}: {oos}; retransmission errors {err_rate:,.1f}/s over {cfg.window_s:g} s "
            f"({counts or 'none'}; threshold {cfg.error_min_rate:g}/s); held {cfg.sustain_s:g} s"
        )
        what = []
        if rate >= thr:
            what.append(f"out-of-sequence packets {rate / max(base, 1e-9):,.0f}x baseline")
        if err_rate >= cfg.error_min_rate:
            what.append(f"{err_rate:,.0f} retransmission errors/s")
        summary = f"RoCE transport errors on {who}: " + (" and ".join(what) or "sustained")
        return Finding(
            "TransportErrors",
            node_labels(self.topology, dev, port),
            ep.severity,
            ep.ts,
            summary=summary,
            description=f"{who} kept retransmitting or receiving out of order for "
            f"{cfg.sustain_s:g} s, beyond its own and the fabric's baseline: a lossy path, "
            "a misbehaving peer or a NIC fault slows every queue pair on it.",
            evidence=evidence,
        )


def build(
    topology: Topology, config: TransportErrorsConfig | None = None
) -> TransportErrorsDetector:
    return TransportErrorsDetector(topology, config or TransportErrorsConfig())


__all__ = ["TransportErrorsConfig", "TransportErrorsDetector", "build"]
