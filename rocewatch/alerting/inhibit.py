"""Inhibition: an alert that another alert explains is kept, but not notified and not drained on.

Rules follow Alertmanager's ``inhibit_rules``: while an alert matching a rule's source matchers
fires, alerts matching its target matchers whose ``equal`` labels have the same values as the
source's are inhibited. As in Alertmanager, a label missing on both sides counts as equal, so a
rule's target matchers must require every ``equal`` label (``node=~".+"``): otherwise a source
without the label would inhibit every target without it, fabric-wide. That is checked at start.
``members: true`` ties a target to a source that lists its members (the ``members`` annotation,
a JSON list of entity label sets: a FabricIncident's entities, a grouped storm's ports or
victims) instead: the target is inhibited when its labels hold every label of one member;
``members: <annotation>`` reads the members from another annotation (``tree``: a storm origin's
pause tree, its own members and its victims'). A grouped alert is also matched member by member
for ``equal`` (``rocewatch.alerting.group``). ``started_after_source: true`` lets only a source
that began no later than the target inhibit it (a congestion that began before the storm is not
the storm's). ``hold_s``: a target that loses its last source stays inhibited that long more
(a symptom drains down after its cause, on its own detector's hysteresis); it is shown only if
it still fires then.

The stage sits after the detectors and the alert lifecycle, before notification and the drain
policy (``Pipeline``). Each alert event comes out in one of two lists:

- **shown**: notified, stored, fed to the drain policy, written to ``alerts.jsonl``;
- **inhibited**: stored with the ``inhibited_by`` annotation (the source's fingerprint), never
  notified nor drained on; replay writes an alert inhibited for its whole life to
  ``inhibited.jsonl``.

A target whose source fires a moment after it (sources come at other cadences) would slip
through, so a firing target is held for ``wait_s`` of telemetry time (like Alertmanager's
``group_wait``) and inhibited if a source appears meanwhile; otherwise it is shown when the wait
ends. An inhibited alert is re-checked every step; when no source inhibits it any more (for the
``hold_s`` of the rules that target it) while it still fires, it is shown from then on like any
other alert (notified, and the policy may drain on it), and never inhibited again. Alerts that
match no rule's target pass at once.

Time is the caller's: every call carries the telemetry time of the step (``now_ns``), so
replay and tests decide exactly as live operation does.

>>> m = Matcher.parse('alertname =~ "Straggler|TransportErrors"')
>>> m.matches({"alertname": "Straggler"}), m.matches({})
(True, False)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from rocewatch.alerting.group import MEMBERS, parse_members, views
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import Alert
from rocewatch.core.state import Stateful

log = logging.getLogger(__name__)

INHIBITED_BY = "inhibited_by"  # the annotation naming the source's fingerprint
OPS = ("=~", "!~", "!=", "=")
_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MATCHER = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*")


@dataclass(frozen=True)
class Matcher:
    """One label matcher, as Alertmanager writes it: ``name op value``, op one of
    ``=``, ``!=``, ``=~``, ``!~``. A missing label is the empty string; regular expressions
    are anchored at both ends."""

    name: str
    op: str
    value: str
    pattern: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ConfigError(f"matcher {self}: operator {self.op!r} is not one of {OPS}")
        if not _LABEL.fullmatch(self.name):
            raise ConfigError(f"matcher: {self.name!r} is not a label name")
        if self.op in ("=~", "!~"):
            try:
                pat = re.compile(f"(?:{self.value})")
            except re.error as e:
                raise ConfigError(f"matcher {self}: bad regular expression: {e}") from e
            object.__setattr__(self, "pattern", pat)

    def __str__(self) -> str:
        return f"{self.name}{self.op}{json.dumps(self.value)}"

    @classmethod
    def parse(cls, text: str) -> Matcher:
        """``'alertname="PFCStorm"'``, ``"node =~ .+"``: the value may be double-quoted."""
        if not isinstance(text, str):
            raise ConfigError(f"matcher {text!r}: must be a string such as 'alertname=\"X\"'")
        m = _MATCHER.fullmatch(text)
        if m is None:
            raise ConfigError(f"matcher {text!r}: not of the form name=value (=, !=, =~, !~)")
        name, op, value = m.groups()
        if value.startswith('"'):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ConfigError(f"matcher {text!r}: badly quoted value") from e
            if not isinstance(value, str):
                raise ConfigError(f"matcher {text!r}: badly quoted value")
        return cls(name, op, value)

    def matches_value(self, v: str) -> bool:
        if self.op == "=":
            return v == self.value
        if self.op == "!=":
            return v != self.value
        assert self.pattern is not None
        hit = self.pattern.fullmatch(v) is not None
        return hit if self.op == "=~" else not hit

    def matches(self, labels: Mapping[str, str]) -> bool:
        return self.matches_value(labels.get(self.name, ""))


@dataclass(frozen=True)
class InhibitRule:
    """Targets matching ``target`` are inhibited while a source matching ``source`` fires with
    the same ``equal`` labels (and, with ``members``, lists the target among its members)."""

    source: tuple[Matcher, ...]
    target: tuple[Matcher, ...]
    equal: tuple[str, ...] = ()
    members: bool = False
    member_key: str = MEMBERS  # the source's annotation that lists its members
    started_after_source: bool = False  # only a source that began no later than the target
    hold_s: float = 0.0  # a target stays inhibited this long after its last source stopped

    def validate(self, where: str = "inhibit rule") -> None:
        problems = []
        if not self.source:
            problems.append("no source matchers")
        if not self.target:
            problems.append("no target matchers (it would inhibit every alert)")
        if not self.equal and not self.members:
            problems.append(
                "no 'equal' labels and no 'members': it would tie every target to any source, "
                "fabric-wide"
            )
        for label in self.equal:
            if not _LABEL.fullmatch(label):
                problems.append(f"equal: {label!r} is not a label name")
            elif not any(m.name == label and not m.matches_value("") for m in self.target):
                problems.append(
                    f"equal label {label!r} is not required by the target matchers (add "
                    f'{label}=~".+"): a label missing on both sides counts as equal, so a '
                    f"target without {label} would be inhibited by any source without it"
                )
        if not _LABEL.fullmatch(self.member_key):
            problems.append(f"members: {self.member_key!r} is not an annotation name")
        h = self.hold_s
        if not isinstance(h, int | float) or isinstance(h, bool) or not math.isfinite(h) or h < 0:
            problems.append(f"hold_s: must be a number of seconds >= 0, not {h!r}")
        if problems:
            raise ConfigError(f"{where}: " + "; ".join(problems))

    def is_target(self, labels: Mapping[str, str]) -> bool:
        return all(m.matches(labels) for m in self.target)

    def is_source(self, labels: Mapping[str, str]) -> bool:
        return all(m.matches(labels) for m in self.source)


def parse_rule(d: Any, where: str = "inhibit_rules[0]") -> InhibitRule:
    """One rule from its config mapping, in Alertmanager's syntax: ``source_matchers`` and
    ``target_matchers`` (lists of matcher strings) or the older ``source_match`` /
    ``source_match_re`` / ``target_match`` / ``target_match_re`` mappings, ``equal`` (label
    names) and rocewatch's ``members`` (true/false, or the annotation listing the members),
    ``started_after_source`` (true/false) and ``hold_s`` (seconds)."""
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: must be a mapping")
    known = {
        "source_matchers",
        "target_matchers",
        "source_match",
        "source_match_re",
        "target_match",
        "target_match_re",
        "equal",
        "members",
        "started_after_source",
        "hold_s",
    }
    unknown = sorted(set(d) - known)
    if unknown:
        raise ConfigError(
            f"{where}.{unknown[0]}: unknown setting (known: {', '.join(sorted(known))})"
        )

    def matchers(side: str) -> tuple[Matcher, ...]:
        out: list[Matcher] = []
        items = d.get(f"{side}_matchers") or []
        if not isinstance(items, list | tuple):
            raise ConfigError(f"{where}.{side}_matchers: must be a list of matchers")
        for i, text in enumerate(items):
            try:
                out.append(Matcher.parse(text))
            except ConfigError as e:
                raise ConfigError(f"{where}.{side}_matchers[{i}]: {e}") from e
        for suffix, op in (("match", "="), ("match_re", "=~")):
            key = f"{side}_{suffix}"
            m = d.get(key) or {}
            if not isinstance(m, dict):
                raise ConfigError(f"{where}.{key}: must be a mapping of label: value")
            for name, value in m.items():
                if not isinstance(value, str):
                    raise ConfigError(f"{where}.{key}.{name}: must be a string")
                try:
                    out.append(Matcher(str(name), op, value))
                except ConfigError as e:
                    raise ConfigError(f"{where}.{key}: {e}") from e
        return tuple(out)

    equal = d.get("equal") or []
    if not isinstance(equal, list | tuple) or not all(isinstance(x, str) for x in equal):
        raise ConfigError(f"{where}.equal: must be a list of label names")
    given = d.get("members", False)
    key = MEMBERS
    members = given
    if isinstance(given, str) and given:
        members, key = True, given  # the annotation that lists the source's members
    if not isinstance(members, bool):
        raise ConfigError(f"{where}.members: must be true, false or an annotation name")
    after = d.get("started_after_source", False)
    if not isinstance(after, bool):
        raise ConfigError(f"{where}.started_after_source: must be true or false")
    rule = InhibitRule(
        matchers("source"),
        matchers("target"),
        tuple(equal),
        members,
        key,
        after,
        d.get("hold_s", 0.0),
    )
    rule.validate(where)
    return rule


# The defaults, in the config file's own syntax (docs/alerting.md shows them as YAML).
# A storm's symptoms clear on their own detectors' hysteresis (a clear time plus 2.5 sampling
# intervals, up to ~15 s at 5 s cadences) after the storm's alerts resolve: held that long more.
STORM_HOLD_S = 20.0
DEFAULT_RULES_DOC: tuple[dict[str, Any], ...] = (
    # a paused NIC is slow, retransmits and backs up because of the storm: not a straggler;
    # the origin itself, its receive path stalled, falls silent and times out
    {
        "source_matchers": ['alertname="PFCStorm"'],
        "target_matchers": [
            'alertname=~"Straggler|TransportErrors|QueueBuildup"',
            'node=~".+"',
            'nic=~".+"',
        ],
        "equal": ["node", "nic"],
        "hold_s": STORM_HOLD_S,
    },
    # the ports a storm pauses fill and mark: congestion that began after the storm, anywhere
    # in its pause tree (its origin's tree; victims whose origin is not known, their members)
    {
        "source_matchers": ['alertname="PFCStorm"', 'role="origin"'],
        "target_matchers": ['alertname=~"ECNCongestion|QueueBuildup"'],
        "members": "tree",
        "started_after_source": True,
        "hold_s": STORM_HOLD_S,
    },
    {
        "source_matchers": ['alertname="PFCStorm"', 'role="victim"'],
        "target_matchers": ['alertname=~"ECNCongestion|QueueBuildup"'],
        "members": True,
        "started_after_source": True,
        "hold_s": STORM_HOLD_S,
    },
    # victims grouped before their origin was confirmed (a switch origin read every few
    # seconds is named once its own counters report): the origin's tree holds them
    {
        "source_matchers": ['alertname="PFCStorm"', 'role="origin"'],
        "target_matchers": ['alertname="PFCStorm"', 'role="victim"', 'origin="unknown"'],
        "members": "tree",
        "started_after_source": True,
        "hold_s": STORM_HOLD_S,
    },
    # a storm stalls the jobs it pauses: their NCCL alerts follow from it (docs/nccl.md)
    {
        "source_matchers": ['alertname="PFCStorm"'],
        "target_matchers": ['alertname=~"SlowRank|SlowEdge|BusBandwidthDrop"', 'job=~".+"'],
        "equal": ["job"],
    },
    # two elephant flows hashed onto one uplink fill and mark its queue: the ECMP collision is
    # the one alert (its ``uplinks`` annotation lists the hot and cold uplinks, both ends);
    # the congestion drains on its own detector's hysteresis after the collision ends
    {
        "source_matchers": ['alertname="ECMPImbalance"'],
        "target_matchers": ['alertname=~"ECNCongestion|QueueBuildup|PortAnomaly"'],
        "members": "uplinks",
        "hold_s": STORM_HOLD_S,
    },
    # a fabric event slows its members down: the incident is the one alert
    {
        "source_matchers": ['alertname="FabricIncident"'],
        "target_matchers": ['alertname="Straggler"'],
        "members": True,
    },
    # "a multivariate outlier that no rule explains": a rule alert on the same NIC or port
    # explains it (the isolation forest also drops outliers that a rule explains when it
    # judges them, with the cable's other end and congestion counterfactuals; these rules
    # catch a PortAnomaly that fired a moment before the rule alert)
    {
        "source_matchers": ['alertname!~"PortAnomaly|FabricIncident"'],
        "target_matchers": ['alertname="PortAnomaly"', 'node=~".+"', 'nic=~".+"'],
        "equal": ["node", "nic"],
    },
    {
        "source_matchers": ['alertname!~"PortAnomaly|FabricIncident"'],
        "target_matchers": ['alertname="PortAnomaly"', 'switch=~".+"', 'port=~".+"'],
        "equal": ["switch", "port"],
    },
)
DEFAULT_RULES: tuple[InhibitRule, ...] = tuple(
    parse_rule(d, f"default inhibit rule {i}") for i, d in enumerate(DEFAULT_RULES_DOC)
)


@dataclass(frozen=True)
class InhibitConfig:
    """``rules``: the ``inhibit_rules`` list (given, it replaces the defaults; ``[]`` turns
    inhibition off). ``wait_s``: how long a target is held for a late source (``inhibit_wait_s``,
    telemetry seconds; 0 decides at once)."""

    rules: tuple[InhibitRule, ...] = DEFAULT_RULES
    wait_s: float = 5.0

    def validate(self) -> None:
        w = self.wait_s
        if not isinstance(w, int | float) or isinstance(w, bool) or not math.isfinite(w) or w < 0:
            raise ConfigError(f"inhibit_wait_s: must be a number of seconds >= 0, not {w!r}")
        for i, r in enumerate(self.rules):
            if not isinstance(r, InhibitRule):
                raise ConfigError(f"inhibit_rules[{i}]: not an inhibit rule")
            r.validate(f"inhibit_rules[{i}]")


def inhibit_config(rules: Any, wait_s: Any, where: str = "config") -> InhibitConfig:
    """The ``inhibit_rules`` and ``inhibit_wait_s`` keys of a config file (None: default)."""
    cfg = InhibitConfig()
    if rules is not None:
        if not isinstance(rules, list):
            raise ConfigError(f"{where}.inhibit_rules: must be a list of rules")
        parsed = tuple(parse_rule(d, f"{where}.inhibit_rules[{i}]") for i, d in enumerate(rules))
        cfg = dataclasses.replace(cfg, rules=parsed)
    if wait_s is not None:
        cfg = dataclasses.replace(cfg, wait_s=wait_s)
    cfg.validate()
    return cfg


class AlertStore(Protocol):
    """What the stage needs of the alert lifecycle: the alerts firing now, and a way to note
    (or clear) an alert's ``inhibited_by`` on the lifecycle's own record of it."""

    firing: dict[str, Alert]

    def mark(self, fingerprint: str, starts_at: int, source: str | None) -> None: ...


# per rule: equal-label values (or a member's label set) -> sources, in the order they fired
_Index = list[dict[tuple[Any, ...], list[str]]]


class Inhibitor(Stateful):
    """The inhibition stage (module docstring). State: the targets held for their wait and the
    targets inhibited now; plain data, so it travels in the pipeline's checkpoint."""

    def __init__(self, config: InhibitConfig | None = None) -> None:
        self.config = config or InhibitConfig()
        self.config.validate()
        self.wait_ns = int(self.config.wait_s * 1e9)
        self.held: dict[str, tuple[Alert, int]] = {}  # fingerprint -> (firing event, since)
        self.inhibited: dict[str, str] = {}  # fingerprint -> source fingerprint
        self.now = 0
        # inhibited alerts whose sources all stopped: since when (each rule's hold_s)
        self.orphaned: dict[str, int] = {}
        # member label-set shapes of the members rules' sources (rebuilt with the index)
        self._shapes: list[set[tuple[str, ...]]] = []
        self._starts: dict[str, int] = {}  # the indexed sources' startsAt

    STATE_TYPES: ClassVar[tuple[type, ...]] = (Alert,)
    NOT_STATE: ClassVar[frozenset[str]] = frozenset({"wait_ns", "_shapes", "_starts"})

    def is_target(self, labels: Mapping[str, str]) -> bool:
        return any(r.is_target(labels) for r in self.config.rules)

    def update(
        self, now_ns: int, events: Sequence[Alert], alerts: AlertStore
    ) -> tuple[list[Alert], list[Alert]]:
        """Route one step's alert events (firing and resolved, from the lifecycle); return
        (shown, inhibited) events, including held alerts decided now."""
        self.now = max(self.now, now_ns)
        if not self.config.rules:
            return list(events), []
        shown: list[Alert] = []
        hidden: list[Alert] = []
        index: _Index | None = None

        def source(a: Alert) -> str | None:
            nonlocal index
            if index is None:
                index = self._index(alerts.firing)
            return self._lookup(index, a.labels, a.fingerprint, a.starts_at)

        arrived: set[str] = set()
        for ev in events:
            fp = ev.fingerprint
            if ev.ends_at:
                if fp in self.inhibited:  # the event carries inhibited_by (the lifecycle's)
                    del self.inhibited[fp]
                    self._orphans().pop(fp, None)
                    hidden.append(ev)
                elif fp in self.held:  # ended within its wait: decided now, both events
                    first, _ = self.held.pop(fp)
                    src = source(ev)
                    if src is None:
                        shown += [first, ev]
                    else:
                        alerts.mark(fp, ev.starts_at, src)
                        hidden += [_marked(first, src), _marked(ev, src)]
                else:
                    shown.append(ev)
                continue
            if not self.is_target(ev.labels):
                shown.append(ev)
                continue
            src = source(ev)
            if src is not None:
                self._inhibit(ev, src, alerts)
                hidden.append(_marked(ev, src))
            else:
                self.held[fp] = (ev, self.now)
                arrived.add(fp)
        if self.held:
            for fp, (ev, since) in list(self.held.items()):
                src = None if fp in arrived else source(ev)  # (just looked up: none)
                if src is not None:
                    del self.held[fp]
                    self._inhibit(ev, src, alerts)
                    hidden.append(_marked(ev, src))
                elif self.now - since >= self.wait_ns:
                    del self.held[fp]
                    shown.append(ev)
        for fp, src in list(self.inhibited.items()):
            a = alerts.firing.get(fp)
            if a is None:  # gone without its resolved event (e.g. replaced): nothing to show
                del self.inhibited[fp]
                self._orphans().pop(fp, None)
                continue
            new = source(a)
            if new is None:
                since = self._orphans().setdefault(fp, self.now)
                if self.now - since < self._hold_ns(a.labels):
                    continue  # a symptom draining down after its cause: still its
                # it outlived its source: an ordinary alert from now on
                del self.inhibited[fp]
                del self._orphans()[fp]
                alerts.mark(fp, a.starts_at, None)
                shown.append(_marked(a, None))
                log.info("alert %s outlived its inhibiting source %s: shown", fp, src)
            else:
                self._orphans().pop(fp, None)
                if new != src:
                    self.inhibited[fp] = new
                    alerts.mark(fp, a.starts_at, new)
        return shown, hidden

    def _orphans(self) -> dict[str, int]:
        """``orphaned`` (absent from a checkpoint of a version without it: empty)."""
        return self.__dict__.setdefault("orphaned", {})  # type: ignore[no-any-return]

    def _hold_ns(self, labels: Mapping[str, str]) -> int:
        """How long an inhibited alert stays so after its last source stopped: the longest
        ``hold_s`` of the rules that target it."""
        return max(
            (int(r.hold_s * 1e9) for r in self.config.rules if r.is_target(labels)), default=0
        )

    def flush(self, alerts: AlertStore) -> tuple[list[Alert], list[Alert]]:
        """Decide every held alert now (the stream ended): (shown, inhibited) events."""
        shown: list[Alert] = []
        hidden: list[Alert] = []
        if not self.held:
            return shown, hidden
        index = self._index(alerts.firing)
        for fp, (ev, _) in list(self.held.items()):
            del self.held[fp]
            src = self._lookup(index, ev.labels, fp, ev.starts_at)
            if src is None:
                shown.append(ev)
            else:
                self._inhibit(ev, src, alerts)
                hidden.append(_marked(ev, src))
        return shown, hidden

    def _inhibit(self, ev: Alert, src: str, alerts: AlertStore) -> None:
        self.inhibited[ev.fingerprint] = src
        alerts.mark(ev.fingerprint, ev.starts_at, src)

    # --- matching ----------------------------------------------------------------------------
    def _index(self, firing: Mapping[str, Alert]) -> _Index:
        """Every firing alert that is a rule's source (member by member), by what ties it to
        its targets: the ``equal`` labels' values, and each member's label set."""
        rules = self.config.rules
        index: _Index = [{} for _ in rules]
        self._shapes = [set() for _ in rules]
        self._starts = {}
        for fp, a in firing.items():
            vs = views(a.labels, a.annotations)
            self._starts[fp] = a.starts_at
            for i, r in enumerate(rules):
                member_sets = (
                    parse_members(a.annotations.get(r.member_key, "")) if r.members else ()
                )
                for v in vs:
                    if not r.is_source(v):
                        continue
                    eq = tuple(v.get(k, "") for k in r.equal)
                    if r.members:
                        for m in member_sets:
                            self._shapes[i].add(tuple(k for k, _ in m))
                            index[i].setdefault((m, eq), []).append(fp)
                    else:
                        index[i].setdefault(eq, []).append(fp)
        return index

    def _lookup(
        self, index: _Index, labels: Mapping[str, str], fp: str, starts_at: int = 0
    ) -> str | None:
        """The first firing source that inhibits an alert with ``labels`` that began at
        ``starts_at`` (never itself)."""
        for i, r in enumerate(self.config.rules):
            if not r.is_target(labels):
                continue
            eq = tuple(labels.get(k, "") for k in r.equal)
            keys: Iterable[tuple[Any, ...]]
            if r.members:
                keys = [
                    (tuple((k, labels[k]) for k in shape), eq)
                    for shape in sorted(self._shapes[i])
                    if all(k in labels for k in shape)
                ]
            else:
                keys = [eq]
            for key in keys:
                for src in index[i].get(key, ()):
                    if src == fp:
                        continue
                    if r.started_after_source and self._starts.get(src, 0) > starts_at:
                        continue  # it began before this source: not its symptom
                    return src
        return None


def _marked(a: Alert, source: str | None) -> Alert:
    """A copy of the event with ``inhibited_by`` set to ``source`` (or removed)."""
    ann = dict(a.annotations)
    if source is None:
        ann.pop(INHIBITED_BY, None)
    else:
        ann[INHIBITED_BY] = source
    return dataclasses.replace(a, labels=dict(a.labels), annotations=ann)


__all__ = [
    "DEFAULT_RULES",
    "INHIBITED_BY",
    "InhibitConfig",
    "InhibitRule",
    "Inhibitor",
    "Matcher",
    "inhibit_config",
    "parse_rule",
]
