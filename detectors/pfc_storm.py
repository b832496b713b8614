"""PFCStorm: queues stalled by sustained pause, and the culprit that started it.

A queue is stalled when, over the detection time (200 ms, as SONiC's PFC watchdog, or one
sample where the series is read less often), received pause time grew by at least
``pause_fraction`` of the interval while the queue held data and sent nothing. It stays
stalled until its pause share falls below ``exit_fraction`` over the restoration time (or its
next sample); a series read every few seconds is not judged between its samples: it stays
stalled until ``restoration_time_s`` plus two and a half of its intervals pass without a
sample still paused. A NIC counts as sending a storm from its own ``tx_prio<N>_pause_duration``.

Origin vs victim follows the pause graph over the topology's cables: every stalled receiver
names the sender at the other end of its cable; a sender that is not itself paused is the
origin, every paused entity a victim. So an origin that runs no agent is still found from the
switch port it pauses. A device counts as paused (a relay, not an origin) when it received
pause for ``relay_fraction`` of its sample (of at most ``relay_window_s`` of it) within
``relay_window_s`` (plus two and a half of its sampling intervals) of its victim's stall. A
switch port is named origin only once its switch's own pause counters have reported past the
victim's stall (a relay read less often than its victim would otherwise be blamed before its
own pause shows), or one of its intervals later if they do not; in a fabric domain's pipeline
(``domain``) a switch of another domain is not waited for (its other ports are not heard there).

The sample a storm began in counts whole toward the detection time when it was paused for at
least ``onset_fraction`` of it and every sample after it wholly (SONiC's watchdog, too, counts
the poll that first sees a queue stuck): read every 100 ms, 200 ms of pause counted only in
samples wholly inside the storm would be confirmed 200-300 ms after the onset, past 2.5
intervals whenever the storm began early in a sample. A switch queue's transmit counter is then
judged over the wholly paused samples alone (it sent before the storm began).

Time to detect: the first sample fully inside the storm, so at most two intervals of the
fastest series that sees it; at 100 ms, 1.25-2.5 intervals (plus, for a switch port as origin
whose own transmit counters are not read, until its switch's next sample).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import polars as pl

from detectors.base import Finding, StepContext, node_labels, pct, port_labels
from detectors.state import MISSED_SAMPLE_INTERVALS, NS, EntitySlots, matches
from rocewatch.core.model import PFC_STORM
from rocewatch.core.state import Stateful
from rocewatch.core.topology import NicEnd, PortEnd, Topology

Key = tuple[str, str, str, str]  # (kind "port"|"nic", device, port-or-nic, priority)
RX_PAUSE = {"port": "pfc_rx_pause_us", "nic": "nic_rx_pause_us"}


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
    # the sample a storm began in counts whole toward the detection time when it was paused
    # this share of it and every later one wholly, as SONiC's watchdog counts the poll that
    # first sees a queue stuck: at 100 ms a storm is confirmed within 2.5 samples, and a pause
    # shorter than 1.25 samples (a burst its receiver drained) never is
    onset_fraction: float = 0.25
    require_stall: bool = True


@dataclass
class _Active:
    ts: int
    evidence: str
    seen: int = 0  # end of the last step its series had a sample in the restoration window
    interval: int = 0  # its series' sampling interval (ns)

    def silent_too_long(self, end: int, restoration: int) -> bool:
        """No sample said it is still paused for longer than the series' silence allows."""
        return end - self.seen > restoration + MISSED_SAMPLE_INTERVALS * self.interval


