"""PCIeDowngrade: a NIC whose PCIe link trained below its maximum speed or width.

A Gen5 x16 NIC that trains down to Gen4 (after a thermal event, a marginal riser, a firmware
hiccup) keeps working at about half its host bandwidth: a 400G port behind ~250 Gb/s of PCIe
becomes the straggler every NCCL ring waits for. The agent reads ``current_link_speed``,
``max_link_speed``, ``current_link_width`` and ``max_link_width`` from sysfs; a reading below
the maximum for ``min_duration_s`` (so a retrain caught mid-way does not count) raises a warning
labelled ``node`` + ``nic``. It resolves at the first reading back at the maximum.

Missing data is not evidence: a NIC that stops reporting (an agent gap) keeps its state until
``stale_s`` passes, and one whose maximum is unknown is never judged.

Cost: a healthy step compares the lowest current speed and width with the highest maximum seen
in the fleet (four column reductions, a few µs); only NICs below that are looked at further,
and only while the gauges change or a NIC is still waiting out ``min_duration_s``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import polars as pl

from detectors.base import Finding, StepContext, check_positive_numbers, node_labels
from rocewatch.topology import Topology

S = 1_000_000_000
SPEED, MAX_SPEED = "nic_pcie_speed_gts", "nic_pcie_max_speed_gts"
WIDTH, MAX_WIDTH = "nic_pcie_width", "nic_pcie_max_width"
LINK = "nic_link_speed_mbps"


@dataclass(frozen=True)
class PcieDowngradeConfig:
    enabled: bool = True
    min_duration_s: float = 2.0  # a link retrain completes in milliseconds; a downgrade stays
    stale_s: float = 30.0  # forget a NIC that reported nothing for this long

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_positive_numbers(self, "pcie_downgrade")


def pcie_gbps(gts: float, width: float) -> float:
    """Usable PCIe bandwidth (one direction) in Gb/s: 8b/10b up to Gen2, 128b/130b from Gen3.

    >>> round(pcie_gbps(16.0, 16)), round(pcie_gbps(32.0, 16))
    (252, 504)
    """
    return gts * width * (0.8 if gts < 8 else 128 / 130)


@dataclass
class _Nic:
    since: int  # time of the first reading below the maximum in this run
    last_ts: int  # newest reading
    active: bool = False
    reporting: bool = True  # whether it reported in the last step judged
    fired_ts: int = 0
    evidence: str = ""


@dataclass
class PcieDowngradeDetector:
    topology: Topology
    config: PcieDowngradeConfig = field(default_factory=PcieDowngradeConfig)
    name: str = "pcie_downgrade"
    # the metrics it reads from the window engine (steps carry no others to the detect stage)
    reads: ClassVar[frozenset[str]] = frozenset({SPEED, MAX_SPEED, WIDTH, MAX_WIDTH, LINK})

    @property
    def window_s(self) -> float:
        """The longest sliding window this detector reads: none, gauges of the newest step."""
        return 0.0

    def __post_init__(self) -> None:
        self.nics: dict[tuple[str, str], _Nic] = {}
        self.top_speed = 0.0  # the highest maximum speed and width seen in the fleet
        self.top_width = 0.0
        self.sig: tuple[object, ...] = ()  # what the gauges looked like when last judged

    def evaluate(self, ctx: StepContext) -> list[Finding]:
        cur = ctx.engine.current()
        if cur is None:
            return []
        sp, w = cur.get(SPEED), cur.get(WIDTH)
        for frame, attr in ((cur.get(MAX_SPEED), "top_speed"), (cur.get(MAX_WIDTH), "top_width")):
            if frame.height:
                top = frame.get_column("last").max()
                if isinstance(top, int | float) and top > getattr(self, attr):
                    setattr(self, attr, float(top))
        low_speed = sp.get_column("last").min() if sp.height else None
        low_width = w.get_column("last").min() if w.height else None
        below = (isinstance(low_speed, int | float) and low_speed < self.top_speed) or (
            isinstance(low_width, int | float) and low_width < self.top_width
        )
        if not below and not self.nics:
            return []  # the healthy fast path: every NIC at the fleet's best
        sig = (
            sp.height,
            w.height,
            float(np.sum(sp.get_column("last").to_numpy() < self.top_speed)) if sp.height else 0,
            float(np.sum(w.get_column("last").to_numpy() < self.top_width)) if w.height else 0,
            sp.get_column("last").sum() if sp.height else 0,
            w.get_column("last").sum() if w.height else 0,
        )
        if sig == self.sig and all(st.active for st in self.nics.values()):
            # the same NICs below the same speeds as last step, all already alerting
            for st in self.nics.values():
                if st.reporting:
                    st.last_ts = ctx.end
            return self._findings(ctx)
        self.sig = sig
        cand = set(self.nics)
        if below:
            for frame, top in ((sp, self.top_speed), (w, self.top_width)):
                if frame.height:
                    low = frame.filter(pl.col("last") < top).select("device", "port")
                    cand.update((str(d), str(p)) for d, p in low.iter_rows())
        self._judge(ctx, cand)
        return self._findings(ctx)

    def _judge(self, ctx: StepContext, cand: set[tuple[str, str]]) -> None:
        """Update the state of the candidate NICs from the newest step's gauges."""
        cfg = self.config
        cur = ctx.engine.current()
        assert cur is not None
        nodes = sorted({d for d, _ in cand})
        ports = sorted({p for _, p in cand})
        parts = [f for m in (SPEED, MAX_SPEED, WIDTH, MAX_WIDTH, LINK) if (f := cur.get(m)).height]
        vals: dict[tuple[str, str], dict[str, tuple[float, int]]] = {}
        if parts:
            rows = (
                pl.concat(parts, how="vertical", rechunk=False)
                .filter(pl.col("device").is_in(nodes) & pl.col("port").is_in(ports))
                .select("device", "port", "metric", "last", "ts")
            )
            for d, p, m, v, ts in rows.iter_rows():  # a few rows per NIC below its best
                vals.setdefault((d, p), {})[m] = (v, ts)
        for key in sorted(cand):
            got = vals.get(key, {})
            st = self.nics.get(key)
            if st is not None:
                st.reporting = bool(got)
            if not got:
                if st is not None and ctx.end - st.last_ts > round(cfg.stale_s * S):
                    del self.nics[key]  # silent too long: no evidence either way
                continue
            ts = max(t for _, t in got.values())
            speed, mspeed = got.get(SPEED, (None, 0))[0], got.get(MAX_SPEED, (None, 0))[0]
            width, mwidth = got.get(WIDTH, (None, 0))[0], got.get(MAX_WIDTH, (None, 0))[0]
            slow = _known(speed, mspeed) and speed < mspeed  # type: ignore[operator]
            narrow = _known(width, mwidth) and width < mwidth  # type: ignore[operator]
            if not slow and not narrow:
                if _known(speed, mspeed) or _known(width, mwidth):
                    self.nics.pop(key, None)  # back at its maximum (or never below it)
                continue
            if st is None:
                st = self.nics[key] = _Nic(since=ts, last_ts=ts)
            st.last_ts = ts
            held = (ts - st.since) / S
            if not st.active and held >= cfg.min_duration_s:
                st.active, st.fired_ts = True, ts
                node, nic = key
                link = got.get(LINK, (None, 0))[0] or self.topology.nic_speed_mbps(node, nic)
                st.evidence = _evidence(
                    key, speed, mspeed, width, mwidth, link, held, cfg.min_duration_s
                )

    def _findings(self, ctx: StepContext) -> list[Finding]:
        out = []
        for (node, nic), st in self.nics.items():
            if not st.active:
                continue
            if ctx.end - st.last_ts > round(self.config.stale_s * S):
                continue
            out.append(
                Finding(
                    "PCIeDowngrade",
                    node_labels(self.topology, node, nic),
                    "warning",
                    st.fired_ts,
                    summary=f"{node}/{nic} PCIe link below its maximum",
                    description=f"The PCIe link of {node}/{nic} trained below its maximum speed "
                    "or width, so the host cannot feed the port at line rate: the NIC becomes "
                    "a straggler for every ring it is in. Reseat or reboot to retrain the link.",
                    evidence=st.evidence,
                )
            )
        return out


