"""Interference between tenants (rocewatch/alerting/interference.py): congestion alerts name who
suffers and who causes it, a tenant congesting only itself names no aggressor, and the pause
time each tenant suffered from others is stored for Grafana.

The end-to-end cases replay the simulator's ``TenantIncast`` (rocewatch/sim/tenants.py): team-a's
all-to-all fills the uplinks of the leaf that team-b's ring crosses; the same incast with the
ring in team-a's own hands. The unit cases feed NIC counters through the real window engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from detectors.windows import WindowEngine
from rocewatch.alerting.interference import (
    AGGRESSOR_JOB,
    AGGRESSOR_TENANT,
    VICTIM_JOB,
    VICTIM_PAUSE_S,
    VICTIM_TENANT,
    InterferenceAttributor,
    InterferenceConfig,
)
from rocewatch.config import Config
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import SAMPLE_SCHEMA, Finding, parse_rfc3339
from rocewatch.core.topology import Topology
from rocewatch.pipeline import Pipeline
from rocewatch.replay import replay
from rocewatch.sim import Simulator, write_scenario
from rocewatch.sim.scenarios import tenant_incast_scenario
from storage.store import Store
from tests.support.restart import restart_pipeline

S = 1_000_000_000
CONGESTION = {"ECNCongestion", "QueueBuildup"}
NAMES = (VICTIM_TENANT, VICTIM_JOB, AGGRESSOR_TENANT, AGGRESSOR_JOB)


# --- end to end: the simulated incast, replayed ---------------------------------------------------


class Replayed:
    def __init__(self, root: Path, same_tenant: bool) -> None:
        scen = write_scenario(
            tenant_incast_scenario(8, 12.0, 1 + same_tenant, same_tenant=same_tenant),
            root / "scenario",
        )
        self.store = Store(f"sqlite:///{root / 'rw.db'}")
        self.store.create_schema()
        replay(scen, root / "out", Config(), store=self.store)
        self.truth = json.loads((scen / "truth.json").read_text())
        self.alerts = [
            json.loads(x) for x in (root / "out" / "alerts.jsonl").read_text().splitlines()
        ]
        (self.fault,) = self.truth["faults"]

    def congestion(self) -> list[dict[str, Any]]:
        return [a for a in self.alerts if a["labels"]["alertname"] in CONGESTION]


@pytest.fixture(scope="module")
def cross(tmp_path_factory: pytest.TempPathFactory) -> Replayed:
    return Replayed(tmp_path_factory.mktemp("cross"), same_tenant=False)


@pytest.fixture(scope="module")
def same(tmp_path_factory: pytest.TempPathFactory) -> Replayed:
    return Replayed(tmp_path_factory.mktemp("same"), same_tenant=True)


@pytest.mark.slow
def test_an_incast_into_another_tenants_ring_names_both_tenants(cross: Replayed) -> None:
    f = cross.fault
    assert (f["victim_tenant"], f["aggressor_tenant"]) == ("team-b", "team-a")
    found = cross.congestion()
    # both kinds of congestion on the leaf's uplinks, and nothing else was paged
    assert {a["labels"]["alertname"] for a in found} == CONGESTION
    assert len(found) == len(cross.alerts)
    for a in found:
        assert a["labels"]["switch"] == f["labels"]["switch"]
        assert f["onset_ns"] <= parse_rfc3339(a["startsAt"]) <= f["end_ns"]
        assert {k: a["annotations"].get(k) for k in NAMES} == {k: f[k] for k in NAMES}, a
        # names are annotations: the alert's identity (labels) is the port's alone
        assert not set(NAMES) & set(a["labels"])
    # the victim's pause is credited once per step, to one alert of the incident
    assert sum(float(a["annotations"][VICTIM_PAUSE_S]) for a in found) > 0.05


@pytest.mark.slow
def test_the_same_incast_within_one_tenant_names_no_aggressor(same: Replayed) -> None:
    f = same.fault
    assert f["aggressor_tenant"] is None and f["victim_tenant"] == "team-a"
    found = same.congestion()
    assert {a["labels"]["alertname"] for a in found} == CONGESTION
    for a in found:
        ann = a["annotations"]
        assert ann[VICTIM_TENANT] == "team-a"
        assert AGGRESSOR_TENANT not in ann and AGGRESSOR_JOB not in ann
        assert VICTIM_PAUSE_S not in ann
    assert same.store.tenant_pause() == {}


@pytest.mark.slow
def test_the_pause_each_tenant_suffered_from_others_is_stored(cross: Replayed) -> None:
    stored = cross.store.tenant_pause()
    assert set(stored) == {("team-b", "team-a")}
    want = sum(float(a["annotations"][VICTIM_PAUSE_S]) for a in cross.congestion())
    assert stored[("team-b", "team-a")] == pytest.approx(want, abs=1e-6)


@pytest.mark.slow
def test_a_restart_mid_incast_keeps_attribution_and_pause_time() -> None:
    """A checkpoint taken while the incast's alerts fire, through the product's codec, restored
    into a pipeline built anew: the same alerts with the same names and pause totals as a run
    that never stopped."""
    sim = Simulator(tenant_incast_scenario(8, 10.0, 3))
    frames = list(sim.ticks())

    def run(stop_at_s: float | None) -> list[Any]:
        p = Pipeline(sim.topology, Config(), rollup_s=None)
        lateness = p.engine.lateness_ns()
        t0 = frames[0]["ts"].min()
        for f in frames:
            p.ingest(f)
            p.advance(int(f["ts"].max()) - lateness)  # type: ignore[arg-type]
            if stop_at_s is not None and f["ts"].max() - t0 >= stop_at_s * S:  # type: ignore[operator]
                firing = [
                    a for a in p.lifecycle.firing.values() if AGGRESSOR_TENANT in a.annotations
                ]
                assert firing, "the checkpoint is taken while attributed alerts fire"
                assert p.interference.open
                p = restart_pipeline(p)
                stop_at_s = None
        p.finish()
        return [(a.labels, a.annotations, a.starts_at, a.ends_at) for a in p.all_alerts()]

    whole = run(None)
    assert any(ann.get(AGGRESSOR_TENANT) == "team-a" for _, ann, _, _ in whole)
    assert run(6.5) == whole


# --- the attribution on NIC counters through the window engine ------------------------------------

TOPO = {
    "switches": [
        {"name": "leaf-0", "role": "leaf"},
        {"name": "leaf-1", "role": "leaf"},
        {"name": "spine-0", "role": "spine"},
    ],
    "links": [
        {"a": "leaf-0/Ethernet9", "b": "spine-0/Ethernet1"},
        {"a": "leaf-1/Ethernet9", "b": "spine-0/Ethernet2"},
    ],
    "nodes": [
        {
            "name": f"gpu-{i}",
            "nics": [{"nic": "mlx5_0", "switch_port": f"leaf-{(i - 1) // 3}/Ethernet{i}"}],
        }
        for i in range(1, 7)
    ],
    "jobs": [
        {"name": "a2a", "tenant": "team-a", "nodes": ["gpu-1", "gpu-2", "gpu-4", "gpu-5"]},
        {"name": "ring", "tenant": "team-b", "nodes": ["gpu-3", "gpu-6"]},
    ],
}


def engine_with(tx_gbs: dict[str, float], held: dict[str, float], seconds: int = 2) -> WindowEngine:
    """A window engine fed ``seconds`` of NIC counters (SAMPLE_SCHEMA, cumulative, 100 ms
    apart): each node's transmitted bytes at ``tx_gbs`` GB/s, its received pause at ``held``
    of the time, on priority 3."""
    eng = WindowEngine()
    rows = []
    for k in range(seconds * 10 + 1):
        ts = k * S // 10
        for i in range(1, 7):
            node = f"gpu-{i}"
            tx = int(k * tx_gbs.get(node, 0.0) * 1e8)
            pause = int(k * held.get(node, 0.0) * 1e5)
            rows.append((ts, node, "mlx5_0", "", "nic_tx_rdma_bytes", float(tx), tx))
            rows.append((ts, node, "mlx5_0", "3", "nic_rx_pause_us", float(pause), pause))
    eng.add(pl.DataFrame(rows, schema=SAMPLE_SCHEMA, orient="row"))
    for step in eng.close_until(seconds * S + S // 10):
        eng.enter(step)
    return eng


def finding(switch: str, port: str, name: str = "ECNCongestion") -> Finding:
    labels = {"switch": switch, "port": port, "queue": "3"}
    return Finding(name, labels, "warning", 2 * S, "congested", "marks")


def annotate(
    eng: WindowEngine, *found: Finding, config: InterferenceConfig | None = None
) -> list[dict[str, str]]:
    att = InterferenceAttributor(Topology.from_dict(TOPO), config)
    return [f.extra for f in att.annotate(eng, 2 * S, 0.1, list(found))]


def test_a_leaf_uplink_and_the_spine_port_beyond_it_name_the_sender_and_the_held_ring() -> None:
    eng = engine_with({"gpu-1": 45, "gpu-2": 45, "gpu-3": 5, "gpu-4": 1}, {"gpu-3": 0.1})
    up, spine = annotate(eng, finding("leaf-0", "Ethernet9"), finding("spine-0", "Ethernet2"))
    for ann in (up, spine):
        assert {k: ann.get(k) for k in NAMES} == {
            VICTIM_TENANT: "team-b",
            VICTIM_JOB: "ring",
            AGGRESSOR_TENANT: "team-a",
            AGGRESSOR_JOB: "a2a",
        }
    assert "95%" in up["interference"]  # 90 of the 95 GB/s below leaf-0
    # gpu-3 held 10 % of each 100 ms step: 10 ms, credited to the first alert only
    assert float(up[VICTIM_PAUSE_S]) == pytest.approx(0.01)
    assert float(spine[VICTIM_PAUSE_S]) == 0


def test_no_aggressor_without_a_held_job_of_another_tenant_or_a_dominant_sender() -> None:
    # the ring is not held: the a2a job congests itself
    (ann,) = annotate(
        engine_with({"gpu-1": 45, "gpu-2": 45, "gpu-3": 5}, {"gpu-1": 0.2}),
        finding("leaf-0", "Ethernet9"),
    )
    assert ann[VICTIM_JOB] == "a2a" and AGGRESSOR_JOB not in ann and VICTIM_PAUSE_S not in ann
    # nobody sends half the bytes: no aggressor either
    (ann,) = annotate(
        engine_with({"gpu-1": 10, "gpu-2": 10, "gpu-3": 18}, {"gpu-3": 0.1}),
        finding("leaf-0", "Ethernet9"),
        config=InterferenceConfig(min_share=0.6),
    )
    assert AGGRESSOR_TENANT not in ann
    # a downlink: the NIC's own job sends to it
    (ann,) = annotate(engine_with({"gpu-1": 45}, {"gpu-3": 0.1}), finding("leaf-0", "Ethernet3"))
    assert ann[VICTIM_JOB] == "ring" and AGGRESSOR_JOB not in ann


def test_other_alerts_pass_untouched_and_bad_settings_are_refused() -> None:
    eng = engine_with({"gpu-1": 45}, {"gpu-3": 0.1})
    storm = Finding("PFCStorm", {"node": "gpu-3", "nic": "mlx5_0"}, "critical", 2 * S, "s", "e")
    nic = Finding("ECNCongestion", {"node": "gpu-3", "nic": "mlx5_0"}, "warning", 2 * S, "s", "e")
    assert annotate(eng, storm, nic) == [{}, {}]
    for bad in ({"window_s": 0}, {"min_share": 1.5}, {"min_pause_share": -1}):
        with pytest.raises(ConfigError):
            InterferenceConfig(**bad)  # type: ignore[arg-type]


# --- the evaluation matrix ----------------------------------------------------------------------


def test_the_matrix_has_cells_where_storms_cross_the_spines_and_tenants_interfere() -> None:
    from rocewatch.evaluate import MATRIX, cell_config

    cells = {c.tenants: c for c in MATRIX if c.tenants}
    assert set(cells) == {"other", "same"}
    for c in cells.values():
        assert c.nodes // c.nodes_per_leaf >= 2  # two pods: a storm spreads to the other's leaves
        cfg = cell_config(c)
        kinds = [f.kind for f in cfg.faults]
        assert kinds.count("TenantIncast") == c.rounds and kinds.count("PfcStorm") >= c.rounds
        truth = Simulator(cfg).truth()
        incasts = [f for f in truth["faults"] if f["kind"] == "TenantIncast"]
        tenant = {"other": "team-b", "same": "team-a"}[c.tenants]
        assert {f["victim_tenant"] for f in incasts} == {tenant}
        assert {f["aggressor_tenant"] for f in incasts} == {
            "team-a" if c.tenants == "other" else None
        }
        # each storm of the cell pauses ports of both pods' leaves (through the spines)
        for f in truth["faults"]:
            if f["kind"] == "PfcStorm" and "node" in f["labels"]:
                pods = {v["switch"][-2:] for v in f["victims"] if "switch" in v}
                assert {"p0", "p1"} <= pods, f["id"]


def test_the_attribution_score_counts_right_and_wrong_names() -> None:
    from rocewatch.core.model import Alert
    from rocewatch.evaluate.tenants import attribution

    t0 = 1_795_946_400 * S
    fault = {
        "id": "TenantIncast-1", "kind": "TenantIncast", "alertname": "ECNCongestion",
        "also": ["QueueBuildup"], "labels": {"switch": "leaf-0", "port": "e1", "queue": "3"},
        "match": [{"switch": "leaf-0"}], "onset_ns": t0 + 10 * S, "end_ns": t0 + 20 * S,
        "victim_tenant": "team-b", "aggressor_tenant": "team-a",
    }  # fmt: skip
    truth = {"start_ns": t0, "faults": [fault]}

    def alert(name: str, **ann: str) -> Alert:
        return Alert({"alertname": name, "switch": "leaf-0", "port": "e1"}, ann, t0 + 12 * S)

    right = alert("ECNCongestion", victim_tenant="team-b", aggressor_tenant="team-a")
    wrong = alert("QueueBuildup", victim_tenant="team-a")  # no aggressor named
    other = alert("FlakyLink", victim_tenant="x")  # not a congestion alert: not scored
    got = attribution(truth, [right, wrong, other])
    assert (got["faults"], got["alerts"], got["right"], got["wrong"]) == (1, 2, 1, 1)
    assert got["wrong_list"][0]["got"] == {"victim_tenant": "team-a", "aggressor_tenant": None}
