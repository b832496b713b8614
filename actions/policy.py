"""The drain policy: decides which culprit nodes to drain and resume, and when to hold back.

Draining is destructive, so every decision passes these rules, in this order; the first that
withholds a drain names the refusal (``refused: <rule>`` in the action record):

``fabric_incident``
    a FabricIncident raised by the detectors (fed to ``on_alert``; its ``scope`` label names
    ``fabric``, ``job:<name>``, ``rail:<n>`` or ``switch:<name>``) fires and the node is in
    that scope: the detectors already see a fabric event there. Recorded once per node and
    incident; reconsidered on every tick, so the drain goes ahead once the incident resolves.
``blast_radius``
    more distinct candidate nodes than ``blast_radius_nodes`` started within ``hold_down_s`` of
    each other: the fabric is at fault, not the nodes. Nobody in that window is drained, ever;
    a FabricIncident says so.
``maintenance``
    a maintenance window is open.
``cooldown`` / ``job_cooldown``
    rocewatch drained this node (or, when ``job_cooldown_s`` > 0, a node of the same job)
    less than the cooldown ago.
``max_drains_per_hour``
    the node's scheduler already had that many drains in the last hour.
``max_job_share`` / ``max_rail_share`` / ``max_fabric_share``
    draining the node would put more than that share of a job's, a rail's or the fabric's
    nodes out of service at once (at least one node may always be drained); a FabricIncident
    names the job, rail or fabric. A storm's origin (an alert named in ``uncapped_origins``
    with ``role=origin``: ``PFCStorm``) is exempt: it pauses every job behind its links, so
    draining it is the one drain that protects them all, and two independent origins are
    both drained. What guards against a fabric event drained node by node is
    ``blast_radius`` (and ``fabric_incident``), which still holds for them.

The reason of every refusal names its rule: ``<alert> (withheld by <rule>: <why>)``.

A policy of one fabric domain (the scale-out detect stage split by domain: ``domain`` set)
sees only that domain's alerts and drains, so it applies the caps to the domain's share of
them: a share counts the job's, rail's or fabric's nodes in the domain, and
``max_drains_per_hour`` is split over the domains by their nodes (at least one each).

A refusal other than ``blast_radius`` is reconsidered on every tick while the alert fires, and
the drain goes ahead when the rule stops withholding it (a refusal is recorded once per rule).

Candidates: an alert named in ``drain_on`` with a ``node`` label, never one with
``role=victim``, and for the names in ``origin_only`` only ``role=origin``. A candidate is
decided when its hold-down expires (``startsAt + hold_down_s <= now``) if it still fires.
Times are telemetry time in nanoseconds, so replay decides exactly as live operation does.

>>> from rocewatch.core.topology import Topology
>>> topo = Topology.from_dict({"switches": [{"name": "leaf-0"}],
...     "nodes": [{"name": f"gpu-{i}", "nics": [{"nic": "mlx5_0"}]} for i in range(10)]})
>>> p = DrainPolicy(PolicyConfig(), topo)
>>> storm = Alert({"alertname": "PFCStorm", "severity": "critical", "node": "gpu-3",
...                "nic": "mlx5_0", "role": "origin"}, {}, starts_at=10**18)
>>> p.on_alert(storm, 10**18)
>>> p.tick(10**18 + 2 * 10**9)[0][0].to_json()["outcome"]
'dry-run'
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from actions.executors import DryRunExecutor, Executor
from rocewatch.core.errors import ConfigError, Fenced
from rocewatch.core.model import (
    ALERTNAMES,
    FABRIC_INCIDENT,
    FLAKY_LINK,
    PCIE_DOWNGRADE,
    PFC_STORM,
    Action,
    Alert,
    rfc3339,
)
from rocewatch.core.topology import Topology

log = logging.getLogger(__name__)

S = 1_000_000_000
HOUR = 3600 * S
MODES = ("dry-run", "approval", "auto")
STATE_VERSION = 1


@dataclass(frozen=True)
class PolicyConfig:
    """How cautiously rocewatch drains. Times are seconds of telemetry time."""

    mode: str = "dry-run"  # dry-run | approval | auto
    drain_on: tuple[str, ...] = (PFC_STORM, FLAKY_LINK, PCIE_DOWNGRADE)
    origin_only: tuple[str, ...] = (PFC_STORM,)  # these drain only with role=origin
    # origins of these (role=origin) are not held to the share caps: a storm pauses everyone
    uncapped_origins: tuple[str, ...] = (PFC_STORM,)
    hold_down_s: float = 2.0
    blast_radius_nodes: int = 3
    max_job_share: float = 0.25
    max_rail_share: float = 0.1
    max_fabric_share: float = 0.1
    cooldown_s: float = 600.0  # per node, from rocewatch's last drain of it
    job_cooldown_s: float = 0.0  # per job; 0 leaves a job's nodes to the share cap alone
    max_drains_per_hour: int = 10  # per scheduler
    resume_after_healthy_s: float = 300.0
    maintenance: tuple[tuple[int, int], ...] = ()  # (start_ns, end_ns): no drains inside
    retry_s: float = 30.0  # first retry of a failed drain/resume; doubles, capped at an hour
    max_drain_attempts: int = 3
    memory_s: float = 3600.0  # how long resolved alerts are remembered (re-fed events ignored)

    def validate(self) -> None:
        problems: list[str] = []
        if self.mode not in MODES:
            problems.append(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        for name in (*self.drain_on, *self.origin_only, *self.uncapped_origins):
            if name not in ALERTNAMES or name == FABRIC_INCIDENT:
                problems.append(f"{name!r} is not an alert that can name a culprit node")
        for k in ("hold_down_s", "cooldown_s", "job_cooldown_s", "resume_after_healthy_s"):
            if getattr(self, k) < 0:
                problems.append(f"{k} must not be negative")
        for k in ("retry_s", "memory_s"):
            if getattr(self, k) <= 0:
                problems.append(f"{k} must be positive")
        if self.blast_radius_nodes < 1:
            problems.append("blast_radius_nodes must be at least 1")
        for k in ("max_job_share", "max_rail_share", "max_fabric_share"):
            if not 0 < getattr(self, k) <= 1:
                problems.append(f"{k} must be in (0, 1]")
        if self.max_drains_per_hour < 0:
            problems.append("max_drains_per_hour must not be negative")
        if self.max_drain_attempts < 1:
            problems.append("max_drain_attempts must be at least 1")
        for i, w in enumerate(self.maintenance):
            if len(w) != 2 or not w[0] < w[1]:
                problems.append(f"maintenance[{i}] must be (start_ns, end_ns) with start < end")
        if problems:
            raise ConfigError("drain policy: " + "; ".join(problems))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PolicyConfig:
        """Build from a config file's mapping; unknown keys are an error, not ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"drain policy: unknown settings {', '.join(unknown)}")
        kw = dict(d)
        try:
            for k in ("drain_on", "origin_only", "uncapped_origins"):
                if k in kw:
                    kw[k] = tuple(str(x) for x in kw[k])
            if "maintenance" in kw:
                kw["maintenance"] = tuple((int(a), int(b)) for a, b in kw["maintenance"])
            cfg = cls(**kw)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"drain policy: bad value: {e}") from e
        cfg.validate()
        return cfg


