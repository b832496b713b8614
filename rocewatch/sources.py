"""Sources of sample batches: recorded files now; live collectors plug in the same way."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, cast

import polars as pl

from collector.decode import GnmicEventDecoder, NicSnapshotDecoder
from detectors.clock_guard import ClockGuard
from detectors.windows import WindowConfig
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology

MAX_LINE_BYTES = 4 << 20  # a longer line is garbage, not telemetry


class LineFileSource:
    """A JSON-lines file decoded chunk by chunk; ``hi`` is the newest time read so far."""

    def __init__(
        self,
        path: Path,
        decode: Callable[[list[bytes]], pl.DataFrame],
        stats: Stats,
        chunk_lines: int = 20_000,
        guard: ClockGuard | None = None,
    ) -> None:
        self.path = path
        self.name = path.name
        self.decode = decode
        self.stats = stats
        # a device whose clock lies must not move this source's time (and so the watermark)
        self.guard = guard or ClockGuard(stats=stats, name=path.name)
        self.chunk_lines = chunk_lines
        self.hi: int | None = None
        self.done = False
        # users keep recordings compressed: a .gz file is read as it is (progress in its bytes)
        self._raw: IO[bytes] = path.open("rb")
        self._fh: IO[bytes] = (
            cast(IO[bytes], gzip.GzipFile(fileobj=self._raw, mode="rb"))
            if path.suffix == ".gz"
            else self._raw
        )
        self.bytes_total = path.stat().st_size
        self._lines = 0  # read so far
        self._cut = False  # the file ended early (a truncated .gz): nothing more to read

    def position(self) -> int:
        return self._raw.tell() if not self.done else self.bytes_total

    def next(self) -> pl.DataFrame | None:
        if self.done:
            return None
        lines: list[bytes] = []
        try:
            for line in self._fh if not self._cut else ():
                if len(line) > MAX_LINE_BYTES:
                    self.stats.inc("malformed_lines", detail=f"{self.name}: line too long")
                    continue
                lines.append(line)
                self._lines += 1
                if len(lines) >= self.chunk_lines:
                    break
        except (EOFError, OSError, zlib.error) as e:
            if not self._lines:  # not a recording at all (a .gz that is not gzip)
                from rocewatch.core.errors import ConfigError

                raise ConfigError(f"{self.path}: cannot read: {e}") from e
            # a compressed recording cut short (an interrupted copy): what it held counts
            self.stats.inc("truncated_files", detail=f"{self.name}: {e}")
            self._cut = True
        if not lines:
            self.done = True
            self.close()
            return None
        df = self.guard.filter(self.decode(lines))
        if df.height:
            m = int(df["ts"].max())  # type: ignore[arg-type]
            self.hi = m if self.hi is None else max(self.hi, m)
        return df

    def close(self) -> None:
        for fh in (self._fh, self._raw):
            if not fh.closed:
                fh.close()


class PcapSource:
    """INT Telemetry Reports from a classic pcap file, aggregated into canonical samples."""

    def __init__(
        self,
        path: Path,
        topology: Topology,
        stats: Stats,
        chunk_bytes: int = 4 << 20,
        guard: ClockGuard | None = None,
    ) -> None:
        from collector.inband import InbandStats, PayloadChunk, PcapStats, iter_pcap_chunks
        from collector.inband.aggregate import IntAggregator

        self.path = path
        self.name = path.name
        self.stats = stats
        self.hi: int | None = None
        self.done = False
        self.bytes_total = path.stat().st_size
        self._read = 0
        self._pstats = PcapStats()
        self._istats = InbandStats()
        self._counted: dict[str, int] = {}
        self._agg = IntAggregator(topology, stats)
        self.guard = guard or ClockGuard(stats=stats, name=path.name)
        try:
            self._it: Iterator[PayloadChunk] | None = iter_pcap_chunks(
                path, chunk_bytes=chunk_bytes, stats=self._pstats
            )
        except ValueError as e:
            from rocewatch.core.errors import ConfigError

            raise ConfigError(str(e)) from e  # the reader's message names the file

    def position(self) -> int:
        return self.bytes_total if self.done else min(self._read, self.bytes_total)

    def _count(self) -> None:
        """Move the parser's and reader's skip counters into the shared stats."""
        for prefix, obj in (("pcap_", self._pstats), ("int_", self._istats)):
            for name, value in vars(obj).items():
                if name in ("records", "payloads", "datagrams", "reports"):
                    continue
                key = prefix + name
                if value > self._counted.get(key, 0):
                    self.stats.inc(key, value - self._counted.get(key, 0))
                    self._counted[key] = value

    def next(self) -> pl.DataFrame | None:
        from collector.inband import parse_buffer

        if self.done:
            return None
        chunk = next(self._it, None) if self._it is not None else None
        if chunk is None:
            self.done = True
            self._it = None
            from collector.inband.report import empty_reports

            df = self._agg.add(empty_reports(), final=True) if self._agg.carry is not None else None
            self._count()
            if df is not None and df.height:
                return self._note(df)
            return None
        self._read += int(chunk.buf.shape[0])
        reports, _ = parse_buffer(
            chunk.buf, chunk.starts, chunk.lens, self._istats, rx_ts=chunk.ts, seq=self._agg.seq
        )
        df = self._agg.add(reports)
        self._count()
        return self._note(df) if df.height else df

    def _note(self, df: pl.DataFrame) -> pl.DataFrame:
        """The samples whose clocks agree with this source's (``ClockGuard``); ``hi`` moves."""
        df = self.guard.filter(df)
        if df.height:
            m = int(df["ts"].max())  # type: ignore[arg-type]
            self.hi = m if self.hi is None else max(self.hi, m)
        return df

    def close(self) -> None:
        self._it = None


