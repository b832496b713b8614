"""SlowRank: an NCCL rank whose kernels start late for the same collective, persistently.

Ranks of a collective finish together (each waits for the others), so a culprit does not show
as a longer collective of its own but as a late start: for the same ``coll_sn`` its kernels
start after its peers'. The NCCL collector joins the ranks of each communicator by
``coll_sn`` and sends, per rank and collective, ``nccl_kernel_start_lag_us``: its kernel
start less the median of its communicator's (collector/nccl/inspector.py). A rank is late in
a collective when its lag is at least ``min_lag_us`` and ``spread_k`` times the
communicator's typical lag (the median absolute lag of its ranks in that step), so a noisy
communicator needs more. It is a SlowRank when, over the last ``window_s`` of telemetry time,
at least ``min_collectives`` of its collectives were seen, ``late_share`` of them late, and
the late ones span ``hold_s`` or more. It resolves when the share falls below half that, or
when the rank reports nothing for ``stale_s``.

The alert names the rank, its host, GPU and NIC (the join, sent as ``nccl_rank_gpu``
samples, whose qual is ``<comm>/<nic>``), and says the cause: a fabric alert firing on that
NIC or its switch port (``StepContext.firing``: PCIeDowngrade, FlakyLink, a PFC storm that
pauses it, Straggler, TransportErrors) is named in the ``cause`` annotation, which follows
the alerts while it fires; with none, the cause is "host or GPU side". It is a warning and
no drain follows unless the policy's ``drain_on`` names it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import polars as pl

from detectors.base import Finding, StepContext, check_positive_numbers, node_labels
from rocewatch.core.model import (
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
LAG = "nccl_kernel_start_lag_us"
JOIN = "nccl_rank_gpu"
HOST_SIDE = "host or GPU side"
MAX_PLACES = 200_000  # ranks whose place (GPU, NIC) is remembered
# fabric alerts that explain a late rank, and how the cause reads
CAUSES = {
    PCIE_DOWNGRADE: "PCIe downgrade",
    FLAKY_LINK: "flaky link",
    PFC_STORM: "PFC storm",
    STRAGGLER: "NIC straggler",
    TRANSPORT_ERRORS: "RoCE transport errors",
}


@dataclass(frozen=True)
class SlowRankConfig:
    enabled: bool = True
    min_lag_us: float = 50.0  # a late start smaller than this is noise (clock sync, launch)
    spread_k: float = 5.0  # and this many times the communicator's typical lag
    window_s: float = 5.0  # judged over the rank's collectives of the last this many seconds
    hold_s: float = 3.0  # its late collectives span at least this long
    late_share: float = 0.8  # share of its collectives in the window that started late
    min_collectives: int = 5  # collectives in the window before it is judged
    stale_s: float = 30.0  # forget a rank that reported nothing for this long

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_positive_numbers(self, "slow_rank")


@dataclass
class _Rank:
    seen: list[tuple[int, int, int, float]] = field(default_factory=list)  # ts, n, late, lag
    active: bool = False
    fired_ts: int = 0
    evidence: str = ""


@dataclass
class SlowRankDetector(Stateful):
    topology: Topology
    config: SlowRankConfig = field(default_factory=SlowRankConfig)
    name: str = "slow_rank"
    STATE_TYPES: ClassVar[tuple[type, ...]] = (_Rank,)
    reads: ClassVar[frozenset[str]] = frozenset({LAG, JOIN})

    @property
    def window_s(self) -> float:
        return 0.0  # reads the newest step only; keeps its own history

    def __post_init__(self) -> None:
        self.ranks: dict[tuple[str, str, str], _Rank] = {}  # (host, "rank<r>", comm)
        self.places: dict[tuple[str, str, str], tuple[int, str, int]] = {}  # -> gpu, nic, ts

    def evaluate(self, ctx: StepContext) -> list[Finding]:
        cur = ctx.engine.current()
        if cur is None:
            return []
        self._join(cur.get(JOIN))
        lag = cur.get(LAG)
        if lag.height:
            self._observe(lag)
        return self._judge(ctx)

    def _join(self, f: pl.DataFrame) -> None:
        for dev, port, qual, v, ts in f.select("device", "port", "qual", "last", "ts").iter_rows():
            comm, _, nic = str(qual).partition("/")
            key = (str(dev), str(port), comm)
            old = self.places.get(key)
            if old is None or int(ts) >= old[2]:
                self.places[key] = (int(v), nic, int(ts))
        if len(self.places) > MAX_PLACES:  # ranks of long-gone jobs: keep the newest
            keep = sorted(self.places.items(), key=lambda kv: kv[1][2])[-MAX_PLACES // 2 :]
            self.places = dict(keep)

    def _observe(self, lag: pl.DataFrame) -> None:
        cfg = self.config
        rows = lag.select("device", "port", "qual", "min", "max", "n", "ts").rows()
        by_comm: dict[str, list[float]] = {}
        for _d, _p, comm, lo, hi, _n, _t in rows:
            by_comm.setdefault(comm, []).append(abs(float(lo + hi) / 2))
        typical = {c: statistics.median(v) for c, v in by_comm.items()}
        for dev, port, comm, lo, hi, n, ts in rows:
            thr = max(cfg.min_lag_us, cfg.spread_k * typical[comm])
            n = int(n)
            late = n if float(lo) >= thr else (1 if float(hi) >= thr else 0)
            st = self.ranks.setdefault((dev, port, comm), _Rank())
            st.seen.append((int(ts), n, late, float(hi)))

    def _judge(self, ctx: StepContext) -> list[Finding]:
        cfg = self.config
        out: list[Finding] = []
        firing = list(ctx.firing()) if ctx.firing is not None else []
        for key in list(self.ranks):
            st = self.ranks[key]
            # the window ends at its newest row, not at the step: job telemetry may come a
            # job lateness after its time (detectors/job_lane.py)
            newest = st.seen[-1][0] if st.seen else ctx.end
            st.seen = [s for s in st.seen if s[0] > newest - round(cfg.window_s * S)]
            if not st.seen or ctx.end - st.seen[-1][0] > cfg.stale_s * S:
                del self.ranks[key]
                continue
            n = sum(s[1] for s in st.seen)
            late = [s for s in st.seen if s[2]]
            share = sum(s[2] for s in st.seen) / n if n else 0.0
            span = (late[-1][0] - late[0][0]) / S if late else 0.0
            if not st.active:
                if n >= cfg.min_collectives and share >= cfg.late_share and span >= cfg.hold_s:
                    st.active, st.fired_ts = True, late[-1][0]
                    lags = sorted(s[3] for s in late)
                    st.evidence = (
                        f"{key[1]} of communicator {key[2]} on {key[0]}: kernels started late "
                        f"in {sum(s[2] for s in st.seen)} of {n} collectives over "
                        f"{span:.1f} s (median lag {statistics.median(lags):.0f} us, max "
                        f"{lags[-1]:.0f} us; threshold {cfg.min_lag_us:g} us and "
                        f"{cfg.spread_k:g}x the communicator's spread)"
                    )
            elif share < cfg.late_share / 2:
                st.active = False
            if st.active:
                out.append(self._finding(key, st, firing))
        return out

    def _finding(
        self, key: tuple[str, str, str], st: _Rank, firing: list[Mapping[str, str]]
    ) -> Finding:
        host, port, comm = key
        gpu, nic, _ = self.places.get(key, (-1, "", 0))
        labels = node_labels(self.topology, host, nic or None)
        labels.update(rank=port.removeprefix("rank"), comm=comm)
        if gpu >= 0:
            labels["gpu"] = str(gpu)
        cause, why = self._cause(host, nic, firing)
        where = f"{host} GPU {gpu if gpu >= 0 else '?'} NIC {nic or '?'}"
        return Finding(
            SLOW_RANK,
            labels,
            "warning",
            st.fired_ts,
            summary=f"NCCL {port} on {host} starts its collectives late ({cause})",
            description=f"Rank {port.removeprefix('rank')} of communicator {comm} ({where}) "
            "starts its kernels after its peers for the same collectives, so every "
            f"collective of the job waits for it. Cause: {cause}.",
            evidence=st.evidence,
            extra={"cause": cause, "cause_alert": why},
        )

    def _cause(self, host: str, nic: str, firing: list[Mapping[str, str]]) -> tuple[str, str]:
        """The fabric alert on the rank's NIC or its switch port, else the host side."""
        sp = None
        n = self.topology.nodes.get(host)
        if n is not None and nic:
            sp = next((x.switch_port for x in n.nics if x.nic == nic), None)
        for a in firing:
            name = a.get("alertname", "")
            if name not in CAUSES:
                continue
            on_nic = a.get("node") == host and (not nic or a.get("nic") in (None, nic))
            on_port = sp is not None and a.get("switch") == sp.switch and a.get("port") == sp.port
            if on_nic or on_port:
                role = f" ({a['role']})" if a.get("role") else ""
                return name, f"{CAUSES[name]}{role}: " + ", ".join(
                    f"{k}={v}" for k, v in sorted(a.items()) if k != "alertname"
                )
        return HOST_SIDE, "no fabric alert on the rank's NIC or its switch port"


def build(topology: Topology, config: SlowRankConfig | None = None) -> SlowRankDetector:
    return SlowRankDetector(topology, config or SlowRankConfig())


__all__ = ["HOST_SIDE", "SlowRankConfig", "SlowRankDetector", "build"]
