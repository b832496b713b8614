"""PCIeDowngrade: a NIC whose PCIe link trained below its maximum speed or width.

A Gen5 x16 NIC that trains down to Gen4 (after a thermal event, a marginal riser, a firmware
hiccup) keeps working at about half its host bandwidth: a 400G port behind ~250 Gb/s of PCIe
becomes the straggler every NCCL ring waits for. The agent reads ``current_link_speed``,
``max_link_speed``, ``current_link_width`` and ``max_link_width`` from sysfs; a reading below
the maximum for ``min_duration_s`` (so a retrain caught mid-way does not count) raises a warning
labelled ``node`` + ``nic``. It resolves at the first reading back at the maximum.

Missing data is not evidence: a NIC that stops reporting (an agent gap) keeps its state until
``stale_s`` (or two and a half of its reading intervals, if longer) passes, and one whose
maximum is unknown is never judged. Each NIC's newest reading of every gauge is remembered, so
the cadence does not matter: a NIC read every 10 s fires at its first reading at least
``min_duration_s`` after the first one below its maximum, and its maximum may come in another
step than its current speed.

Cost: a healthy step writes its gauge readings into arrays over entity slots and compares each
new current speed and width with its NIC's maximum (NumPy, no loop per row); only the NICs
below it are looked at further.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from detectors.base import Finding, StepContext, check_positive_numbers, node_labels
from detectors.state import MISSED_SAMPLE_INTERVALS, EntitySlots
from detectors.windows import Step
from rocewatch.core.model import PCIE_DOWNGRADE
from rocewatch.core.state import Stateful
from rocewatch.core.topology import Topology

S = 1_000_000_000
SPEED, MAX_SPEED = "nic_pcie_speed_gts", "nic_pcie_max_speed_gts"
WIDTH, MAX_WIDTH = "nic_pcie_width", "nic_pcie_max_width"
LINK = "nic_link_speed_mbps"
GAUGES = (SPEED, MAX_SPEED, WIDTH, MAX_WIDTH, LINK)


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
class PcieDowngradeDetector(Stateful):
    topology: Topology
    config: PcieDowngradeConfig = field(default_factory=PcieDowngradeConfig)
    name: str = "pcie_downgrade"
    # the record types its state holds (rocewatch.core.state; the checkpoint codec reads no other)
    STATE_TYPES: ClassVar[tuple[type, ...]] = (_Nic, EntitySlots, Finding)
    # the metrics it reads from the window engine (steps carry no others to the detect stage)
    reads: ClassVar[frozenset[str]] = frozenset({SPEED, MAX_SPEED, WIDTH, MAX_WIDTH, LINK})

    @property
    def window_s(self) -> float:
        """The longest sliding window this detector reads: none, gauges of the newest step."""
        return 0.0

    def __post_init__(self) -> None:
        self.nics: dict[tuple[str, str], _Nic] = {}
        # per NIC slot: the newest reading of each gauge (nan: none yet) and its time, and the
        # NIC's reading interval (ns, smoothed): the maxima of a NIC read less often, or in
        # another step than its current values, are remembered, not looked for in one step
        self.slots = EntitySlots()
        self.value = np.empty((0, len(GAUGES)))
        self.seen = np.empty((0, len(GAUGES)), dtype=np.int64)
        self.interval = np.empty(0)

    def _grow(self) -> None:
        add = len(self.slots) - len(self.interval)
        if add > 0:
            self.value = np.concatenate([self.value, np.full((add, len(GAUGES)), np.nan)])
            self.seen = np.concatenate([self.seen, np.zeros((add, len(GAUGES)), dtype=np.int64)])
            self.interval = np.concatenate([self.interval, np.zeros(add)])

    def _observe(self, cur: Step) -> np.ndarray:
        """Remember the step's readings (NumPy over entity slots); return the slots with a new
        current speed or width."""
        fresh: list[np.ndarray] = []
        known = cur.positions
        for j, metric in enumerate(GAUGES):
            f = cur.get(metric)
            if f.height == 0:
                continue
            at = (known[0], known[1][metric]) if known is not None and metric in known[1] else None
            slot = self.slots.rows_at(f, at)
            self._grow()
            v = f.get_column("last").to_numpy().astype(np.float64)
            ts = f.get_column("ts").to_numpy()
            ok = np.isfinite(v) & (v > 0)  # unreadable is not a value
            if metric in (SPEED, WIDTH):
                prev = self.seen[slot, j]
                n = np.maximum(f.get_column("n").to_numpy().astype(np.float64), 1.0)
                iv = np.where(prev > 0, (ts - prev) / n, 0.0)
                old = self.interval[slot]
                upd = iv > 0
                self.interval[slot[upd]] = np.where(
                    old[upd] > 0, old[upd] + 0.25 * (iv[upd] - old[upd]), iv[upd]
                )
                fresh.append(slot[ok])
            self.value[slot[ok], j] = v[ok]
            self.seen[slot, j] = ts
        return np.unique(np.concatenate(fresh)) if fresh else np.empty(0, dtype=np.int64)

    def evaluate(self, ctx: StepContext) -> list[Finding]:
        cur = ctx.engine.current()
        if cur is None:
            return []
        new = self._observe(cur)
        if len(new):
            sp, ms, wd, mw = (self.value[new, GAUGES.index(m)] for m in GAUGES[:4])
            with np.errstate(invalid="ignore"):
                below = (sp < ms) | (wd < mw)  # nan (unknown) is never below
            cand = {self.slots.keys[int(i)] for i in new[below]}
            # NICs followed that read again (perhaps back at their maximum)
            again = set(new.tolist())
            cand |= {k for k in self.nics if self.slots.index.get(k, -1) in again}
            if cand:
                self._judge(cand)
        if self.nics:
            self._forget(ctx.end)
        return self._findings(ctx)

    def _stale_ns(self, key: tuple[str, str]) -> int:
        """How long a NIC may stay silent before it is forgotten: ``stale_s``, or two and a
        half of its reading intervals if longer."""
        i = self.slots.index.get(key, -1)
        iv = float(self.interval[i]) if i >= 0 else 0.0
        return round(max(self.config.stale_s * S, MISSED_SAMPLE_INTERVALS * iv))

    def _forget(self, end: int) -> None:
        for key in list(self.nics):
            if end - self.nics[key].last_ts > self._stale_ns(key):
                del self.nics[key]  # silent too long: no evidence either way

    def _judge(self, cand: set[tuple[str, str]]) -> None:
        """Update the state of the candidate NICs (a new reading in this step)."""
        cfg = self.config
        for key in sorted(cand):
            i = self.slots.index[key]
            speed, mspeed, width, mwidth, link = (_num(x) for x in self.value[i])
            ts = int(max(self.seen[i, GAUGES.index(SPEED)], self.seen[i, GAUGES.index(WIDTH)]))
            st = self.nics.get(key)
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
                link = link or self.topology.nic_speed_mbps(node, nic)
                st.evidence = _evidence(
                    key, speed, mspeed, width, mwidth, link, held, cfg.min_duration_s
                )

    def _findings(self, ctx: StepContext) -> list[Finding]:
        out = []
        for (node, nic), st in self.nics.items():
            if not st.active:
                continue
            if ctx.end - st.last_ts > self._stale_ns((node, nic)):
                continue
            out.append(
                Finding(
                    PCIE_DOWNGRADE,
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


def _num(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


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