# --- internal records (plain data, so state() is JSON) ----------------------------------------


@dataclass
class _Candidate:
    """One firing event of an alert that may name a culprit node."""

    key: str  # fingerprint@startsAt: one alert event
    fingerprint: str
    node: str
    nic: str
    reason: str
    starts_at: int
    ends_at: int = 0
    # waiting: hold-down or a refusal that may lift; decided: drained (or tried);
    # attached: its node was already ours; withheld: blast radius; closed: resolved while waiting
    status: str = "waiting"
    refused: str = ""  # rule of the last refusal recorded for it
    blast_checked: bool = False
    uncapped: bool = False  # a storm's origin: the share caps do not hold it back


@dataclass
class _NodeRecord:
    """A node rocewatch drained or decided to drain; only these are ever resumed."""

    node: str
    scheduler: str
    # pending (approval) | approved | rejected | draining | drained | resuming
    status: str
    since: int  # decision time
    fingerprint: str
    reason: str
    culprits: dict[str, int] = field(default_factory=dict)  # candidate key -> endsAt (0 firing)
    attempts: int = 0
    next_try: int = 0

    def healthy_since(self) -> int:
        """When its last culprit alert resolved; 0 while any still fires."""
        if not self.culprits or any(e == 0 for e in self.culprits.values()):
            return 0
        return max(self.culprits.values())


@dataclass
class _Incident:
    scope: str
    starts_at: int
    members: dict[str, str] = field(default_factory=dict)  # candidate key -> withholding rule
    why: dict[str, str] = field(default_factory=dict)  # rule -> latest explanation
    ends_at: int = 0