def _known(cur: float | None, mx: float | None) -> bool:
    return cur is not None and mx is not None and cur > 0 and mx > 0


def _evidence(
    key: tuple[str, str],
    speed: float | None,
    mspeed: float | None,
    width: float | None,
    mwidth: float | None,
    link_mbps: float | None,
    held: float,
    min_s: float,
) -> str:
    node, nic = key

    def fmt(s: float | None, w: float | None) -> str:
        return f"{s:g} GT/s x{w:g}" if s and w else (f"{s:g} GT/s" if s else f"x{w:g}")

    text = (
        f"{node}/{nic} PCIe {fmt(speed, width)}, maximum {fmt(mspeed, mwidth)}, for "
        f"{held:.1f} s (threshold {min_s:g} s)"
    )
    if speed and width and mspeed and mwidth:
        now, best = pcie_gbps(speed, width), pcie_gbps(mspeed, mwidth)
        text += f"; host bandwidth ~{now:.0f} Gb/s of {best:.0f}"
        if link_mbps:
            text += f", port {link_mbps / 1000:g} Gb/s"
    return text


def build(topology: Topology, config: PcieDowngradeConfig | None = None) -> PcieDowngradeDetector:
    return PcieDowngradeDetector(topology, config or PcieDowngradeConfig())


__all__ = ["PcieDowngradeConfig", "PcieDowngradeDetector", "build", "pcie_gbps"]
