"""BusBandwidthDrop: a communicator's bus bandwidth falls against its own baseline.

NCCL's bus bandwidth (``nccl_coll_busbw_gbs``, from Inspector's ``coll_busbw_gbs``) is
comparable across collectives of the same kind and message size only: the series' qual is
``<comm>/<collective>/<size>``, and each is judged against its own past. Each step with
collectives of a key gives one observation, the median over the ranks that reported. The
baseline is the median of the last ``baseline_n`` observations while the key was healthy
(at least ``min_baseline`` of them before anything is judged). The key drops when the median
of its observations over the last ``window_s`` is below ``1 - drop`` of the baseline, and
fires once that held ``hold_s``; it resolves when the median, or its two newest
observations, are back above ``1 - drop / 2`` of the baseline, or after ``stale_s`` of
silence. The ``cause`` annotation names a fabric
alert firing on a node of the communicator (PCIeDowngrade, FlakyLink, PFCStorm, Straggler,
ECNCongestion, TransportErrors), and follows them while it fires; with none, "unknown".
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import polars as pl

from detectors.base import Finding, StepContext, check_positive_numbers
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import (
    BUS_BANDWIDTH_DROP,
    ECN_CONGESTION,
    FLAKY_LINK,
    PCIE_DOWNGRADE,
    PFC_STORM,
    SLOW_RANK,
    STRAGGLER,
    TRANSPORT_ERRORS,
)
from rocewatch.core.state import Stateful
from rocewatch.core.topology import Topology

S = 1_000_000_000
BUSBW = "nccl_coll_busbw_gbs"
CAUSES = (
    PCIE_DOWNGRADE,
    FLAKY_LINK,
    PFC_STORM,
    STRAGGLER,
    ECN_CONGESTION,
    TRANSPORT_ERRORS,
)


@dataclass(frozen=True)
class BusBandwidthDropConfig:
    enabled: bool = True
    drop: float = 0.2  # fires below this share under the baseline (0.2: 80 % of it)
    window_s: float = 3.0  # the median of the observations of the last this many seconds
    hold_s: float = 2.0  # the drop holds this long before it fires
    baseline_n: int = 100  # the baseline is the median of this many healthy observations
    min_baseline: int = 10  # observations before a key is judged
    stale_s: float = 30.0  # forget a key that reported nothing for this long

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_positive_numbers(self, "bus_bandwidth_drop")
        if self.drop >= 1:
            raise ConfigError(f"bus_bandwidth_drop: drop: {self.drop!r} must be below 1")


@dataclass
class _Key:
    baseline: list[float] = field(default_factory=list)
    recent: list[tuple[int, float]] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    since: int = 0  # start of the current drop (0: none)
    fresh: bool = False  # an observation came in this step
    active: bool = False
    fired_ts: int = 0
    evidence: str = ""


@dataclass
class BusBandwidthDropDetector(Stateful):
    topology: Topology
    config: BusBandwidthDropConfig = field(default_factory=BusBandwidthDropConfig)
    name: str = "bus_bandwidth_drop"
    STATE_TYPES: ClassVar[tuple[type, ...]] = (_Key,)
    reads: ClassVar[frozenset[str]] = frozenset({BUSBW})

    @property
    def window_s(self) -> float:
        return 0.0  # reads the newest step only; keeps its own history

    def __post_init__(self) -> None:
        self.keys: dict[str, _Key] = {}

    def evaluate(self, ctx: StepContext) -> list[Finding]:
        cur = ctx.engine.current()
        if cur is None:
            return []
        f = cur.get(BUSBW)
        if f.height:
            self._observe(f)
        firing = list(ctx.firing()) if ctx.firing is not None else []
        return self._judge(ctx.end, firing)

    def _observe(self, f: pl.DataFrame) -> None:
        g = f.group_by("qual").agg(
            pl.col("last").median().alias("v"),
            pl.col("ts").max().alias("ts"),
            pl.col("device").unique().sort().alias("hosts"),
        )
        for qual, v, ts, hosts in g.iter_rows():
            k = self.keys.setdefault(str(qual), _Key())
            k.recent.append((int(ts), float(v)))
            k.fresh = True
            k.hosts = sorted(set(k.hosts) | set(hosts))

    def _judge(self, end: int, firing: list[Mapping[str, str]]) -> list[Finding]:
        cfg = self.config
        out: list[Finding] = []
        for qual in list(self.keys):
            k = self.keys[qual]
            if not k.recent or end - k.recent[-1][0] > cfg.stale_s * S:
                del self.keys[qual]
                continue
            newest = k.recent[-1]
            fresh, k.fresh = k.fresh, False
            if not fresh and not k.active:
                continue
            k.recent = [r for r in k.recent if r[0] > newest[0] - round(cfg.window_s * S)]
            now = statistics.median(v for _, v in k.recent)
            if len(k.baseline) < cfg.min_baseline:
                if fresh:
                    k.baseline = [*k.baseline, newest[1]][-cfg.baseline_n :]
                continue
            base = statistics.median(k.baseline)
            if now < (1 - cfg.drop) * base:
                if not k.since:
                    k.since = newest[0]
                if not k.active and newest[0] - k.since >= cfg.hold_s * S:
                    k.active, k.fired_ts = True, newest[0]
                    k.evidence = (
                        f"bus bandwidth {now:.1f} GB/s (median of the last {cfg.window_s:g} s) "
                        f"against a baseline of {base:.1f} GB/s ({len(k.baseline)} "
                        f"observations): {100 * (1 - now / base):.0f} % lower, for "
                        f"{(newest[0] - k.since) / S:.1f} s (threshold {100 * cfg.drop:g} %)"
                    )
            else:
                k.since = 0
                if now >= (1 - cfg.drop / 2) * base:
                    k.active = False
            # back: its two newest observations at the baseline again (the window's median
            # would hold a recovered key for half a window more)
            back = (
                len(k.recent) >= 2 and min(v for _, v in k.recent[-2:]) >= (1 - cfg.drop / 2) * base
            )
            if k.active and back:
                k.active, k.since = False, 0
            if not k.active and not k.since and fresh:
                k.baseline = [*k.baseline, newest[1]][-cfg.baseline_n :]
            if k.active:
                out.append(self._finding(qual, k, firing))
        return out

    def _finding(self, qual: str, k: _Key, firing: list[Mapping[str, str]]) -> Finding:
        comm, _, rest = qual.partition("/")
        coll, _, size = rest.partition("/")
        labels = {"comm": comm, "collective": coll, "size": size}
        for h in k.hosts:
            jobs = self.topology.node_jobs.get(h)
            if jobs:
                labels["job"] = jobs[0]
                break
        cause, why = self._cause(comm, set(k.hosts), firing)
        return Finding(
            BUS_BANDWIDTH_DROP,
            labels,
            "warning",
            k.fired_ts,
            summary=f"NCCL {coll} of {size} B on communicator {comm}: bus bandwidth dropped",
            description=f"The communicator's {coll} at {size} B runs well below its own "
            f"bus bandwidth baseline on {len(k.hosts)} nodes. Cause: {cause}.",
            evidence=k.evidence,
            extra={"cause": cause, "cause_alert": why},
        )

    def _cause(
        self, comm: str, hosts: set[str], firing: list[Mapping[str, str]]
    ) -> tuple[str, str]:
        """A SlowRank of this communicator and the fabric alert on its NIC; else the first
        fabric alert (in ``CAUSES`` order) on one of its nodes; else unknown."""

        def say(a: Mapping[str, str]) -> str:
            return ", ".join(f"{x}={y}" for x, y in sorted(a.items()) if x != "alertname")

        slow = [a for a in firing if a.get("alertname") == SLOW_RANK and a.get("comm") == comm]
        for name in CAUSES:
            for a in firing:
                if a.get("alertname") != name:
                    continue
                if any(
                    a.get("node") == s.get("node") and a.get("nic") == s.get("nic") for s in slow
                ):
                    return name, say(a)
        if slow:
            return SLOW_RANK, say(slow[0])
        for name in CAUSES:
            for a in firing:
                if a.get("alertname") == name and a.get("node") in hosts:
                    return name, say(a)
        return "unknown", "no fabric alert on the communicator's nodes"


def build(
    topology: Topology, config: BusBandwidthDropConfig | None = None
) -> BusBandwidthDropDetector:
    return BusBandwidthDropDetector(topology, config or BusBandwidthDropConfig())


__all__ = ["BusBandwidthDropConfig", "BusBandwidthDropDetector", "build"]
