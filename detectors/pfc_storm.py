"""PFCStorm: queues stalled by sustained pause, and the culprit that started it.

A queue is stalled when, over the detection time (200 ms, as SONiC's PFC watchdog), received
pause time grew by at least ``pause_fraction`` of the interval while the queue held data and
sent nothing. It stays stalled until its pause share falls below ``exit_fraction`` over the
restoration time. A NIC counts as sending a storm from its own ``tx_prio<N>_pause_duration`` or
pause-storm events.

Origin vs victim follows the pause graph over the topology's cables: every stalled receiver
names the sender at the other end of its cable; a sender that is not itself paused is the
origin, every paused entity a victim. So an origin that runs no agent is still found from the
switch port it pauses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import polars as pl

from detectors.base import Finding, StepContext, node_labels, pct, port_labels
from rocewatch.topology import NicEnd, PortEnd, Topology

Key = tuple[str, str, str, str]  # (kind "port"|"nic", device, port-or-nic, priority)


@dataclass(frozen=True)
class PfcStormConfig:
    detection_time_s: float = 0.2
    restoration_time_s: float = 0.2
    pause_fraction: float = 0.99
    exit_fraction: float = 0.05
    # a device pausing others counts as paused itself (so not an origin) from this share on,
    # so that a switch that relays a storm is never blamed while its own stall is confirmed
    relay_fraction: float = 0.5
    # a sender that was itself paused within this time of its victim's stall relays the storm;
    # it covers detection jitter at onset and the hop-by-hop drain-down when a storm ends
    relay_window_s: float = 1.0
    min_coverage: float = 0.9  # samples must span this share of the detection time
    require_stall: bool = True


@dataclass
class _Active:
    ts: int
    evidence: str


@dataclass
class PfcStormDetector:
    topology: Topology
    config: PfcStormConfig = field(default_factory=PfcStormConfig)
    name: str = "pfc_storm"
    # the metrics it reads from the window engine (steps carry no others to the detect stage)
    reads: ClassVar[frozenset[str]] = frozenset(
        {
            "pfc_rx_pause_us",
            "pfc_tx_pause_us",
            "nic_rx_pause_us",
            "nic_tx_pause_us",
            "queue_tx_pkts",
            "queue_depth_bytes",
        }
    )

    @property
    def window_s(self) -> float:
        """The longest sliding window this detector reads."""
        return max(self.config.detection_time_s, self.config.restoration_time_s)

    def __post_init__(self) -> None:
        self.paused: dict[Key, _Active] = {}  # stalled receivers
        self.sending: dict[Key, _Active] = {}  # senders seen from their own telemetry
        self.relaying: set[Key] = set()  # receivers paused at least relay_fraction right now
        # per device (kind, device, nic-or-"", priority): [paused since, paused until or None]
        self.device_paused: dict[Key, list[int | None]] = {}

    # --- per-entity states with hysteresis -------------------------------------------------------
    @staticmethod
    def _fractions(w: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each row's pause share ``delta / (dt * 1e6)``, whether it has one (``delta`` and
        ``dt`` not null) and ``dt``, in NumPy: the thresholds cost no Polars call per step."""
        dt_col, delta_col = w.get_column("dt"), w.get_column("delta")
        ok = np.ones(w.height, dtype=bool)
        for col in (dt_col, delta_col):
            if col.null_count():
                ok &= col.is_not_null().to_numpy()
        dt, delta = dt_col.to_numpy(), delta_col.to_numpy()
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = delta / (dt * 1e6)
        return frac, ok, dt

    def _update(
        self, ctx: StepContext, metric: str, kind: str, table: dict[Key, _Active], stall: bool
    ) -> None:
        cfg = self.config
        if not self.paused and not self.sending:
            # fast path: nothing active, so only entities whose newest step could complete a
            # storm window need the window at all
            cur = ctx.engine.current()
            f = cur.get(metric) if cur is not None else None
            if f is None or f.height == 0:
                return
            n = ctx.engine.steps_in(cfg.detection_time_s)
            floor = 1.0 - n * (1.0 - cfg.pause_fraction)
            _, ok, dt = self._fractions(f)
            delta = f.get_column("delta").to_numpy()
            if not (ok & _ge(delta, dt * (1e6 * floor))).any():
                return
        detection = ctx.engine.window(metric, cfg.detection_time_s)
        frac, ok, dt = self._fractions(detection)
        entering = np.flatnonzero(
            ok & _ge(frac, cfg.pause_fraction) & (dt >= cfg.detection_time_s * cfg.min_coverage)
        )
        stay, stay_frac, stay_ok = detection, frac, ok  # the default: the same window, once
        if cfg.restoration_time_s != cfg.detection_time_s:
            stay = ctx.engine.window(metric, cfg.restoration_time_s)
            stay_frac, stay_ok, _ = self._fractions(stay)
        # only the few rows at or above a threshold reach Python (NaN is not a share)
        floor = min(cfg.exit_fraction, cfg.relay_fraction)
        rows = np.flatnonzero(stay_ok & (stay_frac >= floor))
        keys = _keys(stay, rows)
        fr = stay_frac[rows].tolist()
        still = {(kind, *k): f for k, f in zip(keys, fr, strict=True) if f >= cfg.exit_fraction}
        if table is self.paused:
            self.relaying.update(
                (kind, *k) for k, f in zip(keys, fr, strict=True) if f >= cfg.relay_fraction
            )
        for key in [k for k in table if k[0] == kind and k not in still]:
            del table[key]
        if len(entering) == 0:
            return
        # rows of entities already in the table change nothing: only new ones go on
        new = [
            i
            for i, k in zip(entering.tolist(), _keys(detection, entering), strict=True)
            if (kind, *k) not in table
        ]
        if not new:
            return
        enter = detection[pl.Series(new, dtype=pl.UInt32)].with_columns(
            pl.Series("frac", frac[new])
        )
        if stall and cfg.require_stall:
            enter = self._stalled(ctx, enter)
        for d, p, q, f, dt_s, ts, extra in enter.select(
            "device",
            "port",
            "qual",
            "frac",
            "dt",
            "ts",
            pl.col("extra") if "extra" in enter.columns else pl.lit(""),
        ).iter_rows():
            key = (kind, d, p, q)
            if key not in table:
                what = "received" if "rx" in metric else "sent"
                table[key] = _Active(
                    ts,
                    f"{d}/{p} prio {q} {what} pause {pct(f)} of {dt_s:.2f} s"
                    f" (threshold {pct(cfg.pause_fraction)}){extra}",
                )

    def _stalled(self, ctx: StepContext, enter: pl.DataFrame) -> pl.DataFrame:
        """Keep paused switch queues that held data and sent nothing (where the switch says so)."""
        t = self.config.detection_time_s
        tx = ctx.engine.window("queue_tx_pkts", t).select(
            "device", "port", "qual", pl.col("delta").alias("tx")
        )
        depth = ctx.engine.window("queue_depth_bytes", t).select(
            "device", "port", "qual", pl.col("max").alias("depth")
        )
        j = enter.join(tx, on=["device", "port", "qual"], how="left").join(
            depth, on=["device", "port", "qual"], how="left"
        )
        j = j.filter(
            (pl.col("tx").is_null() | (pl.col("tx") == 0))
            & (pl.col("depth").is_null() | (pl.col("depth") > 0))
        )
        return j.with_columns(
            pl.format(
                ", queue {} depth {} B, {} packets sent",
                pl.col("qual"),
                pl.col("depth").fill_null(-1).cast(pl.Int64),
                pl.col("tx").fill_null(-1).cast(pl.Int64),
            ).alias("extra")
        )

    # --- the pause graph -------------------------------------------------------------------------
    def evaluate(self, ctx: StepContext) -> list[Finding]:
        self.relaying = set()
        self._update(ctx, "pfc_rx_pause_us", "port", self.paused, stall=True)
        self._update(ctx, "nic_rx_pause_us", "nic", self.paused, stall=False)
        self._update(ctx, "nic_tx_pause_us", "nic", self.sending, stall=False)
        self._update(ctx, "pfc_tx_pause_us", "port", self.sending, stall=False)
        if not self.paused and not self.sending:
            return []
        topo = self.topology
        # sender -> evidence items (ts, text)
        senders: dict[Key, list[tuple[int, str]]] = {}
        victims_of: dict[Key, list[Key]] = {}
        for key, act in self.paused.items():
            kind, dev, port, prio = key
            peer = topo.peer_of_port(dev, port) if kind == "port" else topo.peer(NicEnd(dev, port))
            if peer is None:
                continue
            s = _end_key(peer, prio)
            senders.setdefault(s, []).append((act.ts, act.evidence))
            victims_of.setdefault(s, []).append(key)
        for key, act in self.sending.items():
            senders.setdefault(key, []).append((act.ts, act.evidence))
        now_paused = {_device(k) for k in (*self.paused, *self.relaying)}
        for pd in now_paused:
            span = self.device_paused.get(pd)
            if span is None or span[1] is not None:
                self.device_paused[pd] = [ctx.end, None]
        horizon = ctx.end - int(10 * cfg_relay_ns(self.config))
        for pd, span in list(self.device_paused.items()):
            if pd not in now_paused and span[1] is None:
                span[1] = ctx.end
            if span[1] is not None and span[1] < horizon:
                del self.device_paused[pd]
        relay_ns = cfg_relay_ns(self.config)

        def is_paused(s: Key, since: int) -> bool:
            span = self.device_paused.get(_device(s))
            if span is None:
                return False
            start, end = span
            assert start is not None
            return start <= since + relay_ns and (end is None or end >= since - relay_ns)

        findings: list[Finding] = []
        origins: list[Key] = []
        for s, ev in senders.items():
            if is_paused(s, min(t for t, _ in ev)):
                continue
            kind, dev, port, prio = s
            if kind == "port" and s not in self.sending and not victims_of.get(s):
                continue
            if kind == "port" and topo.peer_of_port(dev, port) is None and s not in self.sending:
                continue
            origins.append(s)
            ts = min(t for t, _ in ev)
            labels = node_labels(topo, dev, port) if kind == "nic" else port_labels(topo, dev, port)
            labels.update(priority=prio, role="origin")
            who = f"{dev}/{port}"
            findings.append(
                Finding(
                    "PFCStorm",
                    labels,
                    "critical",
                    ts,
                    summary=f"PFC storm on priority {prio} originating at {who}",
                    description=f"{who} keeps sending PFC pause on priority {prio} while not "
                    f"itself paused; {len(victims_of.get(s, []))} directly paused peer(s).",
                    evidence="; ".join(sorted(e for _, e in ev)[:8]),
                )
            )
        origin_names = ", ".join(sorted(f"{o[1]}/{o[2]}" for o in origins)) or "unknown"
        for key, act in self.paused.items():
            kind, dev, port, prio = key
            labels = node_labels(topo, dev, port) if kind == "nic" else port_labels(topo, dev, port)
            labels.update(priority=prio, role="victim")
            findings.append(
                Finding(
                    "PFCStorm",
                    labels,
                    "warning",
                    act.ts,
                    summary=f"{dev}/{port} priority {prio} stalled by PFC pause",
                    description=f"Paused by the storm from {origin_names}; not the culprit.",
                    evidence=act.evidence,
                    extra={"origin": origin_names},
                )
            )
        return findings


