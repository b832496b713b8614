"""One fault, one page: simulated PFC storms that spread to the spines, replayed end to end.

A storm pauses its origin's leaf port, the spine ports facing that leaf and the other leaves'
uplinks: those queues stop sending, fill and mark every packet they take in, and the origin
itself falls silent (no ACK comes back: its requests time out, it sends nothing). Each of
those symptoms raises its own alert (ECNCongestion, TransportErrors, Straggler); the storm's
pause tree explains them, so they are stored in ``inhibited.jsonl`` with the storm as
``inhibited_by`` and the storm is the only page (its origin alert, its grouped victims).
Congestion that began before the storm is its own fault and is paged. Two independent storm
origins are both drained; a mass storm (a third of the nodes) drains none, and every refusal
names the guard that withheld it (docs/alerting.md, actions/policy.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rocewatch.config import Config
from rocewatch.core.model import parse_rfc3339
from rocewatch.core.topology import Topology
from rocewatch.replay import replay
from rocewatch.sim import EcnIncast, JobSpec, PfcStorm, SimConfig, write_scenario

pytestmark = pytest.mark.slow  # each case simulates a 16-node fabric and replays it

S = 1_000_000_000
HOLD_S = 25  # after a storm's end: its symptoms clear within the inhibit rules' hold (20 s)
SYMPTOMS = {"ECNCongestion", "QueueBuildup", "Straggler", "TransportErrors", "PortAnomaly"}

SCENARIOS: dict[str, SimConfig] = {
    # a NIC storm, and an incast into the same NIC that began 5 s before it
    "nic": SimConfig(
        nodes=16,
        nics_per_node=2,
        duration_s=50.0,
        seed=3,
        name="storm-spread-nic",
        faults=(
            EcnIncast(onset_s=15.0, duration_s=20.0, node="gpu-003", nic="mlx5_1"),
            PfcStorm(onset_s=20.0, duration_s=6.0, node="gpu-003", nic="mlx5_1"),
        ),
    ),
    # a leaf that pauses every port it has, read every second
    "switch": SimConfig(
        nodes=16,
        nics_per_node=2,
        duration_s=45.0,
        seed=4,
        name="storm-spread-switch",
        nic_interval_s=1.0,
        switch_interval_s=1.0,
        faults=(PfcStorm(onset_s=20.0, duration_s=8.0, origin="switch", switch="leaf-r0-p0"),),
    ),
    # two unrelated NIC storms on two leaves, seconds apart (16 nodes per rail)
    "two": SimConfig(
        nodes=16,
        nics_per_node=2,
        duration_s=45.0,
        seed=5,
        name="two-storms",
        faults=(
            PfcStorm(onset_s=20.0, duration_s=6.0, node="gpu-002", nic="mlx5_0"),
            PfcStorm(onset_s=23.0, duration_s=6.0, node="gpu-011", nic="mlx5_1"),
        ),
    ),
    # a third of the nodes storm at once (a bad firmware roll-out on the nodes between jobs):
    # a fabric event, whatever each origin looks like alone
    "mass": SimConfig(
        nodes=16,
        nics_per_node=2,
        duration_s=35.0,
        seed=6,
        name="mass-storm",
        jobs=(JobSpec("llm", "team-a", tuple(f"gpu-{i:03d}" for i in range(1, 11))),),
        faults=tuple(
            PfcStorm(
                onset_s=20.0 + 0.1 * k, duration_s=6.0, node=f"gpu-{i:03d}", nic=f"mlx5_{k % 2}"
            )
            for k, i in enumerate(range(11, 17))
        ),
    ),
}


class Run:
    """A scenario replayed: its truth, shown and inhibited alerts, actions and topology."""

    def __init__(self, root: Path, cfg: SimConfig) -> None:
        scen = write_scenario(cfg, root / "scenario")
        replay(scen, root / "out", Config())
        self.truth = json.loads((scen / "truth.json").read_text())
        self.topology = Topology.load(scen / "topology.yaml")
        self.alerts = _lines(root / "out" / "alerts.jsonl")
        self.inhibited = _lines(root / "out" / "inhibited.jsonl")
        self.actions = _lines(root / "out" / "actions.jsonl")

    def storms(self) -> list[dict[str, Any]]:
        return [f for f in self.truth["faults"] if f["alertname"] == "PFCStorm"]

    def storm_alerts(self, fault: dict[str, Any]) -> list[dict[str, Any]]:
        """The storm's own alerts: its origin's, and the victims' labelled with its origin."""
        name = _origin_name(fault)
        out = []
        for a in self.alerts:
            lb = a["labels"]
            if lb["alertname"] != "PFCStorm":
                continue
            victim = lb.get("role") == "victim" and lb.get("origin") == name
            origin = lb.get("role") == "origin" and all(
                lb.get(k) == v for k, v in fault["labels"].items()
            )
            if victim or origin:
                out.append(a)
        return out

    def during(self, fault: dict[str, Any]) -> list[dict[str, Any]]:
        """Shown alerts that began while the storm (and its symptoms' hold) lasted."""
        lo, hi = fault["onset_ns"] - S, fault["end_ns"] + HOLD_S * S
        return [a for a in self.alerts if lo <= parse_rfc3339(a["startsAt"]) <= hi]

    def spine_ports_facing(self, leaf: str) -> set[tuple[str, str]]:
        out = set()
        for a, b in self.topology.links:
            for mine, other in ((a, b), (b, a)):
                if mine.switch == leaf and other.switch.startswith("spine"):
                    out.add((other.switch, other.port))
        return out


