"""Scoring: each alert of a run matched against the simulator's ground truth
(``Simulator.truth()``), the detection bound of each fault, and the figures over runs.

The rules (docs/evaluation.md):

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

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rocewatch.core.model import (
    ECMP_IMBALANCE,
    ECN_CONGESTION,
    FABRIC_INCIDENT,
    FLAKY_LINK,
    PFC_STORM,
    QUEUE_BUILDUP,
    Action,
    Alert,
)

S = 1_000_000_000
EARLY_NS = 1 * S  # an alert may start this long before the onset (sampling jitter, windows)
LATE_NS = 5 * S  # ... and this long after the end (slow windows, hysteresis)
INCIDENT = FABRIC_INCIDENT
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
    ``members`` annotation, a JSON list of entity label sets), one per port a switch's
    origin alert lists (``ports``, comma-separated) and one per NIC on a communicator alert's
    path (``path_nics``). Malformed annotations are ignored."""
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
    # a communicator's alert (BusBandwidthDrop) speaks for the NICs on its path (the rank join's
    # ``path_nics``, rocewatch/alerting/job_paths.py): a fault on any of them slows it
    nics = alert.annotations.get("path_nics")
    if nics and "comm" in alert.labels and "node" not in alert.labels:
        for e in nics.split(","):
            node, _, nic = e.split(" (")[0].strip().partition("/")  # (and "(+N more)")
            if node and nic:
                out.append({**alert.labels, "node": node, "nic": nic})
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
    if kind == PFC_STORM:
        if not on_nic:  # a switch pauses its NICs and the spines: both sides see it
            return ("nic", "switch")
        agent = (fault.get("details") or {}).get("agent", True)
        return ("nic", "switch") if agent else ("switch",)
    if kind == QUEUE_BUILDUP:
        return ("gauge",)
    if kind == ECMP_IMBALANCE:
        return ("switch",)  # the uplinks' byte counters
    if kind == ECN_CONGESTION:
        return ("switch", "nic")  # the queue's marks and the receiver's ECN/CNP counters
    if kind == FLAKY_LINK:
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
    if fault.get("alertname") == PFC_STORM:
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
    if fault.get("alertname") != FLAKY_LINK or details.get("errors", True):
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
