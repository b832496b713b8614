"""Follow an NCCL Inspector directory: new files, appended lines, truncation and rotation.

``InspectorTail.poll()`` reads what every ``*.log`` file of the directory gained since the last
call and returns it as samples (``InspectorDecoder``). Only whole lines are decoded: a line
still being written stays in the file's buffer until its newline arrives. A file that shrank
(truncated, or rewritten in place) is read again from its start, the partial line it held
dropped and counted (``nccl_truncated_lines``); a file replaced under its name (a new inode:
rotation) has the rest of the old file read through the descriptor still open, then the new
one from its start, so nothing else is lost. A line longer than ``max_line_bytes`` is counted
and skipped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from collector.nccl.inspector import InspectorDecoder
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology

MAX_LINE_BYTES = 4 << 20


def read_new(fd: int, offset: int) -> bytes:
    """Every byte of the file ``fd`` from ``offset`` to its end now (b"" when none)."""
    chunks = []
    while b := os.pread(fd, 1 << 20, offset):
        chunks.append(b)
        offset += len(b)
    return b"".join(chunks)


@dataclass
class _File:
    fd: int
    inode: int
    offset: int = 0
    partial: bytes = b""


class InspectorTail:
    def __init__(
        self,
        directory: str | Path,
        topology: Topology | None = None,
        stats: Stats | None = None,
        max_line_bytes: int = MAX_LINE_BYTES,
    ) -> None:
        self.dir = Path(directory)
        self.stats = stats or Stats()
        self.decoder = InspectorDecoder(topology, self.stats)
        self.max_line_bytes = max_line_bytes
        self.files: dict[str, _File] = {}

    def _read(self, key: str, f: _File) -> None:
        new = read_new(f.fd, f.offset)
        if not new:
            return
        f.offset += len(new)
        data = f.partial + new
        cut = data.rfind(b"\n")
        if cut < 0:
            whole, f.partial = b"", data
        else:
            whole, f.partial = data[: cut + 1], data[cut + 1 :]
        if len(f.partial) > self.max_line_bytes:
            self.stats.inc("nccl_malformed_lines", detail=f"{key}: line too long")
            f.partial = b""
        lines = []
        for ln in whole.split(b"\n"):
            if len(ln) > self.max_line_bytes:
                self.stats.inc("nccl_malformed_lines", detail=f"{key}: line too long")
                continue
            lines.append(ln)
        self.decoder.lines(key, lines)

    def _drop_partial(self, f: _File) -> None:
        if f.partial:
            self.stats.inc("nccl_truncated_lines")
            f.partial = b""

    def poll(self) -> pl.DataFrame:
        """Samples from everything written since the last poll."""
        names = sorted(p.name for p in self.dir.glob("*.log")) if self.dir.is_dir() else []
        for name in names:
            path = self.dir / name
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            f = self.files.get(name)
            if f is not None and f.inode != st.st_ino:  # rotated: finish the old file first
                self._read(name, f)
                self._drop_partial(f)
                os.close(f.fd)
                self.decoder.forget(name)
                f = None
            if f is None:
                try:
                    fd = os.open(path, os.O_RDONLY)
                except FileNotFoundError:
                    continue
                f = self.files[name] = _File(fd, os.fstat(fd).st_ino)
            if os.fstat(f.fd).st_size < f.offset:  # truncated in place
                self.stats.inc("nccl_truncated_files", detail=name)
                self._drop_partial(f)
                f.offset = 0
                self.decoder.forget(name)
            self._read(name, f)
        for name in set(self.files) - set(names):  # removed: read what is left
            f = self.files.pop(name)
            self._read(name, f)
            self._drop_partial(f)
            os.close(f.fd)
            self.decoder.forget(name)
        return self.decoder.frame()

    def finish(self) -> pl.DataFrame:
        """The end of the job: partial lines are counted, waiting collectives judged."""
        for f in self.files.values():
            self._drop_partial(f)
        self.decoder.finish()
        return self.decoder.frame()

    def close(self) -> None:
        for f in self.files.values():
            os.close(f.fd)
        self.files.clear()
