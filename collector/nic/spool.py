"""A bounded on-disk queue of snapshot lines: what the agent could not send yet, in order.

Everything the agent samples is appended here first and removed only once the broker has
acknowledged it, so a broker outage (or an agent restart) loses nothing while the spool has
room. Lines go into segment files (``<seq>.jsonl``, docs/formats.md section 3 lines); a segment is
sealed at ``segment_bytes`` or when the sender asks for it. Past ``max_bytes`` the oldest
segment that is not being sent is deleted and its snapshots are counted in ``dropped``.
Delivery is at least once: a segment whose send failed halfway is sent again whole (the
detector drops readings it has already seen).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import IO

from rocewatch.core.errors import ConfigError


class Spool:
    def __init__(self, directory: str | Path, max_bytes: int, segment_bytes: int = 1 << 20) -> None:
        if segment_bytes < 1024 or max_bytes < 2 * segment_bytes:
            raise ConfigError("agent spool: need segment_bytes >= 1024 and max_bytes >= 2 segments")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.dropped = 0  # snapshots deleted unsent because the spool was full
        # sealed segments: id -> (bytes, lines); a crash may leave a torn last line: the
        # decoder counts it as malformed
        self._sealed: dict[int, tuple[int, int]] = {}
        for p in sorted(self.dir.glob("*.jsonl")):
            if p.stem.isdigit():
                data = p.read_bytes()
                self._sealed[int(p.stem)] = (len(data), data.count(b"\n"))
        self._next = max(self._sealed, default=0) + 1
        self._cur: int | None = None
        self._cur_fh: IO[bytes] | None = None
        self._cur_bytes = 0
        self._cur_lines = 0
        self._inflight: int | None = None
        if self._sealed:
            self.ready.set()

    def _path(self, seg: int) -> Path:
        return self.dir / f"{seg:020d}.jsonl"

    def append(self, lines: list[bytes]) -> None:
        """Add snapshot lines (each ending in a newline)."""
        if not lines:
            return
        data = b"".join(lines)
        with self.lock:
            if self._cur is None:
                self._cur = self._next
                self._next += 1
                self._cur_fh = open(self._path(self._cur), "ab")  # noqa: SIM115
                self._cur_bytes = self._cur_lines = 0
            fh = self._cur_fh
            assert fh is not None
            fh.write(data)
            fh.flush()
            self._cur_bytes += len(data)
            self._cur_lines += len(lines)
            if self._cur_bytes >= self.segment_bytes:
                self._seal()
            self._bound()
        self.ready.set()

    def _seal(self) -> None:
        if self._cur is None or self._cur_fh is None:
            return
        self._cur_fh.close()
        self._sealed[self._cur] = (self._cur_bytes, self._cur_lines)
        self._cur, self._cur_fh = None, None
        self._cur_bytes = self._cur_lines = 0

    def _bound(self) -> None:
        total = sum(b for b, _ in self._sealed.values()) + self._cur_bytes
        for seg in sorted(self._sealed):
            if total <= self.max_bytes:
                break
            if seg == self._inflight:
                continue
            size, lines = self._sealed.pop(seg)
            self._path(seg).unlink(missing_ok=True)
            self.dropped += lines
            total -= size

    def oldest(self) -> tuple[int, list[bytes]] | None:
        """The oldest unsent segment's lines (sealing the open one if it is all there is)."""
        with self.lock:
            if not self._sealed and self._cur is not None and self._cur_lines:
                self._seal()
            if not self._sealed:
                self.ready.clear()
                return None
            seg = min(self._sealed)
            self._inflight = seg
        lines = self._path(seg).read_bytes().splitlines(keepends=True)
        return seg, lines

    def ack(self, seg: int) -> None:
        """The segment reached the broker: delete it."""
        with self.lock:
            self._sealed.pop(seg, None)
            self._path(seg).unlink(missing_ok=True)
            self._inflight = None

    def release(self, seg: int) -> None:
        """Sending the segment failed; it stays and may be dropped by the bound again."""
        with self.lock:
            self._inflight = None

    def pending(self) -> tuple[int, int]:
        """(snapshots, bytes) not yet acknowledged."""
        with self.lock:
            lines = sum(n for _, n in self._sealed.values()) + self._cur_lines
            size = sum(b for b, _ in self._sealed.values()) + self._cur_bytes
        return lines, size

    def close(self) -> None:
        with self.lock:
            self._seal()
