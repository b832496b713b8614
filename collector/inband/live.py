"""The live INT collector: UDP listener -> parser -> per-interval aggregates -> an output.

The output is any callable taking a sample frame (collector.output: Kafka's
``TelemetryPublisher``, JSON lines to a file or stdout); the collector knows nothing of what
consumes the samples. An interval is emitted
once a later one has been seen; when no report arrived for ``idle_flush_s`` the open intervals
are emitted too, so a quiet switch does not hold its last samples back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import polars as pl

from collector.inband.aggregate import IntAggregator
from collector.inband.report import empty_reports
from collector.inband.udp import UdpListener
from collector.output import json_lines
from rocewatch.core.metrics import Reading, skipped_readings
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology

log = logging.getLogger(__name__)

SendFrame = Callable[[pl.DataFrame], None]  # an output (collector.output) or a test's list


class IntCollector:
    """Runs a ``UdpListener`` into an ``IntAggregator`` and hands samples to ``sink``."""

    def __init__(
        self,
        topology: Topology,
        listener: UdpListener,
        sink: SendFrame,
        stats: Stats | None = None,
        interval_ns: int = 100_000_000,
        idle_flush_s: float = 1.0,
    ) -> None:
        self.listener = listener
        self.sink = sink
        self.stats = stats or Stats()
        self.agg = IntAggregator(topology, self.stats, interval_ns, seq=listener.seq)
        self.idle_flush_s = idle_flush_s
        self.samples = 0
        self.reports = 0
        self._last_input = time.monotonic()
        self._counted: dict[str, int] = {}

    def step(self, timeout: float = 0.1) -> int:
        """One poll: parse what arrived, emit closed intervals; returns reports parsed."""
        reports = self.listener.poll(timeout=timeout)
        now = time.monotonic()
        if reports.height:
            self._last_input = now
            self.reports += reports.height
            self._emit(self.agg.add(reports))
        elif self.agg.carry is not None and now - self._last_input >= self.idle_flush_s:
            self._emit(self.agg.add(empty_reports(), final=True))
        self._count()
        return reports.height

    def flush(self) -> None:
        """Parse what is left and emit every open interval (shutdown)."""
        while True:
            before = self.listener.stats.received
            reports = self.listener.poll(timeout=0.0)
            self.reports += reports.height
            if self.listener.stats.received == before:
                break
            self._emit(self.agg.add(reports))
        self._emit(self.agg.add(empty_reports(), final=True))
        self._count()

    def run(self, duration_s: float = 0.0, stop: threading.Event | None = None) -> None:
        """Receive until ``stop`` is set or ``duration_s`` (0: forever) has passed."""
        end = time.monotonic() + duration_s if duration_s else None
        stop = stop or threading.Event()
        while not stop.is_set() and (end is None or time.monotonic() < end):
            self.step()
        self.flush()

    def _emit(self, df: pl.DataFrame) -> None:
        if df.height:
            self.samples += df.height
            self.sink(df)

    def _count(self) -> None:
        """Move the listener's and parser's counters into ``stats`` (only what grew)."""
        for prefix, obj in (("int_udp_", self.listener.stats), ("int_", self.listener.parse_stats)):
            for name, value in vars(obj).items():
                if name in ("received", "datagrams", "reports"):  # volumes, not skips
                    continue
                key = prefix + name
                if value > self._counted.get(key, 0):
                    self.stats.inc(key, value - self._counted.get(key, 0))
                    self._counted[key] = value

    def readings(self) -> list[Reading]:
        """int-listen's /metrics, read at scrape time."""
        no: dict[str, str] = {}
        return [
            (
                "rocewatch_int_datagrams_total",
                "counter",
                "UDP datagrams received",
                no,
                self.listener.stats.received,
            ),
            ("rocewatch_int_reports_total", "counter", "INT reports parsed", no, self.reports),
            (
                "rocewatch_samples_ingested_total",
                "counter",
                "per-queue aggregate samples emitted",
                no,
                self.samples,
            ),
            *(
                (
                    "rocewatch_int_reports_lost_total",
                    "counter",
                    "telemetry reports missing from a switch's sequence numbers",
                    {"switch": name},
                    n,
                )
                for name, n in sorted(self.agg.lost_by_switch.items())
            ),
            *skipped_readings(self.stats),
        ]

    def counts(self) -> dict[str, int]:
        """Datagrams received and reports parsed, with every skip counter."""
        out = {
            "datagrams": self.listener.stats.received,
            "reports": self.reports,
            "samples": self.samples,
        }
        out.update({k: v for k, v in self.stats.counts.items() if v})
        return out


def sample_lines(df: pl.DataFrame) -> bytes:
    """Samples as JSON lines (``ts, device, port, qual, metric, value``): a ``LinesOutput``'s
    format for a file or stdout (collector.output)."""
    return json_lines(df.select("ts", "device", "port", "qual", "metric", "value").to_dicts())
