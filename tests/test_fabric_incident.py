"""FabricIncident from the detectors: firing alerts grouped per scope; the policy honours it."""

from __future__ import annotations

from typing import Any

from actions import DrainPolicy, PolicyConfig
from detectors.base import Finding, StepContext
from detectors.fabric_incident import FabricIncidentConfig, FabricIncidentDetector
from detectors.lifecycle import AlertLifecycle
from detectors.registry import ALERTNAMES, DETECTORS
from rocewatch.core.model import Alert
from rocewatch.core.topology import Topology
from tests.support.restart import restart_part

T0 = 1_795_946_400_000_000_000
S = 1_000_000_000
STEP = S // 10
LEAVES = 4  # per rail
PER_LEAF = 8


def topology() -> Topology:
    """32 nodes; NIC mlx5_<r> is on rail r, cabled to leaf-r<r>-<i // 8>; one job of 12 nodes."""
    n = LEAVES * PER_LEAF
    return Topology.from_dict(
        {
            "switches": [
                {"name": f"leaf-r{r}-{k}", "role": "leaf", "rail": r}
                for r in (0, 1)
                for k in range(LEAVES)
            ],
            "nodes": [
                {
                    "name": f"gpu-{i:02d}",
                    "nics": [
                        {"nic": f"mlx5_{r}", "switch_port": f"leaf-r{r}-{i // PER_LEAF}/Eth{i}"}
                        for r in (0, 1)
                    ],
                }
                for i in range(n)
            ],
            "jobs": [{"name": "llm", "nodes": [f"gpu-{i:02d}" for i in range(12)]}],
        }
    )


TOPO = topology()
# two NICs on each rail-0 leaf: no switch holds 3, the rail holds 8
SPREAD = [k * PER_LEAF + j for k in range(LEAVES) for j in (0, 1)]


def transport(i: int, r: int = 0) -> Finding:
    return Finding(
        "TransportErrors",
        {"node": f"gpu-{i:02d}", "nic": f"mlx5_{r}", "rail": str(r)},
        "critical",
        T0,
        summary="retransmits",
        evidence="x",
    )


def run(
    steps: list[list[Finding]], cut: int | None = None, after: FabricIncidentConfig | None = None
) -> tuple[list[Alert], AlertLifecycle]:
    """The pipeline's per-step order: the rule alerts first, then fabric_incident reads them.
    With ``cut``, stopped before that step and started again as the service does: the
    lifecycle's and the detector's state through the product's checkpoint codec, laid over
    ones built anew (the detector from ``after``, the configuration it restarts with)."""
    life = AlertLifecycle()
    det = FabricIncidentDetector(TOPO)
    events: list[Alert] = []
    for k, findings in enumerate(steps):
        if k == cut:
            life = restart_part(life, AlertLifecycle())
            det = restart_part(det, FabricIncidentDetector(TOPO, after or det.config))
        end = T0 + (k + 1) * STEP
        ctx = StepContext(
            engine=None,  # type: ignore[arg-type]
            topology=TOPO,
            start=end - STEP,
            end=end,
            firing=lambda life=life: [a.labels for a in life.firing.values()],
        )
        events += life.update("transport_errors", end, findings)
        events += life.update(det.name, end, det.evaluate(ctx))
    return events, life


def incidents(events: list[Alert]) -> list[Alert]:
    return [a for a in events if a.name == "FabricIncident"]


def test_registered_before_isolation_forest() -> None:
    names = list(DETECTORS)
    assert names.index("fabric_incident") == names.index("isolation_forest") - 1
    assert ALERTNAMES["fabric_incident"] == "FabricIncident"


def test_eight_nics_of_one_rail_make_one_rail_incident() -> None:
    findings = [transport(i) for i in SPREAD]
    events, _ = run([findings] * 3)
    inc = incidents(events)
    assert len(inc) == 1
    a = inc[0]
    assert a.labels == {
        "alertname": "FabricIncident",
        "severity": "critical",
        "scope": "rail:0",
        "source": "detector",
    }
    assert a.starts_at == T0 + STEP and a.ends_at == 0
    assert "TransportErrors: 8 nics of 32" in a.annotations["evidence"]
    assert "gpu-00/mlx5_0" in a.annotations["evidence"]
    assert "withheld" in a.annotations["summary"]
    # the per-entity alerts fire as they would alone, labels untouched
    te = [a for a in events if a.name == "TransportErrors"]
    assert len(te) == 8 and all(a.ends_at == 0 for a in te)
    assert {a.labels["node"] for a in te} == {f"gpu-{i:02d}" for i in SPREAD}
    assert all("scope" not in a.labels for a in te)
    # when the storm stops, the incident resolves with its members
    later, _ = run([findings] * 3 + [[]] * 25)
    assert [a.ends_at > 0 for a in incidents(later)] == [False, True]


def test_a_checkpoint_taken_mid_incident_carries_on() -> None:
    """Stopped while the rail incident fires and started again from the state through the
    codec: no second incident, the same one (same startsAt) resolving with its members when
    the uninterrupted one does."""
    findings = [transport(i) for i in SPREAD]
    steps = [findings] * 6 + [[]] * 25
    whole, _ = run(steps)
    assert [a.status for a in incidents(whole)] == ["firing", "resolved"]
    cut, life = run(steps, cut=4)
    assert [a.to_json() for a in cut] == [a.to_json() for a in whole]
    assert not life.firing


