"""SlowEdge: one send/receive edge of an NCCL communicator persistently slower than its others.

google/CoMMA exports, per communicator, the latency of each network edge (source rank ->
destination rank): ``nccl.net.send.latency`` from the sender's process and
``nccl.net.recv.latency`` from the receiver's (collector/nccl/comma.py turns each export into
the mean over its interval: ``nccl_net_send_latency_ns`` / ``nccl_net_recv_latency_ns``, port
``rank<src>->rank<dst>``, qual the communicator). A culprit that asks for no pause and starts
its kernels on time (a link that retransmits, a NIC whose PCIe link trained down) shows there:
its edges take longer than the communicator's other edges moving the same collectives.

Per communicator and direction, each export is judged against the median of the
communicator's other edges in the same step: the edge is slow when its latency is at least
``ratio`` times that median and ``min_excess_us`` above it (``min_edges`` edges needed to
compare). An edge is a SlowEdge when, over the last ``window_s`` of telemetry time, at least
``min_points`` of its exports were seen, ``slow_share`` of them slow, the slow ones spanning
``hold_s``; it resolves below half that share, or after ``stale_s`` of silence. The window is
counted in exports, not steps, so a slow export cadence (CoMMA's interval is configurable)
only needs a longer ``window_s``.

The alert names both ranks, their hosts, GPUs and NICs (the join's ``nccl_rank_gpu``
samples), and says the cause: the fabric alerts firing on the path between the two NICs (both
NICs, their leaf ports, and the uplinks of the spines that join their leaves:
rocewatch/core/paths.py); with none, the cause is "unknown". It is a warning; no drain follows
unless the policy's ``drain_on`` names it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import polars as pl

from detectors.base import Finding, StepContext, check_positive_numbers, node_labels
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import SLOW_EDGE
from rocewatch.core.paths import Path, alerts_on, nic_path, path_between, say
from rocewatch.core.state import Stateful
from rocewatch.core.topology import Topology

S = 1_000_000_000
SEND = "nccl_net_send_latency_ns"
RECV = "nccl_net_recv_latency_ns"
JOIN = "nccl_rank_gpu"
UNKNOWN = "unknown"
MAX_PLACES = 200_000  # ranks whose place (host, GPU, NIC) is remembered


@dataclass(frozen=True)
class SlowEdgeConfig:
    enabled: bool = True
    ratio: float = 1.5  # an edge this many times the communicator's median edge is slow
    min_excess_us: float = 5.0  # and at least this much above it
    min_edges: int = 4  # edges of the communicator (same direction) needed to compare
    window_s: float = 5.0  # judged over the edge's exports of the last this many seconds
    hold_s: float = 3.0  # its slow exports span at least this long
    slow_share: float = 0.8  # share of its exports in the window that were slow
    min_points: int = 3  # exports in the window before it is judged
    stale_s: float = 120.0  # forget an edge that reported nothing for this long

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_positive_numbers(self, "slow_edge")
        if self.ratio <= 1:
            raise ConfigError(f"slow_edge: ratio: must be > 1, not {self.ratio!r}")


@dataclass
class _Edge:
    seen: list[tuple[int, int, float, float]] = field(default_factory=list)  # ts, slow, ns, med
    active: bool = False
    fired_ts: int = 0
    evidence: str = ""
    dst_named: bool = False  # the alert's node/nic name the destination's end (see _suspect)


@dataclass
class SlowEdgeDetector(Stateful):
    topology: Topology
    config: SlowEdgeConfig = field(default_factory=SlowEdgeConfig)
    name: str = "slow_edge"
    STATE_TYPES: ClassVar[tuple[type, ...]] = (_Edge,)
    reads: ClassVar[frozenset[str]] = frozenset({SEND, RECV, JOIN})

    @property
    def window_s(self) -> float:
        return 0.0  # reads the newest step only; keeps its own history

    def __post_init__(self) -> None:
        self.edges: dict[tuple[str, int, int], _Edge] = {}  # (comm, src, dst)
        self.places: dict[tuple[str, int], tuple[str, int, str, int]] = {}  # -> host, gpu, nic, ts

    def evaluate(self, ctx: StepContext) -> list[Finding]:
        cur = ctx.engine.current()
        if cur is None:
            return []
        self._join(cur.get(JOIN))
        for metric in (SEND, RECV):
            f = cur.get(metric)
            if f.height:
                self._observe(f)
        return self._judge(ctx)

    def _join(self, f: pl.DataFrame) -> None:
        for dev, port, qual, v, ts in f.select("device", "port", "qual", "last", "ts").iter_rows():
            comm, _, nic = str(qual).partition("/")
            rank = _rank(str(port))
            if rank is None:
                continue
            old = self.places.get((comm, rank))
            if old is None or int(ts) >= old[3]:
                self.places[(comm, rank)] = (str(dev), int(v), nic, int(ts))
        if len(self.places) > MAX_PLACES:  # ranks of long-gone jobs: keep the newest
            keep = sorted(self.places.items(), key=lambda kv: kv[1][3])[-MAX_PLACES // 2 :]
            self.places = dict(keep)

    def _observe(self, f: pl.DataFrame) -> None:
        cfg = self.config
        by_comm: dict[str, list[tuple[int, int, float, int]]] = {}
        for port, comm, v, ts in f.select("port", "qual", "last", "ts").iter_rows():
            src, _, dst = str(port).partition("->")
            s, d = _rank(src), _rank(dst)
            if s is None or d is None or v is None:
                continue
            by_comm.setdefault(str(comm), []).append((s, d, float(v), int(ts)))
        for comm, rows in by_comm.items():
            if len(rows) < cfg.min_edges:
                continue
            values = [r[2] for r in rows]
            for i, (s, d, v, ts) in enumerate(rows):
                med = statistics.median(values[:i] + values[i + 1 :])
                slow = v >= cfg.ratio * med and v - med >= cfg.min_excess_us * 1000
                st = self.edges.setdefault((comm, s, d), _Edge())
                st.seen.append((ts, int(slow), v, med))

    def _judge(self, ctx: StepContext) -> list[Finding]:
        cfg = self.config
        out: list[Finding] = []
        firing = list(ctx.firing()) if ctx.firing is not None else []
        for key in list(self.edges):
            st = self.edges[key]
            # the window ends at its newest row, not at the step: job telemetry may come a
            # job lateness after its time (detectors/job_lane.py)
            newest = st.seen[-1][0] if st.seen else ctx.end
            st.seen = [s for s in st.seen if s[0] > newest - round(cfg.window_s * S)]
            if not st.seen or ctx.end - st.seen[-1][0] > cfg.stale_s * S:
                del self.edges[key]
                continue
            n = len(st.seen)
            slow = [s for s in st.seen if s[1]]
            share = len(slow) / n
            span = (slow[-1][0] - slow[0][0]) / S if slow else 0.0
            if not st.active:
                if n >= cfg.min_points and share >= cfg.slow_share and span >= cfg.hold_s:
                    st.active, st.fired_ts = True, slow[-1][0]
                    st.dst_named = self._suspect(key, firing) == key[2]
                    comm, s, d = key
                    lat = statistics.median(x[2] for x in slow) / 1000
                    med = statistics.median(x[3] for x in slow) / 1000
                    st.evidence = (
                        f"edge rank{s} -> rank{d} of communicator {comm}: slow in {len(slow)} "
                        f"of {n} latency exports over {span:.1f} s (median {lat:.1f} us "
                        f"against {med:.1f} us for the communicator's other edges; threshold "
                        f"{cfg.ratio:g}x and +{cfg.min_excess_us:g} us)"
                    )
            elif share < cfg.slow_share / 2:
                st.active = False
            if st.active:
                out.append(self._finding(key, st, firing))
        return out

    def _suspect(self, key: tuple[str, int, int], firing: list[Mapping[str, str]]) -> int:
        """The end of a slow edge its alert is about: the one whose NIC has a fabric alert,
        else the one more of the communicator's slow edges touch (a slow NIC slows its send and
        its receive edge), else the source."""
        comm, src, dst = key
        for r in (src, dst):
            host, _, nic = self._place(comm, r)
            if host and nic and alerts_on(nic_path(self.topology, host, nic), firing):
                return r
        touch = {src: 0, dst: 0}
        for (c, s, d), e in self.edges.items():
            if c == comm and (e.active or (e.seen and e.seen[-1][1])):
                for r in (s, d):
                    if r in touch:
                        touch[r] += 1
        return dst if touch[dst] > touch[src] else src

    def _place(self, comm: str, rank: int) -> tuple[str, int, str]:
        host, gpu, nic, _ = self.places.get((comm, rank), ("", -1, "", 0))
        return host, gpu, nic

    def path(self, comm: str, src: int, dst: int) -> Path:
        """The fabric between the two ranks' NICs (what the join knows of it)."""
        (h1, _, n1), (h2, _, n2) = self._place(comm, src), self._place(comm, dst)
        if h1 and n1 and h2 and n2:
            return path_between(self.topology, (h1, n1), (h2, n2))
        p = Path()
        for h, n in ((h1, n1), (h2, n2)):
            if h and n:
                p = p | nic_path(self.topology, h, n)
        return p

    def _finding(
        self, key: tuple[str, int, int], st: _Edge, firing: list[Mapping[str, str]]
    ) -> Finding:
        comm, src, dst = key
        h1, g1, n1 = self._place(comm, src)
        h2, g2, n2 = self._place(comm, dst)
        # node/nic: the suspect end (``_suspect``), peer_node/peer_nic: the other
        (hs, ns), (hp, np_) = ((h2, n2), (h1, n1)) if st.dst_named else ((h1, n1), (h2, n2))
        labels = node_labels(self.topology, hs, ns or None) if hs else {}
        labels.update(comm=comm, src_rank=str(src), dst_rank=str(dst))
        if hp:
            labels["peer_node"] = hp
        if np_:
            labels["peer_nic"] = np_
        path = self.path(comm, src, dst)
        on_path = alerts_on(path, firing)
        cause = on_path[0]["alertname"] if on_path else UNKNOWN
        why = "; ".join(say(a) for a in on_path[:5]) or "no fabric alert on the path"

        def where(h: str, g: int, n: str) -> str:
            return f"{h or '?'} GPU {g if g >= 0 else '?'} NIC {n or '?'}"

        return Finding(
            SLOW_EDGE,
            labels,
            "warning",
            st.fired_ts,
            summary=f"NCCL edge rank{src} -> rank{dst} of {comm} is slow ({cause})",
            description=f"Traffic from rank {src} ({where(h1, g1, n1)}) to rank {dst} "
            f"({where(h2, g2, n2)}) of communicator {comm} takes persistently longer than the "
            f"communicator's other edges. Cause: {cause}.",
            evidence=st.evidence,
            extra={
                "cause": cause,
                "cause_alert": why,
                "path_nics": ", ".join(f"{h}/{n}" for h, n in sorted(path.nics)),
                "path_ports": ", ".join(sorted(str(p) for p in path.ports)),
            },
        )


def _rank(port: str) -> int | None:
    r = port.removeprefix("rank")
    return int(r) if r.isdigit() and r != port else None


def build(topology: Topology, config: SlowEdgeConfig | None = None) -> SlowEdgeDetector:
    return SlowEdgeDetector(topology, config or SlowEdgeConfig())


__all__ = ["UNKNOWN", "SlowEdgeConfig", "SlowEdgeDetector", "build"]
