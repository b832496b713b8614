"""The simulator's RoCE configuration: a correct fabric passes ``rocewatch check roce``; each
configuration fault makes exactly its check fire, naming the faulted end, and the command exit 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rocewatch.cli import main
from rocewatch.roce.report import check_dir
from rocewatch.sim import SimConfig, write_scenario
from rocewatch.sim.fabric import Fabric
from rocewatch.sim.roce_config import CONFIG_FAULTS, ConfigFault, parse_fault, write_roce_config
from rocewatch.sim.scenarios import demo_scenario


def config_dir(tmp: Path, cfg: SimConfig, faults: list[ConfigFault] | None = None) -> Path:
    """A recorded directory of ``cfg``'s fabric: topology and configuration (no telemetry)."""
    fab = Fabric(cfg)
    (tmp / "topology.yaml").write_text(yaml.safe_dump(fab.topology_dict(), sort_keys=False))
    write_roce_config(tmp, cfg, faults or [], fabric=fab)
    return tmp


@pytest.mark.parametrize("naming", ["openconfig", "cumulus", "sonic"])
def test_the_simulated_fabric_is_correct_by_default(tmp_path: Path, naming: str) -> None:
    res = check_dir(config_dir(tmp_path, SimConfig(nodes=16, naming=naming)))
    assert res["findings"] == []
    assert res["unknown_ends"] == 0 and res["skipped"] == {}
    nic = next(r for r in res["rows"] if r["device"] == "gpu-001" and r["port"] == "mlx5_0")
    assert (nic["trust"], nic["pfc"], nic["mtu"], nic["gid"]) == ("dscp", "3", "9000", "v2")
    port = next(r for r in res["rows"] if r["device"] == "spine-0")
    assert (port["pfc"], port["ecn"], port["mtu"]) == ("3", "153600/1536000", "9216")


@pytest.mark.slow  # the demo's 64-node topology.yaml takes PyYAML ~2 s to load
def test_check_roce_on_the_demo_fabric_reports_no_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = config_dir(tmp_path, demo_scenario())
    assert main(["check", "roce", str(d), "--no-table"]) == 0
    out = capsys.readouterr().out
    assert "0 errors, 0 warnings" in out


@pytest.mark.parametrize("kind", sorted(CONFIG_FAULTS))
def test_each_configuration_fault_is_exactly_its_finding(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    d = config_dir(tmp_path, SimConfig(nodes=16, seed=3), [ConfigFault(kind)])
    truth = json.loads((d / "config_truth.json").read_text())["config_faults"]
    assert len(truth) == 1 and truth[0]["kind"] == kind and truth[0]["check"] == CONFIG_FAULTS[kind]
    target = truth[0]["target"]
    assert main(["check", "roce", str(d), "--json"]) == 1
    res = json.loads(capsys.readouterr().out)
    assert res["findings"], kind
    for f in res["findings"]:
        assert (f["check"], f["severity"]) == (CONFIG_FAULTS[kind], "error"), f
        assert len(f["ends"]) == 2
        assert any(e == target or e.startswith(target + "/") for e in f["ends"]), (target, f)
        assert f["ends"][0] in f["message"] and f["ends"][1] in f["message"]
    if kind in ("nic_pcp_trust", "no_roce_v2_gid", "uplink_mtu"):
        assert len(res["findings"]) == 1  # one end faulted: one cable


def test_simulate_writes_the_configuration_and_its_faults(tmp_path: Path) -> None:
    """``rocewatch simulate`` (write_scenario's hook) writes a correct configuration; its
    ``--config-fault`` puts the faults in."""
    out = write_scenario(SimConfig(nodes=2, nics_per_node=2, spines=2, duration_s=0.3), tmp_path)
    assert (out / "nic_config.jsonl").exists() and (out / "switch_config.jsonl").exists()
    assert check_dir(out)["findings"] == []
    d2 = tmp_path / "faulted"
    argv = ["simulate", str(d2), "--nodes", "2", "--duration", "0.3", "--scenario", "healthy"]
    assert main([*argv, "--config-fault", "uplink_mtu=leaf-r1-p0/Ethernet2/2"]) == 0
    found = check_dir(d2)["findings"]
    assert [(f["check"], f["ends"]) for f in found] == [
        ("mtu", ["leaf-r1-p0/Ethernet2/2", "spine-1/Ethernet1/2"])
    ]


def test_unknown_fault_or_target_is_refused() -> None:
    from rocewatch.core.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown configuration fault"):
        parse_fault("pfc_everywhere")
    with pytest.raises(ConfigError, match="not in the simulated fabric"):
        write_roce_config(Path("/nonexistent"), SimConfig(nodes=2), [parse_fault("spine_no_ecn=x")])
