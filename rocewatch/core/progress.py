"""A progress line on stderr for long work (only on a terminal or when asked)."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, total: float, unit: str = "", enabled: bool = True) -> None:
        self.label = label
        self.total = max(total, 1)
        self.unit = unit
        self.enabled = enabled
        self.t0 = time.monotonic()
        self._last = 0.0

    def update(self, done: float, note: str = "") -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < 0.2 and done < self.total:
            return
        self._last = now
        frac = min(1.0, done / self.total)
        bar = "#" * int(frac * 30)
        sys.stderr.write(
            f"\r{self.label:8s} [{bar:<30s}] {100 * frac:5.1f}%  {now - self.t0:5.1f}s {note}"
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            self.update(self.total)
            sys.stderr.write("\n")
            sys.stderr.flush()
