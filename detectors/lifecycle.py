"""The alert lifecycle: findings per step -> alerts that fire once, stay deduplicated, resolve.

An alert's identity is its fingerprint (a hash of its labels). A finding seen again while its
alert fires only refreshes it; a finding that stays absent for ``resolve_after_s`` of telemetry
time resolves it (flap damping). A new firing after that is a new alert instance.

An alert's annotations are those of the finding that made it fire, except the ones that list a
grouped alert's members (``LIVE_ANNOTATIONS``: a storm's ports or victims, an incident's
members), which follow the latest finding while it fires: no new event, but the resolved event
and the final state name everything the alert covered.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from rocewatch.core.model import Alert, Finding, fingerprint
from rocewatch.core.state import Stateful

# annotations that follow the latest finding of a firing alert (rocewatch/alerting/group.py)
LIVE_ANNOTATIONS = (
    "members",
    "ports",
    "victims",
    "tree",
    "cause",
    "cause_alert",
    "victim_pause_s",  # the pause time an interference victim suffered so far (alerting/)
)


@dataclass(frozen=True)
class LifecycleConfig:
    resolve_after_s: float = 1.0


class AlertLifecycle(Stateful):
    def __init__(self, config: LifecycleConfig | None = None, retain: bool = True) -> None:
        """``retain=False`` forgets resolved alerts once emitted (a service, whose storage and
        output topics keep them); replay retains them to write its final ``alerts.jsonl``."""
        self.config = config or LifecycleConfig()
        self.retain = retain
        self.firing: dict[str, Alert] = {}
        self.owner: dict[str, str] = {}
        self.last_seen: dict[str, int] = {}
        self.history: list[Alert] = []

    STATE_TYPES: ClassVar[tuple[type, ...]] = (Alert,)
    NOT_STATE: ClassVar[frozenset[str]] = frozenset({"retain"})

    def update(self, source: str, now_ns: int, findings: list[Finding]) -> list[Alert]:
        """Apply one detector's findings for the step ending at ``now_ns``; return new events."""
        events: list[Alert] = []
        seen: set[str] = set()
        for f in findings:
            labels = {"alertname": f.alertname, "severity": f.severity, **f.labels}
            fp = fingerprint(labels)
            seen.add(fp)
            self.last_seen[fp] = now_ns
            live = self.firing.get(fp)
            if live is not None:
                for k in LIVE_ANNOTATIONS:
                    if k in f.extra:
                        live.annotations[k] = f.extra[k]
                continue
            ann = {
                "summary": f.summary,
                "description": f.description or f.summary,
                "evidence": f.evidence,
                **f.extra,
            }
            alert = Alert(labels=labels, annotations=ann, starts_at=f.ts, fingerprint=fp)
            self.firing[fp] = alert
            self.owner[fp] = source
            events.append(replace(alert, labels=dict(labels), annotations=dict(ann)))
        hold = int(self.config.resolve_after_s * 1e9)
        for fp in [fp for fp, o in self.owner.items() if o == source and fp not in seen]:
            if now_ns - self.last_seen.get(fp, 0) >= hold:
                events.append(self._resolve(fp, now_ns))
        return events

    def resolve(self, fp: str, now_ns: int) -> Alert:
        """Resolve a firing alert now (its detector is off, its entity left the topology)."""
        return self._resolve(fp, now_ns)

    def _resolve(self, fp: str, now_ns: int) -> Alert:
        alert = self.firing.pop(fp)
        self.owner.pop(fp, None)
        self.last_seen.pop(fp, None)
        alert.ends_at = max(now_ns, alert.starts_at + 1)
        if self.retain:
            self.history.append(alert)
        return replace(alert, labels=dict(alert.labels), annotations=dict(alert.annotations))

    def mark(self, fingerprint: str, starts_at: int, source: str | None) -> None:
        """Note on the lifecycle's own record of an alert instance that ``source`` inhibits it
        (``inhibited_by``), or clear that (None): later events and the final state carry it."""
        alert = self.firing.get(fingerprint)
        if alert is None or alert.starts_at != starts_at:
            # ended already (within the inhibition wait): the newest instance in the history
            alert = next(
                (
                    a
                    for a in reversed(self.history)
                    if a.fingerprint == fingerprint and a.starts_at == starts_at
                ),
                None,
            )
        if alert is None:
            return
        if source is None:
            alert.annotations.pop("inhibited_by", None)
        else:
            alert.annotations["inhibited_by"] = source

    def add_external(self, alert: Alert) -> None:
        """Record an alert raised outside the detectors (e.g. a FabricIncident by the policy)."""
        if alert.ends_at:
            self.firing.pop(alert.fingerprint, None)
            if self.retain:
                key = alert.event_key()[:2]
                self.history = [a for a in self.history if a.event_key()[:2] != key]
                self.history.append(alert)
        else:
            self.firing[alert.fingerprint] = alert

    def all_alerts(self) -> list[Alert]:
        """Every alert instance that fired, in its current state, by start time."""
        out = self.history + list(self.firing.values())
        return sorted(
            out, key=lambda a: (a.starts_at, a.labels.get("alertname", ""), a.fingerprint)
        )
