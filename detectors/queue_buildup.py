"""QueueBuildup: an egress queue held near its buffer limit (incast, repeated microbursts).

Occupancy is the queue's depth, or its peak since the previous read where the switch exports
one (a queue that touches the limit every interval is in trouble even if each read lands on a
calmer instant), divided by the switch's ``buffer_bytes`` from the topology (the share one
lossless queue may use; ``default_buffer_bytes`` for switches the topology does not size).

A queue fires once its occupancy stayed at or above ``warning_fraction`` for ``sustain_s``;
``critical`` when it stayed at or above ``critical_fraction`` as long. It stays firing while at
or above ``exit_fraction`` and clears ``clear_s`` after it last was (hysteresis both ways).

A queue paused by PFC is full *because* it is paused: when it received pause for at least
``pause_exempt_fraction`` of the step on its priority (``pfc_rx_pause_us``; the queue's name is
its priority, as in SONiC's lossless queues), it is left to the PFC storm detector.

A healthy step costs one vectorised filter over each occupancy gauge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from detectors.base import Finding, StepContext, port_labels
from detectors.state import Episode, Key, Row, Sustain, lookup, over
from detectors.windows import Step
from rocewatch.errors import ConfigError
from rocewatch.topology import Topology


@dataclass(frozen=True)
class QueueBuildupConfig:
    # healthy all-reduce queues stay under ~5% of the buffer and bursty MoE under ~30%; a queue
    # held above 80% has almost no headroom left before PFC XOFF or drops, above 95% none
    warning_fraction: float = 0.8
    critical_fraction: float = 0.95
    exit_fraction: float = 0.6
    sustain_s: float = 1.0  # ten reads in a row: a standing queue, not one burst
    gap_s: float = 0.1
    clear_s: float = 0.5
    use_peak: bool = True  # the peak since the previous read counts as occupancy
    pause_exempt_fraction: float = 0.5  # of the step paused: the PFC storm detector's case
    default_buffer_bytes: int | None = None  # for switches with no buffer_bytes (None: skip)
    max_entities: int = 10_000
    enabled: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        where = "detectors.queue_buildup"
        if not 0 < self.exit_fraction <= self.warning_fraction <= self.critical_fraction <= 1:
            raise ConfigError(
                f"{where}: need 0 < exit_fraction <= warning_fraction <= critical_fraction <= 1"
            )
        if self.sustain_s <= 0 or self.gap_s < 0 or self.clear_s < 0:
            raise ConfigError(f"{where}: sustain_s must be > 0, gap_s and clear_s >= 0")
        if not 0 < self.pause_exempt_fraction <= 1:
            raise ConfigError(f"{where}.pause_exempt_fraction: must be within (0, 1]")
        if self.default_buffer_bytes is not None and self.default_buffer_bytes <= 0:
            raise ConfigError(f"{where}.default_buffer_bytes: must be > 0")
        if self.max_entities < 1:
            raise ConfigError(f"{where}.max_entities: must be >= 1")


@dataclass
class QueueBuildupDetector:
    topology: Topology
    config: QueueBuildupConfig = field(default_factory=QueueBuildupConfig)
    name: str = "queue_buildup"
    # the metrics it reads from the window engine (steps carry no others to the detect stage)
    reads: ClassVar[frozenset[str]] = frozenset(
        {"queue_depth_bytes", "queue_peak_bytes", "pfc_rx_pause_us"}
    )

    def __post_init__(self) -> None:
        c = self.config
        self.sustain = Sustain(c.sustain_s, c.gap_s, c.clear_s, c.max_entities)
        self.buffers = {
            s.name: s.buffer_bytes for s in self.topology.switches.values() if s.buffer_bytes
        }
        sizes = [*self.buffers.values()]
        if c.default_buffer_bytes:
            sizes.append(c.default_buffer_bytes)
        # the cheapest test a healthy step needs: nothing reaches exit_fraction of any buffer
        self.floor_bytes = c.exit_fraction * min(sizes) if sizes else None

    @property
    def window_s(self) -> float:
        """Reads only the newest step: the history it needs is its own (``Sustain``)."""
        return 0.0

    def evaluate(self, ctx: StepContext) -> list[Finding]:
        cur = ctx.engine.current()
        rows = self._rows(cur) if cur is not None and self.floor_bytes is not None else []
        if not rows and not self.sustain.episodes:
            return []
        return [self._finding(k, ep) for k, ep in self.sustain.update(ctx.start, ctx.end, rows)]

    def _rows(self, cur: Step) -> list[Row]:
        cfg = self.config
        assert self.floor_bytes is not None
        depth = cur.get("queue_depth_bytes")
        peak = cur.get("queue_peak_bytes") if cfg.use_peak else depth.clear()
        hit = [over(f, self.floor_bytes, "max", rate=False) for f in (depth, peak)]
        if not hit[0] and not hit[1]:
            return []
        keys = sorted({(r["device"], r["port"], r["qual"]) for h in hit for r in h})
        dep, dts = lookup(depth, keys, "max"), lookup(depth, keys, "ts")
        pk, pts = lookup(peak, keys, "max"), lookup(peak, keys, "ts")
        paused = lookup(cur.get("pfc_rx_pause_us"), keys, "rate")
        rows = []
        for key in keys:
            buf = self.buffers.get(key[0], cfg.default_buffer_bytes)
            p = paused.get(key)
            if not buf or (p is not None and p >= cfg.pause_exempt_fraction * 1e6):
                continue  # unsized, or full because it is paused: PFC storm's case
            d, k = dep.get(key), pk.get(key)
            frac = max(x for x in (d, k, 0.0) if x is not None) / buf
            if frac < cfg.exit_fraction:
                continue
            level = 2 if frac >= cfg.critical_fraction else 1 if frac >= cfg.warning_fraction else 0
            ts = max(int(t) for t in (dts.get(key), pts.get(key)) if t is not None)
            info = (frac, d, k, buf, p / 1e6 if p is not None else None)
            rows.append(Row(("queue", *key), level, ts, info))
        return rows

    def _finding(self, key: Key, ep: Episode) -> Finding:
        cfg = self.config
        _, dev, port, q = key
        frac, depth, peak, buf, paused = ep.info
        labels = port_labels(self.topology, dev, port)
        labels["queue"] = q
        who = f"{dev}/{port} queue {q}"
        mark = cfg.critical_fraction if ep.severity == "critical" else cfg.warning_fraction

        def mib(x: float | None) -> str:
            return "n/a" if x is None else f"{x / 2**20:.1f} MiB"

        pause_s = f"{paused:.1%}" if paused is not None else "n/a"
        return Finding(
            "QueueBuildup",
            labels,
            ep.severity,
            ep.ts,
            summary=f"{who} at {frac:.0%} of its buffer",
            description=f"{who} held at least {mark:.0%} of its {mib(buf)} buffer for "
            f"{cfg.sustain_s:g} s without being paused by PFC: incast or standing congestion "
            "toward its receiver.",
            evidence=f"{who}: occupancy {frac:.1%} of {mib(buf)} (depth {mib(depth)}, peak "
            f"{mib(peak)}), received pause {pause_s} of the step; threshold {mark:.0%} held "
            f"{cfg.sustain_s:g} s, exempt when paused >= {cfg.pause_exempt_fraction:.0%}",
        )


def build(topology: Topology, config: QueueBuildupConfig | None = None) -> QueueBuildupDetector:
    return QueueBuildupDetector(topology, config or QueueBuildupConfig())


__all__ = ["QueueBuildupConfig", "QueueBuildupDetector", "build"]
