"""NCCL Inspector NDJSON (``plugins/profiler/inspector`` of NVIDIA/nccl) -> rocewatch samples.

Inspector writes one file per process (``<dir>/<host>-pid<pid>.log``), one JSON object a line.
Two layouts exist, and both are read:

- v4.0-v4.2: every operation line carries its own context,
  ``{"header": {...}, "metadata": {...}, "coll_perf": {...}}``.
- v4.3: each communicator dump starts with a ``dump_stats`` marker carrying ``header`` and
  ``metadata`` once, followed by exactly ``coll_records + p2p_records + proxy_records``
  one-key lines (``{"coll_perf": {...}}``) that belong to it (NVIDIA's
  ``inspector_json_reader.py`` restores the context the same way).

``header``: ``id`` (the communicator hash, as NCCL_DEBUG prints ``commId``), ``comm_name``,
``rank``, ``n_ranks``, ``nnodes``. ``metadata``: ``inspector_output_format_version``,
``dump_timestamp_us``, ``hostname``, ``pid``. ``coll_perf``: ``coll``, ``coll_algo``,
``coll_proto``, ``coll_sn``, ``coll_msg_size_bytes``, ``coll_exec_time_us``,
``coll_timing_source``, ``coll_algobw_gbs``, ``coll_busbw_gbs``; verbose mode
(``NCCL_INSPECTOR_DUMP_VERBOSE=1``) adds ``event_trace_ts`` with per-channel
``kernel_events`` (``channel_id``, ``kernel_start_ts``, ``kernel_stop_ts``, microseconds).

Samples (``rocewatch.core.model``): device the host (the topology's node name when the
hostname or its short form is one), port ``rank<r>``, qual ``<comm>/<coll>/<size>`` for
``nccl_coll_exec_us``, ``nccl_coll_busbw_gbs`` and ``nccl_coll_algobw_gbs``; and, from verbose
records joined across the ranks of one communicator by ``coll_sn`` (``CollJoin``), one
``nccl_kernel_start_lag_us`` per rank (qual ``<comm>``): its kernel start (the median of its
channels') less the median of all ranks' starts for that collective. A line that is not JSON,
a record without its context, a v4.3 payload beyond its marker's counts: counted, skipped.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
import polars as pl

from rocewatch.core.model import SAMPLE_SCHEMA, empty_samples
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology

log = logging.getLogger(__name__)

US = 1000  # ns per microsecond
OPS = ("coll_perf", "p2p_perf", "proxy_trace")


@dataclass(frozen=True)
class RankStart:
    """One rank's kernel start for one collective (verbose records only)."""

    host: str
    rank: int
    start_us: float  # median of its channels' kernel_start_ts
    late_channel: int  # the channel that started last
    late_channel_us: float


@dataclass
class _Pending:
    n_ranks: int
    starts: dict[int, RankStart] = field(default_factory=dict)