def recording(scenario: Path, name: str) -> Path | None:
    """``name`` in the scenario directory, or its gzip-compressed ``name.gz``; None if neither."""
    for p in (scenario / name, scenario / f"{name}.gz"):
        if p.exists():
            return p
    return None


def scenario_sources(
    scenario: Path, topology: Topology, stats: Stats, window: WindowConfig | None = None
) -> list[LineFileSource | PcapSource]:
    """The recorded inputs of a scenario directory (docs/formats.md section 5) that exist; each
    with its own ``ClockGuard`` bounded by ``window``'s ``max_ahead_s`` / ``max_behind_s``."""
    w = window or WindowConfig()

    def guard(p: Path) -> ClockGuard:
        return ClockGuard(w.max_ahead_s, w.max_behind_s, stats=stats, name=p.name)

    out: list[LineFileSource | PcapSource] = []
    sw = recording(scenario, "switch.jsonl")
    if sw is not None:
        dec = GnmicEventDecoder(topology, stats).decode_lines
        out.append(LineFileSource(sw, dec, stats, guard=guard(sw)))
    nic = recording(scenario, "nic.jsonl")
    if nic is not None:
        dec = NicSnapshotDecoder(topology, stats).decode_lines
        out.append(LineFileSource(nic, dec, stats, guard=guard(nic)))
    pcap = scenario / "int.pcap"
    if pcap.exists():
        out.append(PcapSource(pcap, topology, stats, guard=guard(pcap)))
    return out


def merged(
    sources: list[LineFileSource | PcapSource], lateness_ns: int
) -> Iterator[tuple[pl.DataFrame, int]]:
    """Merge sources on telemetry time; yield (batch sorted by time, watermark).

    Reads ahead from whichever source is furthest behind and releases rows only up to the
    newest time every unfinished source has reached, so a batch never runs ahead of a slower
    source. The watermark is that time less the allowed lateness (-1 before every source spoke).
    """
    live = list(sources)
    buffered: dict[str, list[pl.DataFrame]] = {s.name: [] for s in sources}
    while live:
        src = min(live, key=lambda s: -1 if s.hi is None else s.hi)
        df = src.next()
        if df is None:
            live.remove(src)
        elif df.height:
            buffered[src.name].append(df)
        his = [s.hi for s in live]
        if any(h is None for h in his) and live:
            continue  # a source that has said nothing yet holds everything back
        until = min(h for h in his if h is not None) + 1 if live else None
        ready: list[pl.DataFrame] = []
        for name, parts in buffered.items():
            if not parts:
                continue
            frame = pl.concat(parts, how="vertical") if len(parts) > 1 else parts[0]
            if until is None:
                ready.append(frame)
                buffered[name] = []
            else:
                ready.append(frame.filter(pl.col("ts") < until))
                rest = frame.filter(pl.col("ts") >= until)
                buffered[name] = [rest] if rest.height else []
        out = pl.concat(ready, how="vertical").sort("ts") if ready else pl.DataFrame()
        wm = (until - 1 - lateness_ns) if until is not None else -1
        if until is None:  # everything is read: what is left closes with finish()
            wm = -1
        yield out, wm
