"""ECMPImbalance: the uplinks of one ECMP group carry persistently unequal load while it is busy.

Training traffic is a few elephant flows per NIC. Static ECMP hashes each flow's 5-tuple onto
one uplink, so two elephants can land on the same uplink while another uplink of the group
idles: the group delivers 60-70 % of what it could. The ECMP group of a switch is its cables to
switches of the tier above (a leaf's uplinks to its spines, a spine's to the core), as the
topology's ``links`` say; a group needs at least ``min_uplinks`` of them.

From the interface byte counters (``port_out_octets``) each uplink's utilisation is its
transmitted bits over its link speed (the port's ``port_speed_mbps`` where reported, else the
fastest NIC the topology cables to that switch, else ``default_speed_gbps``). A group is judged
once every reporting uplink's readings since the last judgement cover ``judge_s`` (one reading
alone at a slower cadence), so collective bursts of ~0.5 s average out and every uplink of a
judgement covers about the same time, whatever the cadence. A judgement is *imbalanced* when

- the group is busy: its mean utilisation is at least ``busy_util``;
- its busiest uplink is at least ``hot_util``;
- an uplink is cold: at most ``cold_ratio`` x the group's mean; and
- the imbalance, max / mean utilisation, is at least ``min_imbalance``.

Byte counters alone cannot tell the uplink that carries two squeezed elephants from one that
carries one at full speed (both run near line rate): the cold uplink is what shows the
collision. The *hot* uplink named is, where the switch reports ECN marks on its uplink queues,
the one marking most among those at or above the mean (two flows into one uplink fill its
queue, DCQCN marks them down to half each: it runs a little below one flow alone); else those
near the busiest (at least 0.95 x its utilisation).

Left out of a group (and listed in the evidence): an uplink that carries nothing either way
(below ``down_util`` in both directions: down, or not routed over, which is FlakyLink's case or
the operator's, not a hash), one with carrier transitions or input/FCS errors within
``error_hold_s`` (a flapping or erroring link: FlakyLink), and one that does not report. A group
with an uplink paused by PFC for ``pause_share`` of the judgement is not judged at all: a storm
stops uplinks unequally and PFCStorm names it. Fewer than ``min_uplinks`` left: not judged.

Cadence: each judgement is a row of the ``Sustain`` state machine (detectors/state.py) spanning
the time it covers, so the alert needs imbalanced judgements for ``sustain_s`` and at least two
of them (one slow reading never fires alone): at 0.1 and 1 s cadence about ``sustain_s`` after
the onset, at 5 s at the second reading wholly inside the fault. It stays while the group is
busy (0.8 x ``busy_util``) with an uplink below ``exit_cold_ratio`` x the mean, and clears
``clear_s`` (plus 2.5 judgement spans) after that last held. Counter resets give one short
reading (rates.py) that two judgements never both show; gaps make a longer judgement.

Adaptive routing (packet spraying) balances a group by construction: it never fires there. INT
reports may carry the inner 5-tuple of the packets they sample (collector/inband/report.py
parses them with ``inner=True``), but the sample stream detectors read aggregates INT per
egress queue, without flows: the alert names uplinks, not flows (the simulator's ground truth
names the colliding flows).

The alert is labelled with the switch (and its rail); ``uplinks`` lists the hot and cold uplinks
and their cable peers as entity label sets (the inhibition stage reads it: congestion on the
hot uplink is the collision's symptom, rocewatch/alerting/inhibit.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import polars as pl

from detectors.base import Finding, StepContext, check_positive_numbers
from detectors.state import EntitySlots, Episode, Key, Row, Sustain
from detectors.windows import Step
from rocewatch.core.errors import ConfigError
from rocewatch.core.members import encode_members
from rocewatch.core.model import ECMP_IMBALANCE
from rocewatch.core.state import Stateful
from rocewatch.core.topology import PortEnd, Topology

NS = 1_000_000_000
TIER = {"leaf": 0, "spine": 1, "core": 2}
OUT, IN, PAUSE = "port_out_octets", "port_in_octets", "pfc_rx_pause_us"
MARKS = "queue_ecn_marked_pkts"
BAD = ("port_carrier_transitions", "port_in_fcs_errors", "port_in_errors")
SPEED = "port_speed_mbps"
UPLINKS = "uplinks"  # the annotation listing the hot and cold uplinks (and their peers)
NEAR_MAX = 0.95  # of the busiest uplink's utilisation: hot too
MISSED = 2.5  # intervals without a reading: the uplink stopped reporting
# accumulator columns, per uplink, since its group was last judged
OUT_B, OUT_S, IN_B, IN_S, PAUSE_US, MARK_N, IV_S, SPEED_MBPS = range(8)
LAST_TS, BAD_TS = range(2)


@dataclass(frozen=True)
class EcmpImbalanceConfig:
    """When one ECMP group's uplinks carry persistently unequal load (module docstring)."""

    judge_s: float = 1.0  # each uplink's readings summed over this long, at least one reading
    busy_util: float = 0.3  # the group's mean utilisation (of its uplinks' line rate)
    hot_util: float = 0.6  # the busiest uplink's utilisation
    cold_ratio: float = 0.5  # an uplink at most this x the group's mean is cold
    min_imbalance: float = 1.2  # max / mean utilisation
    exit_cold_ratio: float = 0.7  # stays while an uplink is below this x the mean
    sustain_s: float = 3.0  # imbalanced judgements this long (and two at least) to fire
    clear_s: float = 3.0  # resolves this long (plus 2.5 judgement spans) after it last held
    down_util: float = 0.01  # both directions below this: down or unused, not in the group
    pause_share: float = 0.2  # an uplink paused this share of a judgement: not judged (PFC)
    error_hold_s: float = 60.0  # an uplink that flapped or errored this recently is left out
    default_speed_gbps: float = 400.0  # uplink speed where neither telemetry nor topology says
    min_uplinks: int = 2  # uplinks left in a group to judge it
    enabled: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        where = "detectors.ecmp_imbalance"
        check_positive_numbers(self, where)
        for name in ("busy_util", "hot_util", "cold_ratio", "exit_cold_ratio", "down_util"):
            if getattr(self, name) >= 1:
                raise ConfigError(f"{where}.{name}: must be below 1")
        if self.pause_share > 1:
            raise ConfigError(f"{where}.pause_share: must be within (0, 1]")
        if self.min_imbalance <= 1:
            raise ConfigError(f"{where}.min_imbalance: must be > 1 (max / mean)")
        if self.exit_cold_ratio < self.cold_ratio:
            raise ConfigError(f"{where}: exit_cold_ratio must be >= cold_ratio")
        if self.busy_util > self.hot_util:
            raise ConfigError(f"{where}: busy_util must not exceed hot_util")
        if isinstance(self.min_uplinks, bool) or int(self.min_uplinks) != self.min_uplinks:
            raise ConfigError(f"{where}.min_uplinks: must be a whole number")
        if self.min_uplinks < 2:
            raise ConfigError(f"{where}.min_uplinks: must be >= 2")


