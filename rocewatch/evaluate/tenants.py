"""The matrix's tenant cells: one tenant's all-to-all into the leaf uplinks another tenant's
ring crosses (``TenantIncast``, rocewatch/sim/tenants.py), and whether the alerts that hit it
name the right victim and aggressor (rocewatch/alerting/interference.py).

A tenant cell lays its fabric out in pods of ``nodes_per_leaf`` nodes (two or more, so storms
spread through the spines to the other pod's leaves) and runs two jobs on every pod: team-a's
MoE job on three quarters of its nodes, a ring job on the last quarter (team-b's, or with
``same`` team-a's own). Each round adds a ``TenantIncast`` of the MoE job beside the round's
other faults, on a rail none of them uses.

>>> [j.name for j in tenant_jobs(8, 4, same=False)], tenant_jobs(8, 4, same=False)[1].nodes
(['moe-a', 'ring-b'], ('gpu-004', 'gpu-008'))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rocewatch.core.model import ECN_CONGESTION, QUEUE_BUILDUP, Alert
from rocewatch.evaluate.scoring import hits, late_window_ns
from rocewatch.sim.fabric import JobSpec, node_name
from rocewatch.sim.faults import TenantIncast

AGGRESSOR_JOB = "moe-a"
NAMES = ("victim_tenant", "aggressor_tenant")  # what the attribution is scored on
MAX_LISTED = 20


def tenant_jobs(nodes: int, nodes_per_leaf: int, same: bool) -> tuple[JobSpec, ...]:
    """The MoE job on three quarters of each pod, the ring on the last quarter."""
    names = [node_name(i) for i in range(nodes)]
    q = max(1, nodes_per_leaf // 4)
    ring = tuple(n for i, n in enumerate(names) if i % nodes_per_leaf >= nodes_per_leaf - q)
    a2a = tuple(n for n in names if n not in ring)
    return (
        JobSpec(AGGRESSOR_JOB, "team-a", a2a, traffic="moe"),
        JobSpec("ring-b", "team-a" if same else "team-b", ring, traffic="allreduce"),
    )


def tenant_incast(onset_s: float, duration_s: float) -> TenantIncast:
    """The round's incast: the MoE job into a leaf (drawn by the simulator) the ring crosses."""
    return TenantIncast(onset_s=onset_s, duration_s=duration_s, job=AGGRESSOR_JOB)


def attribution(truth: Mapping[str, Any], alerts: Sequence[Alert]) -> dict[str, Any]:
    """How the alerts that hit each ``TenantIncast`` name its victim and aggressor tenants:
    ``right`` when both equal the truth's (a missing aggressor equals a null one)."""
    late_ns = late_window_ns(truth)
    out: dict[str, Any] = {"faults": 0, "alerts": 0, "right": 0, "wrong": 0, "wrong_list": []}
    for f in truth.get("faults", []):
        if f.get("kind") != TenantIncast.kind:
            continue
        out["faults"] += 1
        want = {k: f.get(k) for k in NAMES}
        for a in alerts:
            if a.name not in (ECN_CONGESTION, QUEUE_BUILDUP) or not hits(a, f, late_ns):
                continue
            out["alerts"] += 1
            got = {k: a.annotations.get(k) for k in NAMES}
            if got == want:
                out["right"] += 1
                continue
            out["wrong"] += 1
            if len(out["wrong_list"]) < MAX_LISTED:
                out["wrong_list"].append(
                    {"fault": f["id"], "alert": dict(a.labels), "got": got, "want": want}
                )
    return out
