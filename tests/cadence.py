"""Telemetry at any sampling cadence, built directly as sample frames, for detector tests.

A test describes each series by what it does over time (a counter's rate per second, or a
gauge's reading, as a function of seconds after ``T0``) and how it is sampled (interval, phase,
jitter, lost samples). ``frames`` turns them into SAMPLE_SCHEMA frames in time order, one per
``chunk_s`` of telemetry (a collector's delivery), and ``run`` feeds them through the real
pipeline the way replay does. Counters are exact integrals of their rate, so a test controls
precisely what each sample says.

>>> s = Series("gpu-001", "mlx5_0", "nic_packet_seq_err", rate=Rate(0.0, [(1.0, 3.0, 40.0)]))
>>> f = pl.concat(frames([s.every(1.0)], 4.0))
>>> f["raw"].to_list()  # 40 errors a second from 1 s to 3 s, read every second
[1000, 1000, 1040, 1080, 1080]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from rocewatch.config import Config
from rocewatch.core.model import Alert, conform
from rocewatch.core.topology import Topology
from rocewatch.pipeline import Pipeline

S = 1_000_000_000
T0 = 1_795_946_400 * S
CADENCES = (0.1, 1.0, 5.0)  # the fast default, switch/NIC counters, slow queue polling


@dataclass(frozen=True)
class Rate:
    """A piecewise-constant rate per second: ``base``, plus ``extra`` during each
    ``(from_s, until_s, extra)`` window. ``integral(t)`` is the count from 0 to ``t``."""

    base: float
    extra: Sequence[tuple[float, float, float]] = ()

    def __call__(self, t: float) -> float:
        return self.base + sum(x for a, b, x in self.extra if a <= t < b)

    def integral(self, t: float) -> float:
        return self.base * t + sum(x * max(0.0, min(t, b) - a) for a, b, x in self.extra if t > a)


@dataclass(frozen=True)
class Series:
    """One series: a counter (``rate``, counts per second; cumulative from ``start``) or a
    gauge (``gauge``: the reading at t), sampled every ``interval`` s from ``phase`` with
    uniform jitter of ``jitter`` intervals in all, samples at ``lost`` nominal times left out."""

    device: str
    port: str
    metric: str
    qual: str = ""
    rate: Rate | None = None
    gauge: Callable[[float], float] | None = None
    interval: float = 0.1
    phase: float = 0.003  # devices read a few ms after the tick
    jitter: float = 0.0
    lost: frozenset[float] = frozenset()
    start: int = 1_000  # a counter's value at t = 0

    def every(self, interval: float, **kw: object) -> Series:
        return dataclasses.replace(self, interval=interval, **kw)  # type: ignore[arg-type]

    def times(self, seconds: float, rng: np.random.Generator) -> list[float]:
        out = []
        for k in range(int(seconds / self.interval) + 1):
            nominal = round(k * self.interval, 6)
            off = float(rng.uniform(-0.5, 0.5)) * self.jitter * self.interval if k else 0.0
            if nominal not in self.lost:
                out.append(self.phase + nominal + off)
        return out

    def value(self, t: float) -> tuple[float, int | None]:
        if self.rate is not None:
            raw = self.start + round(self.rate.integral(t))
            return float(raw), raw
        assert self.gauge is not None
        return float(self.gauge(t)), None


def frames(
    series: Sequence[Series], seconds: float, chunk_s: float | None = None, seed: int = 0
) -> Iterator[pl.DataFrame]:
    """Every series' samples over ``seconds`` as SAMPLE_SCHEMA frames in time order, one per
    ``chunk_s`` of telemetry time (default: the shortest sampling interval; empty chunks
    skipped)."""
    rng = np.random.default_rng(seed)
    if chunk_s is None:
        chunk_s = min((s.interval for s in series), default=0.1)
    rows = []
    for s in series:
        for t in s.times(seconds, rng):
            v, raw = s.value(t)
            rows.append((T0 + round(t * S), s.device, s.port, s.qual, s.metric, v, raw))
    rows.sort(key=lambda r: r[0])
    chunk = round(chunk_s * S)
    by_chunk: dict[int, list[tuple[object, ...]]] = {}
    for r in rows:
        by_chunk.setdefault((int(r[0]) - T0) // chunk, []).append(r)  # type: ignore[call-overload]
    for k in sorted(by_chunk):
        yield conform(
            pl.DataFrame(
                by_chunk[k],
                schema=["ts", "device", "port", "qual", "metric", "value", "raw"],
                orient="row",
            )
        )


@dataclass
class Run:
    pipeline: Pipeline
    alerts: list[Alert] = field(default_factory=list)

    def named(self, name: str) -> list[Alert]:
        return [a for a in self.alerts if a.name == name]


def run(
    topology: Topology,
    series: Sequence[Series],
    seconds: float,
    config: Config | None = None,
    seed: int = 0,
    only: Sequence[str] = (),
) -> Run:
    """Feed the series through a pipeline as replay does (watermark = newest sample time less
    the lateness, then everything closed at the end); return its alerts, every instance.
    ``only``: the names of the detectors to run (default: every enabled one)."""
    p = Pipeline(topology, config or Config(), rollup_s=None)
    if only:
        p.detectors = [d for d in p.detectors if d.name in only]
    for f in frames(series, seconds, seed=seed):
        p.ingest(f)
        p.advance(int(f.get_column("ts").to_numpy().max()) - p.engine.lateness_ns())
    p.finish()
    return Run(p, p.all_alerts())


def ttd(alert: Alert, onset_s: float) -> float:
    """Seconds from a fault's onset to the alert's startsAt."""
    return (alert.starts_at - (T0 + round(onset_s * S))) / S


def timeline(interval: float, learn_s: float = 5.0) -> tuple[float, float, float]:
    """(onset, end, run length) in seconds for one fault at a sampling interval: ``learn_s``
    of healthy history (plus three samples) first, a fault that outlasts the detection bound,
    then time for it to clear (the longest clear time plus two and a half intervals)."""
    onset = learn_s + 3 * interval
    end = onset + bound(interval) + 2 * interval
    return onset, end, end + 6.0 + 4 * interval


def bound(interval: float) -> float:
    """The time to detect a sustained fault may take at a sampling interval (every detector
    but PFC storms): the rule's own duration or three intervals, whichever is longer."""
    return max(10.0, 3 * interval)


def still_firing_or_ended_after(alert: Alert, until_s: float) -> bool:
    """The alert did not resolve before ``until_s`` (it fired through the fault)."""
    return not alert.ends_at or alert.ends_at >= T0 + round(until_s * S)
