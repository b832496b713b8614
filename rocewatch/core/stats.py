"""Counters of what the stream skipped or repaired, shared by collectors and detectors.

Each counter is also exported to Prometheus when a /metrics endpoint runs; this object keeps
plain numbers so that replay and tests can read them without a registry.
"""

from __future__ import annotations

import logging
from collections import Counter

log = logging.getLogger(__name__)


class Stats:
    """Named counts (``malformed_lines``, ``unknown_source``, ...) with bounded detail keys."""

    MAX_DETAIL_KEYS = 1000

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.detail: dict[str, Counter[str]] = {}
        self._warned: set[str] = set()

    def inc(self, name: str, n: int = 1, detail: str | None = None) -> None:
        self.counts[name] += n
        if detail is not None:
            d = self.detail.setdefault(name, Counter())
            if detail in d or len(d) < self.MAX_DETAIL_KEYS:
                d[detail] += n
            key = f"{name}:{detail}"
            if key not in self._warned and len(self._warned) < self.MAX_DETAIL_KEYS:
                self._warned.add(key)
                log.warning("skipped input: %s (%s); further ones are only counted", name, detail)

    def get(self, name: str) -> int:
        return self.counts.get(name, 0)

    @classmethod
    def merged(cls, *stats: Stats) -> Stats:
        """One Stats summing several (a count two of them keep, say a scale-out instance's two
        stages, is their total, not the last one's)."""
        out = cls()
        for st in stats:
            # copies first (each one call, whole under the GIL): a scale-out instance's stages
            # count in their own threads, and a dict may not grow while it is iterated
            out.counts.update(dict(st.counts))
            for k, d in list(st.detail.items()):
                out.detail.setdefault(k, Counter()).update(dict(d))
        return out

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = dict(self.counts)
        for k, d in self.detail.items():
            out[k + "_by"] = dict(d.most_common(20))
        return out
