"""Scoring RoCEConfigMismatch alerts against the simulator's configuration faults
(``config_truth.json``, rocewatch/sim/roce_config.py): each fault must give exactly its check's
alerts, one per cable it touches, each naming both ends, and nothing else.

Which cables a fault touches follows from its target alone (docs/roce_config.md, "Simulated
faults"): a NIC (``node/nic``) its own cable; a leaf or a spine every cable of that switch; an
uplink (``leaf/port``) that one cable. Expected is the set of (check, cable) pairs; an alert
matches one when its ``check`` label and its two ends (the ``ends`` annotation) are the pair's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rocewatch.core.model import ROCE_CONFIG_MISMATCH
from rocewatch.core.roce import RoceFabric
from rocewatch.core.topology import Topology
from rocewatch.roce.checks import links

ALERTNAME = ROCE_CONFIG_MISMATCH
Pair = tuple[str, frozenset[str]]  # (check, {end a, end b})


def expected(topo: Topology, faults: Iterable[Mapping[str, Any]]) -> dict[str, set[Pair]]:
    """Per fault kind, the (check, cable) pairs its fault must raise."""
    cables = [frozenset((lk.a, lk.b)) for lk in links(topo, RoceFabric())]
    out: dict[str, set[Pair]] = {}
    for f in faults:
        target, check = str(f["target"]), str(f["check"])
        if "/" in target:  # a NIC or one port: that end's cable
            hit = [c for c in cables if target in c]
        else:  # a switch: every cable of it
            hit = [c for c in cables if any(e.split("/", 1)[0] == target for e in c)]
        out.setdefault(str(f["kind"]), set()).update((check, c) for c in hit)
    return out


def found(alerts: Iterable[Mapping[str, Any]]) -> list[Pair]:
    """The (check, cable) pair of every RoCEConfigMismatch alert (Alertmanager JSON)."""
    out = []
    for a in alerts:
        labels = a["labels"]
        if labels.get("alertname") != ALERTNAME:
            continue
        ends = [e.strip() for e in str(a["annotations"].get("ends", "")).split(",") if e.strip()]
        out.append((str(labels.get("check", "")), frozenset(ends)))
    return out


def both_ends_named(a: Mapping[str, Any]) -> bool:
    """The alert names both ends: in its labels (a NIC's node/nic and its switch's
    switch/port, or two switch ports) and in its evidence."""
    labels, ev = a["labels"], str(a["annotations"].get("evidence", ""))
    ends = [e.strip() for e in str(a["annotations"].get("ends", "")).split(",") if e.strip()]
    named = {
        f"{labels[k]}/{labels[v]}"
        for k, v in (("node", "nic"), ("switch", "port"))
        if k in labels and v in labels
    }
    if "peer" in labels:
        named.add(labels["peer"])
    return len(ends) == 2 and set(ends) <= named and all(e in ev for e in ends)


def score(
    topo: Topology, faults: Iterable[Mapping[str, Any]], alerts: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    """Per fault kind and overall: expected, hits, missed, false alerts, precision, recall,
    whether every alert names both ends, and ``exact`` (each fault gave exactly its alerts)."""
    alerts = [a for a in alerts if a["labels"].get("alertname") == ALERTNAME]
    want = expected(topo, faults)
    got = found(alerts)
    every = set().union(*want.values()) if want else set()
    kinds: dict[str, Any] = {}
    for kind, pairs in sorted(want.items()):
        hits = pairs & set(got)
        kinds[kind] = {"expected": len(pairs), "hits": len(hits), "missed": len(pairs - hits)}
    false = [p for p in got if p not in every]
    dup = len(got) - len(set(got))
    tp = len(set(got) & every)
    named = all(both_ends_named(a) for a in alerts)
    return {
        "kinds": kinds,
        "expected": len(every),
        "alerts": len(got),
        "hits": tp,
        "false": len(false),
        "duplicates": dup,
        "precision": tp / len(got) if got else (1.0 if not every else 0.0),
        "recall": tp / len(every) if every else 1.0,
        "both_ends_named": named,
        "exact": tp == len(every) and not false and not dup and named,
    }
