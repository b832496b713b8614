"""Telemetry records as the detector service takes them from Kafka: decoded, their devices'
clocks checked, unusable ones kept on the dead-letter topic, their send times held for latency.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np

from detectors.clock_guard import ClockGuard
from rocewatch import wire
from rocewatch.config import Config
from rocewatch.core.errors import BadInput
from rocewatch.core.stats import Stats


def parse_record(m: Any) -> tuple[wire.Decoded, int, int]:
    """A telemetry record -> (its columns, its newest sample time or -1 when empty, the time it
    was sent in ns). Latency starts at the record's CreateTime (when the collector sent it),
    else at the batch's own production time. Raises BadInput for anything but a valid batch."""
    if m.value is None:
        raise BadInput("empty message")
    d = wire.parse(m.value)
    if not d.rows:
        return d, -1, 0
    sent = m.timestamp * 1_000_000 if m.timestamp and m.timestamp > 0 else d.produced_ns
    return d, int(d.cols["ts"].max()), sent


def admit_record(guard: ClockGuard, d: wire.Decoded) -> int:
    """Set aside the rows of a decoded record whose device's clock disagrees with its
    partition's (``ClockGuard``: far ahead of it, or of the wall clock; far behind); return the
    newest sample time left, -1 when none is. A year-ahead snapshot thus never moves the
    partition's watermark. Usually one comparison of the record's extremes."""
    ts = d.cols["ts"]
    if not d.rows or guard.quick(ts):
        return int(ts.max()) if d.rows else -1
    names = np.asarray(d.dict, dtype=object)
    keep = guard.admit(ts, names[d.cols["device"]])
    if not keep.all():
        d.cols = {k: v[keep] for k, v in d.cols.items()}
        d.rows = int(keep.sum())
    return int(d.cols["ts"].max()) if d.rows else -1


def partition_guard(cfg: Config, stats: Stats, name: str) -> ClockGuard:
    """A live partition's ``ClockGuard``: bounded by the window config, and by the wall clock."""
    w = cfg.window
    return ClockGuard(w.max_ahead_s, w.max_behind_s, stats=stats, wall_ns=time.time_ns, name=name)


def send_dead_letter(producer: Any, topic: str, m: Any, err: Exception, stats: Stats) -> None:
    """Count a record that could not be used and keep it, with why, on the dead-letter topic."""
    stats.inc("dead_letter", detail=type(err).__name__)
    headers = [
        ("rocewatch-error", str(err)[:500].encode()),
        ("rocewatch-source", f"{m.topic}/{m.partition}/{m.offset}".encode()),
    ]
    producer.send(topic, key=m.key, value=m.value or b"", headers=headers)


class SendTimes:
    """When records were sent, held until the step holding their newest sample closes."""

    def __init__(self) -> None:
        self.q: deque[tuple[int, int]] = deque()  # (newest sample time, sent ns), arrival order

    def add(self, hi: int, sent: int) -> None:
        self.q.append((hi, sent))

    def __len__(self) -> int:
        return len(self.q)

    def closed(self, closed_ns: int) -> list[int]:
        """The send times of the records (in arrival order) whose samples all lie before
        ``closed_ns``, removed."""
        out: list[int] = []
        q = self.q
        while q and q[0][0] < closed_ns:
            out.append(q.popleft()[1])
        return out