class DrainPolicy:
    """Turns culprit alerts into drain and resume actions, within the configured limits.

    Feed every alert event with ``on_alert`` (firing and resolved, in telemetry-time order),
    call ``tick(now)`` regularly; it returns the actions decided since the last tick and the
    FabricIncident alerts raised, updated or resolved. ``state()`` / ``restore()`` carry the
    policy across a restart so nothing is drained twice.
    """

    def __init__(
        self, config: PolicyConfig, topology: Topology, executor: Executor | None = None
    ) -> None:
        config.validate()
        self.config = config
        self.topology = topology
        self.domain: str | None = None  # set by a pipeline of one fabric domain
        self.executor: Executor = executor if executor is not None else DryRunExecutor()
        self._hold = int(config.hold_down_s * S)
        self._cands: dict[str, _Candidate] = {}
        self._nodes: dict[str, _NodeRecord] = {}
        self._last_drain: dict[str, int] = {}
        self._job_last_drain: dict[str, int] = {}
        self._drain_log: list[tuple[int, str]] = []  # (time, scheduler)
        self._incidents: dict[str, _Incident] = {}  # open incidents by scope
        # firing FabricIncidents from the detectors: fingerprint -> scope; and the
        # "node@fingerprint" refusals already recorded under them
        self._detector_incidents: dict[str, str] = {}
        self._incident_refused: set[str] = set()
        self._now = 0
        self._warned_unknown: set[str] = set()
        self._rail_nodes: dict[int, set[str]] = {}
        for (node, nic), _ in topology.nics.items():
            rail = topology.nic_rail(node, nic)
            if rail is not None:
                self._rail_nodes.setdefault(rail, set()).add(node)

    # --- inputs --------------------------------------------------------------------------------
    def on_alert(self, alert: Alert, now_ns: int) -> None:
        """Take one alert event; only drain candidates are remembered."""
        self._now = max(self._now, now_ns)
        if self._on_detector_incident(alert):
            return
        if not self._is_candidate(alert):
            return
        key = f"{alert.fingerprint}@{alert.starts_at}"
        c = self._cands.get(key)
        if alert.ends_at:
            if c is None:
                # Resolved before we saw it fire (e.g. after a restart): remember it, so a late
                # re-send of the firing event is not mistaken for a new fault.
                c = self._new_candidate(alert, key)
                c.status = "closed"
                self._cands[key] = c
            if c.ends_at == 0:
                c.ends_at = alert.ends_at
                if c.status == "waiting":
                    c.status = "closed"
            rec = self._nodes.get(c.node)
            if rec is not None and key in rec.culprits:
                rec.culprits[key] = alert.ends_at
            return
        if c is not None:
            return  # the same event again: already known, whatever was decided
        c = self._new_candidate(alert, key)
        self._cands[key] = c
        rec = self._nodes.get(c.node)
        if rec is not None:
            self._attach(c, rec)

    def approve(self, node: str) -> bool:
        """Release a drain waiting for approval; it executes on the next tick."""
        rec = self._nodes.get(node)
        if rec is None or rec.status != "pending":
            return False
        rec.status = "approved"
        rec.next_try = 0
        log.info("drain of %s approved", node)
        return True

    def reject(self, node: str) -> bool:
        """Drop a drain waiting for approval; the next tick records the refusal."""
        rec = self._nodes.get(node)
        if rec is None or rec.status != "pending":
            return False
        rec.status = "rejected"
        log.info("drain of %s rejected", node)
        return True

    def undrain(self, node: str) -> bool:
        """An operator returns a node rocewatch holds to service now (next tick), healthy or not.

        A drain still waiting for approval is rejected instead. Nodes rocewatch did not drain
        are never touched: False.
        """
        rec = self._nodes.get(node)
        if rec is None:
            return False
        if rec.status in ("pending", "approved"):  # not drained yet: the drain is dropped
            rec.status = "rejected"
        elif rec.status in ("drained", "draining", "resuming"):
            rec.status = "undrain"
            rec.next_try = 0
        else:
            return False
        log.warning("undrain of %s requested by an operator", node)
        return True

    @property
    def now(self) -> int:
        """The latest telemetry time the policy has seen."""
        return self._now

    def pending(self) -> list[str]:
        """Nodes whose drain waits for ``approve``."""
        return sorted(n for n, r in self._nodes.items() if r.status == "pending")

    def drained(self) -> dict[str, str]:
        """Nodes rocewatch holds (drained, draining, pending...) and their status."""
        return {n: r.status for n, r in sorted(self._nodes.items())}

    # --- decisions -----------------------------------------------------------------------------
    def tick(self, now_ns: int) -> tuple[list[Action], list[Alert]]:
        """Decide what is due at telemetry time ``now_ns``; return actions and incidents."""
        self._now = max(self._now, now_ns)
        now = now_ns
        out: list[Action] = []
        changed: set[str] = set()
        self._node_work(now, out)
        self._resumes(now, out)  # first, so a node back in service frees its share at once
        due = [
            c
            for c in self._cands.values()
            if c.status == "waiting" and c.starts_at + self._hold <= now
        ]
        for c in sorted(due, key=lambda c: (c.starts_at, c.node, c.key)):
            if c.status == "waiting":  # a blast window may have withheld it meanwhile
                self._decide(c, now, out, changed)
        incidents = self._incident_updates(now, changed)
        self._forget(now)
        return out, incidents

    def _decide(self, c: _Candidate, now: int, out: list[Action], changed: set[str]) -> None:
        rec = self._nodes.get(c.node)
        if rec is not None:
            self._attach(c, rec)
            return
        if self._withheld_by_detector_incident(c, now, out):
            return
        if not c.blast_checked:
            c.blast_checked = True
            if self._blast_radius(c, now, out, changed):
                return
        rule, why, scope = self._withholding_rule(c, now)
        if rule:
            if c.refused != rule:
                c.refused = rule
                out.append(self._action(now, "drain", c, False, f"refused: {rule}", why))
                log.warning("drain of %s withheld (%s): %s", c.node, rule, why)
            if scope:
                self._join_incident(scope, now, c, rule, why, changed)
            return
        self._start_drain(c, now, out)

    def _blast_radius(self, c: _Candidate, now: int, out: list[Action], changed: set[str]) -> bool:
        """Withhold ``c`` (and its whole window) when too many nodes fault at once."""
        lo, hi = c.starts_at - self._hold, c.starts_at + self._hold
        for inc in self._incidents.values():
            if any(
                rule == "blast_radius" and (m := self._cands.get(k)) and lo <= m.starts_at <= hi
                for k, rule in inc.members.items()
            ):
                self._withhold(c, inc, now, out, changed)  # the same event, still spreading
                return True
        window = [m for m in self._cands.values() if lo <= m.starts_at <= hi]
        nodes = {m.node for m in window}
        if len(nodes) <= self.config.blast_radius_nodes:
            return False
        scope = self._common_scope(window)
        why = (
            f"{len(nodes)} nodes became drain candidates within {self.config.hold_down_s:g}s "
            f"(blast radius {self.config.blast_radius_nodes}): a fabric event, drains withheld"
        )
        inc = self._incident(scope, now)
        inc.why["blast_radius"] = why
        log.error("blast radius exceeded in %s: %s: %s", scope, why, ", ".join(sorted(nodes)))
        members = [m for m in window if m.status == "waiting" and m.node not in self._nodes]
        for m in sorted(members, key=lambda m: (m.starts_at, m.node, m.key)):
            m.blast_checked = True
            self._withhold(m, inc, now, out, changed)
        return True

    def _withhold(
        self, c: _Candidate, inc: _Incident, now: int, out: list[Action], changed: set[str]
    ) -> None:
        c.status = "withheld"
        c.refused = "blast_radius"
        inc.members[c.key] = "blast_radius"
        changed.add(inc.scope)
        out.append(
            self._action(now, "drain", c, False, "refused: blast_radius", inc.why["blast_radius"])
        )

    def _withholding_rule(self, c: _Candidate, now: int) -> tuple[str, str, str]:
        """(rule, explanation, incident scope or '') of the first rule that withholds ``c``."""
        cfg = self.config
        for start, end in cfg.maintenance:
            if start <= now < end:
                return "maintenance", f"maintenance {rfc3339(start)} to {rfc3339(end)}", ""
        last = self._last_drain.get(c.node)
        if last is not None and now - last < cfg.cooldown_s * S:
            ago = (now - last) / S
            why = f"{c.node} was drained {ago:.0f}s ago (cooldown {cfg.cooldown_s:g}s)"
            return "cooldown", why, ""
        jobs = sorted(self.topology.node_jobs.get(c.node, []))
        if cfg.job_cooldown_s > 0:
            for j in jobs:
                last = self._job_last_drain.get(j)
                if last is not None and now - last < cfg.job_cooldown_s * S:
                    ago = (now - last) / S
                    why = (
                        f"job {j} had a node drained {ago:.0f}s ago "
                        f"(cooldown {cfg.job_cooldown_s:g}s)"
                    )
                    return "job_cooldown", why, ""
        sched = self.topology.scheduler_of(c.node)
        recent = sum(1 for t, s in self._drain_log if s == sched and t > now - HOUR)
        limit = self._hourly_limit()
        if recent >= limit:
            why = f"{recent} {sched} drains in the last hour (limit {limit}{self._where()})"
            return "max_drains_per_hour", why, ""
        if c.uncapped:
            return "", "", ""
        for j in jobs:
            members = set(self.topology.jobs[j].nodes)
            why = self._share_exceeded(f"job {j}", members, cfg.max_job_share)
            if why:
                return "max_job_share", why, f"job:{j}"
        first = self.topology.nic_rail(c.node, c.nic)
        rails = sorted(r for r, ns in self._rail_nodes.items() if c.node in ns)
        for r in sorted(rails, key=lambda r: r != first):
            why = self._share_exceeded(f"rail {r}", self._rail_nodes[r], cfg.max_rail_share)
            if why:
                return "max_rail_share", why, f"rail:{r}"
        why = self._share_exceeded("the fabric", set(self.topology.nodes), cfg.max_fabric_share)
        if why:
            return "max_fabric_share", why, "fabric"
        return "", "", ""

    def _hourly_limit(self) -> int:
        """``max_drains_per_hour``, or a domain's part of it (by its share of the nodes)."""
        limit = self.config.max_drains_per_hour
        domain = getattr(self, "domain", None)
        if domain is None or limit == 0 or not self.topology.nodes:
            return limit
        mine = sum(1 for n in self.topology.nodes if self.topology.domain_of(n) == domain)
        return max(1, math.floor(limit * mine / len(self.topology.nodes)))

    def _where(self) -> str:
        domain = getattr(self, "domain", None)
        return "" if domain is None else f" in domain {domain!r}"

    def _share_exceeded(self, what: str, members: set[str], share: float) -> str:
        domain = getattr(self, "domain", None)
        if domain is not None:  # this domain's part of the job, rail or fabric
            members = {n for n in members if self.topology.domain_of(n) == domain}
            what += self._where()
        held = sorted(n for n in self._nodes if n in members)
        allowed = max(1, math.floor(share * len(members) + 1e-9))
        if len(held) + 1 <= allowed:
            return ""
        return (
            f"{what} already has {len(held)} of {len(members)} nodes out ({', '.join(held)}); "
            f"cap {share:.0%} allows {allowed}"
        )

    def _start_drain(self, c: _Candidate, now: int, out: list[Action]) -> None:
        sched = self.topology.scheduler_of(c.node)
        rec = _NodeRecord(c.node, sched, "draining", now, c.fingerprint, c.reason)
        rec.culprits[c.key] = c.ends_at
        self._nodes[c.node] = rec
        c.status = "decided"
        self._last_drain[c.node] = now
        for j in self.topology.node_jobs.get(c.node, []):
            self._job_last_drain[j] = now
        self._drain_log.append((now, sched))
        if self.config.mode == "dry-run":
            rec.status = "drained"
            out.append(self._action(now, "drain", c, False, "dry-run"))
            log.warning("dry-run: would drain %s: %s", c.node, c.reason)
        elif self.config.mode == "approval":
            rec.status = "pending"
            out.append(self._action(now, "drain", c, False, "pending-approval"))
            log.warning("drain of %s waits for approval: %s", c.node, c.reason)
        else:
            self._try_drain(rec, now, out)

    def _try_drain(self, rec: _NodeRecord, now: int, out: list[Action]) -> None:
        rec.status = "draining"
        outcome = self._execute("drain", rec)
        rec.attempts += 1
        out.append(self._node_action(now, "drain", rec, rec.reason, outcome))
        if outcome in ("done", "dry-run"):
            rec.status = "drained"
            rec.attempts = 0
        elif outcome.startswith("failed") and rec.attempts < self.config.max_drain_attempts:
            rec.next_try = now + self._backoff(rec.attempts)
            log.warning("drain of %s %s; retrying", rec.node, outcome)
        else:
            # Refused by the scheduler (e.g. drained by someone else) or out of attempts:
            # rocewatch does not hold this node and will never resume it.
            level = logging.ERROR if outcome.startswith("failed") else logging.INFO
            log.log(level, "drain of %s given up: %s", rec.node, outcome)
            del self._nodes[rec.node]

    def _node_work(self, now: int, out: list[Action]) -> None:
        """Approved, rejected and retried drains; retried resumes."""
        for node in sorted(self._nodes):
            rec = self._nodes[node]
            if rec.status == "approved" or (rec.status == "draining" and rec.next_try <= now):
                self._try_drain(rec, now, out)
            elif rec.status == "rejected":
                out.append(self._node_action(now, "drain", rec, rec.reason, "refused: rejected"))
                del self._nodes[node]
            elif rec.status == "resuming" and rec.next_try <= now:
                self._try_resume(rec, now, out)
            elif rec.status == "undrain":
                was = rec.reason.removeprefix("rocewatch: ")
                reason = f"rocewatch: undrained by an operator after {was}"
                if self.config.mode == "dry-run":
                    out.append(self._node_action(now, "resume", rec, reason, "dry-run"))
                    del self._nodes[node]
                else:
                    self._try_resume(rec, now, out, reason)

    def _resumes(self, now: int, out: list[Action]) -> None:
        wait = self.config.resume_after_healthy_s * S
        for node in sorted(self._nodes):
            rec = self._nodes[node]
            healthy = rec.healthy_since()
            if healthy and rec.status == "draining":
                # Its alerts resolved while the drain kept failing: nothing left to drain for.
                log.warning("drain of %s abandoned: its alerts resolved", node)
                del self._nodes[node]
                continue
            if not healthy or now - healthy < wait or rec.status not in ("drained", "pending"):
                continue
            if rec.status == "pending":
                # Healthy again before anyone approved: the drain is no longer wanted.
                out.append(
                    self._node_action(now, "drain", rec, rec.reason, "refused: approval_expired")
                )
                del self._nodes[node]
                continue
            rec.attempts = 0
            if self.config.mode == "dry-run":
                reason = self._resume_reason(rec)
                out.append(self._node_action(now, "resume", rec, reason, "dry-run"))
                del self._nodes[node]
                log.info("dry-run: would resume %s", node)
                continue
            self._try_resume(rec, now, out)

    def _try_resume(self, rec: _NodeRecord, now: int, out: list[Action], reason: str = "") -> None:
        rec.status = "resuming"
        outcome = self._execute("resume", rec)
        rec.attempts += 1
        out.append(
            self._node_action(now, "resume", rec, reason or self._resume_reason(rec), outcome)
        )
        if outcome.startswith("failed"):
            rec.next_try = now + self._backoff(rec.attempts)  # never give up: it stays drained
            log.warning("resume of %s %s; retrying", rec.node, outcome)
        else:
            del self._nodes[rec.node]

    def _attach(self, c: _Candidate, rec: _NodeRecord) -> None:
        """A new culprit alert on a node we already hold: no new drain, but no resume yet."""
        c.status = "attached"
        rec.culprits[c.key] = c.ends_at
        if c.ends_at == 0 and rec.status == "resuming":
            rec.status = "drained"  # faulting again: stop trying to resume it
            rec.attempts = 0

    # --- FabricIncidents raised by the detectors --------------------------------------------
    def _on_detector_incident(self, alert: Alert) -> bool:
        """Track a detector FabricIncident event; True when ``alert`` was one."""
        labels = alert.labels
        if labels.get("alertname") != FABRIC_INCIDENT or not labels.get("scope"):
            return False
        fp = alert.fingerprint
        if alert.ends_at:
            if self._detector_incidents.pop(fp, None) is not None:
                log.warning("fabric incident %s resolved: drains reconsidered", labels["scope"])
            self._incident_refused = {k for k in self._incident_refused if not k.endswith(f"@{fp}")}
        elif fp not in self._detector_incidents:
            self._detector_incidents[fp] = labels["scope"]
            log.warning("fabric incident %s: drains there withheld", labels["scope"])
        return True

    def _in_scope(self, node: str, scope: str) -> bool:
        kind, _, name = scope.partition(":")
        if kind == "fabric":
            return True
        if kind == "job":
            return name in self.topology.node_jobs.get(node, [])
        if kind == "rail":
            return name.isdigit() and node in self._rail_nodes.get(int(name), set())
        if kind == "switch":
            n = self.topology.nodes.get(node)
            return n is not None and any(
                x.switch_port is not None and x.switch_port.switch == name for x in n.nics
            )
        return False

    def _withheld_by_detector_incident(self, c: _Candidate, now: int, out: list[Action]) -> bool:
        """Withhold ``c`` while a detector FabricIncident covering its node fires."""
        for fp, scope in sorted(self._detector_incidents.items(), key=lambda x: x[1]):
            if not self._in_scope(c.node, scope):
                continue
            c.refused = "fabric_incident"
            noted = f"{c.node}@{fp}"
            if noted not in self._incident_refused:
                self._incident_refused.add(noted)
                why = f"FabricIncident in {scope} fires: a fabric event, drains there withheld"
                out.append(self._action(now, "drain", c, False, "refused: fabric_incident", why))
                log.warning("drain of %s withheld (fabric_incident): %s", c.node, why)
            return True
        return False

    # --- incidents -----------------------------------------------------------------------------
    def _incident(self, scope: str, now: int) -> _Incident:
        inc = self._incidents.get(scope)
        if inc is None:
            inc = self._incidents[scope] = _Incident(scope, now)
        return inc

    def _join_incident(
        self, scope: str, now: int, c: _Candidate, rule: str, why: str, changed: set[str]
    ) -> None:
        inc = self._incident(scope, now)
        if inc.members.get(c.key) != rule or inc.why.get(rule) != why:
            inc.members[c.key] = rule
            inc.why[rule] = why
            changed.add(scope)

    def _incident_updates(self, now: int, changed: set[str]) -> list[Alert]:
        out: list[Alert] = []
        for scope in sorted(self._incidents):
            inc = self._incidents[scope]
            open_members = [
                k
                for k in inc.members
                if (m := self._cands.get(k)) is not None
                and m.ends_at == 0
                and m.status in ("waiting", "withheld")
            ]
            if not open_members:
                ends = [m.ends_at for k in inc.members if (m := self._cands.get(k)) and m.ends_at]
                inc.ends_at = max([inc.starts_at, *ends]) if ends else max(now, inc.starts_at)
                del self._incidents[scope]
                out.append(self._incident_alert(inc))
                log.warning("fabric incident in %s resolved", scope)
            elif scope in changed:
                out.append(self._incident_alert(inc))
        return out

    def _incident_alert(self, inc: _Incident) -> Alert:
        nodes = sorted({m.node for k in inc.members if (m := self._cands.get(k))})
        withheld = ", ".join(
            f"{m.node}: {rule}"
            for k, rule in sorted(inc.members.items())
            if (m := self._cands.get(k))
        )
        labels = {"alertname": FABRIC_INCIDENT, "severity": "critical", "scope": inc.scope}
        domain = getattr(self, "domain", None)
        if domain is not None:  # one policy per fabric domain (the sharded detect stage)
            labels["domain"] = domain
        return Alert(
            labels=labels,
            annotations={
                "summary": f"{len(nodes)} nodes faulted at once in {inc.scope}: drains withheld",
                "description": "; ".join(inc.why[r] for r in sorted(inc.why)),
                "nodes": ", ".join(nodes),
                "evidence": f"withheld drains: {withheld}",
            },
            starts_at=inc.starts_at,
            ends_at=inc.ends_at,
        )

    def _common_scope(self, cands: Iterable[_Candidate]) -> str:
        """The narrowest place all these candidates share: a switch, a rail, a job, or none."""
        cs = list(cands)
        switches, rails = set(), set()
        for c in cs:
            nic = self.topology.nics.get((c.node, c.nic))
            switches.add(nic.switch_port.switch if nic and nic.switch_port else None)
            rails.add(self.topology.nic_rail(c.node, c.nic))
        if len(switches) == 1 and None not in switches:
            return f"switch:{switches.pop()}"
        if len(rails) == 1 and None not in rails:
            return f"rail:{rails.pop()}"
        common: set[str] | None = None
        for c in cs:
            js = set(self.topology.node_jobs.get(c.node, []))
            common = js if common is None else common & js
        if common:
            return f"job:{sorted(common)[0]}"
        return "fabric"

    # --- helpers -------------------------------------------------------------------------------
    def _is_candidate(self, alert: Alert) -> bool:
        labels = alert.labels
        name = labels.get("alertname", "")
        node = labels.get("node", "")
        role = labels.get("role", "")
        if name not in self.config.drain_on or not node or role == "victim":
            return False
        if name in self.config.origin_only and role != "origin":
            return False
        if node not in self.topology.nodes:
            if node not in self._warned_unknown:
                self._warned_unknown.add(node)
                log.warning("%s names node %s, which the topology lacks: never drained", name, node)
            return False
        return True

    def _new_candidate(self, alert: Alert, key: str) -> _Candidate:
        labels = alert.labels
        parts = [labels["alertname"], labels.get("role", ""), labels.get("nic", "")]
        return _Candidate(
            key=key,
            fingerprint=alert.fingerprint,
            node=labels["node"],
            nic=labels.get("nic", ""),
            reason="rocewatch: " + " ".join(p for p in parts if p),
            starts_at=alert.starts_at,
            ends_at=alert.ends_at,
            uncapped=labels.get("role") == "origin"
            and labels["alertname"] in self.config.uncapped_origins,
        )

    def _execute(self, what: str, rec: _NodeRecord) -> str:
        try:
            if what == "drain":
                return self.executor.drain(rec.node, rec.scheduler, rec.reason)
            return self.executor.resume(rec.node, rec.scheduler)
        except Fenced:
            raise  # another instance decides now: this one records no outcome
        except Exception as e:  # an executor bug must not stop the policy
            log.exception("%s of %s raised", what, rec.node)
            return f"failed: {type(e).__name__}: {e}"

    def _backoff(self, attempts: int) -> int:
        return int(min(self.config.retry_s * 2 ** (attempts - 1), 3600.0) * S)

    def _resume_reason(self, rec: _NodeRecord) -> str:
        return (
            f"rocewatch: healthy for {self.config.resume_after_healthy_s:g}s after "
            f"{rec.reason.removeprefix('rocewatch: ')}"
        )

    def _action(
        self, now: int, what: str, c: _Candidate, executed: bool, outcome: str, why: str = ""
    ) -> Action:
        rule = outcome.removeprefix("refused: ") if outcome.startswith("refused: ") else ""
        if rule:
            reason = f"{c.reason} (withheld by {rule}: {why or 'see the policy'})"
        else:
            reason = f"{c.reason} (withheld: {why})" if why else c.reason
        sched = self.topology.scheduler_of(c.node)
        return Action(now, what, c.node, sched, reason, c.fingerprint, executed, outcome)

    def _node_action(
        self, now: int, what: str, rec: _NodeRecord, reason: str, outcome: str
    ) -> Action:
        return Action(
            now, what, rec.node, rec.scheduler, reason, rec.fingerprint, outcome == "done", outcome
        )

    def _forget(self, now: int) -> None:
        """Drop what can no longer matter, so state stays bounded."""
        keep = self.config.memory_s * S
        held = {k for r in self._nodes.values() for k in r.culprits}
        held |= {k for inc in self._incidents.values() for k in inc.members}
        for k in [
            k
            for k, c in self._cands.items()
            if c.ends_at and now - c.ends_at > keep and k not in held
        ]:
            del self._cands[k]
        self._drain_log = [(t, s) for t, s in self._drain_log if t > now - HOUR]
        node_cd, job_cd = self.config.cooldown_s * S, self.config.job_cooldown_s * S
        self._last_drain = {n: t for n, t in self._last_drain.items() if now - t < node_cd}
        self._job_last_drain = {j: t for j, t in self._job_last_drain.items() if now - t < job_cd}

    # --- persistence ---------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Everything needed to carry on after a restart, as JSON-able data."""
        return {
            "version": STATE_VERSION,
            "now": self._now,
            "candidates": [dataclasses.asdict(c) for c in self._cands.values()],
            "nodes": [dataclasses.asdict(r) for r in self._nodes.values()],
            "last_drain": dict(self._last_drain),
            "job_last_drain": dict(self._job_last_drain),
            "drain_log": [[t, s] for t, s in self._drain_log],
            "incidents": [dataclasses.asdict(i) for i in self._incidents.values()],
            "detector_incidents": dict(self._detector_incidents),
            "incident_refused": sorted(self._incident_refused),
        }

    def forget_nodes(self, keep: set[str]) -> int:
        """Drop what was only waiting on nodes no longer in the topology (alerts waiting for
        their hold-down, drains waiting for approval); how many. A drain already made stays
        recorded: only rocewatch's record lets it be resumed."""
        gone = [k for k, c in self._cands.items() if c.node not in keep and c.status == "waiting"]
        for k in gone:
            del self._cands[k]
        held = [n for n, r in self._nodes.items() if n not in keep and r.status == "pending"]
        for n in held:
            del self._nodes[n]
        return len(gone) + len(held)

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state()`` of an earlier run (of the same or an older version)."""
        if state.get("version") != STATE_VERSION:
            raise ConfigError(f"drain policy state version {state.get('version')!r} is unknown")
        try:
            cands = [_Candidate(**c) for c in state["candidates"]]
            nodes = [_NodeRecord(**r) for r in state["nodes"]]
            incidents = [_Incident(**i) for i in state["incidents"]]
            self._drain_log = [(int(t), str(s)) for t, s in state["drain_log"]]
            self._last_drain = {str(k): int(v) for k, v in state["last_drain"].items()}
            self._job_last_drain = {str(k): int(v) for k, v in state["job_last_drain"].items()}
            self._now = int(state["now"])
            detector_incidents = {
                str(k): str(v) for k, v in state.get("detector_incidents", {}).items()
            }
            incident_refused = {str(k) for k in state.get("incident_refused", [])}
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"drain policy state is damaged: {e}") from e
        self._cands = {c.key: c for c in cands}
        self._nodes = {r.node: r for r in nodes}
        self._incidents = {i.scope: i for i in incidents}
        self._detector_incidents = detector_incidents
        self._incident_refused = incident_refused
        log.info(
            "drain policy restored: %d nodes held, %d alerts remembered",
            len(self._nodes),
            len(self._cands),
        )
