"""Sources of sample batches: recorded files now; live collectors plug in the same way."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import polars as pl

from collector.decode import GnmicEventDecoder, NicSnapshotDecoder
from rocewatch.stats import Stats
from rocewatch.topology import Topology

MAX_LINE_BYTES = 4 << 20  # a longer line is garbage, not telemetry


class LineFileSource:
    """A JSON-lines file decoded chunk by chunk; ``hi`` is the newest time read so far."""

    def __init__(
        self,
        path: Path,
        decode: Callable[[list[bytes]], pl.DataFrame],
        stats: Stats,
        chunk_lines: int = 20_000,
    ) -> None:
        self.path = path
        self.name = path.name
        self.decode = decode
        self.stats = stats
        self.chunk_lines = chunk_lines
        self.hi: int | None = None
        self.done = False
        self._fh: IO[bytes] = path.open("rb")
        self.bytes_total = path.stat().st_size

    def position(self) -> int:
        return self._fh.tell() if not self.done else self.bytes_total

    def next(self) -> pl.DataFrame | None:
        if self.done:
            return None
        lines: list[bytes] = []
        for line in self._fh:
            if len(line) > MAX_LINE_BYTES:
                self.stats.inc("malformed_lines", detail=f"{self.name}: line too long")
                continue
            lines.append(line)
            if len(lines) >= self.chunk_lines:
                break
        if not lines:
            self.done = True
            self._fh.close()
            return None
        df = self.decode(lines)
        if df.height:
            m = int(df["ts"].max())  # type: ignore[arg-type]
            self.hi = m if self.hi is None else max(self.hi, m)
        return df

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()


def scenario_sources(scenario: Path, topology: Topology, stats: Stats) -> list[LineFileSource]:
    """The recorded inputs of a scenario directory (CONTRACTS.md section 5) that exist."""
    out: list[LineFileSource] = []
    sw = scenario / "switch.jsonl"
    if sw.exists():
        out.append(LineFileSource(sw, GnmicEventDecoder(topology, stats).decode_lines, stats))
    nic = scenario / "nic.jsonl"
    if nic.exists():
        out.append(LineFileSource(nic, NicSnapshotDecoder(topology, stats).decode_lines, stats))
    return out


def merged(sources: list[LineFileSource], lateness_ns: int) -> Iterator[tuple[pl.DataFrame, int]]:
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
