"""Interference between tenants: who suffers from a congested port, and who causes it.

In a shared fabric one tenant's all-to-all fills the queues another tenant's ring crosses. For
each congestion alert about a switch port (``ECNCongestion``, ``QueueBuildup``) this stage
names, from the topology's jobs (``jobs:`` of the topology file, or live membership from the
schedulers, ``actions/membership.py``) and the NICs' own counters:

- the **senders** behind the port: the NICs that feed its egress queue. A leaf's uplink is fed
  by the NICs cabled to that leaf; a spine's port toward a leaf by the NICs of the other leaves
  it links; a leaf's downlink by its NIC's own job (a job's traffic stays within the job). Each
  sender's transmit rate of RDMA bytes (``nic_tx_rdma_bytes``), averaged over about
  ``window_s`` (an exponential average kept per NIC at every step, whatever its cadence), is
  summed per job;
- the **aggressor**: the job that sends at least ``min_share`` of those bytes, its sending NICs
  busy (at least ``min_busy`` of their link speed on average: a storm's silence names nobody);
- the **victim**: among the jobs whose NICs sit on either side of the port, the one of another
  tenant whose NICs were held longest by PFC (``nic_rx_pause_us``), at least
  ``min_pause_share`` of the window. With none, the alert's victim is the aggressor's (or the
  busiest) job and no aggressor is named: a tenant congesting only itself is not interference.

The names are annotations (``victim_tenant``, ``victim_job``, ``aggressor_tenant``,
``aggressor_job``, and ``interference``: the figures they rest on), fixed when the alert
starts: they do not change an alert's fingerprint, and an alert keeps the attribution it was
notified with. ``victim_pause_s`` (only with an aggressor) is the PFC pause time the victim
job's NICs on either side of the port suffered while the alert fires, in seconds, summed over
those NICs; a NIC's pause in a step is credited to one alert only (the first attributed in the
step), so a sum over alerts (one congestion raises several: ECN and queue, one per uplink)
counts it once. It follows the alert (the resolved event holds the total) and the store keeps
it per alert and tenant (``tenant_interference``, storage/models.py) for Grafana.

INT reports' inner 5-tuples would name the senders flow by flow; the INT aggregation does not
pass them to the pipeline, so the senders are those the topology puts behind the port.
A job without a tenant is a tenant of its own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Protocol

import numpy as np
import polars as pl

from rocewatch.core.errors import ConfigError
from rocewatch.core.model import ECN_CONGESTION, QUEUE_BUILDUP, Finding, fingerprint
from rocewatch.core.state import Stateful
from rocewatch.core.topology import NicEnd, PortEnd, Topology

VICTIM_TENANT = "victim_tenant"
VICTIM_JOB = "victim_job"
AGGRESSOR_TENANT = "aggressor_tenant"
AGGRESSOR_JOB = "aggressor_job"
VICTIM_PAUSE_S = "victim_pause_s"
EVIDENCE = "interference"
# the alerts about congested switch queues that get attributed
ATTRIBUTED = frozenset({ECN_CONGESTION, QUEUE_BUILDUP})
TX = "nic_tx_rdma_bytes"  # the RDMA bytes a NIC sent (tx_vport_rdma_unicast_bytes)
HELD = "nic_rx_pause_us"
# the metrics it reads from the window engine (the scale-out aggregate stage sends them)
READS = frozenset({TX, HELD})

Nic = tuple[str, str]
# the per-NIC averages as ``state()`` gives them (one row per NIC of the topology seen)
AVERAGES: dict[str, pl.DataType] = {
    "device": pl.String(),
    "port": pl.String(),
    "tx": pl.Float64(),  # bytes/s
    "held": pl.Float64(),  # share of time
    "ts": pl.Int64(),  # newest reading, ns
}


@dataclass(frozen=True)
class InterferenceConfig:
    """The ``interference`` section of the config file (docs/alerting.md)."""

    enabled: bool = True  # false: congestion alerts name no victim nor aggressor
    window_s: float = 2.0  # traffic and pauses are judged over this much telemetry time
    min_share: float = 0.5  # the aggressor sends at least this share of the port's senders' bytes
    min_pause_share: float = 0.01  # a victim's NICs held by PFC at least this share of the window
    min_busy: float = 0.2  # the aggressor's NICs send at least this share of their link speed

    def __post_init__(self) -> None:
        if not isinstance(self.window_s, int | float) or not 0 < self.window_s <= 60:
            raise ConfigError(f"interference.window_s: {self.window_s!r} must be in (0, 60] s")
        for k in ("min_share", "min_pause_share", "min_busy"):
            v = getattr(self, k)
            if not isinstance(v, int | float) or not 0 < v <= 1:
                raise ConfigError(f"interference.{k}: {v!r} must be in (0, 1]")


class StepRows(Protocol):
    def get(self, metric: str) -> pl.DataFrame: ...


class WindowReader(Protocol):
    """What it reads of telemetry: the window engine's newest step (detectors/windows.py), its
    rows of one metric per series (``device``, ``port``, ``qual``, ``delta``, ``dt``, ``last``
    (a counter's rate), ``ts``)."""

    def current(self) -> StepRows | None: ...


@dataclass(frozen=True)
class Attribution:
    """Who suffers from a congested port and who causes it (``aggressor_*`` None: nobody else)."""

    victim_job: str | None
    victim_tenant: str | None
    aggressor_job: str | None
    aggressor_tenant: str | None
    evidence: str
    victims: tuple[Nic, ...] = ()  # the victim job's NICs whose pause time is counted

    def annotations(self) -> dict[str, str]:
        pairs = (
            (VICTIM_JOB, self.victim_job),
            (VICTIM_TENANT, self.victim_tenant),
            (AGGRESSOR_JOB, self.aggressor_job),
            (AGGRESSOR_TENANT, self.aggressor_tenant),
        )
        out = {k: v for k, v in pairs if v}
        if self.evidence:
            out[EVIDENCE] = self.evidence
        return out


class InterferenceAttributor(Stateful):
    """Annotates congestion findings with their victim and aggressor (module docstring).

    ``annotate`` is called with each detector's findings of a step, before the alert
    lifecycle; its state is each attributed alert's attribution and pause total, so a
    restarted pipeline keeps both.
    """

    STATE_TYPES: ClassVar[tuple[type, ...]] = ()
    NOT_STATE: ClassVar[frozenset[str]] = frozenset(
        {"forget_ns", "_below", "_linked", "_step_ns", "_counted", "_keys", "_pos", "_avg", "_ts"}
    )

    def __init__(
        self, topology: Topology, config: InterferenceConfig | None = None, forget_s: float = 1.0
    ) -> None:
        """``forget_s``: an alert whose finding is absent this long has resolved (the
        lifecycle's ``resolve_after_s``); its next firing is attributed afresh."""
        self.topology = topology
        self.config = config or InterferenceConfig()
        self.forget_ns = int(forget_s * 1e9)
        # alert fingerprint -> [attribution as a dict, pause µs so far, last seen ns]
        self.open: dict[str, list[Any]] = {}
        # per NIC of the topology (``_keys``, rows by ``_pos``): exponential averages of its
        # transmit rate (bytes/s) and of the share of time PFC held it (``_avg``: 2 x NICs,
        # NaN before its first reading), the telemetry time of its newest reading (``_ts``)
        self._keys = pl.DataFrame(
            sorted(self.topology.nics),
            schema={"device": pl.String, "port": pl.String},
            orient="row",
        ).with_row_index("pos")
        self._pos = {(str(d), str(p)): int(i) for i, d, p in self._keys.iter_rows()}
        self._avg = np.full((2, len(self._pos)), np.nan)
        self._ts = np.zeros(len(self._pos), dtype=np.int64)
        self._below: dict[str, list[Nic]] = {}
        self._linked: dict[str, set[str]] = {}
        # the victim NICs whose pause this step is credited to an alert already: credited once
        self._step_ns = 0
        self._counted: set[Nic] = set()
        self._index()

    def state(self) -> dict[str, Any]:
        """The attributions open and the per-NIC averages (by NIC name, as a frame)."""
        seen = np.flatnonzero(self._ts > 0)
        keys = self._keys[seen]
        return {
            "open": self.open,
            "averages": pl.DataFrame(
                {
                    "device": keys["device"],
                    "port": keys["port"],
                    "tx": self._avg[0, seen],
                    "held": self._avg[1, seen],
                    "ts": self._ts[seen],
                },
                schema=AVERAGES,
            ),
        }

    def restore(self, data: dict[str, Any]) -> None:
        """Lay ``state()`` over this one: the averages of NICs still in the topology."""
        self.open = dict(data.get("open") or {})
        avg = data.get("averages")
        if isinstance(avg, pl.DataFrame):
            for d, p, tx, held, ts in avg.iter_rows():
                i = self._pos.get((d, p))
                if i is not None:
                    self._avg[:, i] = tx, held
                    self._ts[i] = ts

    def _index(self) -> None:
        for (node, nic), n in self.topology.nics.items():
            if n.switch_port is not None:
                self._below.setdefault(n.switch_port.switch, []).append((node, nic))
        for a, b in self.topology.links:
            self._linked.setdefault(a.switch, set()).add(b.switch)
            self._linked.setdefault(b.switch, set()).add(a.switch)

    # --- per step --------------------------------------------------------------------------------
    def annotate(
        self, reader: WindowReader, now_ns: int, step_s: float, findings: list[Finding]
    ) -> list[Finding]:
        """``findings`` of one detector for the step ending at ``now_ns``, the attributed ones
        with their annotations (the others as they are)."""
        if not self.config.enabled:
            return findings
        if now_ns != self._step_ns:  # the step's first call: fold its readings in
            self._step_ns, self._counted = now_ns, set()
            self._average(reader, step_s)
        if not any(f.alertname in ATTRIBUTED for f in findings):
            self._forget(now_ns)
            return findings
        view = _View(self, reader, step_s, now_ns - int(10 * self.config.window_s * 1e9))
        out = []
        for f in findings:
            if f.alertname not in ATTRIBUTED or "switch" not in f.labels:
                out.append(f)
                continue
            fp = fingerprint({"alertname": f.alertname, "severity": f.severity, **f.labels})
            rec = self.open.get(fp)
            if rec is None:
                a = self.attribute(view, f.labels["switch"], f.labels.get("port", ""))
                rec = self.open[fp] = [_to_data(a), 0.0, now_ns]
            a = _from_data(rec[0])
            if a.aggressor_job is not None:
                fresh = [n for n in a.victims if n not in self._counted]
                self._counted.update(fresh)
                rec[1] += view.held_us_step(fresh)
            rec[2] = now_ns
            extra = dict(f.extra)
            extra.update(a.annotations())
            if a.aggressor_job is not None:
                extra[VICTIM_PAUSE_S] = f"{rec[1] / 1e6:.3f}"
            out.append(replace(f, extra=extra))
        self._forget(now_ns)
        return out

    def _average(self, reader: WindowReader, step_s: float) -> None:
        """Fold the step's NIC readings into the per-NIC averages (time constant ``window_s``):
        a few array operations per step."""
        if not self._pos:
            return
        for row, metric, scale in ((0, TX, 1.0), (1, HELD, 1e-6)):
            w = _rows(reader, metric)
            if w.height == 0:
                continue
            # (a dict lookup per row: cheaper than a join for the few hundred rows of a step)
            pos = np.fromiter(
                (
                    self._pos.get(k, -1)
                    for k in zip(w["device"].to_list(), w["port"].to_list(), strict=True)
                ),
                dtype=np.int64,
                count=w.height,
            )
            last = w["last"].to_numpy().astype(np.float64)
            ok = (pos >= 0) & ~np.isnan(last)
            if not ok.any():
                continue
            pos, last = pos[ok], last[ok]
            dts = w["dt"].fill_null(step_s).to_numpy().astype(np.float64)[ok]
            tss = w["ts"].to_numpy().astype(np.int64)[ok]
            value = np.full(len(self._pos), np.nan)
            np.fmax.at(value, pos, last * scale)  # a NIC's most held priority
            dt = np.zeros(len(self._pos))
            np.maximum.at(dt, pos, dts)
            np.maximum.at(self._ts, pos, tss)
            got = np.flatnonzero(~np.isnan(value))
            old = self._avg[row, got]
            keep = np.exp(-dt[got] / self.config.window_s)
            self._avg[row, got] = np.where(
                np.isnan(old), value[got], keep * old + (1 - keep) * value[got]
            )

    def _forget(self, now_ns: int) -> None:
        if self.open:
            for fp in [fp for fp, r in self.open.items() if now_ns - r[2] > self.forget_ns]:
                del self.open[fp]

    # --- attribution -----------------------------------------------------------------------------
    def senders(self, switch: str, port: str) -> tuple[list[Nic], list[Nic]]:
        """(the NICs that feed the port's egress queue, the NICs beyond it)."""
        peer = self.topology.peer_of_port(switch, port)
        if isinstance(peer, NicEnd):
            return [], [(peer.node, peer.nic)]
        mine = self._below.get(switch, [])
        if isinstance(peer, PortEnd):
            far = self._below.get(peer.switch, [])
            if mine:  # a leaf's uplink
                return mine, far
            # a spine's port toward a leaf: fed by the other leaves it links
            fed = [
                x
                for s in sorted(self._linked.get(switch, set()) - {peer.switch})
                for x in self._below.get(s, [])
            ]
            return fed, far
        return mine, []

    def attribute(self, view: _View, switch: str, port: str) -> Attribution:
        topo, cfg = self.topology, self.config
        feed, far = self.senders(switch, port)
        job_of = {n: j[0] for n, j in topo.node_jobs.items() if j}
        if not feed and far:  # a downlink: the NIC's own job sends to it
            job = job_of.get(far[0][0])
            return Attribution(job, self._tenant(job) if job else None, None, None, "")
        sent: dict[str, float] = {}
        for nic in feed:
            job = job_of.get(nic[0])
            if job is not None:
                sent[job] = sent.get(job, 0.0) + view.tx(nic)
        total = sum(sent.values())
        top = max(sorted(sent), key=lambda j: sent[j]) if sent else None
        share = sent[top] / total if top is not None and total > 0 else 0.0
        aggressor = top if share >= cfg.min_share else None
        if aggressor is not None:  # busy: a storm's silence or an idle fabric names nobody
            senders = [n for n in feed if job_of.get(n[0]) == aggressor]
            line = sum((topo.nic_speed_mbps(*n) or 400_000.0) * 125_000.0 for n in senders)
            if line <= 0 or sent[aggressor] < cfg.min_busy * line:
                aggressor = None
        held: dict[str, float] = {}
        members: dict[str, list[Nic]] = {}
        for nic in dict.fromkeys(feed + far):
            job = job_of.get(nic[0])
            if job is None:
                continue
            members.setdefault(job, []).append(nic)
            held[job] = max(held.get(job, 0.0), view.held_share(nic))
        suffering = [
            j for j in sorted(held, key=lambda j: (-held[j], j)) if held[j] >= cfg.min_pause_share
        ]
        if aggressor is not None:
            mine = self._tenant(aggressor)
            foreign = [j for j in suffering if self._tenant(j) != mine]
            if foreign:
                v = foreign[0]
                ev = (
                    f"{aggressor} sends {100 * share:.0f}% of the bytes into {switch}/{port} "
                    f"({sent[aggressor] / 1e9:.1f} GB/s, averaged over ~{cfg.window_s:g} s); "
                    f"{v}'s NICs there held by PFC up to {100 * held[v]:.1f}% of the time"
                )
                return Attribution(
                    v,
                    self._tenant(v),
                    aggressor,
                    self._tenant(aggressor),
                    ev,
                    tuple(members[v]),
                )
        victim = aggressor or (suffering[0] if suffering else top)
        if victim is None:
            return Attribution(None, None, None, None, "")
        ev = f"{switch}/{port}: no job of another tenant suffers; {victim}'s own traffic"
        return Attribution(victim, self._tenant(victim), None, None, ev)

    def _tenant(self, job: str) -> str:
        j = self.topology.jobs.get(job)
        return str(j.tenant) if j is not None and j.tenant else job


class _View:
    """Per-NIC figures for the attributions of one step."""

    def __init__(
        self, owner: InterferenceAttributor, reader: WindowReader, step_s: float, since_ns: int
    ) -> None:
        self.owner, self.reader, self.step_s, self.since_ns = owner, reader, step_s, since_ns
        self._held_step: dict[Nic, float] | None = None

    def _get(self, nic: Nic, row: int) -> float:
        o = self.owner
        i = o._pos.get(nic)
        if i is None or o._ts[i] < self.since_ns:
            return 0.0
        v = float(o._avg[row, i])
        return 0.0 if math.isnan(v) else v

    def tx(self, nic: Nic) -> float:
        """Its average transmit rate, bytes/s."""
        return self._get(nic, 0)

    def held_share(self, nic: Nic) -> float:
        """The average share of time PFC held it (its most held priority)."""
        return self._get(nic, 1)

    def held_us_step(self, nics: Iterable[Nic]) -> float:
        """PFC pause µs the NICs received in this step (their most held priority each)."""
        if self._held_step is None:
            self._held_step = {}
            w = _rows(self.reader, HELD)
            for dev, port, delta in w.select("device", "port", "delta").iter_rows():
                if delta is None or not math.isfinite(delta):
                    continue
                key = (str(dev), str(port))
                self._held_step[key] = max(self._held_step.get(key, 0.0), float(delta))
        return sum(self._held_step.get(n, 0.0) for n in nics)


def _rows(reader: WindowReader, metric: str) -> pl.DataFrame:
    step = reader.current()
    return step.get(metric) if step is not None else pl.DataFrame()


def _to_data(a: Attribution) -> dict[str, Any]:
    return {
        "victim_job": a.victim_job,
        "victim_tenant": a.victim_tenant,
        "aggressor_job": a.aggressor_job,
        "aggressor_tenant": a.aggressor_tenant,
        "evidence": a.evidence,
        "victims": [list(n) for n in a.victims],
    }


def _from_data(d: dict[str, Any]) -> Attribution:
    return Attribution(
        d.get("victim_job"),
        d.get("victim_tenant"),
        d.get("aggressor_job"),
        d.get("aggressor_tenant"),
        str(d.get("evidence") or ""),
        tuple((str(n[0]), str(n[1])) for n in d.get("victims") or ()),
    )