@dataclass
class PfcStormDetector(Stateful):
    topology: Topology
    config: PfcStormConfig = field(default_factory=PfcStormConfig)
    name: str = "pfc_storm"
    # the record types its state holds (rocewatch.core.state; the checkpoint codec reads no other)
    STATE_TYPES: ClassVar[tuple[type, ...]] = (_Active, EntitySlots, Finding)
    # the fabric domain is the pipeline's to say at every start
    NOT_STATE: ClassVar[frozenset[str]] = frozenset({"domain"})
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
        """The longest sliding window this detector reads (the detection time and one step
        more: twice it covers any step)."""
        return 2 * max(self.config.detection_time_s, self.config.restoration_time_s)

    def __post_init__(self) -> None:
        self.paused: dict[Key, _Active] = {}  # stalled receivers
        self.sending: dict[Key, _Active] = {}  # senders seen from their own telemetry
        # receivers paused at least relay_fraction lately: (step end last seen so, interval)
        self.relay_seen: dict[Key, tuple[int, int]] = {}
        self.relaying: set[Key] = set()  # ... within their silence allowance: right now
        # per device (kind, device, nic-or-"", priority): [paused since, paused until or None]
        self.device_paused: dict[Key, list[int | None]] = {}
        # per switch port: its pause counters' newest sample time and interval (ns)
        self.port_slots = EntitySlots()
        self.switch_ports: dict[str, list[int]] = {}  # a switch's port slots
        self.port_newest = np.empty(0, dtype=np.int64)
        self.port_interval = np.empty(0)
        # the fabric domain whose pipeline this runs in (the scale-out detect stage sets it;
        # None: the whole fabric). A switch of another domain is heard there only on the cable
        # ends facing this one, so no wait shows it a relay: it is where the pause enters
        self.domain: str | None = None

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
            # storm window, or show a relay, need the window at all
            cur = ctx.engine.current()
            f = cur.get(metric) if cur is not None else None
            if f is None or f.height == 0:
                return
            n = ctx.engine.steps_in(cfg.detection_time_s)
            floor: np.ndarray | float = 1.0 - n * (1.0 - cfg.pause_fraction)
            _, ok, dt = self._fractions(f)
            if table is self.paused:
                floor = np.minimum(floor, self._relay_share(dt))
            delta = f.get_column("delta").to_numpy()
            if not (ok & _ge(delta, dt * 1e6 * floor)).any():
                return
        detection = ctx.engine.window(metric, cfg.detection_time_s)
        frac, ok, dt = self._fractions(detection)
        entering = np.flatnonzero(
            ok & _ge(frac, cfg.pause_fraction) & (dt >= cfg.detection_time_s * cfg.min_coverage)
        )
        stay, stay_frac, stay_ok = detection, frac, ok  # the default: the same window, once
        stay_dt = dt
        if cfg.restoration_time_s != cfg.detection_time_s:
            stay = ctx.engine.window(metric, cfg.restoration_time_s)
            stay_frac, stay_ok, stay_dt = self._fractions(stay)
        relay = self._relay_share(stay_dt)
        # only the few rows at or above a threshold reach Python (NaN is not a share)
        rows = np.flatnonzero(stay_ok & ((stay_frac >= cfg.exit_fraction) | (stay_frac >= relay)))
        if table is self.paused:
            hi = rows[stay_frac[rows] >= relay[rows]]
            iv = _intervals(stay, hi)
            for k, i in zip(_keys(stay, hi), iv, strict=True):
                self.relay_seen[(kind, *k)] = (ctx.end, i)
        # entities followed: judged on their samples in the restoration window; one read less
        # often is not judged between its samples (no sample is no news)
        mine = [k for k in table if k[0] == kind]
        if table is self.paused:
            mine += [k for k in self.relay_seen if k[0] == kind and k not in table]
        if mine:
            at = np.flatnonzero(matches(stay, [k[1:] for k in mine]) & stay_ok)
            present = {
                (kind, *k): (f, i, r)
                for k, f, i, r in zip(
                    _keys(stay, at),
                    stay_frac[at].tolist(),
                    _intervals(stay, at),
                    relay[at].tolist(),
                    strict=True,
                )
            }
            restoration = round(cfg.restoration_time_s * NS)
            for key in mine:
                got = present.get(key)
                act = table.get(key)
                if got is not None:
                    f, i, r = got
                    if key in self.relay_seen and f < r:
                        del self.relay_seen[key]
                    if act is None:
                        continue
                    if f >= cfg.exit_fraction:
                        act.seen, act.interval = ctx.end, i
                    else:
                        del table[key]
                elif act is not None and act.silent_too_long(ctx.end, restoration):
                    del table[key]
        # rows of entities already in the table change nothing: only new ones go on
        new = [
            i
            for i, k in zip(entering.tolist(), _keys(detection, entering), strict=True)
            if (kind, *k) not in table
        ]
        parts = [
            detection[pl.Series(new, dtype=pl.UInt32)].with_columns(
                pl.Series("frac", frac[new]), *_WHOLE
            )
        ]
        taken = {(kind, *k) for k in _keys(detection, np.asarray(new, dtype=np.int64))}
        onset = self._onset(ctx, metric, kind, detection, table, taken)
        if onset is not None:
            parts.append(onset)
            taken |= {(kind, *k) for k in onset.select("device", "port", "qual").iter_rows()}
        # samples jittered across step boundaries may leave the window of the detection time
        # short of it (one sample in two steps): one step more, for a window still all paused
        # (looked at only where an entity not yet stalled is paused but short of coverage)
        short = np.flatnonzero(
            ok & _ge(frac, cfg.pause_fraction) & (dt < cfg.detection_time_s * cfg.min_coverage)
        )
        more = np.empty(0, dtype=np.int64)
        if len(short) and any((kind, *k) not in table for k in _keys(detection, short)):
            longer = ctx.engine.window(metric, cfg.detection_time_s + ctx.engine.config.step_s)
            lf, lok, ldt = self._fractions(longer)
            more = np.flatnonzero(
                lok & _ge(lf, cfg.pause_fraction) & (ldt >= cfg.detection_time_s * cfg.min_coverage)
            )
        if len(more):
            extra = [
                i
                for i, k in zip(more.tolist(), _keys(longer, more), strict=True)
                if (kind, *k) not in table and (kind, *k) not in taken
            ]
            if extra:
                parts.append(
                    longer[pl.Series(extra, dtype=pl.UInt32)].with_columns(
                        pl.Series("frac", lf[extra]), *_WHOLE
                    )
                )
        enter = pl.concat(parts, how="vertical")
        if enter.height == 0:
            return
        if stall and cfg.require_stall:
            enter = self._stalled(ctx, enter)
        for d, p, q, f, dt_s, n, ts, began, extra in enter.select(
            "device",
            "port",
            "qual",
            "frac",
            "dt",
            "n",
            "ts",
            "onset",
            pl.col("extra") if "extra" in enter.columns else pl.lit(""),
        ).iter_rows():
            key = (kind, d, p, q)
            if key not in table:
                what = "received" if "rx" in metric else "sent"
                how = "" if began is None else f" after {pct(began)} of the sample it began in"
                table[key] = _Active(
                    ts,
                    f"{d}/{p} prio {q} {what} pause {pct(f)} of {dt_s:.2f} s{how}"
                    f" (threshold {pct(cfg.pause_fraction)}){extra}",
                    seen=ctx.end,
                    interval=round(dt_s / max(n, 1) * NS),
                )

    def _onset(
        self,
        ctx: StepContext,
        metric: str,
        kind: str,
        detection: pl.DataFrame,
        table: dict[Key, _Active],
        taken: set[Key],
    ) -> pl.DataFrame | None:
        """Entities whose newest samples were wholly paused after one paused at least
        ``onset_fraction``: the storm began in that one, which counts whole toward the
        detection time, as SONiC's watchdog counts the poll that first sees a queue stuck.

        Counting only samples wholly inside the storm, 200 ms of pause read every 100 ms is
        confirmed 200-300 ms after its onset (the onset falls anywhere in a sample); counted from
        the sample it began in, within 2.5 intervals. Rows are the newest step's (the wholly
        paused samples: their share, interval and time), with the onset sample's share.
        """
        cfg = self.config
        cur = ctx.engine.current()
        c = cur.get(metric) if cur is not None else None
        if c is None or c.height == 0 or detection.height == 0 or cfg.onset_fraction > 1:
            return None
        cf, cok, _ = self._fractions(c)
        hot = np.flatnonzero(cok & (cf >= cfg.pause_fraction))
        if len(hot) == 0:
            return None
        hot = np.array(
            [
                i
                for i, k in zip(hot.tolist(), _keys(c, hot), strict=True)
                if (kind, *k) not in table and (kind, *k) not in taken
            ],
            dtype=np.int64,
        )
        if len(hot) == 0:
            return None
        newest = c[pl.Series(hot, dtype=pl.UInt32)].with_columns(pl.Series("frac", cf[hot]))
        on = ["device", "port", "qual"]

        def before(w: pl.DataFrame) -> pl.DataFrame:
            span = w.select(*on, pl.col("delta").alias("w_delta"), pl.col("dt").alias("w_dt"))
            return newest.join(span, on=on, how="inner").with_columns(
                (pl.col("w_dt") - pl.col("dt")).alias("before_dt"),
                (pl.col("w_delta") - pl.col("delta")).alias("before_us"),
            )

        j = before(detection)
        if (j.get_column("before_dt") <= 0).any():
            # jitter left the step before the newest empty: the sample before is one step older
            longer = ctx.engine.window(metric, cfg.detection_time_s + ctx.engine.config.step_s)
            gap = j.filter(pl.col("before_dt") <= 0).select(on)
            j = pl.concat(
                [j.filter(pl.col("before_dt") > 0), before(longer).join(gap, on=on, how="semi")]
            )
        need = cfg.detection_time_s * cfg.min_coverage
        # the samples before the newest, within the detection time: the one the storm began in
        began = (pl.col("before_dt") > 0) & (
            pl.col("before_us") >= cfg.onset_fraction * pl.col("before_dt") * 1e6
        )
        # or the newest step alone spans the detection time (jitter put two samples in it)
        j = j.filter((began & (pl.col("w_dt") >= need)) | (pl.col("dt") >= need))
        if j.height == 0:
            return None
        return j.select(
            *detection.columns,
            "frac",
            pl.when(pl.col("dt") < need)
            .then(pl.col("before_us") / (pl.col("before_dt") * 1e6))
            .otherwise(None)
            .alias("onset"),
            pl.lit(True).alias("newest"),
        )

    def _relay_share(self, dt: np.ndarray) -> np.ndarray:
        """Per row, the pause share that makes its device a relay: ``relay_fraction`` of the
        sample, but of at most ``relay_window_s`` of it (a relay read every 5 s may have been
        paused for only the last second of its sample when its victim stalled)."""
        cfg = self.config
        with np.errstate(divide="ignore", invalid="ignore"):
            span = np.minimum(np.nan_to_num(dt, nan=0.0), cfg.relay_window_s)
            return np.where(dt > 0, cfg.relay_fraction * span / dt, cfg.relay_fraction)

    def _switch_reports(self, ctx: StepContext) -> None:
        """Follow each switch port's newest pause-counter sample and its interval: NumPy over
        the step's rows, through entity slots that remember each series' port."""
        cur = ctx.engine.current()
        metric = RX_PAUSE["port"]
        f = cur.get(metric) if cur is not None else None
        if f is None or f.height == 0:
            return
        known = cur.positions if cur is not None else None
        at = (known[0], known[1][metric]) if known is not None and metric in known[1] else None
        slot = self.port_slots.rows_at(f, at)
        have = len(self.port_newest)
        if have < len(self.port_slots):
            for i, (dev, _) in enumerate(self.port_slots.keys[have:], have):  # new ports
                self.switch_ports.setdefault(dev, []).append(i)
            grow = len(self.port_slots) - have
            self.port_newest = np.concatenate([self.port_newest, np.zeros(grow, dtype=np.int64)])
            self.port_interval = np.concatenate([self.port_interval, np.zeros(grow)])
        np.maximum.at(self.port_newest, slot, f.get_column("ts").to_numpy())
        iv = np.zeros(len(self.port_interval))
        np.maximum.at(iv, slot, np.asarray(_intervals(f, np.arange(f.height)), dtype=np.float64))
        old = self.port_interval
        self.port_interval = np.where(iv > 0, np.where(old > 0, old + 0.25 * (iv - old), iv), old)

    def _reported(self, switch: str) -> tuple[int, int] | None:
        """Since when every port of a switch has reported its pause counters (any of them may
        be the one a relay is paused on), and their longest interval (ns); None if the switch
        reports none."""
        ports = self.switch_ports.get(switch)
        if not ports:
            return None
        return int(self.port_newest[ports].min()), round(float(self.port_interval[ports].max()))

    def _stalled(self, ctx: StepContext, enter: pl.DataFrame) -> pl.DataFrame:
        """Keep paused switch queues that held data and sent nothing (where the switch says so):
        over the detection time, or for a storm's onset (it sent before the storm began in its
        first sample) over the newest step, whose wholly paused samples entered it."""
        t = self.config.detection_time_s
        on = ["device", "port", "qual"]
        whole = enter.filter(~pl.col("newest"))
        began = enter.filter(pl.col("newest"))
        parts = []
        for rows, span in ((whole, t), (began, ctx.engine.config.step_s)):
            if rows.height == 0:
                continue
            tx = ctx.engine.window("queue_tx_pkts", span).select(
                *on, pl.col("delta").alias("tx"), pl.col("dt").alias("tx_dt")
            )
            parts.append(rows.join(tx, on=on, how="left"))
        depth = ctx.engine.window("queue_depth_bytes", t).select(*on, pl.col("max").alias("depth"))
        j = pl.concat(parts, how="vertical").join(depth, on=on, how="left")
        # a queue counter read much less often than the pause counter reaches back to before
        # the storm: it says nothing either way
        j = j.filter(
            (pl.col("tx").is_null() | (pl.col("tx") == 0) | (pl.col("tx_dt") > 1.5 * pl.col("dt")))
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
        cfg = self.config
        self._update(ctx, "pfc_rx_pause_us", "port", self.paused, stall=True)
        self._update(ctx, "nic_rx_pause_us", "nic", self.paused, stall=False)
        self._update(ctx, "nic_tx_pause_us", "nic", self.sending, stall=False)
        self._update(ctx, "pfc_tx_pause_us", "port", self.sending, stall=False)
        restoration = round(cfg.restoration_time_s * NS)
        for key, (seen, iv) in list(self.relay_seen.items()):
            if ctx.end - seen > restoration + MISSED_SAMPLE_INTERVALS * iv:
                del self.relay_seen[key]
        self.relaying = set(self.relay_seen)
        self._switch_reports(ctx)
        if not self.paused and not self.sending:
            # the storm is over: a device still marked paused stopped being so now (left
            # open, its span would make the next storm's origin look like a relay)
            relays = {_device(k) for k in self.relaying}
            for pd, sp in self.device_paused.items():
                if sp[1] is None and pd not in relays:
                    sp[1] = ctx.end
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
        horizon = ctx.end - max(10 * cfg_relay_ns(cfg), 60 * NS)
        for pd, span in list(self.device_paused.items()):
            if pd not in now_paused and span[1] is None:
                span[1] = ctx.end
            if span[1] is not None and span[1] < horizon:
                del self.device_paused[pd]
        # the relay window grows with how often the sender's own pause is read: its stall
        # shows up to two of its intervals after its victim's
        intervals: dict[Key, int] = {}
        for k, act in (*self.paused.items(), *self.sending.items()):
            d = _device(k)
            intervals[d] = max(intervals.get(d, 0), act.interval)
        for k, (_, iv) in self.relay_seen.items():
            d = _device(k)
            intervals[d] = max(intervals.get(d, 0), iv)

        reported: dict[str, tuple[int, int] | None] = {}  # per switch, this step

        def report(switch: str) -> tuple[int, int] | None:
            if switch not in reported:
                reported[switch] = self._reported(switch)
            return reported[switch]

        def relay_ns(s: Key) -> int:
            iv = intervals.get(_device(s), 0)
            rep = report(s[1]) if s[0] == "port" else None
            if rep is not None:
                iv = max(iv, rep[1])
            return cfg_relay_ns(cfg) + round(MISSED_SAMPLE_INTERVALS * iv)

        def is_paused(s: Key, since: int) -> bool:
            span = self.device_paused.get(_device(s))
            if span is None:
                return False
            start, end = span
            assert start is not None
            r = relay_ns(s)
            return start <= since + r and (end is None or end >= since - r)

        def unheard(s: Key, since: int) -> bool:
            """A switch whose own pause counters have not yet reported far enough past its
            victim's stall to show a relay (one of its intervals is waited for beyond that), so
            it may still turn out one. A relay was paused before its victim stalled, so a sample
            reaching ``relay_fraction`` of a relay's share past the stall shows it paused."""
            if s[0] != "port" or (self.domain is not None and topo.domain_of(s[1]) != self.domain):
                # (a switch of another domain: its origin alert is not this pipeline's; named
                # origin here it labels its victims in this domain with where the pause came
                # in, as replay does when it traces them from an origin this domain never sees)
                return False
            rep = report(s[1])
            if rep is None:
                return False
            newest, iv = rep
            need = round(cfg.relay_fraction * min(iv, cfg_relay_ns(cfg)))
            return newest < since + need and ctx.end <= since + need + round(1.5 * iv)

        findings: list[Finding] = []
        origins: list[Key] = []
        for s, ev in senders.items():
            since = min(t for t, _ in ev)
            if is_paused(s, since) or unheard(s, since):
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
                    PFC_STORM,
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
                    PFC_STORM,
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


# entries judged over the whole detection time (not only its newest samples; no onset sample)
_WHOLE = (pl.lit(None, dtype=pl.Float64).alias("onset"), pl.lit(False).alias("newest"))


def _ge(a: np.ndarray, b: np.ndarray | float) -> np.ndarray:
    """``a >= b`` as Polars compares floats: NaN above every number."""
    return (a >= b) | np.isnan(a)


def _intervals(frame: pl.DataFrame, rows: np.ndarray) -> list[int]:
    """The sampling interval (ns) of the given counter rows: their ``dt`` over their count of
    samples (0 without a ``dt``)."""
    if len(rows) == 0:
        return []
    dt = np.nan_to_num(frame.get_column("dt").to_numpy()[rows].astype(np.float64))
    n = np.maximum(frame.get_column("n").to_numpy()[rows].astype(np.float64), 1.0)
    return (dt / n * NS).astype(np.int64).tolist()


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
