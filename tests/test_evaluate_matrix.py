"""`rocewatch evaluate --matrix`: a tiny matrix end to end, the cells' cadences, the scoring of
grouped and inhibited alerts and the detection bound (docs/evaluation.md)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import polars as pl
import pytest

from rocewatch.core.model import Alert
from rocewatch.evaluate import MATRIX, Cell, cell_config, late_bound, run_matrix, score_run
from rocewatch.sim import Simulator, config_from_dict, config_to_dict

S = 1_000_000_000
T0 = 1_795_946_400 * S
CELL_KEYS = {
    "name", "nic_interval_s", "switch_interval_s", "link_gbps", "buffer_mb", "naming", "nodes",
    "magnitude", "kinds", "healthy_alerts", "wrong_drains", "late",
}  # fmt: skip
KIND_KEYS = {"faults", "precision", "recall", "ttd_median_s", "ttd_p95_s"}
TOP_KEYS = {"cells", "worst_precision", "worst_recall", "healthy_alerts", "wrong_drains", "late"}
ALL_KINDS = {
    "PFCStorm", "FlakyLink", "PCIeDowngrade", "ECNCongestion", "QueueBuildup",
    "TransportErrors", "Straggler",
}  # fmt: skip

# test-sized cells: one round each (one fault of every kind), a few small nodes
TINY = (
    Cell("tiny-sonic-500ms-1s", 0.5, 1.0, 400, 32, "sonic", 4, "severe", 11, rounds=1,
         nics_per_node=2),
    Cell("tiny-healthy-cumulus-1s", 1.0, 1.0, 200, 16, "cumulus", 4, "healthy", 12, rounds=1,
         nics_per_node=2),
)  # fmt: skip


@pytest.mark.slow  # two simulated fabrics replayed end to end: ~10 s
def test_tiny_matrix_reports_every_key() -> None:
    seen: list[str] = []
    rep = run_matrix(TINY, progress=lambda n, total, c: seen.append(c["name"]))
    assert set(rep) >= TOP_KEYS
    assert sorted(seen) == sorted(c.name for c in TINY)
    assert [c["name"] for c in rep["cells"]] == [c.name for c in TINY]
    faulty, healthy = rep["cells"]
    for c in rep["cells"]:
        assert set(c) >= CELL_KEYS, c["name"]
        for key in ("healthy_alerts", "wrong_drains", "late"):
            assert isinstance(c[key], int)
    assert set(faulty["kinds"]) == ALL_KINDS  # one fault of each kind, each scored
    for kind, k in faulty["kinds"].items():
        assert set(k) >= KIND_KEYS, kind
        assert k["faults"] == 1 and 0.0 <= k["recall"] <= 1.0
    assert faulty["nic_interval_s"] == 0.5 and faulty["naming"] == "sonic"
    assert healthy["kinds"] == {} and healthy["magnitude"] == "healthy"
    for key in ("healthy_alerts", "wrong_drains", "late"):
        assert rep[key] == sum(c[key] for c in rep["cells"])
    precisions = [k["precision"] for k in faulty["kinds"].values() if k["precision"] is not None]
    assert rep["worst_precision"] == min(precisions)
    assert rep["worst_recall"] == min(k["recall"] for k in faulty["kinds"].values())
    assert rep["generated"]["date"] and rep["runtime_s"] > 0


@pytest.mark.parametrize("cell", [MATRIX[2], MATRIX[6]], ids=lambda c: c.name)
def test_a_cells_recording_has_the_cells_cadences(cell: Cell) -> None:
    """Observed median intervals per source are what the cell says (first 25 s of a smaller
    copy of the cell: the cadences do not depend on the size)."""
    small = dataclasses.replace(cell, nodes=4, nics_per_node=2)
    cfg = dataclasses.replace(cell_config(small), duration_s=25.0, faults=())
    df = pl.concat(list(Simulator(cfg).ticks()))
    key = ["device", "port", "qual", "metric"]

    def median_dt(metric: str) -> float:
        d = (
            df.filter(pl.col("metric") == metric)
            .sort([*key, "ts"])
            .with_columns(pl.col("ts").diff().over(key).alias("dt"))
        )
        return float(np.median(d["dt"].drop_nulls().to_numpy())) / S

    assert median_dt("nic_tx_bytes") == pytest.approx(cell.nic_interval_s, rel=0.05)
    assert median_dt("pfc_rx_pause_us") == pytest.approx(cell.switch_interval_s, rel=0.05)
    gauges = cell.gauge_interval_s or cell.switch_interval_s
    assert median_dt("queue_depth_bytes") == pytest.approx(gauges, rel=0.05)
    assert all(cfg.naming == cell.naming and cfg.link_gbps == cell.link_gbps for _ in (0,))


def test_the_matrix_covers_what_production_varies() -> None:
    assert {c.nic_interval_s for c in MATRIX} >= {0.1, 0.5, 1.0, 2.0}
    assert {c.switch_interval_s for c in MATRIX} >= {0.1, 1.0, 5.0}
    assert {c.link_gbps for c in MATRIX} == {100, 200, 400, 800}
    assert {c.naming for c in MATRIX} == {"openconfig", "cumulus", "sonic"}
    assert {c.magnitude for c in MATRIX} == {"mild", "middling", "severe", "healthy"}
    assert min(c.buffer_mb for c in MATRIX) == 16 and max(c.buffer_mb for c in MATRIX) == 64
    assert max(c.nodes for c in MATRIX) == 128 and min(c.nodes for c in MATRIX) == 16
    for cell in MATRIX:  # scenario.json reads back to the very run
        c = cell_config(cell)
        assert config_from_dict(json.loads(json.dumps(config_to_dict(c)))) == c, cell.name
    cfg = cell_config(MATRIX[0])
    kinds: dict[str, int] = {}
    for f in Simulator(dataclasses.replace(cfg, duration_s=cfg.duration_s)).truth()["faults"]:
        kinds[f["alertname"]] = kinds.get(f["alertname"], 0) + 1
    assert set(kinds) == ALL_KINDS and min(kinds.values()) >= 5


# --- scoring -------------------------------------------------------------------------------


def _alert(name: str, at_s: float, annotations: dict[str, str] | None = None, **lb: str) -> Alert:
    return Alert({"alertname": name, **lb}, annotations or {}, starts_at=T0 + round(at_s * S))


def _truth() -> dict[str, Any]:
    leaf_storm = {
        "id": "PfcStorm-1",
        "kind": "PfcStorm",
        "alertname": "PFCStorm",
        "also": [],
        "labels": {"switch": "leaf-r1-p0"},
        "match": [{"switch": "leaf-r1-p0"}],
        "onset_ns": T0 + 10 * S,
        "end_ns": T0 + 16 * S,
        "culprit_node": None,
        "victims": [{"node": "gpu-001", "nic": "mlx5_1"}, {"switch": "spine-0", "port": "swp2"}],
        "details": {"origin": "switch"},
    }
    strag = {
        "id": "Straggler-1",
        "kind": "Straggler",
        "alertname": "Straggler",
        "also": [],
        "labels": {"node": "gpu-004", "nic": "mlx5_0"},
        "match": [{"node": "gpu-004", "nic": "mlx5_0"}, {"node": "gpu-004"}],
        "onset_ns": T0 + 30 * S,
        "end_ns": T0 + 60 * S,
        "culprit_node": "gpu-004",
        "victims": [],
    }
    return {
        "start_ns": T0, "end_ns": T0 + 90 * S, "faults": [leaf_storm, strag], "not_faults": [],
        "sampling": {
            "nic_interval_s": 2.0, "switch_interval_s": 1.0, "gauge_interval_s": 1.0,
            "lost": {"nic": {"gpu-004/mlx5_0": [T0 + 31 * S, T0 + 35 * S, T0 + 80 * S]},
                     "switch": {}, "gauge": {}},
        },
    }  # fmt: skip


def test_grouped_storm_alerts_and_inhibited_ones() -> None:
    members = '[{"port":"swp3","switch":"leaf-r1-p0"},{"port":"swp9","switch":"leaf-r1-p0"}]'
    alerts = [
        # one origin alert for the switch, labelled with a representative port: a hit
        _alert("PFCStorm", 11.0, {"ports": "swp3, swp9", "members": members},
               switch="leaf-r1-p0", port="swp3", role="origin"),
        # one victim alert for the storm, represented by a spine port: neutral
        _alert("PFCStorm", 11.5, {"victims": "gpu-001/mlx5_1, spine-0/swp2"},
               switch="spine-0", port="swp2", role="victim", origin="leaf-r1-p0"),
        # a victim alert naming none of the storm's victims but its origin: neutral too
        _alert("PFCStorm", 12.0, {}, node="gpu-002", nic="mlx5_1", role="victim",
               origin="leaf-r1-p0"),
        # an origin alert for a victim: a false positive
        _alert("PFCStorm", 11.0, {}, node="gpu-001", nic="mlx5_1", role="origin"),
        _alert("Straggler", 40.0, {}, node="gpu-004"),
        _alert("FabricIncident", 3.0, {}, scope="fabric"),  # before the first fault
    ]  # fmt: skip
    inhibited = [_alert("Straggler", 12.0, {"inhibited_by": "x"}, node="gpu-001")]
    r = score_run(_truth(), alerts, [], inhibited)
    assert r.detected == {"PfcStorm-1": True, "Straggler-1": True}
    assert r.tp == {"PFCStorm": 1, "Straggler": 1} and r.fp == {"PFCStorm": 1}
    assert r.neutral == 2 and r.inhibited == 1
    assert r.healthy_alerts == 1  # the incident before the first fault
    # a grouped origin alert names its device's ports in `ports` only: still a hit
    only_ports = _alert("PFCStorm", 11.0, {"ports": "swp3"}, switch="leaf-r1-p0", role="origin")
    assert score_run(_truth(), [only_ports], []).detected["PfcStorm-1"]


def test_late_bound_by_source_and_lost_readings() -> None:
    truth = _truth()
    storm, strag = truth["faults"]
    # a switch's storm: both sides see it, the faster (switch counters, 1 s) sets 2.5 s
    assert late_bound(storm, truth) == pytest.approx(2.5)
    # a straggler needs its NIC (2 s): max(10 s, 6 s), plus one interval for each of its
    # readings lost inside the bound (31 s and 35 s; not the one at 80 s)
    assert late_bound(strag, truth) == pytest.approx(14.0)
    dark = dict(storm, labels={"node": "gpu-009", "nic": "mlx5_0"}, details={"agent": False})
    assert late_bound(dark, truth) == pytest.approx(2.5)  # only the switch sees a dark origin
    lit = dict(dark, details={"agent": True})
    truth["sampling"]["switch_interval_s"] = 5.0
    assert late_bound(lit, truth) == pytest.approx(5.0)  # its own agent at 2 s
    alerts = [_alert("Straggler", 45.0, {}, node="gpu-004")]  # 15 s after onset: late
    r = score_run(_truth(), alerts, [])
    assert r.late == ["Straggler-1"] and r.bound_s["Straggler-1"] == 14.0


def test_a_flaps_only_link_is_timed_from_its_second_link_down() -> None:
    truth = _truth()
    flaps = [{"down_ns": (30 + 13 * k) * S, "up_ns": (31 + 13 * k) * S} for k in range(3)]
    cable = {
        "id": "FlakyLink-1",
        "alertname": "FlakyLink",
        "onset_ns": 30 * S,
        "end_ns": 70 * S,
        "labels": {"node": "gpu-004", "nic": "mlx5_0"},
        "match": [{"node": "gpu-004"}],
        "details": {"flaps": flaps, "errors": False},
    }
    truth["sampling"]["lost"] = {}
    # its NIC at 2 s: max(10 s, 6 s), from the second down 13 s after onset
    assert late_bound(cable, truth) == pytest.approx(23.0)
    # the same cable with errors (or a BER rise) is a fault from its onset
    noisy = dict(cable, details={"flaps": flaps})
    assert late_bound(noisy, truth) == pytest.approx(10.0)