def test_a_restored_incident_detector_takes_todays_thresholds() -> None:
    """Restarted mid-incident with thresholds the 8 NICs no longer reach (10 entities, half
    the rail): today's configuration applies at once, and the incident that was open (the
    same alert) resolves; the member alerts go on."""
    findings = [transport(i) for i in SPREAD]
    higher = FabricIncidentConfig(min_entities=10, min_share=0.5)
    events, life = run([findings] * 20, cut=4, after=higher)
    inc = incidents(events)
    assert [a.status for a in inc] == ["firing", "resolved"]
    assert inc[1].fingerprint == inc[0].fingerprint and inc[1].starts_at == inc[0].starts_at
    assert len([a for a in life.firing.values() if a.name == "TransportErrors"]) == 8
    # the same steps without the restart keep the incident open
    events, _ = run([findings] * 20)
    assert [a.status for a in incidents(events)] == ["firing"]


def test_two_alerts_make_no_incident() -> None:
    events, _ = run([[transport(0), transport(8)]] * 3)
    assert incidents(events) == []
    assert len(events) == 2


def test_narrowest_scope_only() -> None:
    # 6 NICs on one leaf: that switch holds the group; rail and fabric are not raised too
    events, _ = run([[transport(i) for i in range(6)]] * 2)
    assert [a.labels["scope"] for a in incidents(events)] == ["switch:leaf-r0-0"]


def test_victims_and_anomalies_are_not_members() -> None:
    def victim(i: int) -> Finding:
        labels = {"node": f"gpu-{i:02d}", "nic": "mlx5_0", "priority": "3", "role": "victim"}
        return Finding("PFCStorm", labels, "warning", T0, summary="paused", evidence="x")

    def anomaly(i: int) -> Finding:
        labels = {"node": f"gpu-{i:02d}", "nic": "mlx5_1"}
        return Finding("PortAnomaly", labels, "warning", T0, summary="odd", evidence="x")

    events, _ = run([[victim(i) for i in range(20)] + [anomaly(i) for i in range(20)]] * 2)
    assert incidents(events) == []


def test_no_firing_callable_is_skipped() -> None:
    ctx = StepContext(engine=None, topology=TOPO, start=T0, end=T0 + STEP)  # type: ignore[arg-type]
    assert FabricIncidentDetector(TOPO).evaluate(ctx) == []


# --- the policy honours a detector FabricIncident ------------------------------------------------


def storm(node: str, t: int) -> Alert:
    labels = {"alertname": "PFCStorm", "severity": "critical", "node": node}
    labels.update(nic="mlx5_0", priority="3", role="origin")
    return Alert(labels, {}, starts_at=t)


def incident(scope: str, t: int, ends: int = 0) -> Alert:
    labels = {"alertname": "FabricIncident", "severity": "critical", "scope": scope}
    labels["source"] = "detector"
    return Alert(labels, {}, starts_at=t, ends_at=ends)


def outcomes(actions: list[Any]) -> list[tuple[str, str, str]]:
    return [(a.action, a.node, a.outcome) for a in actions]


def test_policy_withholds_drains_inside_a_detector_incident() -> None:
    p = DrainPolicy(PolicyConfig(), TOPO)
    p.on_alert(incident("switch:leaf-r0-0", T0), T0)
    p.on_alert(storm("gpu-01", T0), T0)  # cabled to leaf-r0-0: inside
    p.on_alert(storm("gpu-20", T0), T0)  # leaf-r0-2: outside
    acts, incs = p.tick(T0 + 1 * S)
    assert acts == [] and incs == []  # hold-down
    acts, incs = p.tick(T0 + 2 * S)
    assert sorted(outcomes(acts)) == [
        ("drain", "gpu-01", "refused: fabric_incident"),
        ("drain", "gpu-20", "dry-run"),
    ]
    assert incs == []  # the detector's incident already says why; the policy adds none
    assert "switch:leaf-r0-0" in next(a for a in acts if a.node == "gpu-01").reason
    # a second culprit on the same node while the incident fires: still one refusal per node
    second = storm("gpu-01", T0 + 2 * S)
    second.labels["nic"] = "mlx5_1"
    second = Alert(second.labels, {}, starts_at=T0 + 2 * S)
    p.on_alert(second, T0 + 2 * S)
    for k in range(3, 8):
        acts, _ = p.tick(T0 + k * S)
        assert acts == []
    assert "gpu-01" not in p.drained()
    # the incident resolves: the drain is reconsidered and goes ahead
    p.on_alert(incident("switch:leaf-r0-0", T0, ends=T0 + 8 * S), T0 + 8 * S)
    acts, _ = p.tick(T0 + 8 * S)
    assert outcomes(acts) == [("drain", "gpu-01", "dry-run")]
    assert set(p.drained()) == {"gpu-01", "gpu-20"}


def test_policy_incident_scopes() -> None:
    p = DrainPolicy(PolicyConfig(), TOPO)
    assert p._in_scope("gpu-03", "fabric")
    assert p._in_scope("gpu-03", "job:llm") and not p._in_scope("gpu-20", "job:llm")
    assert p._in_scope("gpu-20", "rail:1") and not p._in_scope("gpu-20", "rail:7")
    assert p._in_scope("gpu-20", "switch:leaf-r1-2")
    assert not p._in_scope("gpu-20", "switch:leaf-r1-0")


def test_policy_state_keeps_detector_incidents() -> None:
    p = DrainPolicy(PolicyConfig(), TOPO)
    p.on_alert(incident("fabric", T0), T0)
    p.on_alert(storm("gpu-05", T0), T0)
    assert outcomes(p.tick(T0 + 2 * S)[0]) == [("drain", "gpu-05", "refused: fabric_incident")]
    q = DrainPolicy(PolicyConfig(), TOPO)
    q.restore(p.state())
    assert q.tick(T0 + 3 * S)[0] == []  # still withheld, not recorded again
    q.on_alert(incident("fabric", T0, ends=T0 + 4 * S), T0 + 4 * S)
    assert outcomes(q.tick(T0 + 4 * S)[0]) == [("drain", "gpu-05", "dry-run")]
