"""FlakyLink: a cable whose physical layer degrades: BER above its own baseline, errors, flaps.

A bad cable or optic shows long before it fails outright:

- pre-FEC BER rising above the link's *own* learned baseline. The driver exports no bit counter,
  so BER = corrected bits / (link speed x interval), from the NIC end (``rx_corrected_bits_phy``);
  speed from the netdev (``speed_mbps``), else the topology's ``speed_gbps``, else 400G.
  Healthy PAM4 links run around 1e-8..1e-6, each at its own level, so a rise of ``ber_ratio``
  over the baseline (and above ``ber_floor``) flags a link early; ``ber_max`` flags any link
  whatever its history (one that was already bad when rocewatch started);
- FCS/CRC errored frames at either end (``in-fcs-errors`` on the switch, ``rx_crc_errors_phy``
  on the NIC), symbol errors, FEC-uncorrectable blocks (post-FEC errors: critical);
- flaps: carrier transitions at a switch end (two a flap), ``link_down_events_phy`` or the RDMA
  port's ``link_downed`` at a NIC end (one a flap; the larger where both are read) (critical).

Hysteresis: BER must stay above threshold in readings at least ``ber_min_s`` apart without a
reading below; errors need ``min_*`` within ``error_window_s``, seen in two reads (one burst in
one read is not a trend); a flagged cable stays flagged until ``clear_s`` passed with nothing
bad (BER back below the exit threshold, no errors, no flap). One flap on its own (a reboot, a
re-seated cable) is not a flaky link; ``min_flaps`` within ``flap_window_s`` are, and any flap
on a flagged cable makes it critical.

Cadence: every duration holds at the counters' own sampling interval. A BER reading is the
corrected bits of all samples since the link was last judged, once they cover ``ber_every_s``
(a link read every 5 s is judged at each reading), and the baseline learns each reading by
the time it covers. The error window holds two reads of the cable's counters (at least
``max(error_window_s, 2.5 intervals)``), and the counts it needs scale to two reads' worth of
time (``min_* x max(1, 2 x interval / error_window_s)``): the same errors per second at any
cadence. The flap window is at least three intervals.

The alert names the cable: for a NIC cable ``node``+``nic`` and ``switch``+``port`` of the leaf
end (both ends, from the topology); for a switch-to-switch cable the end that saw errors, with
the peer in the ``peer`` annotation. The ``strands`` annotation names the node that loses the
rail when the cable goes down.

Cost: a healthy step reads the maximum of six error counters' deltas (a few µs) and sums the
step's corrected-bit readings into each link's slot; a link's sum is judged, and its baseline
learned, once per ``ber_every_s`` (numpy arrays over entity slots: no join, no loop per row).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field, fields
from typing import ClassVar

import numpy as np
import polars as pl

from detectors.base import Finding, StepContext, node_labels, port_labels
from detectors.state import MISSED_SAMPLE_INTERVALS, EntitySlots
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import FLAKY_LINK
from rocewatch.core.state import Stateful
from rocewatch.core.topology import NicEnd, PortEnd, Topology

log = logging.getLogger(__name__)

S = 1_000_000_000
# error and flap counters -> what they count
ERROR_METRICS: dict[str, str] = {
    "port_in_fcs_errors": "fcs",
    "nic_rx_crc_errors": "fcs",
    "nic_rx_symbol_errors": "symbol",
    "nic_rx_uncorrectable": "uncorrectable",
    "port_carrier_transitions": "carrier",
    "nic_link_down_events": "link_down",
    # the RDMA port's own count (port_counters/link_downed), for agents that export no ethtool
    # PHY counters; a NIC exporting both counts each flap in each: an end's flaps are the most
    # any one of its counters shows, never their sum
    "nic_port_link_downed": "link_downed",
}
_FLAP_KINDS = ("carrier", "link_down", "link_downed")
CableKey = tuple[str, str, str]  # ("nic", node, nic) | ("link", end, end) | ("port", sw, port)


@dataclass(frozen=True)
class FlakyLinkConfig:
    """Thresholds for a flaky cable. Defaults follow what operators of 400G PAM4 fabrics use."""

    enabled: bool = True
    # pre-FEC BER: a link's readings summed over ber_every_s (or each reading, if longer)
    ber_every_s: float = 0.5
    ber_min_s: float = 0.5  # above threshold in readings this far apart, none below, to flag
    ber_ratio: float = 100.0  # two decades over the link's own baseline...
    ber_floor: float = 1e-6  # ...and above the worst healthy PAM4 link
    ber_max: float = 1e-5  # any link: little FEC margin left (KP4 corrects up to ~2.4e-4)
    ber_exit_factor: float = 0.1  # recovered below max(threshold x this, baseline x exit_ratio)
    ber_exit_ratio: float = 3.0
    baseline_tau_s: float = 600.0  # EWMA of log10(BER): follows slow drift, not a failing optic
    baseline_min_s: float = 3.0  # the ratio test needs this much clean history
    default_speed_gbps: float = 400.0
    # error counters (either end of the cable), counted over error_window_s
    error_window_s: float = 1.0
    min_frame_errors: int = 5  # FCS/CRC errored frames
    min_symbol_errors: int = 20
    min_uncorrectable: int = 3  # FEC-uncorrectable blocks: errors that reach the traffic
    # flaps: one down/up is a reboot or a re-seat; two within the window is a flapping cable
    flap_window_s: float = 60.0
    min_flaps: int = 2
    clear_s: float = 10.0  # a flagged cable resolves after this long with nothing bad

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        problems = []
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "enabled":
                continue
            if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
                problems.append(f"{f.name}: {v!r} is not a number")
            elif v <= 0 and f.name not in ("min_frame_errors", "min_symbol_errors"):
                problems.append(f"{f.name}: must be > 0, not {v!r}")
            elif v < 0:
                problems.append(f"{f.name}: must be >= 0, not {v!r}")
        if not problems:
            if not 0 < self.ber_exit_factor <= 1:
                problems.append("ber_exit_factor: must be within (0, 1]")
            if self.ber_ratio <= 1 or self.ber_exit_ratio < 1:
                problems.append("ber_ratio must be > 1 and ber_exit_ratio >= 1")
            if self.ber_floor > self.ber_max:
                problems.append("ber_floor must not exceed ber_max")
            for name in ("min_frame_errors", "min_symbol_errors", "min_uncorrectable", "min_flaps"):
                if int(getattr(self, name)) != getattr(self, name):
                    problems.append(f"{name}: must be a whole number")
        if problems:
            raise ConfigError("flaky_link: " + "; ".join(problems))


@dataclass
class _Cable:
    """What one cable has shown lately (only cables with something to show are kept)."""

    errors: deque[tuple[int, str, float, str]] = field(default_factory=lambda: deque(maxlen=4096))
    flaps: deque[tuple[int, str, float, str]] = field(default_factory=lambda: deque(maxlen=1024))
    active: bool = False
    since: int = 0  # startsAt of the warning alert
    crit_since: int | None = None  # startsAt of the critical one
    last_bad: int = 0  # step end when something bad was last seen
    end: str = ""  # the end that saw errors first (labels a switch-to-switch cable)
    ber_bad: bool = False  # from the latest BER window: above the entry threshold long enough
    ber_stay: bool = False  # ... above the exit threshold
    ber_ts: int = 0
    ber_evidence: str = ""
    evidence: str = ""
    crit_evidence: str = ""
    interval: float = 0.0  # the sampling interval (s) of its error counters' latest read


@dataclass
class FlakyLinkDetector(Stateful):
    topology: Topology
    config: FlakyLinkConfig = field(default_factory=FlakyLinkConfig)
    name: str = "flaky_link"
    # the record types its state holds (rocewatch.core.state; the checkpoint codec reads no other)
    STATE_TYPES: ClassVar[tuple[type, ...]] = (_Cable, EntitySlots, Finding)
    # the metrics it reads from the window engine (steps carry no others to the detect stage)
    reads: ClassVar[frozenset[str]] = frozenset(
        {*ERROR_METRICS, "nic_link_speed_mbps", "nic_rx_corrected_bits"}
    )

    @property
    def window_s(self) -> float:
        """The longest sliding window this detector reads: none, it keeps its own state."""
        return 0.0

    def __post_init__(self) -> None:
        self.cables: dict[CableKey, _Cable] = {}
        self.slots = EntitySlots()  # NICs, for BER
        self.base_log = np.empty(0)  # learned log10(BER) baseline (nan: none yet)
        self.base_n = np.empty(0)
        self.base_age = np.empty(0)  # seconds of clean history learned
        self.speed_bps = np.empty(0)
        self.bad_since = np.empty(0, dtype=np.int64)  # first reading of a run above threshold
        # corrected bits, seconds and newest time of the readings not judged yet
        self.acc_bits = np.empty(0)
        self.acc_s = np.empty(0)
        self.acc_ts = np.empty(0, dtype=np.int64)
        self.next_prune_ns = 0
        self.speed_sig: tuple[object, ...] = ()  # the speed gauges last matched to links

    # --- BER against each link's own baseline ----------------------------------------------------
    def _grow(self) -> None:
        n, have = len(self.slots), len(self.base_log)
        if n == have:
            return
        add = n - have
        speeds = []
        for node, nic in self.slots.keys[have:]:  # entities seen for the first time
            mbps = self.topology.nic_speed_mbps(node, nic)
            speeds.append((mbps or self.config.default_speed_gbps * 1000) * 1e6)
        self.base_log = np.concatenate([self.base_log, np.full(add, np.nan)])
        self.base_n = np.concatenate([self.base_n, np.zeros(add)])
        self.base_age = np.concatenate([self.base_age, np.zeros(add)])
        self.speed_bps = np.concatenate([self.speed_bps, np.array(speeds)])
        self.bad_since = np.concatenate([self.bad_since, np.zeros(add, dtype=np.int64)])
        self.acc_bits = np.concatenate([self.acc_bits, np.zeros(add)])
        self.acc_s = np.concatenate([self.acc_s, np.zeros(add)])
        self.acc_ts = np.concatenate([self.acc_ts, np.zeros(add, dtype=np.int64)])

    def _ber(self, ctx: StepContext) -> bool:
        """Judge each NIC link's BER once its readings since it was last judged cover
        ``ber_every_s`` (or at each reading, for a link read less often); flag cables, learn
        baselines.

        Returns whether a cable's BER state changed (it needs judging now). BER moves slowly, so
        the corrected bits of ``ber_every_s`` (0.1 s of a 400G link is 4e10 bits: no Poisson
        noise left at any threshold) judge it as well as each reading, at a fraction of the cost.
        Every reading is summed in (NumPy over entity slots), whatever the link's cadence.
        """
        cfg = self.config
        cur = ctx.engine.current()
        if cur is None:
            return False
        cb = cur.get("nic_rx_corrected_bits")
        sp = cur.get("nic_link_speed_mbps")
        if sp.height:
            col = sp.get_column("last")
            sig = (sp.height, col.min(), col.max(), col.sum(), len(self.slots))
            if sig != self.speed_sig:  # a speed changed (or new links): match the gauges
                s = self.slots.rows(sp)
                self._grow()
                v = np.nan_to_num(col.to_numpy())
                self.speed_bps[s[v > 0]] = v[v > 0] * 1e6
                self.speed_sig = (sp.height, col.min(), col.max(), col.sum(), len(self.slots))
        if cb.height == 0:
            return False
        known = cur.positions
        at = None
        if known is not None and "nic_rx_corrected_bits" in known[1]:
            at = (known[0], known[1]["nic_rx_corrected_bits"])  # no hashing of known series
        row_slot = self.slots.rows_at(cb, at)
        self._grow()
        with np.errstate(divide="ignore", invalid="ignore"):
            d = cb.get_column("delta").to_numpy().astype(np.float64)
            dt = cb.get_column("dt").to_numpy().astype(np.float64)
        fine = np.isfinite(d) & np.isfinite(dt) & (dt > 0) & (d >= 0)
        np.add.at(self.acc_bits, row_slot[fine], d[fine])
        np.add.at(self.acc_s, row_slot[fine], dt[fine])
        np.maximum.at(self.acc_ts, row_slot, cb.get_column("ts").to_numpy())
        # a link is judged when its sum covers ber_every_s, or at a reading that alone is that
        # long (minus jitter)
        due = np.unique(row_slot[fine])
        due = due[self.acc_s[due] >= 0.9 * cfg.ber_every_s]
        if len(due) == 0:
            return False
        slot, ts, span = due, self.acc_ts[due].copy(), self.acc_s[due].copy()
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = self.acc_bits[due] / span
            valid = np.isfinite(rate) & (rate >= 0)
            ber = rate / self.speed_bps[slot]
            ready = self.base_age[slot] >= cfg.baseline_min_s
            base = np.where(ready, 10.0 ** self.base_log[slot], np.nan)
            thr = np.where(ready, np.maximum(cfg.ber_ratio * base, cfg.ber_floor), np.inf)
            thr = np.minimum(thr, cfg.ber_max)
            exit_thr = np.maximum(
                thr * cfg.ber_exit_factor, np.where(ready, cfg.ber_exit_ratio * base, 0.0)
            )
            bad = valid & (ber >= thr)
            stay = valid & (ber >= exit_thr)
        self.acc_bits[due] = 0.0
        self.acc_s[due] = 0.0
        since = self.bad_since[slot]
        since = np.where(bad, np.where(since > 0, since, ts), np.where(valid, 0, since))
        self.bad_since[slot] = since
        changed = False
        # above threshold in two readings at least ber_min_s apart, none below in between
        enter = np.flatnonzero(bad & (ts - since >= round(cfg.ber_min_s * S)))
        entered = set()
        for r in enter.tolist():  # the few links over threshold long enough
            node, nic = self.slots.keys[int(slot[r])]
            c = self.cables.setdefault(("nic", node, nic), _Cable())
            why = f"{cfg.ber_ratio:g}x baseline {base[r]:.1e}" if ready[r] else "absolute"
            c.ber_bad, c.ber_stay, c.ber_ts = True, True, int(ts[r])
            c.ber_evidence = (
                f"{node}/{nic} pre-FEC BER {ber[r]:.1e} ({self.speed_bps[slot[r]] / 1e9:g} Gb/s)"
                f" above {thr[r]:.1e} ({why}; floor {cfg.ber_floor:.0e}, max {cfg.ber_max:.0e})"
                f" for {(ts[r] - since[r]) / S:.1f} s (minimum {cfg.ber_min_s:g} s)"
            )
            c.end = c.end or f"{node}/{nic}"
            entered.add((node, nic))
            changed = True
        # NIC cables flagged or close to it: is their BER still above the exit threshold?
        flagged: list[int] = []
        for k, c in self.cables.items():
            if k[0] != "nic" or (k[1], k[2]) in entered or not (c.active or c.ber_stay):
                continue
            i = self.slots.index.get((k[1], k[2]), -1)
            if c.active:
                flagged.append(i)
            rows = np.flatnonzero(valid & (slot == i))
            if i < 0 or len(rows) == 0:
                continue  # no reading this time: neither bad nor clean
            now_stay = bool(stay[rows[0]])
            changed |= c.ber_bad or c.ber_stay != now_stay
            c.ber_bad, c.ber_stay = False, now_stay
        # learn from clean readings only, so a failing optic never becomes its own baseline;
        # each reading weighs the time it covers
        learn = valid & (ber > 0) & ~stay & ~np.isin(slot, flagged)
        s, lb, w = slot[learn], np.log10(ber[learn]), span[learn]
        n = self.base_n[s] + 1
        alpha = np.maximum(1.0 / n, -np.expm1(-w / cfg.baseline_tau_s))
        old = self.base_log[s]
        self.base_log[s] = np.where(np.isnan(old), lb, old + alpha * (lb - old))
        self.base_n[s] = n
        self.base_age[s] += w
        return changed

    # --- error and flap events -------------------------------------------------------------------
    def _events(self, ctx: StepContext) -> list[tuple[str, str, str, float, int, float]]:
        """(metric, device, port, count, ts, sampling interval s) of every error read."""
        cur = ctx.engine.current()
        if cur is None:
            return []
        out: list[tuple[str, str, str, float, int, float]] = []
        for m in ERROR_METRICS:
            f = cur.get(m)
            if f.height == 0:
                continue
            top = f.get_column("delta").max()
            if top is None or top <= 0:  # type: ignore[operator]
                continue
            rows = f.filter(pl.col("delta") > 0).select(
                "device", "port", "delta", "ts", (pl.col("dt") / pl.col("n")).fill_null(0.0)
            )
            out += [(m, d, p, float(x), int(t), float(i)) for d, p, x, t, i in rows.iter_rows()]
        return out

    def _cable_of(self, metric: str, dev: str, port: str) -> CableKey:
        if metric.startswith("nic_"):
            return ("nic", dev, port)
        peer = self.topology.peer_of_port(dev, port)
        if isinstance(peer, NicEnd):
            return ("nic", peer.node, peer.nic)
        if isinstance(peer, PortEnd):
            a, b = sorted((f"{dev}/{port}", str(peer)))
            return ("link", a, b)
        return ("port", dev, port)

    # --- the cable state machine -----------------------------------------------------------------
    def evaluate(self, ctx: StepContext) -> list[Finding]:
        events = self._events(ctx)
        ber_changed = self._ber(ctx)
        if not events and not ber_changed and not any(c.active for c in self.cables.values()):
            if ctx.end >= self.next_prune_ns:
                self._prune(ctx.end)
            return []  # the healthy fast path
        touched: set[CableKey] = {k for k, c in self.cables.items() if c.ber_bad or c.active}
        for m, dev, port, n, ts, iv in events:
            key = self._cable_of(m, dev, port)
            c = self.cables.setdefault(key, _Cable())
            c.interval = iv or c.interval
            kind = ERROR_METRICS[m]
            (c.flaps if kind in _FLAP_KINDS else c.errors).append((ts, kind, n, f"{dev}/{port}"))
            c.end = c.end or f"{dev}/{port}"
            touched.add(key)
        findings = []
        for key in sorted(touched):
            c = self.cables[key]
            self._judge(key, c, ctx.end)
            if c.active:
                findings += self._findings(key, c)
        if ctx.end >= self.next_prune_ns:
            self._prune(ctx.end)
        return findings

    def _windows(self, c: _Cable) -> tuple[float, float, float]:
        """The cable's error window, the factor its error counts scale by, and its flap
        window (s): an error window holds two reads of its counters (plus jitter), whatever
        their interval, and the counts it needs are those of two reads' worth of time."""
        cfg = self.config
        iv = c.interval
        window = max(cfg.error_window_s, MISSED_SAMPLE_INTERVALS * iv)
        scale = max(1.0, 2.0 * iv / cfg.error_window_s)
        return window, scale, max(cfg.flap_window_s, 3.0 * iv)

    def _judge(self, key: CableKey, c: _Cable, now: int) -> None:
        cfg = self.config
        err_w, scale, flap_w = self._windows(c)
        err_from = now - round(err_w * S)
        flap_from = now - round(flap_w * S)
        while c.errors and c.errors[0][0] < err_from:
            c.errors.popleft()
        while c.flaps and c.flaps[0][0] < flap_from:
            c.flaps.popleft()
        reasons: list[tuple[int, str]] = []  # (ts of the newest sample behind it, evidence)
        crit: list[tuple[int, str]] = []
        w = f"{err_w:.3g} s"
        for kind, floor, what in (
            ("fcs", round(cfg.min_frame_errors * scale), "FCS/CRC errored frames"),
            ("symbol", round(cfg.min_symbol_errors * scale), "symbol errors"),
            ("uncorrectable", round(cfg.min_uncorrectable * scale), "FEC-uncorrectable blocks"),
        ):
            items = [e for e in c.errors if e[1] == kind]
            total = sum(e[2] for e in items)
            reads = len({(e[0], e[3]) for e in items})
            if items and total >= max(floor, 1) and reads >= 2:
                ts = max(e[0] for e in items)
                ends = sorted({e[3] for e in items})
                r = (ts, f"{int(total)} {what} in {w} at {', '.join(ends)} (threshold {floor})")
                (crit if kind == "uncorrectable" else reasons).append(r)
        if c.ber_bad:
            reasons.append((c.ber_ts, c.ber_evidence))
        if c.flaps:
            # a flap is a down and an up: two carrier transitions (in one reading or two), one
            # link-down event
            per_counter: dict[tuple[str, str], float] = {}
            for _, kind, n, end in c.flaps:
                k = (end, kind)
                per_counter[k] = per_counter.get(k, 0.0) + (n / 2 if kind == "carrier" else n)
            per_end: dict[str, float] = {}
            for (end, _), n in per_counter.items():
                per_end[end] = max(per_end.get(end, 0.0), n)
            flaps = math.ceil(max(per_end.values()))
            if flaps >= cfg.min_flaps or (flaps >= 1 and (c.active or reasons or crit)):
                ts = max(e[0] for e in c.flaps)
                crit.append(
                    (
                        ts,
                        f"{flaps} flap(s) in {flap_w:g} s at "
                        f"{', '.join(sorted(per_end))} (threshold {cfg.min_flaps}, or 1 on a "
                        "cable already erroring)",
                    )
                )
        # fresh trouble (not a flap from a minute ago) keeps a flagged cable flagged
        recent = bool(c.errors) or any(e[0] >= err_from for e in c.flaps)
        if reasons or recent or c.ber_stay:
            c.last_bad = now
        if not c.active and (reasons or crit):
            c.active = True
            c.since = min(t for t, _ in reasons + crit)
            c.evidence = "; ".join(e for _, e in reasons + crit)
        if c.active and crit and c.crit_since is None:
            c.crit_since = max(t for t, _ in crit)
            c.crit_evidence = "; ".join(e for _, e in crit + reasons)
        if c.active and now - c.last_bad >= round(cfg.clear_s * S):
            # the episode is over: a later one starts from a clean slate
            c.active, c.crit_since, c.ber_bad = False, None, False
            c.errors.clear()
            c.flaps.clear()

    def _prune(self, now: int) -> None:
        """Forget quiet cables (bounded state: only cables with recent trouble are kept)."""
        self.next_prune_ns = now + S

        def quiet(c: _Cable) -> bool:
            err_w, _, flap_w = self._windows(c)
            keep_from = now - round(max(flap_w, err_w) * S)
            return all(e[0] < keep_from for e in c.flaps) and all(
                e[0] < keep_from for e in c.errors
            )

        for key in [
            k for k, c in self.cables.items() if not c.active and not c.ber_stay and quiet(c)
        ]:
            del self.cables[key]

    # --- alerts -----------------------------------------------------------------------------------
    def _findings(self, key: CableKey, c: _Cable) -> list[Finding]:
        topo = self.topology
        extra: dict[str, str] = {}
        if key[0] == "nic":
            _, node, nic = key
            labels = node_labels(topo, node, nic)
            sp = topo.nics.get((node, nic))
            far = sp.switch_port if sp is not None else None
            if far is not None:
                labels.update(switch=far.switch, port=far.port)
            rail = labels.get("rail")
            cable = f"{node}/{nic} <-> {far}" if far else f"{node}/{nic} <-> (switch end unknown)"
            extra["strands"] = node
            strands = f"{node} loses {nic}" + (f" (rail {rail})" if rail else "")
        else:
            end = f"{key[1]}/{key[2]}" if key[0] == "port" else c.end
            if key[0] == "link" and end not in key[1:]:
                end = key[1]
            sw, _, port = end.partition("/")
            labels = port_labels(topo, sw, port)
            if key[0] == "link":
                peer = key[2] if end == key[1] else key[1]
                extra["peer"] = peer
                cable = f"{end} <-> {peer}"
                strands = f"no node directly (switch-to-switch cable; {sw} loses one path)"
                extra["strands"] = "none"
            else:
                cable = f"{end} <-> (peer not in the topology)"
                strands = "unknown (the port's peer is not in the topology)"
                extra["strands"] = "unknown"
        extra["cable"] = cable
        crit = c.crit_since is not None
        return [
            Finding(
                FLAKY_LINK,
                labels,
                "critical" if crit else "warning",
                c.crit_since if c.crit_since is not None else c.since,
                summary=f"Flaky cable {cable}"
                + (": flapping or losing data" if crit else ": physical-layer errors"),
                description=f"The cable {cable} shows physical-layer degradation; replace or "
                f"re-seat it. Strands: {strands}.",
                evidence=c.crit_evidence if crit else c.evidence,
                extra=extra,
            )
        ]


def build(topology: Topology, config: FlakyLinkConfig | None = None) -> FlakyLinkDetector:
    return FlakyLinkDetector(topology, config or FlakyLinkConfig())


__all__ = ["EntitySlots", "FlakyLinkConfig", "FlakyLinkDetector", "build"]