class CollJoin:
    """Joins the ranks of one communicator by ``coll_sn`` into per-rank start lags.

    A collective is complete when every one of its ``n_ranks`` reported it. One still
    incomplete once every rank of its communicator reported a collective ``horizon`` sequence
    numbers further is given up (those ranks lost it: Inspector's ring overwrote it): its lags
    are emitted if at least half the ranks (and 3) reported, and it is counted
    (``nccl_partial_collectives``) either way. Ranks are followed by sequence number, not by
    arrival, so files read one after another (a recording) or each at its own dump cadence
    (live) join alike. At most ``max_pending`` collectives wait; past that the oldest is
    given up.
    """

    def __init__(self, stats: Stats, horizon: int = 8, max_pending: int = 100_000) -> None:
        self.stats = stats
        self.horizon = horizon
        self.max_pending = max_pending
        self.pending: dict[tuple[str, int], _Pending] = {}
        self.rank_sn: dict[str, dict[int, int]] = {}  # comm -> rank -> newest coll_sn
        self.low: dict[str, int] = {}  # comm -> the sn every rank has reached

    def add(self, comm: str, sn: int, n_ranks: int, start: RankStart) -> list[tuple[str, int]]:
        key = (comm, sn)
        done: list[tuple[str, int]] = []
        p = self.pending.get(key)
        if p is None:
            if len(self.pending) >= self.max_pending:
                self.stats.inc("nccl_pending_over_limit")
                done.append(next(iter(self.pending)))  # the oldest waiting
            p = self.pending[key] = _Pending(n_ranks)
        p.starts[start.rank] = start
        if len(p.starts) >= p.n_ranks:
            done.append(key)
        ranks = self.rank_sn.setdefault(comm, {})
        if sn > ranks.get(start.rank, -1):
            ranks[start.rank] = sn
            if len(ranks) >= n_ranks:
                low = min(ranks.values())
                if low > self.low.get(comm, -1):
                    self.low[comm] = low
                    done += [
                        k
                        for k in self.pending
                        if k[0] == comm and k[1] < low - self.horizon and k not in done
                    ]
        return done

    def flush(self) -> list[tuple[str, int]]:
        """Every collective still waiting (the end of a recording)."""
        return list(self.pending)

    def take(self, key: tuple[str, int]) -> dict[int, RankStart] | None:
        p = self.pending.pop(key, None)
        if p is None:  # given up already
            return None
        if len(p.starts) < p.n_ranks:
            self.stats.inc("nccl_partial_collectives")
            if len(p.starts) < max(3, (p.n_ranks + 1) // 2):
                return None
        return p.starts


class DumpContext:
    """The v4.3 marker context of one file (never carried from one file to another)."""

    def __init__(self) -> None:
        self.header: dict[str, Any] | None = None
        self.metadata: dict[str, Any] | None = None
        self.remaining: dict[str, int] = {}

    def restore(self, rec: dict[str, Any], stats: Stats) -> dict[str, Any] | None:
        """The record with its header and metadata, or None (counted) when it has none."""
        if "dump_stats" in rec:
            if any(self.remaining.values()):
                stats.inc("nccl_truncated_dumps")  # the previous dump lost lines
            self.header = self.metadata = None
            self.remaining = {}
            hdr, meta, ds = rec.get("header"), rec.get("metadata"), rec.get("dump_stats")
            if isinstance(hdr, dict) and isinstance(meta, dict) and isinstance(ds, dict):
                self.header, self.metadata = hdr, meta
                counts = {
                    "coll_perf": ds.get("coll_records", 0),
                    "p2p_perf": ds.get("p2p_records", 0),
                    "proxy_trace": ds.get("proxy_records", 0),
                }
                if all(type(n) is int and n >= 0 for n in counts.values()):
                    self.remaining = counts
                else:
                    stats.inc("nccl_malformed_records", detail="dump_stats counts")
            else:
                stats.inc("nccl_malformed_records", detail="dump_stats without context")
            return rec
        if "header" in rec and "metadata" in rec:  # v4.0-v4.2: self-contained
            return rec
        if self.header is not None and len(rec) == 1:
            kind = next(iter(rec))
            if self.remaining.get(kind, 0) > 0:
                self.remaining[kind] -= 1
                return {"header": self.header, "metadata": self.metadata, **rec}
        stats.inc("nccl_orphan_records")  # a payload past its marker, or with none
        return None


def ns_of_us(us: float) -> int:
    """Microseconds since the epoch (a float, maybe with a fraction) -> exact nanoseconds.

    >>> ns_of_us(1795946405500000.5)
    1795946405500000500
    """
    whole = int(us)
    return whole * US + round((us - whole) * US)


def node_of(topology: Topology | None, hostname: str) -> str:
    """The topology's node for a hostname (as is, or its short form); else the hostname."""
    if topology is None or hostname in topology.nodes:
        return hostname
    short = hostname.split(".", 1)[0]
    return short if short in topology.nodes else hostname


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x)


@dataclass
class RankInfo:
    """What an Inspector record says of its rank (the join takes it)."""

    host: str
    pid: int | None
    comm: str
    comm_name: str
    rank: int
    n_ranks: int


