"""The node agent's RoCE configuration snapshots: at start, at the configuration cadence, and at
once when sysfs changes between cadences."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import orjson

from collector.nic.roce_config import ConfigWatcher
from collector.roce_config.nic import parse_snapshot

FIX = Path(__file__).parent / "fixtures" / "roce_config"


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_watcher_sends_at_start_on_cadence_and_on_a_sysfs_change(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    shutil.copytree(FIX / "sys", root)
    forks: list[list[str]] = []

    def tools(argv: list[str]) -> str | None:
        forks.append(argv)
        if argv[:2] == ["dcb", "-j"] and (FIX / "dcb" / f"{argv[2]}.json").exists():
            return (FIX / "dcb" / f"{argv[2]}.json").read_text()
        return None

    mono = Clock()
    w = ConfigWatcher(
        "h100-0012",
        [("mlx5_0", "ens1f0np0"), ("mlx5_9", None)],  # a NIC without a netdev has no config
        root,
        interval_s=60,
        check_s=5,
        run=tools,
        clock=lambda: 1795946400000000000 + int(mono.t * 1e9),
        monotonic=mono,
    )
    first = w.poll()
    assert [s["nic"] for s in first] == ["mlx5_0"]
    assert parse_snapshot(first[0]).pfc == frozenset({3})
    n_forks = len(forks)
    mono.t = 30.0
    assert w.poll() == []  # sysfs unchanged: nothing, and no tool was run
    assert len(forks) == n_forks
    # someone turns DCQCN off on priority 3: the next check (5 s) sends a snapshot at once
    (root / "class/net/ens1f0np0/ecn/roce_np/enable/3").write_text("0\n")
    mono.t = 36.0
    got = w.poll()
    assert len(got) == 1 and got[0]["ecn"]["roce_np"]["enable"]["3"] == 0
    assert w.changes == 1
    assert parse_snapshot(got[0]).ecn_np == {p: False for p in range(8)}
    mono.t = 60.0
    assert w.poll() == []
    mono.t = 96.5  # the cadence: 60 s after the last snapshot, changed or not
    assert len(w.poll()) == 1
    assert w.changes == 1


def test_agent_once_writes_configuration_snapshots(tmp_path: Path) -> None:
    """``rocewatch-agent --once --config-out FILE`` on the fixture tree (the real dcb and
    ethtool are run: they know no such netdev, so those sections are left out)."""
    root = tmp_path / "sys"
    shutil.copytree(Path(__file__).parent / "fixtures" / "mlx5" / "sys", root)
    # mlx5_0's netdev gets a name no host has (the real tools must not find it), an MTU and a
    # GID table
    (root / "class/infiniband/mlx5_0/device/net/eth0").rename(
        root / "class/infiniband/mlx5_0/device/net/rwtest0"
    )
    (root / "class/net/eth0").rename(root / "class/net/rwtest0")
    (root / "class/net/rwtest0/mtu").write_text("9000\n")
    g = root / "class/infiniband/mlx5_0/ports/1"
    (g / "gids").mkdir()
    (g / "gid_attrs/types").mkdir(parents=True)
    (g / "gids/3").write_text("0000:0000:0000:0000:0000:ffff:0a00:0001\n")
    (g / "gid_attrs/types/3").write_text("RoCE v2\n")
    cfg_out = tmp_path / "nic_config.jsonl"
    res = subprocess.run(
        [sys.executable, "-m", "rocewatch.agent_cli", "--once", "--node", "n1", "--sysfs-root",
         str(root), "--out", str(tmp_path / "nic.jsonl"), "--config-out", str(cfg_out)],
        capture_output=True, timeout=60, cwd=Path(__file__).parents[1],
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    snaps = [orjson.loads(x) for x in cfg_out.read_bytes().splitlines()]
    assert [s["nic"] for s in snaps] == ["mlx5_0", "mlx5_1"]
    assert snaps[0]["mtu"] == 9000 and snaps[0]["netdev"] == "rwtest0"
    assert "dcb" not in snaps[0] and "pause" not in snaps[0]  # unknown, not wrong
    e = parse_snapshot(snaps[0])
    assert e.gids is not None and e.gids[0].type == "RoCE v2" and e.trust is None


def test_agent_run_sends_configuration_beside_its_samples(tmp_path: Path) -> None:
    """The running agent: counter snapshots on their cadence through the spool, configuration
    snapshots from a thread of their own (their tools' forks do not delay sampling)."""
    import threading

    from collector.nic.agent import AgentConfig, NicAgent

    agent = NicAgent(
        AgentConfig(
            node="n1",
            sysfs_root=str(Path(__file__).parent / "fixtures" / "mlx5" / "sys"),
            ethtool="off",
            mlxlink="off",
            interval_s=0.1,
            spool_dir=str(tmp_path / "spool"),
        )
    )
    samples: list[bytes] = []
    config: list[bytes] = []
    agent.watch_config(config.extend, interval_s=60.0)
    try:
        agent.run(samples.extend, threading.Event(), duration_s=0.5)
    finally:
        agent.close()
    assert len(samples) >= 2 * 2  # two NICs, several rounds
    snaps = [orjson.loads(x) for x in config]
    assert [(s["node"], s["nic"]) for s in snaps] == [("n1", "mlx5_0"), ("n1", "mlx5_1")]
    assert agent.stats.get("agent_config_snapshots") == 2