def ecmp_groups(topology: Topology) -> dict[str, tuple[str, ...]]:
    """Each switch's ECMP group: its ports cabled to a switch of the tier above (leaf -> spine,
    spine -> core), where it has two or more.

    >>> t = Topology.from_dict({"switches": [{"name": "l", "role": "leaf"},
    ...     {"name": "s0", "role": "spine"}, {"name": "s1", "role": "spine"}],
    ...     "links": [{"a": "l/up1", "b": "s0/p1"}, {"a": "s1/p1", "b": "l/up2"}]})
    >>> ecmp_groups(t)
    {'l': ('up1', 'up2')}
    """
    out: dict[str, list[str]] = {}
    for a, b in topology.links:
        for x, y in ((a, b), (b, a)):
            sx, sy = topology.switches.get(x.switch), topology.switches.get(y.switch)
            if sx is None or sy is None:
                continue
            if TIER.get(sy.role, -1) > TIER.get(sx.role, -1) >= 0:
                out.setdefault(x.switch, []).append(x.port)
    return {k: tuple(sorted(set(v))) for k, v in sorted(out.items()) if len(set(v)) >= 2}


@dataclass(frozen=True)
class Judgement:
    """One group's judgement: what a firing alert describes."""

    ts: int
    span_s: float
    util: tuple[tuple[str, float], ...]  # every uplink judged: (port, utilisation)
    mean: float
    top: float
    hot: tuple[str, ...]
    cold: tuple[str, ...]
    left_out: tuple[tuple[str, str], ...] = ()  # (port, why)
    marks: tuple[tuple[str, float], ...] = ()  # (port, ECN marks/s) where reported