def _ge(a: np.ndarray, b: np.ndarray | float) -> np.ndarray:
    """``a >= b`` as Polars compares floats: NaN above every number."""
    return (a >= b) | np.isnan(a)


def _keys(frame: pl.DataFrame, rows: np.ndarray) -> list[tuple[str, str, str]]:
    """(device, port, qual) of the given rows."""
    if len(rows) == 0:
        return []
    sel = frame.select("device", "port", "qual")[pl.Series(rows, dtype=pl.UInt32)]
    return list(
        zip(*(sel.get_column(c).to_list() for c in ("device", "port", "qual")), strict=True)
    )


def _device(k: Key) -> Key:
    """A NIC is its own device; a switch port belongs to its switch."""
    return (k[0], k[1], k[2] if k[0] == "nic" else "", k[3])


def cfg_relay_ns(cfg: PfcStormConfig) -> int:
    return int(cfg.relay_window_s * 1e9)


def _end_key(end: PortEnd | NicEnd, prio: str) -> Key:
    if isinstance(end, NicEnd):
        return ("nic", end.node, end.nic, prio)
    return ("port", end.switch, end.port, prio)


def build(topology: Topology, config: PfcStormConfig | None = None) -> PfcStormDetector:
    return PfcStormDetector(topology, config or PfcStormConfig())


__all__ = ["PfcStormConfig", "PfcStormDetector", "Topology", "build"]