def _lines(p: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def _origin_name(fault: dict[str, Any]) -> str:
    lb = fault["labels"]
    return f"{lb['node']}/{lb['nic']}" if "node" in lb else lb["switch"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    cache: dict[str, Run] = {}

    class Lazy(dict[str, Run]):
        def __missing__(self, key: str) -> Run:
            cache[key] = Run(tmp_path_factory.mktemp(key), SCENARIOS[key])
            self[key] = cache[key]
            return cache[key]

    return Lazy()


def _origin_leaf(run: Run, fault: dict[str, Any]) -> str:
    lb = fault["labels"]
    if "switch" in lb:
        return str(lb["switch"])
    port = run.topology.nics[(lb["node"], lb["nic"])].switch_port
    assert port is not None
    return port.switch


@pytest.mark.parametrize("case", ["nic", "switch"])
def test_a_storm_that_spreads_to_the_spines_is_one_page(runs: dict[str, Run], case: str) -> None:
    run = runs[case]
    (storm,) = run.storms()
    mine = run.storm_alerts(storm)
    origins = [a for a in mine if a["labels"]["role"] == "origin"]
    victims = [a for a in mine if a["labels"]["role"] == "victim"]
    assert len(origins) == 1 and len(victims) == 1, [a["labels"] for a in mine]
    # the victims grouped into that one alert reach the spine ports facing the origin's leaf
    spines = run.spine_ports_facing(_origin_leaf(run, storm))
    assert len(spines) == 4
    listed = victims[0]["annotations"]["victims"]
    assert all(f"{sw}/{port}" in listed for sw, port in spines), listed
    # nothing else was paged for it: no congestion, no silence, no fabric incident
    other_faults = [f for f in run.truth["faults"] if f["alertname"] != "PFCStorm"]
    others = []
    for a in run.during(storm):
        lb = a["labels"]
        # the incast's own alerts (the nic case: it began before the storm) are its pages
        if a in mine or any(
            all(lb.get(k) == v for k, v in m.items()) for f in other_faults for m in f["match"]
        ):
            continue
        others.append(lb)
    assert others == []


@pytest.mark.parametrize("case", ["nic", "switch"])
def test_congestion_on_paused_ports_and_the_origins_silence_are_inhibited_by_the_storm(
    runs: dict[str, Run], case: str
) -> None:
    run = runs[case]
    (storm,) = run.storms()
    storm_fps = {a["fingerprint"] for a in run.storm_alerts(storm)}
    start = min(parse_rfc3339(a["startsAt"]) for a in run.storm_alerts(storm))
    # the spine ports facing the paused leaf stopped sending, filled and marked: ECNCongestion
    # for each, stored inhibited by the storm
    congested = {
        (a["labels"]["switch"], a["labels"]["port"]): a
        for a in run.inhibited
        if a["labels"]["alertname"] == "ECNCongestion" and "switch" in a["labels"]
    }
    spines = run.spine_ports_facing(_origin_leaf(run, storm))
    assert spines <= set(congested), sorted(congested)
    for a in congested.values():
        assert a["annotations"]["inhibited_by"] in storm_fps
        assert parse_rfc3339(a["startsAt"]) >= start
    for a in run.inhibited:  # nothing else is inhibited: symptoms, and victims grouped
        lb = a["labels"]  # before their origin was named (the switch case, read every second)
        early = lb["alertname"] == "PFCStorm" and lb.get("origin") == "unknown"
        assert lb["alertname"] in SYMPTOMS or early, lb
        assert a["annotations"]["inhibited_by"] in storm_fps, lb
    if case == "nic":  # the origin's silence: its requests time out, it sends nothing
        lb = storm["labels"]
        silent = [
            a
            for a in run.inhibited
            if a["labels"].get("node") == lb["node"] and a["labels"].get("nic") == lb["nic"]
        ]
        assert "TransportErrors" in {a["labels"]["alertname"] for a in silent}
        assert all(a["annotations"]["inhibited_by"] in storm_fps for a in silent)


def test_congestion_that_began_before_the_storm_is_paged_not_inhibited(
    runs: dict[str, Run],
) -> None:
    run = runs["nic"]
    (incast,) = [f for f in run.truth["faults"] if f["alertname"] == "ECNCongestion"]
    (storm,) = run.storms()
    port = (incast["labels"]["switch"], incast["labels"]["port"])
    shown = [
        a
        for a in run.alerts
        if a["labels"]["alertname"] == "ECNCongestion"
        and (a["labels"].get("switch"), a["labels"].get("port")) == port
    ]
    assert shown, "the incast's congestion is paged"
    assert all("inhibited_by" not in a["annotations"] for a in shown)
    assert min(parse_rfc3339(a["startsAt"]) for a in shown) < storm["onset_ns"]
    # the port is in the storm's tree (the origin's leaf port): only its start keeps it apart
    assert not [
        a
        for a in run.inhibited
        if (a["labels"].get("switch"), a["labels"].get("port")) == port
        and a["labels"]["alertname"] == "ECNCongestion"
    ]


def test_two_independent_storm_origins_are_both_drained(runs: dict[str, Run]) -> None:
    run = runs["two"]
    storms = run.storms()
    assert len(storms) == 2
    for f in storms:
        assert len([a for a in run.storm_alerts(f) if a["labels"]["role"] == "origin"]) == 1
    drained = [
        a["node"]
        for a in run.actions
        if a["action"] == "drain" and not a["outcome"].startswith("refused")
    ]
    assert sorted(drained) == sorted(f["culprit_node"] for f in storms)


def test_a_mass_storm_drains_none_and_every_refusal_names_its_guard(runs: dict[str, Run]) -> None:
    run = runs["mass"]
    assert len(run.storms()) == 6  # a third of the 16 nodes
    drains = [a for a in run.actions if a["action"] == "drain"]
    assert drains, "the origins are drain candidates"
    for a in drains:
        assert a["outcome"].startswith("refused: "), a
        guard = a["outcome"].removeprefix("refused: ")
        assert guard in ("blast_radius", "fabric_incident"), a
        assert f"withheld by {guard}:" in a["reason"], a
    assert {a["node"] for a in drains} == {f["culprit_node"] for f in run.storms()}
