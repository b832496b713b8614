"""`rocewatch evaluate`: score the detectors on labelled simulated scenarios.

Two suites: the default one below (every source every 100 ms, in process) and the matrix
(``--matrix``: cadences, fabrics, vendor naming and fault magnitudes, each cell replayed from
its recording; ``MATRIX``, ``run_matrix`` and docs/evaluation.md).

Runs a suite of simulated fabrics (several seeds and sizes, healthy all-reduce and MoE traffic,
two tenants, counter clears and agent gaps, overlapping faults, a storm from a node without an
agent) through the same pipeline as replay, in process, and matches every alert against the
simulator's ground truth (``Simulator.truth()``):

- An alert is a true positive (TP) for a fault when its alertname is the fault's ``alertname``
  or in its ``also``, its labels contain every key/value of one of the fault's ``match`` sets,
  and its ``startsAt`` lies within [onset - 1 s, end + 5 s] (end + 3 intervals of the run's
  slowest source, when that is longer). A grouped alert speaks for each of its members (the
  ``members`` annotation) and a switch's origin alert for each port in ``ports``.
- A ``role=victim`` alert whose labels, members or ``victims`` annotation name an entry of a
  fault's ``victims`` list, or whose ``origin`` names the fault's origin, in that window is
  neutral (neither TP nor FP); a victim alert never counts as a TP.
- Alerts an inhibition rule suppressed (replay's ``inhibited.jsonl``) are neutral: counted,
  never a TP nor an FP.
- FabricIncident alerts are scored apart (they explain withheld drains, they detect nothing).
- Every other alert is a false positive (FP) for its own alertname.

Per kind (the alertname of a truth fault): precision over the alerts of that alertname, recall
over the faults of that kind (found by any alertname it accepts), F1, and the time to detect
(first matching ``startsAt`` - onset) as median and p95 over the detected faults. A kind with no
detector is scored like any other: recall 0. A drain whose outcome does not start with
``refused`` of a node that is no fault's ``culprit_node`` in its run is a wrong-node drain.

>>> t = {"start_ns": 0, "faults": [{"id": "PfcStorm-1", "alertname": "PFCStorm", "also": [],
...       "match": [{"node": "gpu-001", "nic": "mlx5_0"}], "onset_ns": 5 * S, "end_ns": 8 * S,
...       "culprit_node": "gpu-001", "victims": []}]}
>>> a = Alert({"alertname": "PFCStorm", "node": "gpu-001", "nic": "mlx5_0"}, {}, 5_200_000_000)
>>> r = score_run(t, [a], [])
>>> r.detected, r.ttd_s
({'PfcStorm-1': True}, {'PfcStorm-1': 0.2})
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rocewatch.core.model import Action, Alert

if TYPE_CHECKING:
    from rocewatch.config import Config
    from rocewatch.sim.fabric import JobSpec
    from rocewatch.sim.simulator import SimConfig

log = logging.getLogger(__name__)

S = 1_000_000_000
EARLY_NS = 1 * S  # an alert may start this long before the onset (sampling jitter, windows)
LATE_NS = 5 * S  # ... and this long after the end (slow windows, hysteresis)
INCIDENT = "FabricIncident"
MAX_LISTED = 50  # FPs and misses listed per run in the JSON

# What the literature and the field reach (DESIGN.md "Detection"), printed beside the figures.
SONIC_DETECT_S = 0.2
MINDER_PRECISION = 0.90
MINDER_F1 = 0.89
PUBLISHED_DETECT_S = (3.6, 30.0)
ANCHORS: dict[str, Any] = {
    "sonic_pfc_watchdog_detect_s": SONIC_DETECT_S,
    "minder_precision": MINDER_PRECISION,
    "minder_f1": MINDER_F1,
    "published_detect_s": list(PUBLISHED_DETECT_S),
}


# --- matching --------------------------------------------------------------------------------


def labels_match(labels: Mapping[str, str], sets: Iterable[Mapping[str, Any]]) -> bool:
    """True when ``labels`` hold every key/value of at least one of ``sets``."""
    return any(all(labels.get(k) == str(v) for k, v in m.items()) for m in sets)


def alert_views(alert: Alert) -> list[Mapping[str, str]]:
    """The label sets an alert speaks for: its own, one per member of a grouped alert (the
    ``members`` annotation, a JSON list of entity label sets) and one per port a switch's
    origin alert lists (``ports``, comma-separated). Malformed annotations are ignored."""
    out: list[Mapping[str, str]] = [alert.labels]
    members = alert.annotations.get("members")
    if members:
        try:
            rows = json.loads(members)
        except ValueError:
            rows = []
        for m in rows if isinstance(rows, list) else []:
            if isinstance(m, dict):
                out.append({**alert.labels, **{str(k): str(v) for k, v in m.items()}})
    ports = alert.annotations.get("ports")
    if ports and "switch" in alert.labels:
        out += [{**alert.labels, "port": p.strip()} for p in ports.split(",") if p.strip()]
    return out


def _named(entity: str, sets: Iterable[Mapping[str, Any]]) -> bool:
    """Whether ``device/port`` (``node/nic`` or ``switch/port``) names one of ``sets``."""
    dev, _, port = entity.strip().partition("/")
    return any(
        (str(m.get("node")), str(m.get("nic"))) == (dev, port)
        or (str(m.get("switch")), str(m.get("port"))) == (dev, port)
        for m in sets
    )


def in_window(alert: Alert, fault: Mapping[str, Any], late_ns: int = LATE_NS) -> bool:
    return int(fault["onset_ns"]) - EARLY_NS <= alert.starts_at <= int(fault["end_ns"]) + late_ns


def late_window_ns(truth: Mapping[str, Any]) -> int:
    """How long after a fault's end its alerts still count: 5 s, or 3 intervals of the run's
    slowest source when that is longer (a slow source's last sample of the fault comes late)."""
    sampling = truth.get("sampling") or {}
    slowest = max(
        (float(sampling.get(k) or 0.0) for k in SOURCE_KEYS.values()),
        default=0.0,
    )
    return max(LATE_NS, round(3 * slowest * S))


def hits(alert: Alert, fault: Mapping[str, Any], late_ns: int = LATE_NS) -> bool:
    """Whether ``alert`` is a true positive for ``fault`` (module docstring)."""
    if alert.labels.get("role") == "victim":
        return False
    names = {fault.get("alertname"), *fault.get("also", ())}
    if alert.name not in names or not in_window(alert, fault, late_ns):
        return False
    match = fault.get("match") or [fault.get("labels", {})]
    return any(labels_match(v, match) for v in alert_views(alert))


def origin_name(fault: Mapping[str, Any]) -> str:
    """How a victim alert's ``origin`` label names the fault's origin (``node/nic`` or the
    switch)."""
    labels = fault.get("labels", {})
    if "node" in labels and "nic" in labels:
        return f"{labels['node']}/{labels['nic']}"
    return str(labels.get("switch", ""))


def is_known_victim(alert: Alert, fault: Mapping[str, Any], late_ns: int = LATE_NS) -> bool:
    if not (
        alert.labels.get("role") == "victim"
        and alert.name == fault.get("alertname")
        and in_window(alert, fault, late_ns)
    ):
        return False
    victims = fault.get("victims", ())
    if any(labels_match(v, victims) for v in alert_views(alert)):
        return True
    listed = alert.annotations.get("victims", "")
    if any(_named(e, victims) for e in listed.split(",") if e.strip()):
        return True
    return bool(alert.labels.get("origin")) and alert.labels.get("origin") == origin_name(fault)


@dataclass
class RunScore:
    """How one run's alerts and actions compare with its truth."""

    faults: dict[str, str] = field(default_factory=dict)  # fault id -> kind (truth alertname)
    detected: dict[str, bool] = field(default_factory=dict)
    ttd_s: dict[str, float] = field(default_factory=dict)  # detected faults only
    tp: dict[str, int] = field(default_factory=dict)  # alertname -> TP alerts
    fp: dict[str, int] = field(default_factory=dict)  # alertname -> FP alerts
    neutral: int = 0  # victims in a fault's victims list
    incidents: int = 0
    incidents_outside_faults: int = 0  # FabricIncidents that overlap no fault window
    alerts: int = 0
    drains: int = 0
    wrong_drains: list[dict[str, Any]] = field(default_factory=list)
    false_positives: list[dict[str, Any]] = field(default_factory=list)
    inhibited: int = 0  # alerts an inhibition rule suppressed: neutral
    bound_s: dict[str, float] = field(default_factory=dict)  # runs with sampling: see late_bound
    late: list[str] = field(default_factory=list)  # detected after their bound
    healthy_alerts: int = 0  # alerts that start before the first fault (all of a run without)


def score_run(
    truth: Mapping[str, Any],
    alerts: Sequence[Alert],
    actions: Sequence[Action],
    inhibited: Sequence[Alert] = (),
) -> RunScore:
    """Match one run's alerts and actions to its ground truth (rules in the module docstring)."""
    faults = [f for f in truth.get("faults", []) if f.get("alertname")]
    start = int(truth.get("start_ns", 0))
    late_ns = late_window_ns(truth)
    r = RunScore(alerts=len(alerts), inhibited=len(inhibited))
    quiet_until = min((int(f["onset_ns"]) for f in faults), default=None)
    for a in alerts:
        if quiet_until is None or a.starts_at < quiet_until - EARLY_NS:
            r.healthy_alerts += 1
    for f in faults:
        r.faults[f["id"]] = f["alertname"]
        r.detected[f["id"]] = False
    first: dict[str, int] = {}
    for a in sorted(alerts, key=lambda x: (x.starts_at, x.fingerprint)):
        if a.name == INCIDENT:
            r.incidents += 1
            if not any(
                int(f["onset_ns"]) - EARLY_NS <= (a.ends_at or a.starts_at)
                and a.starts_at <= int(f["end_ns"]) + LATE_NS
                for f in faults
            ):
                r.incidents_outside_faults += 1
            continue
        if any(is_known_victim(a, f, late_ns) for f in faults):
            r.neutral += 1
            continue
        matched = [f for f in faults if hits(a, f, late_ns)]
        if matched:
            r.tp[a.name] = r.tp.get(a.name, 0) + 1
            for f in matched:
                r.detected[f["id"]] = True
                first.setdefault(f["id"], a.starts_at)
            continue
        r.fp[a.name] = r.fp.get(a.name, 0) + 1
        if len(r.false_positives) < MAX_LISTED:
            r.false_positives.append(
                {
                    "alertname": a.name,
                    "labels": {k: v for k, v in a.labels.items() if k != "alertname"},
                    "starts_s": round((a.starts_at - start) / S, 3),
                    "near": _near_not_fault(a, truth.get("not_faults", [])),
                }
            )
    for f in faults:
        if f["id"] in first:
            r.ttd_s[f["id"]] = round((first[f["id"]] - int(f["onset_ns"])) / S, 6)
    if truth.get("sampling"):
        for f in faults:
            bound = late_bound(f, truth)
            r.bound_s[f["id"]] = round(bound, 3)
            if f["id"] in r.ttd_s and r.ttd_s[f["id"]] > bound:
                r.late.append(f["id"])
    culprits = {f.get("culprit_node") for f in faults if f.get("culprit_node")}
    for x in actions:
        if x.action != "drain" or x.outcome.startswith("refused"):
            continue
        r.drains += 1
        if x.node not in culprits:
            r.wrong_drains.append(
                {"node": x.node, "reason": x.reason, "outcome": x.outcome, "time_ns": x.time}
            )
    return r


# --- the detection bound ---------------------------------------------------------------------

SOURCE_KEYS = {
    "nic": "nic_interval_s",
    "switch": "switch_interval_s",
    "gauge": "gauge_interval_s",
}
STORM_DEADLINE = 2.5  # PFC storms: intervals of the fastest source that sees the origin
OTHER_DEADLINE = 3.0  # the rest: intervals of the slowest source the detector needs ...
OTHER_FLOOR_S = 10.0  # ... or this, whichever is longer


def needed_sources(fault: Mapping[str, Any]) -> tuple[str, ...]:
    """The sources a detector needs to see ``fault`` (for a storm: the ones that see its
    origin, of which the fastest counts)."""
    labels = fault.get("labels", {})
    on_nic = "node" in labels and "nic" in labels
    kind = fault.get("alertname")
    if kind == "PFCStorm":
        if not on_nic:  # a switch pauses its NICs and the spines: both sides see it
            return ("nic", "switch")
        agent = (fault.get("details") or {}).get("agent", True)
        return ("nic", "switch") if agent else ("switch",)
    if kind == "QueueBuildup":
        return ("gauge",)
    if kind == "ECNCongestion":
        return ("switch", "nic")  # the queue's marks and the receiver's ECN/CNP counters
    if kind == "FlakyLink":
        return (
            ("nic",) if on_nic or any("nic" in m for m in fault.get("match", ())) else ("switch",)
        )
    return ("nic",)  # PCIe, stragglers, transport errors: the NIC's own counters


def _fault_devices(fault: Mapping[str, Any], source: str) -> set[str]:
    """The devices whose lost readings on ``source`` delay ``fault``'s detection."""
    out: set[str] = set()
    for m in fault.get("match") or [fault.get("labels", {})]:
        if source == "nic" and "node" in m and "nic" in m:
            out.add(f"{m['node']}/{m['nic']}")
        elif source != "nic" and "switch" in m:
            out.add(str(m["switch"]))
    origin_port = fault.get("origin_port")
    if source != "nic" and isinstance(origin_port, Mapping) and "switch" in origin_port:
        out.add(str(origin_port["switch"]))
    return out


def late_bound(fault: Mapping[str, Any], truth: Mapping[str, Any]) -> float:
    """Seconds after onset by which ``fault`` must be detected (docs/evaluation.md).

    PFC storms: 2.5 intervals of the fastest source that sees the origin; the rest: 3
    intervals of the slowest source the detector needs, at least 10 s (a flaps-only link's
    counted from its second link-down: ``_undecidable_s``). Each reading of the fault's devices
    on that source lost within the bound adds one interval of it.
    """
    sampling = truth.get("sampling") or {}

    def every(src: str) -> float:
        return float(sampling.get(SOURCE_KEYS[src]) or sampling.get("switch_interval_s") or 0.1)

    srcs = needed_sources(fault)
    if fault.get("alertname") == "PFCStorm":
        src = min(srcs, key=every)
        bound = STORM_DEADLINE * every(src)
    else:
        src = max(srcs, key=every)
        bound = max(OTHER_FLOOR_S, OTHER_DEADLINE * every(src))
    lost = sampling.get("lost") or {}
    onset = int(fault["onset_ns"])
    bound += _undecidable_s(fault, onset)
    times = sorted(
        t
        for d in _fault_devices(fault, src)
        for t in (lost.get(src) or {}).get(d, ())
        if t >= onset
    )
    for t in times:  # each lost reading inside the (growing) bound pushes it one interval on
        if t - onset <= bound * S:
            bound += every(src)
    return bound


def _undecidable_s(fault: Mapping[str, Any], onset: int) -> float:
    """Seconds from onset during which no detector can tell the fault from a healthy event.

    A link that only flaps (no errors, no BER rise) looks like an admin bounce or a reboot
    until it goes down a second time: FlakyLink's documented rule stays silent on one down/up,
    so such a fault's bound runs from its second link-down. Every other fault: 0.
    """
    details = fault.get("details") or {}
    if fault.get("alertname") != "FlakyLink" or details.get("errors", True):
        return 0.0
    downs = sorted(int(f["down_ns"]) for f in details.get("flaps") or ())
    if len(downs) < 2:
        return 0.0
    return max(0.0, (downs[1] - onset) / S)


def _near_not_fault(a: Alert, not_faults: Iterable[Mapping[str, Any]]) -> str | None:
    """The id of a counter clear, agent gap or agentless node the FP alert sits on, if any:
    the likeliest reason it fired."""
    for nf in not_faults:
        labels = nf.get("labels")
        if not labels or not labels_match(a.labels, [labels]):
            continue
        if "onset_ns" not in nf and "at_ns" not in nf:  # always there (a node with no agent)
            return str(nf.get("id"))
        t0 = int(nf.get("onset_ns", nf.get("at_ns", 0)))
        t1 = int(nf.get("end_ns", t0))
        if t0 - EARLY_NS <= a.starts_at <= t1 + LATE_NS:
            return str(nf.get("id"))
    return None


# --- aggregation -----------------------------------------------------------------------------


def percentile(xs: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method); None for no values."""
    if not xs:
        return None
    v = sorted(xs)
    pos = (len(v) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _ratio(a: int, b: int) -> float | None:
    return a / b if b else None


def _f1(p: float | None, r: float) -> float | None:
    if r == 0:
        return 0.0
    if p is None:
        return None
    return 2 * p * r / (p + r) if p + r else 0.0


def _round(x: float | None, n: int = 4) -> float | None:
    return None if x is None else round(x, n)


def aggregate(scores: Sequence[RunScore]) -> dict[str, Any]:
    """Per-kind and per-alertname figures over all runs."""
    kinds: dict[str, dict[str, Any]] = {}
    for s in scores:
        for fid, kind in s.faults.items():
            k = kinds.setdefault(kind, {"faults": 0, "detected": 0, "ttd": []})
            k["faults"] += 1
            if s.detected[fid]:
                k["detected"] += 1
                k["ttd"].append(s.ttd_s[fid])
    tp: dict[str, int] = {}
    fp: dict[str, int] = {}
    for s in scores:
        for n, c in s.tp.items():
            tp[n] = tp.get(n, 0) + c
        for n, c in s.fp.items():
            fp[n] = fp.get(n, 0) + c
    out: dict[str, Any] = {}
    for kind in sorted(kinds):
        k = kinds[kind]
        t, f = tp.get(kind, 0), fp.get(kind, 0)
        p = _ratio(t, t + f)
        rec = k["detected"] / k["faults"]
        ttd = sorted(k["ttd"])
        out[kind] = {
            "precision": _round(p),
            "recall": _round(rec),
            "f1": _round(_f1(p, rec)),
            "ttd_median_s": _round(percentile(ttd, 50), 3),
            "ttd_p95_s": _round(percentile(ttd, 95), 3),
            "faults": k["faults"],
            "detected": k["detected"],
            "tp_alerts": t,
            "fp_alerts": f,
            "ttd_s": [round(x, 3) for x in ttd],
        }
    names = {}
    for n in sorted(set(tp) | set(fp)):
        t, f = tp.get(n, 0), fp.get(n, 0)
        names[n] = {"tp_alerts": t, "fp_alerts": f, "precision": _round(_ratio(t, t + f))}
    all_t, all_f = sum(tp.values()), sum(fp.values())
    n_faults = sum(k["faults"] for k in kinds.values())
    n_det = sum(k["detected"] for k in kinds.values())
    p_all = _ratio(all_t, all_t + all_f)
    r_all = n_det / n_faults if n_faults else 0.0
    overall = {
        "precision": _round(p_all),
        "recall": _round(r_all),
        "f1": _round(_f1(p_all, r_all)),
        "faults": n_faults,
        "detected": n_det,
        "tp_alerts": all_t,
        "fp_alerts": all_f,
        "neutral_victim_alerts": sum(s.neutral for s in scores),
    }
    return {"kinds": out, "alertnames": names, "overall": overall}


# --- the suite -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One run of the suite: a named scenario at one size and seed."""

    scenario: str
    nodes: int
    duration_s: float
    seed: int
    healthy: bool = False  # a no-fault run whose every alert is a false alarm

    @property
    def name(self) -> str:
        return f"{self.scenario}/n{self.nodes}/{self.duration_s:g}s/seed{self.seed}"


def overlap_scenario(nodes: int = 16, duration_s: float = 30, seed: int = 1) -> SimConfig:
    """Five faults that overlap in time on different entities (laid out for 30 s): a storm
    5-13 s, a flaky cable 7-19 s, transport errors 10-18 s, an incast 12-20 s and a PCIe
    downgrade from 15 s; the simulator draws the entities apart (other job, other rails)."""
    from rocewatch.sim.faults import EcnIncast, FlakyLink, PcieDowngrade, PfcStorm, TransportErrors
    from rocewatch.sim.scenarios import laid_out

    return laid_out(
        "overlap",
        nodes,
        duration_s,
        seed,
        lambda at: (
            PfcStorm(onset_s=at(5.0), duration_s=at(8.0)),
            FlakyLink(onset_s=at(7.0), duration_s=at(12.0)),
            TransportErrors(onset_s=at(10.0), duration_s=at(8.0)),
            EcnIncast(onset_s=at(12.0), duration_s=at(8.0)),
            PcieDowngrade(onset_s=at(15.0)),
        ),
    )


def mixed_tenants_scenario(nodes: int = 16, duration_s: float = 30, seed: int = 1) -> SimConfig:
    """Two tenants on one fabric, team-a training with all-reduce, team-b with MoE all-to-all;
    a storm in team-a's job (laid out for 30 s: 6-10 s) and a flaky cable in team-b's (14-24 s)."""
    from rocewatch.sim.fabric import JobSpec, node_name
    from rocewatch.sim.faults import FlakyLink, PfcStorm
    from rocewatch.sim.scenarios import laid_out

    names = [node_name(i) for i in range(nodes)]
    half = nodes // 2
    return laid_out(
        "mixed_tenants",
        nodes,
        duration_s,
        seed,
        lambda at: (
            PfcStorm(onset_s=at(6), duration_s=at(4), node=names[1]),
            FlakyLink(onset_s=at(14), duration_s=at(10), node=names[-2]),
        ),
        jobs=(
            JobSpec("llm-train-a", "team-a", tuple(names[:half]), traffic="allreduce"),
            JobSpec("moe-train-b", "team-b", tuple(names[half:]), traffic="moe"),
        ),
    )


def subtle_scenario(nodes: int = 16, duration_s: float = 30, seed: int = 1) -> SimConfig:
    """Weaker versions of every fault (laid out for 30 s): a 0.6 s storm at 4 s, a cable at
    1e-5 peak BER that never flaps (8-18 s), a Gen4 -> Gen3 PCIe downgrade from 12 s (8 GT/s),
    incast from 3 senders (19-24 s), transport errors at a fifth of the default rate (24-29 s)."""
    from rocewatch.sim.faults import EcnIncast, FlakyLink, PcieDowngrade, PfcStorm, TransportErrors
    from rocewatch.sim.scenarios import laid_out

    return laid_out(
        "subtle",
        nodes,
        duration_s,
        seed,
        lambda at: (
            PfcStorm(onset_s=at(4.0), duration_s=0.6),
            FlakyLink(onset_s=at(8.0), duration_s=at(10.0), peak_ber=1e-5, flaps=0),
            PcieDowngrade(onset_s=at(12.0), speed_gts=8.0),
            EcnIncast(onset_s=at(19.0), duration_s=at(5.0), senders=3),
            TransportErrors(onset_s=at(24.0), duration_s=at(5.0), scale=0.2),
        ),
    )


def two_storms_scenario(nodes: int = 16, duration_s: float = 30, seed: int = 1) -> SimConfig:
    """Two PFC storms at once, one in each tenant's job (laid out for 30 s: 5-11 s and 7-13 s):
    two origins, each paused fabric's victims kept apart."""
    from rocewatch.sim.faults import PfcStorm
    from rocewatch.sim.scenarios import laid_out

    return laid_out(
        "two_storms",
        nodes,
        duration_s,
        seed,
        lambda at: (
            PfcStorm(onset_s=at(5), duration_s=at(6)),
            PfcStorm(onset_s=at(7), duration_s=at(6)),
        ),
    )


def _scenarios() -> dict[str, Callable[..., SimConfig]]:
    from rocewatch.sim.scenarios import SCENARIOS

    return {
        **SCENARIOS,
        "overlap": overlap_scenario,
        "mixed_tenants": mixed_tenants_scenario,
        "two_storms": two_storms_scenario,
        "subtle": subtle_scenario,
    }


QUICK_SUITE: tuple[Case, ...] = (
    Case("default", 16, 20, 1),
    Case("overlap", 16, 16, 2),
    Case("dark_storm", 16, 10, 1),
    Case("healthy", 16, 10, 1, healthy=True),
    Case("moe", 16, 10, 1, healthy=True),
)

FULL_SUITE: tuple[Case, ...] = (
    Case("default", 16, 30, 1),
    Case("default", 16, 30, 2),
    Case("default", 16, 30, 3),
    Case("default", 32, 30, 4),
    Case("default", 64, 40, 7),
    Case("overlap", 16, 30, 1),
    Case("overlap", 32, 30, 2),
    Case("mixed_tenants", 16, 30, 1),
    Case("mixed_tenants", 32, 30, 2),
    Case("dark_storm", 16, 20, 1),
    Case("dark_storm", 32, 20, 2),
    Case("uplink_flaky", 16, 30, 1),
    Case("two_storms", 16, 30, 1),
    Case("subtle", 16, 30, 1),
    Case("subtle", 32, 30, 5),
    Case("healthy", 16, 30, 1, healthy=True),
    Case("healthy", 64, 20, 2, healthy=True),
    Case("moe", 16, 30, 1, healthy=True),
    Case("moe", 32, 30, 2, healthy=True),
)


@dataclass
class RunResult:
    case: Case
    truth: dict[str, Any]
    score: RunScore
    seconds: float
    samples: int


def run_case(case: Case, config: Config | None = None) -> RunResult:
    """Simulate ``case``, drive the pipeline as the demo does (advancing every 5 ticks), score."""
    from rocewatch.config import Config
    from rocewatch.pipeline import Pipeline
    from rocewatch.sim.simulator import Simulator

    cfg = _scenarios()[case.scenario](nodes=case.nodes, duration_s=case.duration_s, seed=case.seed)
    t0 = time.perf_counter()
    sim = Simulator(cfg)
    pipeline = Pipeline(sim.topology, config or Config(), rollup_s=None)
    lateness = pipeline.engine.lateness_ns()
    newest = 0
    for i, frame in enumerate(sim.ticks()):
        pipeline.ingest(frame)
        if frame.height:
            newest = max(newest, int(frame["ts"].max()))  # type: ignore[arg-type]
        if i % 5 == 4:
            pipeline.advance(newest - lateness)
    pipeline.finish()
    truth = sim.truth()
    inhibited: list[Alert] = getattr(pipeline, "inhibited_alerts", list)()
    score = score_run(truth, pipeline.all_alerts(), pipeline.actions, inhibited)
    return RunResult(case, truth, score, time.perf_counter() - t0, pipeline.samples_in)


def evaluate(
    cases: Sequence[Case],
    config: Config | None = None,
    progress: Callable[[int, RunResult], None] | None = None,
) -> dict[str, Any]:
    """Run ``cases`` and return the report (the ``evaluation.json`` document)."""
    t0 = time.perf_counter()
    results = []
    for i, case in enumerate(cases):
        res = run_case(case, config)
        results.append(res)
        if progress is not None:
            progress(i, res)
    return report(results, time.perf_counter() - t0)


def report(results: Sequence[RunResult], seconds: float) -> dict[str, Any]:
    agg = aggregate([r.score for r in results])
    healthy = [r for r in results if r.case.healthy]
    healthy_by: dict[str, int] = {}
    for r in healthy:
        for n, c in r.score.fp.items():
            healthy_by[n] = healthy_by.get(n, 0) + c
        if r.score.incidents:
            healthy_by[INCIDENT] = healthy_by.get(INCIDENT, 0) + r.score.incidents
    runs = []
    for r in results:
        s, start = r.score, int(r.truth["start_ns"])
        runs.append(
            {
                "name": r.case.name,
                **dataclasses.asdict(r.case),
                "faults": [
                    {
                        "id": fid,
                        "kind": kind,
                        "detected": s.detected[fid],
                        "ttd_s": s.ttd_s.get(fid),
                        "entity": next(f["labels"] for f in r.truth["faults"] if f["id"] == fid),
                        "onset_s": next(
                            round((f["onset_ns"] - start) / S, 3)
                            for f in r.truth["faults"]
                            if f["id"] == fid
                        ),
                    }
                    for fid, kind in s.faults.items()
                ],
                "alerts": s.alerts,
                "tp_alerts": sum(s.tp.values()),
                "fp_alerts": sum(s.fp.values()),
                "neutral_victim_alerts": s.neutral,
                "fabric_incidents": s.incidents,
                "drains": s.drains,
                "wrong_drains": s.wrong_drains,
                "false_positives": s.false_positives,
                "samples": r.samples,
                "seconds": round(r.seconds, 2),
            }
        )
    return {
        "kinds": agg["kinds"],
        "wrong_drains": sum(len(r.score.wrong_drains) for r in results),
        "healthy_alerts": sum(r.score.alerts for r in healthy),
        "healthy_alerts_by_alertname": dict(sorted(healthy_by.items())),
        "alertnames": agg["alertnames"],
        "overall": agg["overall"],
        "fabric_incidents": {
            "total": sum(r.score.incidents for r in results),
            "outside_fault_windows": sum(r.score.incidents_outside_faults for r in results),
            "in_healthy_runs": sum(r.score.incidents for r in healthy),
        },
        "drains": sum(r.score.drains for r in results),
        "anchors": ANCHORS,
        "rules": {
            "window_s": [-EARLY_NS / S, LATE_NS / S],
            "tp": "alertname is the fault's alertname or in 'also', labels contain one 'match' "
            "set, startsAt within [onset - 1 s, end + 5 s]",
            "neutral": "role=victim alerts in a fault's 'victims' list within the window",
            "precision": "over the alerts of the kind's own alertname",
            "recall": "over the faults of the kind, found by any alertname it accepts",
        },
        "runs": runs,
        "runtime_s": round(seconds, 1),
    }


# --- the matrix: detection across what production varies ---------------------------------------

MATRIX_JITTER = 0.2  # each reading up to a fifth of its interval late
MATRIX_LOSS = 0.01  # 1 % of readings lost
MATRIX_BER = (1e-9, 2e-7)  # healthy pre-FEC BER per link direction
MATRIX_ECN_BURSTS = 0.3  # DCQCN marking bursts (2-10 %) per switch queue a minute
MATRIX_AR_REORDER = 2e-6  # out-of-order share of received packets from adaptive routing
STORM_ORIGINS = ("nic", "switch", "dark", "nic", "switch")  # by round, then again
MAGNITUDES: dict[str, dict[str, tuple[float, float]]] = {
    # fill: standing queue (share of the buffer); ecn: share of the queue's packets marked;
    # errors_per_s: transport errors; ber_factor: peak pre-FEC BER over the link's own;
    # slow: a thermal straggler's shortfall
    "mild": {
        "fill": (0.25, 0.40),
        "ecn": (0.15, 0.30),
        "errors_per_s": (10.0, 40.0),
        "ber_factor": (100.0, 300.0),
        "slow": (0.10, 0.20),
    },
    "middling": {
        "fill": (0.40, 0.70),
        "ecn": (0.30, 0.55),
        "errors_per_s": (40.0, 400.0),
        "ber_factor": (300.0, 3000.0),
        "slow": (0.20, 0.30),
    },
    "severe": {
        "fill": (0.70, 1.00),
        "ecn": (0.55, 0.80),
        "errors_per_s": (400.0, 4000.0),
        "ber_factor": (3000.0, 30000.0),
        "slow": (0.30, 0.40),
    },
}


@dataclass(frozen=True)
class Cell:
    """One cell of the matrix: a fabric, how its sources are read, and how hard it breaks.

    ``magnitude`` is ``mild``, ``middling`` or ``severe`` (``MAGNITUDES``), or ``healthy``
    (no faults: every alert is a false alarm). ``traffic``: ``allreduce``, ``moe`` or
    ``mixed`` (one job of each). Every cell has ``rounds`` rounds, each a PFC storm and then
    one fault of every other kind at once on other nodes and rails, so each kind has
    ``rounds`` faults. ``storm_pairs``: a round whose storm starts at a NIC has a second,
    independent NIC storm (another job, another rail) two seconds later: both spread to the
    spines, both origins are to be drained.
    """

    name: str
    nic_interval_s: float
    switch_interval_s: float
    link_gbps: int
    buffer_mb: int
    naming: str
    nodes: int
    magnitude: str
    seed: int
    gauge_interval_s: float | None = None
    traffic: str = "allreduce"
    rounds: int = 5
    nics_per_node: int = 8
    storm_pairs: bool = False

    @property
    def healthy(self) -> bool:
        return self.magnitude == "healthy"

    def timeline(self) -> dict[str, float]:
        """Durations laid out for the cell's cadences: a baseline before the first fault, a
        storm long enough for 5 intervals of the slower of NIC and switch counters, faults
        long enough for 8 of the slowest source, gaps for counters to settle."""
        slowest = max(self.nic_interval_s, self.switch_interval_s, self.gauge_interval_s or 0.0)
        t = {
            "lead_s": max(20.0, 10 * slowest),
            "storm_s": max(4.0, 5 * max(self.nic_interval_s, self.switch_interval_s)),
            "storm_gap_s": max(4.0, 3 * slowest),
            # the 10 s bound, and room after it
            "fault_s": max(16.0, 8 * slowest),
            "fault_gap_s": max(6.0, 3 * slowest),
        }
        t["pair_s"] = 2.0 if self.storm_pairs else 0.0  # the second storm's lag
        t["round_s"] = (
            t["storm_s"] + t["pair_s"] + t["storm_gap_s"] + t["fault_s"] + t["fault_gap_s"]
        )
        n = min(2, self.rounds) if self.healthy else self.rounds  # a healthy cell: 2 at most
        t["duration_s"] = t["lead_s"] + n * t["round_s"]
        return t


MATRIX: tuple[Cell, ...] = (
    Cell("oc-100ms-400g-severe", 0.1, 0.1, 400, 64, "openconfig", 16, "severe", 101),
    Cell("oc-100ms-200g-mild", 0.1, 0.1, 200, 32, "openconfig", 16, "mild", 102, traffic="mixed"),
    Cell("sonic-100ms-1s-400g-middling", 0.1, 1.0, 400, 48, "sonic", 16, "middling", 103),
    Cell(
        "cumulus-500ms-1s-200g-middling", 0.5, 1.0, 200, 16, "cumulus", 16, "middling", 104,
        traffic="mixed",
    ),
    Cell("sonic-1s-1s-400g-mild", 1.0, 1.0, 400, 32, "sonic", 32, "mild", 105),
    Cell("oc-1s-5s-100g-middling", 1.0, 5.0, 100, 16, "openconfig", 24, "middling", 106),
    Cell(
        "cumulus-2s-1s-q5s-400g-mild", 2.0, 1.0, 400, 24, "cumulus", 16, "mild", 107,
        gauge_interval_s=5.0,
    ),
    Cell("sonic-2s-5s-800g-severe", 2.0, 5.0, 800, 64, "sonic", 16, "severe", 108, traffic="moe"),
    Cell("oc-1s-1s-400g-128n-middling", 1.0, 1.0, 400, 64, "openconfig", 128, "middling", 109),
    Cell("oc-500ms-1s-400g-storm-pairs", 0.5, 1.0, 400, 32, "openconfig", 16, "middling", 110,
         traffic="mixed", storm_pairs=True),
    Cell("healthy-oc-100ms-400g", 0.1, 0.1, 400, 64, "openconfig", 16, "healthy", 201,
         traffic="mixed"),
    Cell("healthy-sonic-1s-800g-moe", 1.0, 1.0, 800, 64, "sonic", 16, "healthy", 202,
         traffic="moe"),
    Cell("healthy-cumulus-2s-5s-200g", 2.0, 5.0, 200, 16, "cumulus", 16, "healthy", 203,
         traffic="mixed"),
)  # fmt: skip


def _jobs(cell: Cell) -> tuple[JobSpec, ...]:
    from rocewatch.sim.fabric import JobSpec, node_name

    if cell.traffic == "allreduce":
        return ()  # the simulator's two halves, all-reduce
    names = [node_name(i) for i in range(cell.nodes)]
    half = cell.nodes // 2
    if cell.traffic == "moe":
        return (
            JobSpec("moe-train-a", "team-a", tuple(names[:half]), traffic="moe"),
            JobSpec("moe-train-b", "team-b", tuple(names[half:]), traffic="moe"),
        )
    return (
        JobSpec("llm-train-a", "team-a", tuple(names[:half]), traffic="allreduce"),
        JobSpec("moe-train-b", "team-b", tuple(names[half:]), traffic="moe"),
    )


def cell_config(cell: Cell) -> SimConfig:
    """The simulated run of ``cell``: its rounds of faults, counter clears and agent gaps, on a
    fabric with realistic healthy noise (``MATRIX_*``). Entities come from the seed."""
    import numpy as np

    from rocewatch.sim.fabric import node_name
    from rocewatch.sim.faults import (
        AgentGap,
        CounterClear,
        EcnIncast,
        Fault,
        FlakyLink,
        PcieDowngrade,
        PfcStorm,
        QueueBuildup,
        Straggler,
        TransportErrors,
    )
    from rocewatch.sim.simulator import SimConfig

    if cell.magnitude not in MAGNITUDES and not cell.healthy:
        raise ValueError(f"{cell.name}: magnitude {cell.magnitude!r} is not one of {MAGNITUDES}")
    tl = cell.timeline()
    rng = np.random.default_rng([cell.seed, 99])
    faults: list[Fault] = []
    dark: list[str] = []
    # nodes of the dark storms: agentless for the whole run, drawn from both halves in turn
    n_dark = sum(1 for i in range(cell.rounds) if STORM_ORIGINS[i % len(STORM_ORIGINS)] == "dark")
    if not cell.healthy and n_dark:
        half = max(1, cell.nodes // 2)
        for j in range(n_dark):
            lo = (j % 2) * half
            dark.append(node_name(int(rng.integers(lo, min(cell.nodes, lo + half)))))
    agentless = list(dark)
    mag = MAGNITUDES.get(cell.magnitude, {})

    def draw(key: str, log: bool = False) -> float:
        lo, hi = mag[key]
        if log:
            return round(float(10 ** rng.uniform(np.log10(lo), np.log10(hi))), 3)
        return round(float(rng.uniform(lo, hi)), 3)

    max_gts = 64.0 if cell.link_gbps >= 800 else 32.0
    for i in range(0 if cell.healthy else cell.rounds):
        r0 = tl["lead_s"] + i * tl["round_s"]
        origin = STORM_ORIGINS[i % len(STORM_ORIGINS)]
        st = tl["storm_s"]
        if origin == "switch":
            faults.append(PfcStorm(onset_s=r0, duration_s=st, origin="switch"))
        elif origin == "dark":
            faults.append(PfcStorm(onset_s=r0, duration_s=st, node=dark.pop(0)))
        else:
            faults.append(PfcStorm(onset_s=r0, duration_s=st))
        if cell.storm_pairs and origin != "switch":  # a switch's storm holds every job
            faults.append(PfcStorm(onset_s=r0 + tl["pair_s"], duration_s=st))
        f0 = r0 + tl["storm_s"] + tl["pair_s"] + tl["storm_gap_s"]
        fl = tl["fault_s"]

        def at(j: int, f0: float = f0) -> float:
            return round(f0 + 0.37 * j, 2)  # staggered: faults do not start in lockstep

        flaky: dict[str, Any] = [
            {"flaps": 3},
            {"flaps": 0},
            {"flaps": 3, "errors": False},
            {"flaps": 3, "uplink": True},
            {"flaps": 3, "uplink": True, "errors": False},
        ][i % 5]
        faults += [
            FlakyLink(
                onset_s=at(0), duration_s=fl, ber_factor=draw("ber_factor", log=True), **flaky
            ),
            PcieDowngrade(
                onset_s=at(1),
                duration_s=fl,
                speed_gts=max_gts / 2 if i % 2 == 0 else max_gts,
                width=16 if i % 2 == 0 else 8,
            ),
            EcnIncast(
                onset_s=at(2),
                duration_s=fl,
                ecn=draw("ecn"),
                fill=round(float(rng.uniform(0.05, 0.15)), 3),
            ),
            QueueBuildup(
                onset_s=at(3),
                duration_s=fl,
                fill=draw("fill"),
                ecn=round(float(rng.uniform(0.02, 0.10)), 3),
            ),
            TransportErrors(
                onset_s=at(4), duration_s=fl, rate_per_s=draw("errors_per_s", log=True)
            ),
            Straggler(onset_s=at(5), duration_s=fl, slow=draw("slow")),
        ]
    run = tl["duration_s"]
    gap = max(3.0, 3 * cell.nic_interval_s)
    if cell.healthy:
        marks = (run / 4, run / 2, 3 * run / 4)
    else:  # in the baseline, in round 1's fault slot, in round 2's gaps
        r1 = tl["lead_s"] + tl["round_s"]
        marks = (
            tl["lead_s"] / 2,
            r1 - tl["fault_gap_s"] - tl["fault_s"] / 2,
            r1 + tl["round_s"] - tl["fault_gap_s"] / 2 - gap / 2,
        )
    faults += [
        CounterClear(onset_s=round(marks[0], 1) + 0.05, target="switch"),
        CounterClear(onset_s=round(marks[1], 1), target="nic"),
        AgentGap(onset_s=round(marks[2], 1), duration_s=gap),
        AgentGap(onset_s=round(marks[0] * 1.5, 1), duration_s=gap),
    ]
    return SimConfig(
        nodes=cell.nodes,
        nics_per_node=cell.nics_per_node,
        duration_s=run,
        interval_s=0.1,
        seed=cell.seed,
        faults=tuple(faults),
        jobs=_jobs(cell),
        no_agent_nodes=tuple(sorted(set(agentless))),
        traffic="moe" if cell.traffic == "moe" else "allreduce",
        name=cell.name,
        link_gbps=cell.link_gbps,
        buffer_mb=cell.buffer_mb,
        naming=cell.naming,
        nic_interval_s=cell.nic_interval_s,
        switch_interval_s=cell.switch_interval_s,
        gauge_interval_s=cell.gauge_interval_s,
        jitter=MATRIX_JITTER,
        sample_loss=MATRIX_LOSS,
        ber_range=MATRIX_BER,
        ecn_bursts_per_min=MATRIX_ECN_BURSTS,
        ar_reorder=MATRIX_AR_REORDER,
    )


def storm_origin(fault: Mapping[str, Any]) -> str:
    """``nic``, ``dark`` (a NIC whose node has no agent) or ``switch``."""
    labels = fault.get("labels", {})
    if "node" not in labels:
        return "switch"
    return "nic" if (fault.get("details") or {}).get("agent", True) else "dark"


def run_cell(cell: Cell, config_path: Path | None = None) -> dict[str, Any]:
    """Simulate ``cell`` into a scenario directory, replay it as a user would (the vendor
    paths through the collector's mapping), score the alerts against the truth."""
    import tempfile

    from rocewatch.config import load_config
    from rocewatch.replay import replay
    from rocewatch.sim.writers import write_scenario

    logging.getLogger().setLevel(logging.ERROR)  # the drain decisions would bury the progress
    t0 = time.perf_counter()
    c0 = time.process_time()
    cfg = cell_config(cell)
    with tempfile.TemporaryDirectory(prefix="rocewatch-matrix-") as tmp:
        scen = write_scenario(cfg, Path(tmp) / "scenario")
        truth = json.loads((scen / "truth.json").read_text())
        res = replay(scen, Path(tmp) / "out", load_config(config_path))
    alerts = [Alert.from_json(a) for a in res.alerts]
    inhibited = [Alert.from_json(a) for a in getattr(res, "inhibited", [])]
    actions = [Action.from_json(a) for a in res.actions]
    score = score_run(truth, alerts, actions, inhibited)
    rep = cell_report(cell, truth, score, time.perf_counter() - t0, res.samples)
    rep["cpu_s"] = round(time.process_time() - c0, 1)  # every thread of this process
    return rep


def cell_report(
    cell: Cell, truth: Mapping[str, Any], s: RunScore, seconds: float, samples: int
) -> dict[str, Any]:
    """One cell's figures (the matrix JSON's ``cells[i]``)."""
    start = int(truth["start_ns"])
    faults = {f["id"]: f for f in truth.get("faults", []) if f.get("alertname")}
    agg = aggregate([s])
    kinds: dict[str, Any] = {}
    for kind, k in agg["kinds"].items():
        ids = [fid for fid, kd in s.faults.items() if kd == kind]
        kinds[kind] = {
            "faults": k["faults"],
            "precision": k["precision"],
            "recall": k["recall"],
            "ttd_median_s": k["ttd_median_s"],
            "ttd_p95_s": k["ttd_p95_s"],
            "detected": k["detected"],
            "tp_alerts": k["tp_alerts"],
            "fp_alerts": k["fp_alerts"],
            "late": sum(1 for fid in ids if fid in s.late),
            "bound_s": sorted({s.bound_s[fid] for fid in ids if fid in s.bound_s}),
        }
    origins: dict[str, dict[str, int]] = {}
    for fid, f in faults.items():
        if f["alertname"] != "PFCStorm":
            continue
        o = origins.setdefault(storm_origin(f), {"faults": 0, "detected": 0, "late": 0})
        o["faults"] += 1
        o["detected"] += int(s.detected.get(fid, False))
        o["late"] += int(fid in s.late)

    def where(fid: str) -> dict[str, Any]:
        f = faults[fid]
        return {
            "id": fid,
            "kind": f["alertname"],
            "entity": f["labels"],
            "onset_s": round((int(f["onset_ns"]) - start) / S, 2),
            **({"origin": storm_origin(f)} if f["alertname"] == "PFCStorm" else {}),
        }

    sampling = truth.get("sampling") or {}
    return {
        "name": cell.name,
        "nic_interval_s": cell.nic_interval_s,
        "switch_interval_s": cell.switch_interval_s,
        "gauge_interval_s": cell.gauge_interval_s or cell.switch_interval_s,
        "link_gbps": cell.link_gbps,
        "buffer_mb": cell.buffer_mb,
        "naming": cell.naming,
        "nodes": cell.nodes,
        "magnitude": cell.magnitude,
        "traffic": cell.traffic,
        "seed": cell.seed,
        "duration_s": round((int(truth["end_ns"]) - start) / S, 1),
        "kinds": kinds,
        "healthy_alerts": s.alerts if cell.healthy else s.healthy_alerts,
        "wrong_drains": len(s.wrong_drains),
        "late": len(s.late),
        "storm_origins": origins,
        "alerts": s.alerts,
        "inhibited": s.inhibited,
        "neutral_victim_alerts": s.neutral,
        "fabric_incidents": s.incidents,
        "fp_by_alertname": dict(sorted(s.fp.items())),
        "missed": [where(fid) for fid, ok in s.detected.items() if not ok],
        "late_faults": [
            {**where(fid), "ttd_s": s.ttd_s[fid], "bound_s": s.bound_s[fid]} for fid in s.late
        ],
        "false_positives": s.false_positives[:20],
        "wrong_drain_list": s.wrong_drains[:20],
        "lost_samples": sum(
            len(v) for src in sampling.get("lost", {}).values() for v in src.values()
        ),
        "samples": samples,
        "seconds": round(seconds, 1),
    }


def _generated() -> dict[str, Any]:
    """When, from which commit and on what machine the figures were made."""
    import contextlib
    import datetime
    import os
    import platform
    import subprocess

    def git(*args: str) -> str:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            return subprocess.run(
                ["git", *args],
                cwd=Path(__file__).resolve().parent,
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
        return ""

    commit = git("rev-parse", "--short", "HEAD") or None
    if commit and git("status", "--porcelain", "--untracked-files=no"):
        commit += "+dirty"  # figures of a tree with uncommitted changes
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit,
        "machine": f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        # other work on the machine slows the wall clock, not the CPU seconds
        "load_average_1m": round(os.getloadavg()[0], 1),
    }


def matrix_report(cells: Sequence[dict[str, Any]], seconds: float, workers: int) -> dict[str, Any]:
    """The matrix JSON: every cell and the worst and total figures over them."""
    precisions = [
        k["precision"] for c in cells for k in c["kinds"].values() if k["precision"] is not None
    ]
    recalls = [k["recall"] for c in cells for k in c["kinds"].values() if k["recall"] is not None]
    return {
        "cells": list(cells),
        "worst_precision": min(precisions, default=None),
        "worst_recall": min(recalls, default=None),
        "healthy_alerts": sum(c["healthy_alerts"] for c in cells),
        "wrong_drains": sum(c["wrong_drains"] for c in cells),
        "late": sum(c["late"] for c in cells),
        "goal": {
            "worst_precision": 0.95,
            "worst_recall": 0.95,
            "healthy_alerts": 0,
            "wrong_drains": 0,
            "late": 0,
        },
        "rules": {
            "tp": "as the default suite (alertname or 'also', one 'match' label set, startsAt "
            "within [onset - 1 s, end + max(5 s, 3 intervals of the slowest source)]); a "
            "grouped alert speaks for each member and each listed port",
            "neutral": "storm victims (labels, members, victims annotation or origin) and "
            "inhibited alerts",
            "late": "first hit after its bound: PFC storms 2.5 intervals of the fastest source "
            "that sees the origin; the rest max(10 s, 3 intervals of the slowest source the "
            "detector needs); plus one interval per reading of the fault's devices lost "
            "within the bound",
            "healthy_alerts": "every alert of a healthy cell; in a fault cell, alerts that start "
            "before its first fault",
            "worst": "precision ignores kinds with no alert of their name (their recall shows)",
        },
        "runtime_s": round(seconds, 1),
        "cpu_s": round(sum(c.get("cpu_s", 0.0) for c in cells), 1),
        "workers": workers,
        "generated": _generated(),
    }


def _run_cell_job(args: tuple[Cell, Path | None]) -> dict[str, Any]:
    return run_cell(*args)


def run_matrix(
    cells: Sequence[Cell] = MATRIX,
    config_path: Path | None = None,
    jobs: int = 1,
    progress: Callable[[int, int, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run ``cells`` (in ``jobs`` processes when more than one) and report the matrix.

    Biggest cells start first so the last to finish is a small one."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    t0 = time.perf_counter()
    order = sorted(
        range(len(cells)),
        key=lambda i: (
            -cells[i].nodes
            * cells[i].timeline()["duration_s"]
            / min(cells[i].nic_interval_s, cells[i].switch_interval_s)
        ),
    )
    results: dict[int, dict[str, Any]] = {}
    if jobs <= 1:
        for n, i in enumerate(order):
            results[i] = run_cell(cells[i], config_path)
            if progress is not None:
                progress(n, len(cells), results[i])
    else:
        # spawned, not forked: a fork of a process whose Polars threads run can deadlock
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            futures = {pool.submit(_run_cell_job, (cells[i], config_path)): i for i in order}
            for n, fut in enumerate(as_completed(futures)):
                i = futures[fut]
                results[i] = fut.result()
                if progress is not None:
                    progress(n, len(cells), results[i])
    return matrix_report(
        [results[i] for i in range(len(cells))], time.perf_counter() - t0, max(1, jobs)
    )


def matrix_table(rep: Mapping[str, Any]) -> str:
    """The matrix as a text table: one row per cell, precision/recall per kind."""
    kinds = sorted({k for c in rep["cells"] for k in c["kinds"]})
    short = {
        "PFCStorm": "storm",
        "FlakyLink": "flaky",
        "PCIeDowngrade": "pcie",
        "ECNCongestion": "ecn",
        "QueueBuildup": "queue",
        "TransportErrors": "transp",
        "Straggler": "strag",
    }
    header = ["cell", "nic/sw s", *(short.get(k, k) for k in kinds), "healthy", "wrong", "late"]
    rows = []
    for c in rep["cells"]:
        row = [c["name"], f"{c['nic_interval_s']:g}/{c['switch_interval_s']:g}"]
        for k in kinds:
            x = c["kinds"].get(k)
            row.append("" if x is None else f"{_fmt(x['precision'])}/{_fmt(x['recall'])}")
        row += [str(c["healthy_alerts"]), str(c["wrong_drains"]), str(c["late"])]
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(x.ljust(w) for x, w in zip(r, widths, strict=True)) for r in rows]
    out.append(
        f"worst precision {_fmt(rep['worst_precision'])}, worst recall {_fmt(rep['worst_recall'])}"
        f", healthy alerts {rep['healthy_alerts']}, wrong drains {rep['wrong_drains']}, "
        f"late {rep['late']} (P/R per kind; goal >= 0.95, 0, 0, 0)"
    )
    return "\n".join(out)


def run_evaluate_matrix(
    out: Path,
    as_json: bool,
    config_path: Path | None = None,
    jobs: int | None = None,
    only: str | None = None,
) -> int:
    """The `rocewatch evaluate --matrix` command."""
    import os

    cells: Sequence[Cell] = MATRIX
    if only:
        wanted = [w.strip() for w in only.split(",") if w.strip()]
        cells = [c for c in MATRIX if any(w in c.name for w in wanted)]
        if not cells:
            print(f"no matrix cell matches {only!r}", file=sys.stderr)
            return 2
    jobs = jobs or min(len(cells), os.cpu_count() or 1)

    def progress(n: int, total: int, c: dict[str, Any]) -> None:
        found = sum(k["detected"] for k in c["kinds"].values())
        n_faults = sum(k["faults"] for k in c["kinds"].values())
        print(
            f"[{n + 1}/{total}] {c['name']}: {found}/{n_faults} faults found, {c['alerts']} "
            f"alerts ({c['inhibited']} inhibited), healthy alerts {c['healthy_alerts']}, "
            f"wrong drains {c['wrong_drains']}, late {c['late']}, {c['seconds']} s",
            file=sys.stderr,
            flush=True,
        )

    print(f"evaluate --matrix: {len(cells)} cells in {jobs} process(es)", file=sys.stderr)
    rep = run_matrix(cells, config_path, jobs, progress)
    out.mkdir(parents=True, exist_ok=True)
    (out / "evaluation_matrix.json").write_text(json.dumps(rep, indent=2) + "\n")
    if as_json:
        print(json.dumps(rep, indent=2))
    else:
        print(matrix_table(rep))
        print(
            f"\n{len(cells)} cells in {rep['runtime_s']} s; wrote evaluation_matrix.json to {out}"
        )
    return 0


# --- output ----------------------------------------------------------------------------------


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}"


def table_rows(rep: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["kind", "faults", "found", "precision", "recall", "F1", "TTD median s", "TTD p95 s"]
    header += ["TP", "FP"]
    rows = []
    for kind, k in rep["kinds"].items():
        rows.append(
            [
                kind,
                str(k["faults"]),
                str(k["detected"]),
                _fmt(k["precision"]),
                _fmt(k["recall"]),
                _fmt(k["f1"]),
                _fmt(k["ttd_median_s"]),
                _fmt(k["ttd_p95_s"]),
                str(k["tp_alerts"]),
                str(k["fp_alerts"]),
            ]
        )
    for name, n in rep["alertnames"].items():
        if name in rep["kinds"]:
            continue
        tp, fp = str(n["tp_alerts"]), str(n["fp_alerts"])
        rows.append([f"({name})", "", "", _fmt(n["precision"]), "", "", "", "", tp, fp])
    o = rep["overall"]
    rows.append(
        [
            "all",
            str(o["faults"]),
            str(o["detected"]),
            _fmt(o["precision"]),
            _fmt(o["recall"]),
            _fmt(o["f1"]),
            "",
            "",
            str(o["tp_alerts"]),
            str(o["fp_alerts"]),
        ]
    )
    return header, rows


def text_table(rep: Mapping[str, Any]) -> str:
    header, rows = table_rows(rep)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def summary_lines(rep: Mapping[str, Any]) -> list[str]:
    fi = rep["fabric_incidents"]
    healthy = rep["healthy_alerts_by_alertname"]
    by_name = f" ({', '.join(f'{k} {v}' for k, v in healthy.items())})" if healthy else ""
    return [
        f"wrong-node drains: {rep['wrong_drains']} (of {rep['drains']} drains not refused)",
        f"alerts on healthy runs (all-reduce, MoE): {rep['healthy_alerts']}{by_name}",
        f"storm victims left neutral: {rep['overall']['neutral_victim_alerts']}; "
        f"FabricIncidents: {fi['total']} ({fi['outside_fault_windows']} outside any fault window)",
        "anchors: SONiC PFC watchdog 0.2 s; Minder precision 0.90 / F1 0.89, detects in 3.6-30 s",
    ]


def markdown(rep: Mapping[str, Any]) -> str:
    header, rows = table_rows(rep)
    out = [
        f"# rocewatch evaluation ({rep.get('suite', '')} suite)",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    out += [""] + [f"- {x}" for x in summary_lines(rep)]
    out += [
        "",
        "Kinds are the alertnames of the injected faults; `(name)` rows are alertnames that only "
        "count as an alternative hit (`also`). Precision is over the alerts of the kind's own "
        "alertname; recall over its faults. TTD = first matching startsAt - onset.",
        "",
        "## Runs",
        "",
        "| run | faults found | alerts | TP | FP | victims | drains | wrong | seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rep["runs"]:
        found = sum(1 for f in r["faults"] if f["detected"])
        out.append(
            f"| {r['name']} | {found}/{len(r['faults'])} | {r['alerts']} | {r['tp_alerts']} | "
            f"{r['fp_alerts']} | {r['neutral_victim_alerts']} | {r['drains']} | "
            f"{len(r['wrong_drains'])} | {r['seconds']} |"
        )
    missed = [
        f"{r['name']}: {f['id']} on {'/'.join(map(str, f['entity'].values()))} at {f['onset_s']} s"
        for r in rep["runs"]
        for f in r["faults"]
        if not f["detected"]
    ]
    if missed:
        out += ["", "## Missed faults", ""] + [f"- {m}" for m in missed]
    fps = [
        f"{r['name']}: {fp['alertname']} {fp['labels']} at {fp['starts_s']} s"
        + (f" (near {fp['near']})" if fp["near"] else "")
        for r in rep["runs"]
        for fp in r["false_positives"]
    ]
    if fps:
        out += ["", "## False positives", ""] + [f"- {m}" for m in fps]
    return "\n".join(out) + "\n"


def plot(rep: Mapping[str, Any], path: Path) -> None:
    """Per-kind precision/recall/F1 bars and the time-to-detect distribution."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(rep["kinds"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.26
    bars_of = (("precision", "precision"), ("recall", "recall"), ("f1", "F1"))
    for j, (key, label) in enumerate(bars_of):
        vals = [rep["kinds"][k][key] for k in kinds]
        xs = [i + (j - 1) * width for i in range(len(kinds))]
        bars = ax1.bar(xs, [v or 0.0 for v in vals], width, label=label)
        for b, v in zip(bars, vals, strict=True):
            if v is None:
                ax1.text(b.get_x() + b.get_width() / 2, 0.02, "n/a", ha="center", fontsize=7)
    ax1.axhline(MINDER_PRECISION, color="grey", ls="--", lw=0.8, label="Minder P 0.90")
    ax1.axhline(MINDER_F1, color="grey", ls=":", lw=0.8, label="Minder F1 0.89")
    ax1.set_xticks(range(len(kinds)), kinds, rotation=20, fontsize=8)
    ax1.set_ylim(0, 1.25)
    ax1.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax1.set_title("per kind: precision, recall, F1")
    ax1.legend(fontsize=7, loc="upper center", ncol=5, frameon=False)

    data = [[max(x, 1e-3) for x in rep["kinds"][k]["ttd_s"]] for k in kinds]
    for i, d in enumerate(data):
        if d:
            ax2.boxplot([d], positions=[i], widths=0.5, showfliers=False)
            ax2.scatter([i] * len(d), d, s=12, alpha=0.6, zorder=3)
        else:
            ax2.text(i, 0.3, "not\ndetected", ha="center", fontsize=7)
    ax2.set_yscale("log")
    ax2.set_ylim(0.05, 60)
    ax2.axhline(SONIC_DETECT_S, color="grey", ls="--", lw=0.8)
    ax2.text(-0.4, 0.21, "SONiC 200 ms", fontsize=7, color="grey")
    lo, hi = PUBLISHED_DETECT_S
    ax2.axhspan(lo, hi, color="grey", alpha=0.12)
    ax2.text(-0.4, lo * 1.1, "published 3.6-30 s", fontsize=7, color="grey")
    ax2.set_xticks(range(len(kinds)), kinds, rotation=20, fontsize=8)
    ax2.set_xlim(-0.6, len(kinds) - 0.4)
    ax2.set_ylabel("time to detect (s)")
    ax2.set_title("time to detect (telemetry time)")
    fig.suptitle(
        f"rocewatch evaluation: {len(rep['runs'])} runs, wrong-node drains "
        f"{rep['wrong_drains']}, alerts on healthy runs {rep['healthy_alerts']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(rep: Mapping[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "evaluation.json").write_text(json.dumps(rep, indent=2) + "\n")
    (out / "evaluation.md").write_text(markdown(rep))
    plot(rep, out / "evaluation.png")


def run_evaluate(
    out: Path, as_json: bool, quick: bool, config_path: Path | None = None, verbose: bool = False
) -> int:
    """The `rocewatch evaluate` command."""
    from rocewatch.config import load_config

    if not verbose:  # the pipeline's per-decision log lines would bury the progress lines
        logging.getLogger().setLevel(logging.ERROR)
    config = load_config(config_path)
    cases = QUICK_SUITE if quick else FULL_SUITE

    def progress(i: int, r: RunResult) -> None:
        s = r.score
        found = sum(s.detected.values())
        print(
            f"[{i + 1}/{len(cases)}] {r.case.name}: {found}/{len(s.faults)} faults found, "
            f"{s.alerts} alerts ({sum(s.tp.values())} TP, {sum(s.fp.values())} FP, "
            f"{s.neutral} victims), {s.drains} drains ({len(s.wrong_drains)} wrong), "
            f"{r.seconds:.1f} s",
            file=sys.stderr,
            flush=True,
        )

    rep = {"suite": "quick" if quick else "full", **evaluate(cases, config, progress)}
    write_outputs(rep, out)
    if as_json:
        print(json.dumps(rep, indent=2))
    else:
        print(text_table(rep))
        print()
        print("\n".join(summary_lines(rep)))
        files = ", ".join(f"evaluation.{x}" for x in ("json", "md", "png"))
        print(f"\n{len(cases)} runs in {rep['runtime_s']} s; wrote {files} to {out}")
    return 0
