"""A recorded job directory (``nccl/<job>/`` of a replay scenario) as one sample source.

The directory holds Inspector's files exactly as NCCL wrote them (``<host>-pid<pid>.log``)
and ``debug/<host>.log``, the job's ``NCCL_DEBUG=INFO`` output on each host (CONTRACTS.md
section 5), and, where the job ran google/CoMMA, ``comma/<host>.jsonl``: its OTLP/JSON exports
(per-edge latency) as an OTel collector's file exporter writes them. The debug logs are read
first (they only build the join); then each Inspector file, in the order of its first dump,
each followed by the join's ``nccl_rank_gpu`` samples at that file's first time (so a
restarted job's new map takes over from when it started); then the CoMMA exports.
Samples are handed out in time order, ``chunk_rows`` at a time, like the other recorded
sources (``rocewatch.sources``).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import polars as pl

from collector.nccl.comma import CommaDecoder
from collector.nccl.debug import DebugLog
from collector.nccl.inspector import InspectorDecoder
from collector.nccl.join import RankJoin
from rocewatch.core.model import empty_samples
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology


def _first_dump_us(path: Path) -> float:
    """The first ``dump_timestamp_us`` of a file (inf when it has none)."""
    with path.open("rb") as fh:
        for line in fh:
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            meta = rec.get("metadata") if isinstance(rec, dict) else None
            if isinstance(meta, dict) and isinstance(meta.get("dump_timestamp_us"), int | float):
                return float(meta["dump_timestamp_us"])
    return float("inf")


def read_job(
    directory: Path, topology: Topology | None, stats: Stats
) -> tuple[pl.DataFrame, RankJoin]:
    """Every sample of one recorded job, sorted by time, and its join."""
    job = directory.name
    debug = DebugLog(stats)
    for p in sorted((directory / "debug").glob("*.log")):
        debug.read(str(p))
    dec = InspectorDecoder(topology, stats)
    join = RankJoin(topology)
    frames: list[pl.DataFrame] = []
    files = sorted(directory.glob("*.log"), key=lambda p: (_first_dump_us(p), p.name))
    for path in files:
        dec.ranks = {}
        with path.open("rb") as fh:
            dec.lines(path.name, fh)
        df = dec.frame()
        if dec.ranks:
            join.update(job, dec.ranks, debug)
            t0 = int(df["ts"].min()) if df.height else 0  # type: ignore[arg-type]
            frames.append(join.samples(t0).filter(pl.col("ts") > 0))
        frames.append(df)
    dec.finish()
    frames.append(dec.frame())
    # CoMMA's OTLP/JSON exports, when the job ran it (``comma/<host>.jsonl``)
    comma = CommaDecoder(topology, stats)
    for p in sorted((directory / "comma").glob("*.jsonl")):
        with p.open("rb") as fh:
            frames.append(comma.lines(fh))
    frames = [f for f in frames if f.height]
    out = pl.concat(frames, how="vertical").sort("ts") if frames else empty_samples()
    return out, join


class NcclJobSource:
    """``read_job`` as a source that ``rocewatch.sources.merged`` merges with the others."""

    def __init__(
        self,
        directory: Path,
        topology: Topology,
        stats: Stats,
        chunk_rows: int = 20_000,
        guard: object | None = None,
    ) -> None:
        self.name = f"nccl/{directory.name}"
        self.stats = stats
        self.guard = guard
        self.bytes_total = sum(
            p.stat().st_size for p in directory.rglob("*") if p.suffix in (".log", ".jsonl")
        )
        self._rows, self.join = read_job(directory, topology, stats)
        self._at = 0
        self.chunk_rows = chunk_rows
        self.hi: int | None = None
        self.done = False

    def position(self) -> int:
        n = self._rows.height
        return self.bytes_total if self.done or not n else self.bytes_total * self._at // n

    def next(self) -> pl.DataFrame | None:
        if self.done:
            return None
        if self._at >= self._rows.height:
            self.done = True
            return None
        df = self._rows.slice(self._at, self.chunk_rows)
        self._at += df.height
        filt = getattr(self.guard, "filter", None)
        if filt is not None:
            df = filt(df)
        if df.height:
            m = int(df["ts"].max())  # type: ignore[arg-type]
            self.hi = m if self.hi is None else max(self.hi, m)
        return df

    def close(self) -> None:
        self.done = True
