"""``rocewatch check roce DIR`` on a recorded directory of real-format inputs: a Cumulus leaf
(NVUE JSON), a SONiC spine (CONFIG_DB over gNMI) and a NIC snapshot."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from collector.nic.roce_config import read_snapshot
from rocewatch.cli import main
from rocewatch.roce.report import check_dir, format_findings

FIX = Path(__file__).parent / "fixtures" / "roce_config"
TS = 1795946400000000000


def tools(argv: list[str]) -> str | None:
    if argv[:2] == ["dcb", "-j"] and (FIX / "dcb" / f"{argv[2]}.json").exists():
        return (FIX / "dcb" / f"{argv[2]}.json").read_text()
    if argv[:3] == ["ethtool", "--json", "-a"]:
        return (FIX / "ethtool" / "a.json").read_text()
    return None


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    """h100-0012/mlx5_0 -> leaf-01/swp13 (Cumulus, NVUE); leaf-01/swp33 -> tor-p0-r3/Ethernet256
    (SONiC, CONFIG_DB events of the fixture)."""
    topo = {
        "fabric": "lab",
        "switches": [
            {"name": "leaf-01", "role": "leaf"},
            {"name": "tor-p0-r3", "role": "spine"},
        ],
        "links": [{"a": "leaf-01/swp33", "b": "tor-p0-r3/Ethernet0"}],
        "nodes": [
            {
                "name": "h100-0012",
                "nics": [{"nic": "mlx5_0", "netdev": "ens1f0np0", "switch_port": "leaf-01/swp13"}],
            }
        ],
    }
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(topo))
    snap = read_snapshot("h100-0012", "mlx5_0", "ens1f0np0", TS, FIX / "sys", tools)
    (tmp_path / "nic_config.jsonl").write_text(json.dumps(snap) + "\n{broken\n[1]\n")
    shutil.copy(FIX / "sonic_config_db.jsonl", tmp_path / "switch_config.jsonl")
    (tmp_path / "nvue").mkdir()
    shutil.copy(FIX / "nvue_qos_roce.json", tmp_path / "nvue" / "leaf-01.json")
    return tmp_path


def test_a_correct_mixed_fabric_passes(recorded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = check_dir(recorded)
    assert res["findings"] == []
    assert res["skipped"] == {
        "nic_config:bad_json": 1,
        "nic_config:not_an_object": 1,
        "switch_config:bad_json": 1,
    }
    rows = {(r["device"], r["port"]): r for r in res["rows"]}
    leaf = rows[("leaf-01", "swp13")]  # a port NVUE's switch-wide settings cover
    assert (leaf["mode"], leaf["trust"], leaf["pfc"], leaf["dscp_sp"]) == (
        "lossless",
        "both",
        "3",
        "26->3",
    )
    assert leaf["ecn"] == "149995/1499463" and leaf["source"] == "nvue"
    spine = rows[("tor-p0-r3", "Ethernet0")]
    assert (spine["pfc"], spine["mtu"], spine["source"]) == ("3", "9100", "CONFIG_DB")
    assert main(["check", "roce", str(recorded)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:4] == ["Device", "Port", "Mode", "Trust"]
    assert "0 errors" in out and "counted and skipped: nic_config:bad_json=1" in out


def test_a_nic_on_pcp_trust_against_a_cumulus_leaf(
    recorded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = (recorded / "nic_config.jsonl").read_text().splitlines()
    snap = json.loads(lines[0])
    snap["dcb"]["apptrust"] = {"order": ["pcp"]}
    snap["timestamp"] = TS + 60_000_000_000  # a newer snapshot: it wins
    (recorded / "nic_config.jsonl").write_text("\n".join([*lines, json.dumps(snap)]) + "\n")
    assert main(["check", "roce", str(recorded), "--json"]) == 1
    res = json.loads(capsys.readouterr().out)
    assert [(f["check"], f["message"]) for f in res["findings"]] == [
        ("trust", "h100-0012/mlx5_0 trusts pcp; leaf-01/swp13 trusts both")
    ]


def test_text_output_groups_a_device_wide_fault() -> None:
    fs = [
        {
            "check": "pfc",
            "severity": "error",
            "ends": [f"gpu-{i}/mlx5_0", f"leaf-1/swp{i}"],
            "message": f"gpu-{i}/mlx5_0 PFC on priority 3; leaf-1/swp{i} PFC on priority 4",
            "consequence": "c",
            "fix": "f",
        }
        for i in range(10)
    ]
    text = format_findings(fs)
    assert text.count("ERROR") == 3
    assert "... and 7 more pfc findings on the cables of leaf-1 (10 in all)" in text
    assert format_findings(fs[:4]).count("ERROR") == 4  # few enough: all shown


def test_an_unusable_directory_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "roce", str(tmp_path / "nope")]) == 2
    assert main(["check", "roce", str(tmp_path)]) == 2  # no topology.yaml
    err = capsys.readouterr().err
    assert "not a directory" in err and "topology" in err
