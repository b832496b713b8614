"""Follow the job's other NCCL outputs live: CoMMA's OTLP/JSON exports, Inspector's Prometheus
textfiles and NCCL RAS's JSON (``rocewatch nccl-collect``, docs/nccl.md).

- ``CommaTail``: every ``*.jsonl`` of a directory (``nccl/<job>/comma/<host>.jsonl``, as in a
  recording), appended one ``ExportMetricsServiceRequest`` a line by an OTel collector's file
  exporter. Files are followed by inode, not by name: the exporter's rotation renames the file
  it writes to a backup beside it (``<name>-<time>.jsonl``) and starts a new one, so a renamed
  file is read on through the descriptor already open (never again from its start), and a new
  inode is read from its start. Only whole lines are decoded; a file that shrank is read again
  from its start and the partial line it held counted (``nccl_comma_truncated_lines``); so is
  the cut last line of a file that went away. Lines that are not OTLP/JSON are counted by the
  decoder (``nccl_comma_malformed``). Its points are cumulative, so a line read twice gives
  nothing new (``CommaDecoder`` keeps each series' last count).
- ``PromTextfiles``: every ``*.prom`` of a directory (Inspector writes
  ``nccl_inspector_metrics_<GPU UUID>.prom`` into ``NCCL_INSPECTOR_DUMP_DIR``), rewritten
  whole every dump interval with the latest snapshot. A file is read again when its inode,
  size or modification time changed; its samples are stamped with the file's modification
  time (the format carries no time unless a line gives one) and a series is sent only when
  its time is newer than the last one sent for it, so a re-read of the same snapshot sends
  nothing. A file read while it is being written (its stat moved during the read, or its last
  line has no newline yet) waits for the next poll (``nccl_prom_partial_reads``); a file
  without final newline that stays so is read as it is.
- ``RasFile``: one file holding ``ncclras -f json``'s output, re-read when it changes,
  each new document's missing ranks sent as ``nccl_rank_missing`` samples at the file's
  modification time (``collector.nccl.ras``; the service replaces RAS's host address with the
  rank's host where its join places that rank). A document that does not parse is counted once
  (``nccl_ras_malformed``) and retried when the file changes again; a read during which the
  file changed waits for the next poll. Write it by rename (``ncclras -f json > f.tmp &&
  mv f.tmp f``) so a half-written document is never seen.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from collector.nccl.comma import CommaDecoder
from collector.nccl.prometheus import parse_textfile
from collector.nccl.ras import parse_ras, ras_samples
from collector.nccl.tail import read_new
from rocewatch.core.model import empty_samples
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology

MAX_LINE_BYTES = 4 << 20


@dataclass
class _Open:
    fd: int
    name: str
    offset: int = 0
    partial: bytes = b""


class LineFollower:
    """Whole new lines of every file matching ``pattern`` in ``directory``, followed by inode
    (see the module's docstring); counters ``<prefix>_truncated_lines``,
    ``<prefix>_truncated_files``, ``<prefix>_malformed`` (a line over ``max_line_bytes``)."""

    def __init__(
        self,
        directory: Path,
        pattern: str,
        stats: Stats,
        prefix: str,
        max_line_bytes: int = MAX_LINE_BYTES,
    ) -> None:
        self.dir = directory
        self.pattern = pattern
        self.stats = stats
        self.prefix = prefix
        self.max_line_bytes = max_line_bytes
        self.files: dict[tuple[int, int], _Open] = {}

    def _read(self, f: _Open) -> list[bytes]:
        new = read_new(f.fd, f.offset)
        if not new:
            return []
        f.offset += len(new)
        data = f.partial + new
        cut = data.rfind(b"\n") + 1
        whole, f.partial = data[:cut], data[cut:]
        if len(f.partial) > self.max_line_bytes:
            self.stats.inc(f"{self.prefix}_malformed", detail=f"{f.name}: line too long")
            f.partial = b""
        out = []
        for ln in whole.split(b"\n"):
            if len(ln) > self.max_line_bytes:
                self.stats.inc(f"{self.prefix}_malformed", detail=f"{f.name}: line too long")
            elif ln.strip():
                out.append(ln)
        return out

    def _drop_partial(self, f: _Open) -> None:
        if f.partial:
            self.stats.inc(f"{self.prefix}_truncated_lines", detail=f.name)
            f.partial = b""

    def poll(self) -> list[bytes]:
        """The whole lines every file gained since the last poll, oldest file first."""
        seen: list[tuple[float, str, tuple[int, int]]] = []
        paths = sorted(self.dir.glob(self.pattern)) if self.dir.is_dir() else []
        for path in paths:
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            seen.append((st.st_mtime, path.name, (st.st_dev, st.st_ino)))
        lines: list[bytes] = []
        live = {key for _, _, key in seen}
        for key in set(self.files) - live:  # gone (moved away or deleted): read what is left
            gone = self.files.pop(key)
            lines += self._read(gone)
            self._drop_partial(gone)
            os.close(gone.fd)
        for _, name, key in sorted(seen):  # by modification time: a rotated backup first
            f = self.files.get(key)
            if f is None:
                try:
                    fd = os.open(self.dir / name, os.O_RDONLY)
                except FileNotFoundError:
                    continue
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) != key:  # replaced between stat and open
                    os.close(fd)
                    continue
                f = self.files[key] = _Open(fd, name)
            f.name = name
            if os.fstat(f.fd).st_size < f.offset:  # truncated in place: read it again
                self.stats.inc(f"{self.prefix}_truncated_files", detail=name)
                self._drop_partial(f)
                f.offset = 0
            lines += self._read(f)
        return lines

    def finish(self) -> None:
        for f in self.files.values():
            self._drop_partial(f)

    def close(self) -> None:
        for f in self.files.values():
            os.close(f.fd)
        self.files.clear()


class CommaTail:
    def __init__(self, directory: Path, topology: Topology | None, stats: Stats) -> None:
        self.lines = LineFollower(directory, "*.jsonl", stats, "nccl_comma")
        self.decoder = CommaDecoder(topology, stats)

    def poll(self) -> pl.DataFrame:
        return self.decoder.lines(self.lines.poll())

    def finish(self) -> pl.DataFrame:
        df = self.poll()
        self.lines.finish()
        return df

    def close(self) -> None:
        self.lines.close()


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class PromTextfiles:
    def __init__(self, directory: Path, topology: Topology | None, stats: Stats) -> None:
        self.dir = directory
        self.topology = topology
        self.stats = stats
        self.read: dict[str, tuple[int, int, int, int]] = {}  # file -> its stat when read
        self.waiting: dict[str, tuple[int, int, int, int]] = {}  # file -> stat of a cut read
        self.last_ts: dict[tuple[str, str, str, str], int] = {}  # series -> last time sent

    def poll(self, final: bool = False) -> pl.DataFrame:
        frames = []
        paths = sorted(self.dir.glob("*.prom")) if self.dir.is_dir() else []
        for path in paths:
            try:
                before = _stat_key(path.stat())
                if self.read.get(path.name) == before:
                    continue
                data = path.read_bytes()
                after = _stat_key(path.stat())
            except FileNotFoundError:
                continue
            if before != after:  # written while read: the next poll
                self.stats.inc("nccl_prom_partial_reads", detail=path.name)
                continue
            cut = data and not data.endswith(b"\n") and not final
            if cut and self.waiting.get(path.name) != after:  # maybe still being written: wait
                self.waiting[path.name] = after
                self.stats.inc("nccl_prom_partial_reads", detail=path.name)
                continue
            self.waiting.pop(path.name, None)
            self.read[path.name] = after
            text = data.decode("utf-8", "replace").splitlines()
            df = parse_textfile(text, after[3], self.topology, self.stats)
            frames.append(self._new(df))
        frames = [f for f in frames if f.height]
        return pl.concat(frames) if frames else empty_samples()

    def _new(self, df: pl.DataFrame) -> pl.DataFrame:
        """Only the series whose time moved on since they were last sent."""
        keep = []
        for ts, dev, port, qual, metric in df.select(
            "ts", "device", "port", "qual", "metric"
        ).iter_rows():
            key = (dev, port, qual, metric)
            new = ts > self.last_ts.get(key, -1)
            if new:
                self.last_ts[key] = ts
            keep.append(new)
        return df.filter(pl.Series(keep, dtype=pl.Boolean))


class RasFile:
    def __init__(self, path: Path, stats: Stats) -> None:
        self.path = path
        self.stats = stats
        self.read: tuple[int, int, int, int] | None = None
        self.digest: bytes | None = None

    def poll(self) -> pl.DataFrame:
        try:
            before = _stat_key(self.path.stat())
            if before == self.read:
                return empty_samples()
            data = self.path.read_bytes()
            after = _stat_key(self.path.stat())
        except FileNotFoundError:
            return empty_samples()
        if before != after:  # written while read: the next poll
            return empty_samples()
        self.read = after
        digest = hashlib.sha256(data).digest()
        if digest == self.digest:  # touched, not changed
            return empty_samples()
        self.digest = digest
        if not data.strip():  # emptied (about to be written): nothing to say
            return empty_samples()
        return ras_samples(parse_ras(data, self.stats), after[3])
