"""SlowRank and BusBandwidthDrop end to end: the simulator's jobs write NCCL Inspector output
consistent with their faults, replay reads ``nccl/<job>/``, and the alert names the rank, its
host, GPU and NIC, and its cause (a fabric alert on the rank's NIC, or the host side)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from detectors.bus_bandwidth_drop import BusBandwidthDropConfig
from detectors.slow_rank import HOST_SIDE, SlowRankConfig
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import Alert
from rocewatch.replay import replay
from rocewatch.sim import SlowGpu
from rocewatch.sim.scenarios import default_scenario, healthy_scenario
from rocewatch.sim.writers import write_scenario

pytestmark = pytest.mark.slow  # each simulates and replays a scenario (5-10 s)


def _alerts(out: Path) -> list[Alert]:
    path = out / "alerts.jsonl"
    return [Alert.from_json(json.loads(x)) for x in path.read_text().splitlines() if x]


def _truth(scen: Path, kind: str) -> dict[str, object]:
    truth = json.loads((scen / "truth.json").read_text())
    return next(f for f in truth["faults"] if f["kind"] == kind)


def test_pcie_downgrade_names_rank_host_nic_and_cause(tmp_path: Path) -> None:
    scen = write_scenario(
        default_scenario(nodes=8, duration_s=20, seed=3), tmp_path / "s", nccl=True
    )
    res = replay(scen, tmp_path / "out")
    fault = _truth(scen, "PcieDowngrade")
    node, nic = fault["labels"]["node"], fault["labels"]["nic"]  # type: ignore[index]
    slow = [a for a in _alerts(tmp_path / "out") if a.name == "SlowRank"]
    assert len(slow) == 1, [a.labels for a in slow]
    a = slow[0]
    assert (a.labels["node"], a.labels["nic"]) == (node, nic)
    # the rank is the GPU beside that NIC: rank = position of the node in its job x 8 + GPU
    gpu = int(nic.removeprefix("mlx5_"))  # type: ignore[union-attr]
    assert a.labels["gpu"] == str(gpu)
    job = a.labels["job"]
    topo_jobs = (scen / "topology.yaml").read_text()
    assert job in topo_jobs
    assert int(a.labels["rank"]) % 8 == gpu
    assert a.annotations["cause"] == "PCIeDowngrade"
    assert f"node={node}" in a.annotations["cause_alert"]
    assert "kernels started late" in a.annotations["evidence"]
    # it starts after the downgrade, on telemetry time, within a few seconds
    onset = int(fault["onset_ns"])  # type: ignore[call-overload]
    assert onset < a.starts_at < onset + 6_000_000_000
    # the job's collectives ran at the slow link's pace: its communicator's bus bandwidth fell
    drops = [a for a in _alerts(tmp_path / "out") if a.name == "BusBandwidthDrop"]
    assert [(d.labels["comm"], d.labels["job"]) for d in drops] == [(a.labels["comm"], job)]
    assert drops[0].annotations["cause"] == "PCIeDowngrade"
    assert "% lower" in drops[0].annotations["evidence"]
    # the other ranks of both jobs stay quiet; the skip counters saw nothing malformed
    assert not any(k.startswith("nccl_") for k in res.stats), res.stats


def test_slow_gpu_on_a_clean_fabric_is_the_host_side_and_drains_nothing(tmp_path: Path) -> None:
    cfg = healthy_scenario(nodes=4, duration_s=15, seed=2)
    cfg = dataclasses.replace(cfg, faults=(SlowGpu(onset_s=4.0, node="gpu-003", nic="mlx5_2"),))
    scen = write_scenario(cfg, tmp_path / "s", nccl=True)
    replay(scen, tmp_path / "out")
    alerts = _alerts(tmp_path / "out")
    slow = [a for a in alerts if a.name == "SlowRank"]
    assert [(a.labels["node"], a.labels["nic"], a.labels["gpu"]) for a in slow] == [
        ("gpu-003", "mlx5_2", "2")
    ]
    assert slow[0].annotations["cause"] == HOST_SIDE
    assert [a.name for a in alerts if a.name != "SlowRank"] == []  # no fabric alert at all
    actions = (tmp_path / "out" / "actions.jsonl").read_text().splitlines()
    assert actions == []  # SlowRank is not in the policy's drain_on: nothing drained
    assert _truth(scen, "SlowGpu")["alertname"] == "SlowRank"


def test_config_is_validated() -> None:
    with pytest.raises(ConfigError):
        SlowRankConfig(min_lag_us=0)
    with pytest.raises(ConfigError):
        BusBandwidthDropConfig(drop=1.0)


def test_a_storm_is_the_cause_of_the_jobs_nccl_alerts_which_do_not_page(tmp_path: Path) -> None:
    from rocewatch.sim import PfcStorm

    cfg = healthy_scenario(nodes=4, duration_s=15, seed=2)
    storm = PfcStorm(onset_s=7.0, duration_s=5.0, node="gpu-001", nic="mlx5_3")
    scen = write_scenario(dataclasses.replace(cfg, faults=(storm,)), tmp_path / "s", nccl=True)
    replay(scen, tmp_path / "out")
    alerts = _alerts(tmp_path / "out")
    assert any(a.name == "PFCStorm" for a in alerts)
    assert not [a for a in alerts if a.name in ("SlowRank", "BusBandwidthDrop")]
    held = [
        Alert.from_json(json.loads(x))
        for x in (tmp_path / "out" / "inhibited.jsonl").read_text().splitlines()
    ]
    drops = [a for a in held if a.name == "BusBandwidthDrop"]
    assert len(drops) == 1 and drops[0].annotations["cause"] == "PFCStorm"
    assert not [a for a in held if a.name == "SlowRank"]  # a storm makes no rank late