class InspectorDecoder:
    """Inspector lines of one or more files -> sample frames (see the module docstring).

    Feed each file's complete lines with ``lines(key, lines)`` (``key`` names the file: its
    marker context is its own); read samples from ``frame()``. ``ranks`` collects what the
    records say of each (comm, rank): host and pid, for the join.
    """

    def __init__(
        self, topology: Topology | None = None, stats: Stats | None = None, horizon: int = 8
    ) -> None:
        self.topology = topology
        self.stats = stats or Stats()
        self.join = CollJoin(self.stats, horizon=horizon)
        self.ctx: dict[str, DumpContext] = {}
        self.ranks: dict[tuple[str, int], RankInfo] = {}
        self.records = 0
        # a dump that holds records older than this (s) suggests dumps only at teardown
        self.teardown_gap_s = 60.0
        self.teardown_warned = False
        self._cols: dict[str, list[Any]] = {k: [] for k in SAMPLE_SCHEMA}

    def forget(self, key: str) -> None:
        """A file that was truncated or replaced: its context starts again."""
        self.ctx.pop(key, None)

    def lines(self, key: str, lines: Iterable[bytes]) -> None:
        ctx = self.ctx.setdefault(key, DumpContext())
        for line in lines:
            line = line.strip()
            if not line:
                continue
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                self.stats.inc("nccl_malformed_lines", detail=key)
                continue
            if not isinstance(rec, dict):
                self.stats.inc("nccl_malformed_lines", detail=key)
                continue
            full = ctx.restore(rec, self.stats)
            if full is None or "coll_perf" not in full:
                continue  # a marker, a p2p or proxy record: not read (yet)
            self._coll(full)

    def _coll(self, rec: dict[str, Any]) -> None:
        hdr, meta, cp = rec.get("header"), rec.get("metadata"), rec.get("coll_perf")
        if not (isinstance(hdr, dict) and isinstance(meta, dict) and isinstance(cp, dict)):
            self.stats.inc("nccl_malformed_records", detail="coll_perf shape")
            return
        comm, rank, n_ranks = hdr.get("id"), hdr.get("rank"), hdr.get("n_ranks")
        host, sn = meta.get("hostname"), cp.get("coll_sn")
        dump_us = _num(meta.get("dump_timestamp_us"))
        if not (
            isinstance(comm, str)
            and type(rank) is int
            and type(n_ranks) is int
            and isinstance(host, str)
            and type(sn) is int
            and dump_us is not None
        ):
            self.stats.inc("nccl_malformed_records", detail="coll_perf fields")
            return
        self.records += 1
        node = node_of(self.topology, host)
        pid = meta.get("pid") if type(meta.get("pid")) is int else None
        name = hdr.get("comm_name") if isinstance(hdr.get("comm_name"), str) else ""
        self.ranks[(comm, rank)] = RankInfo(node, pid, comm, str(name), rank, n_ranks)
        trace = cp.get("event_trace_ts")
        starts: list[tuple[float, int]] = []
        if isinstance(trace, dict) and isinstance(trace.get("kernel_events"), list):
            for ev in trace["kernel_events"]:
                if isinstance(ev, dict):
                    t = _num(ev.get("kernel_start_ts"))
                    ch = ev.get("channel_id")
                    if t is not None and t > 0 and type(ch) is int:
                        starts.append((t, ch))
        # the operation's own time when verbose, else the dump's
        t_us = statistics.median(t for t, _ in starts) if starts else dump_us
        ts = ns_of_us(t_us)
        port = f"rank{rank}"
        qual = f"{comm}/{cp.get('coll', '?')}/{cp.get('coll_msg_size_bytes', '?')}"
        for metric, key in (
            ("nccl_coll_exec_us", "coll_exec_time_us"),
            ("nccl_coll_busbw_gbs", "coll_busbw_gbs"),
            ("nccl_coll_algobw_gbs", "coll_algobw_gbs"),
        ):
            v = _num(cp.get(key))
            if v is not None:
                self._row(ts, node, port, qual, metric, v)
        if not starts:
            return
        if not self.teardown_warned and dump_us - t_us > self.teardown_gap_s * 1e6:
            self.teardown_warned = True
            log.warning(
                "NCCL Inspector on %s dumped a collective %.0f s after it ran: it seems to "
                "dump only at teardown; set NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS "
                "(e.g. 1000000) for live detection",
                host,
                (dump_us - t_us) / 1e6,
            )
        last_t, last_ch = max(starts)
        start = RankStart(node, rank, t_us, last_ch, last_t - t_us)
        for done in self.join.add(comm, sn, n_ranks, start):
            self._emit(done)

    def _emit(self, key: tuple[str, int]) -> None:
        starts = self.join.take(key)
        if not starts:
            return
        med = statistics.median(s.start_us for s in starts.values())
        ts = ns_of_us(med)
        for s in starts.values():
            self._row(
                ts, s.host, f"rank{s.rank}", key[0], "nccl_kernel_start_lag_us", s.start_us - med
            )

    def finish(self) -> None:
        """The end of the input: collectives still waiting are judged with what came."""
        for key in self.join.flush():
            self._emit(key)

    def _row(self, ts: int, device: str, port: str, qual: str, metric: str, v: float) -> None:
        c = self._cols
        c["ts"].append(ts)
        c["device"].append(device)
        c["port"].append(port)
        c["qual"].append(qual)
        c["metric"].append(metric)
        c["value"].append(v)
        c["raw"].append(None)

    def frame(self) -> pl.DataFrame:
        """The samples decoded since the last call, sorted by time."""
        if not self._cols["ts"]:
            return empty_samples()
        df = pl.DataFrame(self._cols, schema=SAMPLE_SCHEMA).sort("ts")
        self._cols = {k: [] for k in SAMPLE_SCHEMA}
        return df


def dump_interval_warning(env: dict[str, str]) -> str | None:
    """Why an Inspector environment gives rocewatch nothing until the job ends, or None.

    >>> dump_interval_warning({"NCCL_INSPECTOR_ENABLE": "1"}) is not None
    True
    >>> dump_interval_warning({"NCCL_INSPECTOR_ENABLE": "1",
    ...     "NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS": "1000000"}) is None
    True
    """
    if env.get("NCCL_INSPECTOR_ENABLE") != "1":
        return "NCCL_INSPECTOR_ENABLE is not 1: Inspector writes nothing"
    if env.get("NCCL_INSPECTOR_DUMP_THREAD_ENABLE", "1") == "0":
        return "NCCL_INSPECTOR_DUMP_THREAD_ENABLE=0: Inspector dumps only at teardown"
    raw = env.get("NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS", "-1").strip()
    try:
        iv = int(raw)
    except ValueError:
        return f"NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS={raw!r} is not a number"
    if iv < 0:
        return (
            "NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS is -1 (the default): Inspector "
            "dumps only at communicator teardown, so rocewatch sees the job when it ends"
        )
    return None
