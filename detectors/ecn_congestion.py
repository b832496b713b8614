"""ECNCongestion: sustained ECN marking (a CNP storm at the NIC) beyond the fabric's baseline.

DCQCN marks packets in every burst of a healthy fabric, so a count of marks says little. What
does not happen in healthy operation is a queue that marks a large share of what it sends, step
after step, far above what the rest of the fabric marks: its occupancy sits past the RED
profile's Kmin for seconds, not for one collective's burst. So, at every step (100 ms):

- a switch queue is *hot* when at least ``min_mark_share`` of the packets it transmitted were
  ECN-marked, at a rate of at least ``min_marked_pps`` and ``fabric_factor`` times the median
  marking rate of every queue in the fabric in the same step (a fabric-wide event is not blamed
  on each queue);
- a NIC is hot likewise from ``nic_ecn_marked_pkts`` (``np_ecn_marked_roce_packets``) against
  the packets it received, estimated from its RDMA byte counter at ``packet_bytes`` a packet
  (the agent exports no packet counter); its ``np_cnp_sent`` rate goes into the evidence.

An entity fires once hot for ``sustain_s`` (a dip of up to ``gap_s`` is tolerated: a missed
sample), and stays firing while its marked share stays at or above ``exit_mark_share``; after
``clear_s`` below that the finding stops and the alert resolves (hysteresis both ways).

A healthy step costs one numpy comparison per metric. Only the queues and NICs marking at least
``min_marked_pps`` and ``fabric_factor`` x the median are looked up in their packet counters
(a join first drops those below the stay share when many qualify at once).

``Sustain``, the small per-entity state machine behind "held for N seconds, with hysteresis",
is shared with the other congestion detectors (queue_buildup, transport_errors).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import polars as pl

from detectors.base import Finding, StepContext, node_labels, port_labels
from detectors.state import (
    NKEY,
    QKEY,
    Episode,
    Key,
    Row,
    Sustain,
    lookup,
    matches,
    over_idx,
    rows_at,
)
from detectors.windows import Step
from rocewatch.errors import ConfigError
from rocewatch.topology import Topology

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EcnCongestionConfig:
    # a quarter of all packets marked means the queue sat well past Kmin for the whole step;
    # healthy DCQCN marks well under 1% (bursty MoE a few %), a slow receiver ~5-10%
    min_mark_share: float = 0.25
    exit_mark_share: float = 0.1
    # ~2% of what a 400G link carries in 4 KiB packets (12.2 Mpps): less is not a storm, and
    # keeps busy but healthy uplinks (bursty MoE marks ~1% of ~10 Mpps) off the slow path;
    # scale it with the link speed
    min_marked_pps: float = 250_000.0
    fabric_factor: float = 10.0  # x the fabric's median marking rate in the same step
    sustain_s: float = 2.0  # longer than any collective's burst (all-reduce ~0.3 s)
    gap_s: float = 0.1  # one missed step does not restart the count
    clear_s: float = 0.5
    packet_bytes: float = 4096.0  # RoCE MTU: received bytes -> packets at a NIC
    queues: bool = True
    nics: bool = True
    max_entities: int = 10_000
    enabled: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        where = "detectors.ecn_congestion"
        if not 0 < self.min_mark_share <= 1:
            raise ConfigError(f"{where}.min_mark_share: must be within (0, 1]")
        if not 0 < self.exit_mark_share <= self.min_mark_share:
            raise ConfigError(f"{where}.exit_mark_share: must be within (0, min_mark_share]")
        if self.min_marked_pps < 0 or self.fabric_factor < 0:
            raise ConfigError(f"{where}: min_marked_pps and fabric_factor must be >= 0")
        if self.sustain_s <= 0 or self.gap_s < 0 or self.clear_s < 0:
            raise ConfigError(f"{where}: sustain_s must be > 0, gap_s and clear_s >= 0")
        if self.packet_bytes <= 0:
            raise ConfigError(f"{where}.packet_bytes: must be > 0")
        if self.max_entities < 1:
            raise ConfigError(f"{where}.max_entities: must be >= 1")


@dataclass
class EcnCongestionDetector:
    topology: Topology
    config: EcnCongestionConfig = field(default_factory=EcnCongestionConfig)
    name: str = "ecn_congestion"
    # the metrics it reads from the window engine (steps carry no others to the detect stage)
    reads: ClassVar[frozenset[str]] = frozenset(
        {
            "queue_ecn_marked_pkts",
            "queue_tx_pkts",
            "port_out_pkts",
            "nic_ecn_marked_pkts",
            "nic_rx_rdma_bytes",
            "nic_rx_bytes",
            "nic_cnp_sent",
        }
    )

    def __post_init__(self) -> None:
        c = self.config
        self.sustain = Sustain(c.sustain_s, c.gap_s, c.clear_s, c.max_entities)

    @property
    def window_s(self) -> float:
        """Reads only the newest step: the history it needs is its own (``Sustain``)."""
        return 0.0

    def evaluate(self, ctx: StepContext) -> list[Finding]:
        cur = ctx.engine.current()
        rows: list[Row] = []
        if cur is not None:
            if self.config.queues:
                rows += self._queues(cur)
            if self.config.nics:
                rows += self._nics(cur)
        if not rows and not self.sustain.episodes:
            return []
        return [self._finding(k, ep) for k, ep in self.sustain.update(ctx.start, ctx.end, rows)]

    # --- per step --------------------------------------------------------------------------------
    def _judge(self, marks: float, dt: float, pkts: float | None, med: float) -> int | None:
        """The level of one candidate: 1 enter, 0 stay, None neither (or no packet count)."""
        cfg = self.config
        if not pkts or pkts <= 0 or marks < cfg.min_marked_pps * dt:
            return None
        share = min(marks / pkts, 1.0)
        if share < cfg.exit_mark_share:
            return None
        return int(share >= cfg.min_mark_share and marks / dt >= cfg.fabric_factor * med)

    def _candidates(
        self, marks: pl.DataFrame, kind: str, denom: pl.DataFrame, per_mark: float = 1.0
    ) -> tuple[list[dict[str, Any]], float]:
        """Rows that may enter (marking ``min_marked_pps`` and ``fabric_factor`` x the median)
        or stay (the entities already tracked), and the fabric's median marking rate.

        Where many rows qualify (busy uplinks in bursty traffic), one join with ``denom`` (the
        packet counter, or bytes at ``per_mark`` bytes a packet) first drops those whose
        marked share is below the stay threshold."""
        cfg = self.config
        if marks.height == 0:
            return [], 0.0
        tracked = [k[1:] for k in self.sustain.episodes if k[0] == kind]
        r = marks["delta"].to_numpy() / marks["dt"].to_numpy()
        if not tracked and not (r >= cfg.min_marked_pps).any():
            return [], 0.0  # the healthy step: nothing marks enough to matter
        fin = r[np.isfinite(r)]
        med = float(np.median(fin)) if len(fin) else 0.0
        idx = over_idx(marks, max(cfg.min_marked_pps, cfg.fabric_factor * med))
        if tracked:
            idx = np.union1d(idx, np.flatnonzero(matches(marks, tracked)))
        if len(idx) <= 8 or denom.height == 0:
            return rows_at(marks, idx), med
        key = QKEY if kind == "queue" else NKEY
        sub = marks[idx]
        d = denom.select(*key, pl.col("delta").alias("_d"))
        c = sub.join(d, on=key, how="inner")  # several times cheaper than a left join
        if c.height < sub.height:  # some have no counter here: keep them for the slow path
            c = sub.join(d, on=key, how="left")
        keep = ~(c["delta"].to_numpy() * per_mark < c["_d"].to_numpy() * cfg.exit_mark_share)
        return rows_at(c.drop("_d"), np.flatnonzero(keep)), med  # (NaN compares False: kept)

    def _queues(self, cur: Step) -> list[Row]:
        marks = cur.get("queue_ecn_marked_pkts")
        txf = cur.get("queue_tx_pkts")
        cand, med = self._candidates(marks, "queue", txf)
        if not cand:
            return []
        keys = [(c["device"], c["port"], c["qual"]) for c in cand]
        # the queue's own packet counter, else its port's (then the share is a lower bound)
        tx = lookup(txf, keys)
        missing = [k[:2] for k in keys if tx.get(k) is None]
        ptx = lookup(cur.get("port_out_pkts"), missing) if missing else {}
        rows = []
        for key, c in zip(keys, cand, strict=True):
            delta, dt = c["delta"], c["dt"]
            pkts = tx.get(key)
            if pkts is None:
                pkts = ptx.get(key[:2])
            level = self._judge(delta, dt, pkts, med) if dt else None
            if level is not None:
                assert pkts is not None
                info = (min(delta / pkts, 1.0), pkts, delta / dt, med, dt)
                rows.append(Row(("queue", *key), level, c["ts"], info))
        return rows

    def _nics(self, cur: Step) -> list[Row]:
        marks, rdma = cur.get("nic_ecn_marked_pkts"), cur.get("nic_rx_rdma_bytes")
        cand, med = self._candidates(marks, "nic", rdma, self.config.packet_bytes)
        if not cand:
            return []
        keys = [(c["device"], c["port"]) for c in cand]
        by = lookup(rdma, keys)
        missing = [k for k in keys if by.get(k) is None]
        if missing:
            by.update(lookup(cur.get("nic_rx_bytes"), missing))
        cnp = lookup(cur.get("nic_cnp_sent"), keys, "rate")
        rows = []
        for key, c in zip(keys, cand, strict=True):
            delta, dt = c["delta"], c["dt"]
            b = by.get(key)
            pkts = b / self.config.packet_bytes if b is not None else None
            level = self._judge(delta, dt, pkts, med) if dt else None
            if level is not None:
                assert pkts is not None
                info = (min(delta / pkts, 1.0), pkts, delta / dt, med, dt, cnp.get(key))
                rows.append(Row(("nic", *key), level, c["ts"], info))
        return rows

    # --- findings --------------------------------------------------------------------------------
    def _finding(self, key: Key, ep: Episode) -> Finding:
        cfg = self.config
        share, pkts, rate, med, dt = ep.info[:5]
        limits = (
            f"thresholds {cfg.min_mark_share:.0%} marked, {cfg.fabric_factor:g}x the fabric "
            f"median ({med:,.0f}/s), {cfg.min_marked_pps:,.0f}/s; held {cfg.sustain_s:g} s"
        )
        if key[0] == "queue":
            _, dev, port, q = key
            labels = port_labels(self.topology, dev, port)
            labels["queue"] = q
            who = f"{dev}/{port} queue {q}"
            evidence = (
                f"{who}: {share:.1%} of {pkts:,.0f} packets ECN-marked in {dt:.2f} s "
                f"({rate:,.0f} marks/s); {limits}"
            )
        else:
            _, dev, port = key
            labels = node_labels(self.topology, dev, port)
            who = f"{dev}/{port}"
            cnp = ep.info[5]
            cnp_s = f", {cnp:,.0f} CNPs sent/s" if cnp is not None else ""
            evidence = (
                f"{who}: {rate:,.0f} ECN-marked packets/s received, {share:.1%} of ~{pkts:,.0f} "
                f"packets ({cfg.packet_bytes:g} B each) in {dt:.2f} s{cnp_s}; {limits}"
            )
        return Finding(
            "ECNCongestion",
            labels,
            ep.severity,
            ep.ts,
            summary=f"sustained ECN marking at {who}: {share:.0%} of packets",
            description=f"{who} marked {share:.1%} of its packets for at least "
            f"{cfg.sustain_s:g} s, {rate / med if med else float('inf'):,.0f}x the fabric's "
            "median marking rate: standing congestion (incast or a slow receiver), not "
            "DCQCN's normal bursts.",
            evidence=evidence,
        )


def build(topology: Topology, config: EcnCongestionConfig | None = None) -> EcnCongestionDetector:
    return EcnCongestionDetector(topology, config or EcnCongestionConfig())


__all__ = [
    "EcnCongestionConfig",
    "EcnCongestionDetector",
    "Episode",
    "Row",
    "Sustain",
    "build",
]