@dataclass
class EcmpImbalanceDetector(Stateful):
    topology: Topology
    config: EcmpImbalanceConfig = field(default_factory=EcmpImbalanceConfig)
    name: str = "ecmp_imbalance"
    # the record types its state holds (rocewatch.core.state; the checkpoint codec reads no other)
    STATE_TYPES: ClassVar[tuple[type, ...]] = (Sustain, Episode, Judgement)
    # derived from the topology and configuration at every start, or caches
    NOT_STATE: ClassVar[frozenset[str]] = frozenset(
        {"groups", "keys", "index", "group_of", "members_of", "base_speed", "slots", "slot_member"}
    )
    reads: ClassVar[frozenset[str]] = frozenset({OUT, IN, PAUSE, MARKS, SPEED, *BAD})

    def __post_init__(self) -> None:
        c = self.config
        self.groups = ecmp_groups(self.topology)
        self.keys: list[tuple[str, str]] = [(sw, p) for sw, ps in self.groups.items() for p in ps]
        self.index = {k: i for i, k in enumerate(self.keys)}
        gnames = list(self.groups)
        self.group_of = np.array([gnames.index(sw) for sw, _ in self.keys], dtype=np.int64)
        self.members_of = [np.flatnonzero(self.group_of == g) for g in range(len(gnames))]
        self.base_speed = np.array([self._speed_gbps(sw) * 1e9 for sw, _ in self.keys])
        self.slots = EntitySlots()
        self.slot_member = np.zeros(0, dtype=np.int64)
        m = len(self.keys)
        self.acc = np.zeros((m, 8))
        self.acc[:, SPEED_MBPS] = np.nan
        self.ts = np.zeros((m, 2), dtype=np.int64)
        # a judgement waits for every uplink's readings: one lost reading delays it by an
        # interval, so a dip of one judgement more than Sustain's own slack is tolerated
        self.sustain = Sustain(c.sustain_s, c.judge_s, c.clear_s, min_rows=2)

    @property
    def window_s(self) -> float:
        """Reads only the newest step: the history it needs is its own."""
        return 0.0

    def _speed_gbps(self, switch: str) -> float:
        """The fastest NIC cabled to ``switch`` (uplinks run at least that fast), else the
        configured default."""
        speeds = [
            n.speed_gbps
            for n in self.topology.nics.values()
            if n.switch_port is not None and n.switch_port.switch == switch and n.speed_gbps
        ]
        return float(max(speeds)) if speeds else self.config.default_speed_gbps

    # --- state -------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The accumulators by uplink name (the topology's groups may differ after a restart)."""
        return {
            "uplinks": list(self.keys),
            "acc": self.acc.copy(),
            "ts": self.ts.copy(),
            "sustain": self.sustain,
        }

    def restore(self, data: dict[str, Any]) -> None:
        fresh = self.sustain
        keys = [tuple(k) for k in data.get("uplinks", [])]
        acc, ts = data.get("acc"), data.get("ts")
        if acc is not None and ts is not None and len(keys) == len(acc) == len(ts):
            for old, k in enumerate(keys):
                i = self.index.get((str(k[0]), str(k[1])))
                if i is not None:
                    self.acc[i] = acc[old]
                    self.ts[i] = ts[old]
        got = data.get("sustain")
        if isinstance(got, Sustain):
            for p in Sustain.PARAMS:
                setattr(got, p, getattr(fresh, p))
            got.episodes = {k: v for k, v in got.episodes.items() if k[1] in self.groups}
            self.sustain = got

    # --- per step ----------------------------------------------------------------------------
    def evaluate(self, ctx: StepContext) -> list[Finding]:
        cur = ctx.engine.current()
        rows: list[Row] = []
        if cur is not None and self.keys:
            touched = self._read(cur)
            if len(touched):
                rows = self._judge(touched, ctx.end)
        if not rows and not self.sustain.episodes:
            return []
        fired = self.sustain.update(ctx.start, ctx.end, rows)
        return [self._finding(k, ep) for k, ep in fired]

    def _members(self, cur: Step, metric: str) -> tuple[np.ndarray, np.ndarray, pl.DataFrame]:
        """The uplink index of the rows of ``metric`` that are uplinks of a group, the rows'
        positions in the step's frame, and the frame."""
        f = cur.get(metric)
        none = np.zeros(0, dtype=np.int64)
        if f.height == 0:
            return none, none, f
        known = cur.positions
        at = None
        if known is not None and metric in known[1]:
            at = (known[0], known[1][metric])
        s = self.slots.rows_at(f, at)
        n = len(self.slots)
        if n > len(self.slot_member):
            new = [self.index.get(k, -1) for k in self.slots.keys[len(self.slot_member) :]]
            self.slot_member = np.concatenate([self.slot_member, np.array(new, dtype=np.int64)])
        m = self.slot_member[s]
        keep = np.flatnonzero(m >= 0)
        return m[keep], keep, f

    def _counter(self, cur: Step, metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any]:
        """Uplink index, delta, dt and ts of the valid rows of a counter (NumPy only: no frame
        is gathered)."""
        m, keep, f = self._members(cur, metric)
        if len(m) == 0:
            z = np.zeros(0)
            return m, z, z, np.zeros(0, dtype=np.int64)
        d = f["delta"].to_numpy()[keep].astype(np.float64)
        dt = f["dt"].to_numpy()[keep].astype(np.float64)
        ts = f["ts"].to_numpy()[keep].astype(np.int64)
        ok = np.isfinite(d) & np.isfinite(dt) & (dt > 0) & (d >= 0)
        if metric == OUT:
            n = np.maximum(f["n"].to_numpy()[keep].astype(np.float64), 1.0)
            self.acc[m[ok], IV_S] = (dt / n)[ok]
        return m[ok], d[ok], dt[ok], ts[ok]

    def _read(self, cur: Step) -> np.ndarray:
        """Sum the step's readings into each uplink's accumulators; the uplinks whose bytes
        were read."""
        m, d, dt, ts = self._counter(cur, OUT)
        np.add.at(self.acc[:, OUT_B], m, d)
        np.add.at(self.acc[:, OUT_S], m, dt)
        np.maximum.at(self.ts[:, LAST_TS], m, ts)
        touched = m
        mi, d, dt, _ = self._counter(cur, IN)
        np.add.at(self.acc[:, IN_B], mi, d)
        np.add.at(self.acc[:, IN_S], mi, dt)
        mp, d, _, _ = self._counter(cur, PAUSE)
        if len(mp):
            # the priorities of a port: the most paused one (pauses of two priorities overlap)
            most = np.zeros(len(self.keys))
            np.maximum.at(most, mp, d)
            self.acc[:, PAUSE_US] += most
        mm, d, _, _ = self._counter(cur, MARKS)
        np.add.at(self.acc[:, MARK_N], mm, d)
        for metric in BAD:
            mb, d, _, ts = self._counter(cur, metric)
            hit = d > 0
            np.maximum.at(self.ts[:, BAD_TS], mb[hit], ts[hit])
        ms, keep, f = self._members(cur, SPEED)
        if len(ms):
            v = f["last"].to_numpy()[keep].astype(np.float64)
            ok = np.isfinite(v) & (v > 0)
            self.acc[ms[ok], SPEED_MBPS] = v[ok]
        return np.unique(touched)

    def _judge(self, touched: np.ndarray, now: int) -> list[Row]:
        """Judge the groups read in this step whose every reporting uplink's readings cover
        ``judge_s`` (or one slower reading); start their next judgement afresh."""
        cfg = self.config
        groups = np.unique(self.group_of[touched])
        last, iv = self.ts[:, LAST_TS], self.acc[:, IV_S]
        stale = np.round(np.maximum(MISSED * iv, cfg.judge_s) * NS).astype(np.int64)
        present = (last > 0) & (last >= now - stale - NS // 10)
        short = present & (self.acc[:, OUT_S] < 0.9 * np.maximum(cfg.judge_s, iv))
        n = len(self.groups)
        n_present = np.bincount(self.group_of, weights=present, minlength=n)[groups]
        n_short = np.bincount(self.group_of, weights=short, minlength=n)[groups]
        rows: list[Row] = []
        for g in groups[(n_present >= cfg.min_uplinks) & (n_short == 0)].tolist():
            mem = self.members_of[g]
            row = self._judgement(mem, present[mem])
            self.acc[mem, OUT_B : IN_S + 1] = 0.0
            self.acc[mem, PAUSE_US] = 0.0
            self.acc[mem, MARK_N] = 0.0
            if row is not None:
                rows.append(row)
        return rows

    def _judgement(self, mem: np.ndarray, present: np.ndarray) -> Row | None:
        cfg = self.config
        acc = self.acc[mem]
        span = float(np.median(acc[present, OUT_S]))
        speed = np.where(acc[:, SPEED_MBPS] > 0, acc[:, SPEED_MBPS] * 1e6, self.base_speed[mem])
        with np.errstate(divide="ignore", invalid="ignore"):
            out_u = acc[:, OUT_B] * 8 / acc[:, OUT_S] / speed
            in_u = np.where(acc[:, IN_S] > 0, acc[:, IN_B] * 8 / acc[:, IN_S] / speed, 0.0)
            paused = acc[:, PAUSE_US] / 1e6 / acc[:, OUT_S]
        ts = int(self.ts[mem, LAST_TS].max())
        if np.any(present & (np.nan_to_num(paused) >= cfg.pause_share)):
            return None  # a storm stops uplinks unequally: PFCStorm's case
        left: list[tuple[str, str]] = []
        live = present.copy()
        hold = round(cfg.error_hold_s * NS)
        for j, i in enumerate(mem.tolist()):
            port = self.keys[i][1]
            if not present[j]:
                left.append((port, "not reporting"))
            elif self.ts[i, BAD_TS] > 0 and ts - self.ts[i, BAD_TS] <= hold:
                live[j] = False
                left.append((port, "flapped or errored lately"))
            elif out_u[j] < cfg.down_util and in_u[j] < cfg.down_util:
                live[j] = False
                left.append((port, "carries nothing either way (down or unused)"))
        key: Key = ("ecmp", self.keys[int(mem[0])][0])
        iv_ns = round(span * NS)
        if live.sum() < cfg.min_uplinks:
            return Row(key, -1, ts, (), iv_ns, iv_ns)
        u = out_u[live]
        mean, top, low = float(u.mean()), float(u.max()), float(u.min())
        imbalance = top / mean if mean > 0 else 0.0
        enter = (
            mean >= cfg.busy_util
            and top >= cfg.hot_util
            and low <= cfg.cold_ratio * mean
            and imbalance >= cfg.min_imbalance
        )
        stay = mean >= 0.8 * cfg.busy_util and low <= cfg.exit_cold_ratio * mean
        level = 1 if enter else (0 if stay else -1)
        if level < 1:
            return Row(key, level, ts, (), iv_ns, iv_ns)
        ports = [self.keys[int(i)][1] for i in mem]
        live_idx = np.flatnonzero(live)
        near = [j for j in live_idx.tolist() if out_u[j] >= NEAR_MAX * top]
        marks = {
            ports[j]: float(acc[j, MARK_N] / acc[j, OUT_S])
            for j in live_idx.tolist()
            if acc[j, MARK_N] > 0
        }
        hot = [ports[j] for j in near]
        # two flows squeezed into one uplink run it a little below one flow alone: the queue
        # that marks most among the uplinks not cold names it
        loaded = [ports[j] for j in live_idx.tolist() if out_u[j] >= mean]
        lead = max(loaded, key=lambda p: marks.get(p, 0.0))
        if marks.get(lead, 0.0) > 0:
            hot = [lead]
        cold = [ports[j] for j in live_idx.tolist() if out_u[j] <= cfg.cold_ratio * mean]
        info = Judgement(
            ts,
            span,
            tuple((ports[j], float(out_u[j])) for j in live_idx.tolist()),
            mean,
            top,
            tuple(hot),
            tuple(cold),
            tuple(left),
            tuple(sorted(marks.items())),
        )
        return Row(key, 1, ts, (info,), iv_ns, iv_ns)

    # --- findings ----------------------------------------------------------------------------
    def _finding(self, key: Key, ep: Episode) -> Finding:
        cfg = self.config
        switch = key[1]
        j: Judgement = ep.info[0]
        labels = {"switch": switch}
        sw = self.topology.switches.get(switch)
        if sw is not None and sw.rail is not None:
            labels["rail"] = str(sw.rail)
        imbalance = j.top / j.mean if j.mean > 0 else math.inf
        util = ", ".join(f"{p} {u:.0%}" for p, u in j.util)
        hot, cold = ", ".join(j.hot), ", ".join(j.cold)
        n = len(j.util)
        # what the group delivers against all its uplinks at the busiest one's rate
        used = j.mean / j.top if j.top > 0 else 0.0
        members = []
        for p in (*j.hot, *j.cold):
            members.append({"switch": switch, "port": p})
            peer = self.topology.peer_of_port(switch, p)
            if isinstance(peer, PortEnd):
                members.append({"switch": peer.switch, "port": peer.port})
        left = "; ".join(f"{p}: {why}" for p, why in j.left_out)
        marks = ", ".join(f"{p} {m:,.0f}/s" for p, m in j.marks)
        sustained = (ep.last_hot - ep.since) / NS
        return Finding(
            ECMP_IMBALANCE,
            labels,
            ep.severity or "warning",
            ep.ts,
            summary=f"ECMP collision on {switch}: uplink {hot} hot, {cold} cold "
            f"(imbalance {imbalance:.2f})",
            description=f"The {n} uplinks of {switch}'s ECMP group carry unequal load while the "
            f"group is busy: {hot} at {j.top:.0%} of line rate, {cold} at or below "
            f"{cfg.cold_ratio:g}x the group's mean of {j.mean:.0%}. Static ECMP hashed "
            f"elephant flows onto the same uplink while another idles: the group delivers "
            f"about {used:.0%} of what its uplinks could at the busiest one's rate.",
            evidence=f"{switch}: utilisation over {j.span_s:.2g} s: {util}; mean {j.mean:.1%}, "
            f"max {j.top:.1%}, max/mean {imbalance:.2f}; imbalanced in every judgement for "
            f"{sustained:.1f} s; thresholds: mean >= {cfg.busy_util:.0%}, max >= "
            f"{cfg.hot_util:.0%}, an uplink <= {cfg.cold_ratio:g}x mean, max/mean >= "
            f"{cfg.min_imbalance:g}, for {cfg.sustain_s:g} s"
            + (f"; ECN marks: {marks}" if marks else "")
            + (f"; left out: {left}" if left else ""),
            extra={
                UPLINKS: encode_members(members),
                "hot_uplinks": hot,
                "cold_uplinks": cold,
                "imbalance": f"{imbalance:.2f}",
            },
        )


def build(topology: Topology, config: EcmpImbalanceConfig | None = None) -> EcmpImbalanceDetector:
    return EcmpImbalanceDetector(topology, config or EcmpImbalanceConfig())


__all__ = ["UPLINKS", "EcmpImbalanceConfig", "EcmpImbalanceDetector", "build", "ecmp_groups"]
