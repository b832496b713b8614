"""The node agent: real `ethtool -S` of a veth pair in a network namespace, fixture files in the
mlx5 driver's formats, the bounded spool, and a 30 s Kafka outage that loses no snapshot."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest

from collector.decode import NicSnapshotDecoder
from collector.nic.agent import AgentConfig, NicAgent
from collector.nic.ethtool import EthtoolReader, parse_ethtool_s
from collector.nic.mlxlink import parse_mlxlink
from collector.nic.spool import Spool
from rocewatch.core.stats import Stats
from tests.support.kafka_read import read_to_end

FIX = Path(__file__).parent / "fixtures" / "mlx5"


# --- fixture files in real formats ------------------------------------------------------------
def test_parse_ethtool_s_of_mlx5() -> None:
    c = parse_ethtool_s((FIX / "ethtool_S_cx7.txt").read_text())
    assert "NIC statistics" not in " ".join(c)
    assert c["rx_prio3_pause"] == 12345 and c["tx_prio3_pause_duration"] == 5678
    assert c["rx_vport_rdma_unicast_bytes"] == 73900000000000
    assert c["rx_corrected_bits_phy"] == 88123 and c["rx0_packets"] == 1140432098
    assert len(c) == 53


def test_parse_mlxlink() -> None:
    ber = parse_mlxlink((FIX / "mlxlink_c.txt").read_text())
    assert ber == {
        "time_since_last_clear_min": 1715.4,
        "effective_physical_errors": 0,
        "effective_physical_ber": 15e-255,
        "raw_physical_ber": 3e-12,
    }


def test_agent_reads_mlx5_sysfs_tree() -> None:
    agent = NicAgent(
        AgentConfig(node="gpu-007", sysfs_root=str(FIX / "sys"), ethtool="off", mlxlink="off")
    )
    try:
        snaps = agent.sample()
    finally:
        agent.close()
    assert [(s["nic"], s["netdev"]) for s in snaps] == [("mlx5_0", "eth0"), ("mlx5_1", "eth1")]
    a, b = snaps
    assert a["node"] == "gpu-007" and a["speed_mbps"] == 400000
    assert "speed_mbps" not in b  # link down: -1 in sysfs
    assert a["hw_counters"]["np_cnp_sent"] == 44012 and b["hw_counters"]["np_cnp_sent"] == 44013
    assert a["hw_counters"]["out_of_sequence"] == 91 and len(a["hw_counters"]) == 29
    assert a["port_counters"]["port_xmit_data"] == 16500000000000
    assert a["port_counters"]["symbol_error"] == 4 and len(a["port_counters"]) == 21
    assert a["pcie"] == {
        "current_link_speed": "32.0 GT/s PCIe",
        "max_link_speed": "32.0 GT/s PCIe",
        "current_link_width": 16,
        "max_link_width": 16,
    }
    assert b["pcie"]["current_link_speed"] == "16 GT/s" and b["pcie"]["current_link_width"] == 8
    # what the detectors get from them: both spellings give GT/s numbers
    df = NicSnapshotDecoder(None, Stats()).decode_lines([orjson.dumps(s) for s in snaps])
    pcie = {
        (r["port"], r["metric"]): r["value"]
        for r in df.filter(pl.col("metric").str.starts_with("nic_pcie")).to_dicts()
    }
    assert pcie[("mlx5_0", "nic_pcie_speed_gts")] == 32.0
    assert pcie[("mlx5_1", "nic_pcie_speed_gts")] == 16.0
    assert pcie[("mlx5_1", "nic_pcie_max_speed_gts")] == 32.0
    assert pcie[("mlx5_1", "nic_pcie_width")] == 8.0


def test_agent_runs_mlxlink_when_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in `mlxlink` on PATH (the real one needs NVIDIA hardware) prints real output."""
    tool = tmp_path / "bin" / "mlxlink"
    tool.parent.mkdir()
    calls = tmp_path / "calls"
    tool.write_text(f'#!/bin/sh\necho "$@" >> {calls}\ncat {FIX / "mlxlink_c.txt"}\n')
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}:{os.environ['PATH']}")
    cfg = AgentConfig(sysfs_root=str(FIX / "sys"), ethtool="off", mlxlink_interval_s=3600)
    agent = NicAgent(cfg)
    try:
        first = agent.sample()
        second = agent.sample()
    finally:
        agent.close()
    assert first[0]["mlxlink"]["raw_physical_ber"] == 3e-12
    assert all("mlxlink" not in s for s in second)  # its own, slower cadence
    assert calls.read_text().split("\n")[:2] == ["-d mlx5_0 -c", "-d mlx5_1 -c"]


# --- real interfaces: a veth pair in network namespaces this test creates ------------------------
def _sh(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True, timeout=30).stdout


@pytest.fixture
def veth_netns() -> Iterator[tuple[str, str]]:
    """Namespaces A and B joined by veth va (in A) <-> vb (in B), 10.77.0.1/30 <-> .2."""
    for tool in ("ip", "ethtool"):
        assert shutil.which(tool), f"{tool} missing: scripts/services.sh install adds it"
    tag = uuid.uuid4().hex[:6]
    a, b = f"rwa-{tag}", f"rwb-{tag}"
    _sh("ip", "netns", "add", a)
    _sh("ip", "netns", "add", b)
    try:
        _sh("ip", "-n", a, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", b)
        _sh("ip", "-n", a, "addr", "add", "10.77.0.1/30", "dev", "va")
        _sh("ip", "-n", b, "addr", "add", "10.77.0.2/30", "dev", "vb")
        for ns, dev in ((a, "va"), (b, "vb")):
            _sh("ip", "-n", ns, "link", "set", dev, "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield a, b
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


@pytest.mark.slow
def test_agent_matches_ethtool_on_veth(veth_netns: tuple[str, str], tmp_path: Path) -> None:
    a, _ = veth_netns
    # real traffic over the pair first
    _sh(
        "ip", "netns", "exec", a, sys.executable, "-c",
        "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "for _ in range(50): s.sendto(b'x' * 200, ('10.77.0.2', 9))",
    )  # fmt: skip
    want = parse_ethtool_s(_sh("ip", "netns", "exec", a, "ethtool", "-S", "va"))
    assert want and "peer_ifindex" in want
    speed = int(_sh("ip", "netns", "exec", a, "cat", "/sys/class/net/va/speed"))
    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", str(Path.cwd())))
    for mode in ("ioctl", "command"):
        cfg = tmp_path / f"{mode}.yaml"
        cfg.write_text(f"agent: {{ethtool: {mode}, mlxlink: 'off'}}\n")
        out = subprocess.run(
            ["ip", "netns", "exec", a, sys.executable, "-m", "rocewatch.cli", "agent",
             "--once", "--netdev", "va", "--node", "vm-1", "--config", str(cfg)],
            check=True, capture_output=True, timeout=60, env=env,
        ).stdout  # fmt: skip
        snaps = [orjson.loads(x) for x in out.splitlines()]
        veth = [s for s in snaps if s["nic"] == "va"]
        assert len(veth) == 1, snaps
        s = veth[0]
        assert s["node"] == "vm-1" and s["netdev"] == "va"
        assert s["speed_mbps"] == speed == 10000
        assert s["ethtool"] == want, mode
        assert abs(s["timestamp"] - time.time_ns()) < 60e9


def test_ethtool_ioctl_errors_are_counted(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        EthtoolReader("rw-no-such0")
    (tmp_path / "class" / "net" / "rw-no-such0").mkdir(parents=True)
    agent = NicAgent(AgentConfig(sysfs_root=str(tmp_path), netdevs=("rw-no-such0",)))
    try:
        snap = agent.sample()[0]
    finally:
        agent.close()
    assert "ethtool" not in snap and agent.stats.get("agent_ethtool_errors") == 1


# --- the spool ------------------------------------------------------------------------------------
def test_spool_keeps_order_and_drops_oldest(tmp_path: Path) -> None:
    sp = Spool(tmp_path, max_bytes=8192, segment_bytes=2048)
    lines = [b'{"n":%04d,"pad":"%s"}\n' % (i, b"x" * 80) for i in range(400)]
    for i in range(0, 400, 4):
        sp.append(lines[i : i + 4])
    got: list[bytes] = []
    while (seg := sp.oldest()) is not None:
        got += seg[1]
        sp.ack(seg[0])
    assert sp.dropped > 0 and len(got) + sp.dropped == 400
    assert got == lines[sp.dropped :]  # what is kept is the newest, in order
    # a restarted agent finds what it had not sent
    sp.append(lines[:3])
    sp.close()
    again = Spool(tmp_path, max_bytes=8192, segment_bytes=2048)
    seg = again.oldest()
    assert seg is not None and seg[1] == lines[:3]


def wait_until(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.1)


# --- a broker outage: the agent spools to disk and keeps its cadence ----------------------
@pytest.mark.kafka
def test_broker_outage_loses_no_snapshot(
    restartable_kafka_broker: Any, kafka_topics: Any, tmp_path: Path
) -> None:
    from collector.nic.kafka_output import KafkaSnapshotOutput
    from rocewatch import wire
    from rocewatch.config import KafkaConfig, TopicsConfig

    broker = restartable_kafka_broker
    topic = kafka_topics.create("telemetry", partitions=1)
    k = KafkaConfig(bootstrap_servers=broker.bootstrap, topics=TopicsConfig(telemetry=topic))
    cfg = AgentConfig(
        node="gpu-042",
        interval_s=0.1,
        sysfs_root=str(FIX / "sys"),
        ethtool="off",
        mlxlink="off",
        spool_dir=str(tmp_path / "spool"),
    )
    agent = NicAgent(cfg)
    sampled: list[int] = []
    real = agent.sample

    def recording() -> list[dict[str, Any]]:
        snaps = real()
        sampled.extend(s["timestamp"] for s in snaps)
        return snaps

    agent.sample = recording  # type: ignore[method-assign]
    sink = KafkaSnapshotOutput(k, agent.node)
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(sink, stop), kwargs={"drain_timeout_s": 60})
    runner.start()
    try:
        wait_until(lambda: len(sampled) >= 20, 60, "the agent sampling")
        broker.stop()
        down_at, t_down = len(sampled), time.monotonic()
        # away until more than 200 snapshots (10 s of 2 NICs at 10 Hz) wait on disk: past
        # anything the producer's own buffer and retries would have held
        wait_until(lambda: agent.spool.pending()[0] > 200, 120, "200 snapshots spooled")
        broker.start()
        wait_until(lambda: agent.spool.pending()[0] == 0, 90, "the spool drained")
        away_s = time.monotonic() - t_down
        # sampling kept its cadence through the outage (at least half of 20 snapshots/s, as
        # before: 290 over a 30 s outage and the restart)
        assert len(sampled) - down_at >= 0.5 * 20 * away_s, (len(sampled) - down_at, away_s)
    finally:  # (stopping drains the spool: what was sampled since is sent too)
        stop.set()
        runner.join(120)
        sink.close()
        agent.close()
    assert agent.spool.pending()[0] == 0 and agent.spool.dropped == 0
    got: set[tuple[int, str]] = set()
    order: list[int] = []
    for m in read_to_end(topic, bootstrap_servers=broker.bootstrap):
        d = wire.decode(m.value)
        assert m.key == b"gpu-042"
        got |= set(zip(d["ts"].to_list(), d["port"].to_list(), strict=True))
        order.append(int(d["ts"].min()))  # type: ignore[arg-type]
    want = set(sampled)
    assert {ts for ts, _ in got} == want  # every snapshot arrived, none invented
    assert len(got) == len(sampled)
    assert order == sorted(order)  # sent in order after the broker came back


def test_agent_reads_simulated_node_tree(tmp_path: Path) -> None:
    """`simulate --sysfs` lays out each node as the kernel does (symlinks included); the agent
    reads back what the simulator's snapshots held."""
    from rocewatch.sim import SimConfig, write_scenario
    from rocewatch.sim.sysfs import write_scenario_sysfs

    write_scenario(SimConfig(nodes=4, duration_s=0.3, seed=2), tmp_path)
    trees = write_scenario_sysfs(tmp_path)
    newest: dict[str, dict[str, Any]] = {}
    for line in (tmp_path / "nic.jsonl").read_bytes().splitlines():
        s = orjson.loads(line)
        if s["node"] == "gpu-002" and s["timestamp"] >= newest.get(s["nic"], s)["timestamp"]:
            newest[s["nic"]] = s
    root = trees / "gpu-002"
    assert (root / "class" / "infiniband" / "mlx5_0").is_symlink()
    agent = NicAgent(AgentConfig(node="gpu-002", sysfs_root=str(root), ethtool="off"))
    try:
        snaps = agent.sample()
    finally:
        agent.close()
    assert [s["nic"] for s in snaps] == sorted(newest) and len(snaps) == 8
    for s in snaps:
        want = newest[s["nic"]]
        assert s["hw_counters"] == want["hw_counters"]
        assert s["pcie"] == want["pcie"] and s["speed_mbps"] == want["speed_mbps"]
        assert s["netdev"] == want["netdev"]
        assert s["port_counters"]["port_xmit_data"] == want["ethtool"]["tx_bytes_phy"] // 4


@pytest.mark.slow
def test_cli_agent_runs_at_100ms(tmp_path: Path) -> None:
    """`rocewatch agent --interval 0.1 --out FILE --duration 2`: ~20 samples of every NIC, each
    snapshot a docs/formats.md section 3 line."""
    out = tmp_path / "snaps.jsonl"
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"agent: {{ethtool: 'off', spool_dir: {str(tmp_path / 'spool')!r}}}\n")
    res = subprocess.run(
        [sys.executable, "-m", "rocewatch.cli", "agent", "--config", str(cfg), "--node", "n1",
         "--sysfs-root", str(FIX / "sys"), "--interval", "0.1", "--out", str(out),
         "--duration", "2"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    snaps = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    per_nic: dict[str, list[int]] = {}
    for s in snaps:
        per_nic.setdefault(s["nic"], []).append(s["timestamp"])
    assert set(per_nic) == {"mlx5_0", "mlx5_1"}
    for ts in per_nic.values():
        # about 2 s sampled (--duration), at 10 Hz over the span the samples cover: judged on
        # their own times, not on how many a loaded machine let through in 2 s of wall time
        span = (ts[-1] - ts[0]) / 1e9
        assert 1.5 <= span <= 2.1 and ts == sorted(ts), ts
        assert 0.8 * (span / 0.1 + 1) <= len(ts) <= span / 0.1 + 1.5, (len(ts), span)
        gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(ts)]
        assert 0.08 < sorted(gaps)[len(gaps) // 2] < 0.12  # 100 ms cadence
    assert "samples=" in res.stdout
    assert not list((tmp_path / "spool").glob("*.jsonl"))  # everything left the spool


# --- the lean agent: what it imports, what it sends -----------------------------------------------
# what the node agent must never import: the detectors' and services' dependencies, and the
# product's other parts (rocewatch/agent_cli.py, rocewatch.config's lazy sections)
HEAVY = (
    "polars", "numpy", "pyarrow", "sklearn", "sqlalchemy", "alembic", "grpc", "google.protobuf",
    "kubernetes", "detectors", "actions", "storage", "rocewatch.core.model", "rocewatch.wire",
    "rocewatch.pipeline", "rocewatch.notify", "collector.decode", "collector.gnmi",
)  # fmt: skip

_ONCE_THEN_ENCODE = """
import json, sys
from pathlib import Path
from rocewatch.cli import main
rc = main(sys.argv[1:])
once = sorted(sys.modules)
from collector.nic.kafka_output import KafkaSnapshotOutput
from rocewatch.config import load_agent_config
cfg = load_agent_config(sys.argv[sys.argv.index("--config") + 1])
sink = KafkaSnapshotOutput(cfg.kafka, "n1")
out = Path(sys.argv[sys.argv.index("--out") + 1])
msgs = sink.encode(out.read_bytes().splitlines(keepends=True))
print(json.dumps({"rc": rc, "once": once, "sending": sorted(sys.modules), "msgs": len(msgs)}))
"""


def test_cli_agent_once_imports_only_the_agent(tmp_path: Path) -> None:
    """`rocewatch agent --once --out FILE` with the services' own config file: one snapshot per
    NIC in FILE, exit 0, and neither it nor the Kafka sink's encoding imports a detector, Polars,
    NumPy, scikit-learn, SQLAlchemy, grpcio or protobuf (the lean distribution has none)."""
    cfg = tmp_path / "rocewatch.yaml"
    cfg.write_text(
        "kafka: {bootstrap_servers: '127.0.0.1:1', client_id: agent-test}\n"
        "agent: {ethtool: 'off', mlxlink: 'off'}\n"
        "metrics_port: 9464\n"
        # the services' sections: theirs to read; the agent neither imports nor expands them
        "detectors: {pfc_storm: {enabled: true}}\n"
        "window: {step_s: 0.1}\n"
        "notify: {webhooks: [{url: 'https://example.invalid/', secret: '${RW_NOT_ON_NODES}'}]}\n"
    )
    out = tmp_path / "once.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "RW_NOT_ON_NODES"}
    res = subprocess.run(
        [sys.executable, "-c", _ONCE_THEN_ENCODE, "agent", "--config", str(cfg),
         "--node", "n1", "--sysfs-root", str(FIX / "sys"), "--once", "--out", str(out)],
        capture_output=True, text=True, timeout=60, env=env, cwd=Path(__file__).parents[1],
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    got = orjson.loads(res.stdout.splitlines()[-1])
    assert got["rc"] == 0
    snaps = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert [(s["node"], s["nic"]) for s in snaps] == [("n1", "mlx5_0"), ("n1", "mlx5_1")]
    assert snaps[0]["hw_counters"]["np_cnp_sent"] == 44012
    assert got["msgs"] == 1
    for phase in ("once", "sending"):
        loaded = [m for m in got[phase] if any(m == h or m.startswith(h + ".") for h in HEAVY)]
        assert not loaded, (phase, loaded)
    assert "kafka" not in got["once"]  # --once sends nothing
    # and the lean distribution packages every module of ours it used (agent/setup.py; its
    # command is rocewatch.agent_cli's, not the product's rocewatch.cli)
    ours = {m for m in got["sending"] if m.split(".")[0] in ("rocewatch", "collector")}
    ours.discard("rocewatch.cli")
    assert ours and ours <= _lean_modules(), ours - _lean_modules()


def _lean_modules() -> set[str]:
    """The modules agent/setup.py packages (read, not run), by import name."""
    import ast

    tree = ast.parse((Path(__file__).parents[1] / "agent" / "setup.py").read_text())
    listed = next(
        ast.literal_eval(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "MODULES"
    )
    return {m.removesuffix(".__init__") for m in listed}


def test_cli_agent_once_to_stdout_and_errors(tmp_path: Path) -> None:
    """Without --out, --once prints the snapshots; a config the agent cannot use exits 2 with one
    line naming the key."""
    from rocewatch.agent_cli import main

    cfg = tmp_path / "bad.yaml"
    cfg.write_text("agent: {interval: 1}\n")
    res = subprocess.run(
        [sys.executable, "-m", "rocewatch.agent_cli", "--once", "--node", "n2",
         "--sysfs-root", str(FIX / "sys")],
        capture_output=True, timeout=60, cwd=Path(__file__).parents[1],
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert [orjson.loads(x)["nic"] for x in res.stdout.splitlines()] == ["mlx5_0", "mlx5_1"]
    assert main(["--config", str(cfg), "--once", "--sysfs-root", str(FIX / "sys")]) == 2
    cfg.write_text("agent: {ethtool: 'off'}\ndetector: {}\n")  # misspelt top-level key
    assert main(["--config", str(cfg), "--once", "--sysfs-root", str(FIX / "sys")]) == 2


def test_agent_config_reads_its_sections(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rocewatch.config import ConfigError, KafkaConfig, agent_config_from_dict

    monkeypatch.setenv("RW_AGENT_PW", "s3cret")
    doc = {
        "kafka": {"bootstrap_servers": "k1:9093", "security_protocol": "SASL_SSL",
                  "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "agent",
                  "sasl_plain_password": "${RW_AGENT_PW}"},
        "agent": {"interval_s": 0.5, "nics": ["mlx5_0"], "spool_dir": str(tmp_path)},
        "metrics_port": 9464,
    }  # fmt: skip
    # (tests/test_deploy_agent.py compares with what the services' loader reads)
    lean = agent_config_from_dict(doc)
    assert lean.kafka == KafkaConfig(
        bootstrap_servers="k1:9093", security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username="agent", sasl_plain_password="s3cret",
    )  # fmt: skip
    assert lean.agent == AgentConfig(interval_s=0.5, nics=("mlx5_0",), spool_dir=str(tmp_path))
    assert lean.metrics_port == 9464
    for bad, where in (
        ({"agent": {"interval_s": 0.01}}, "agent.interval_s"),
        ({"agent": {"intervall_s": 1}}, "config.agent.intervall_s"),
        ({"kafka": {"security_protocol": "TLS"}}, "kafka.security_protocol"),
        ({"agnet": {}}, "config.agnet"),
        ({"kafka": {"sasl_plain_password": "${RW_UNSET_ON_PURPOSE}"}}, "RW_UNSET_ON_PURPOSE"),
    ):
        with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
            agent_config_from_dict(bad)


def test_agent_batches_are_what_the_services_encode() -> None:
    """The agent's own TelemetryBatch writer gives the bytes rocewatch.wire.encode gives for the
    decoder's frame of the same snapshots (messages split where the sink splits them)."""
    from collector.mapping import NicMapper
    from collector.nic import batch
    from collector.nic.samples import SnapshotReader
    from rocewatch import wire
    from rocewatch.wire.telemetry_pb2 import TelemetryBatch

    agent = NicAgent(AgentConfig(node="gpu-007", sysfs_root=str(FIX / "sys"), ethtool="off"))
    try:
        lines = agent.sample_lines() + agent.sample_lines()
    finally:
        agent.close()
    odd = {
        "timestamp": 1795946400000000000, "node": "gpu-ü", "nic": "mlx5_9", "speed_mbps": "200000",
        "ethtool": {"rx_prio3_pause": "17", "rx_crc_errors_phy": 2**64 - 1, "odd": "n/a"},
        "mlxlink": {"raw_physical_ber": 3e-12, "effective_physical_errors": 5},
        "pcie": {"current_link_speed": "16 GT/s", "max_link_width": 16},
    }  # fmt: skip
    lines += [orjson.dumps(odd) + b"\n", b"not json\n"]
    stats = Stats()
    cols = SnapshotReader(stats, NicMapper(check_metrics=False)).read_lines(lines)
    df = NicSnapshotDecoder(None, Stats()).decode_lines(lines)
    assert len(cols) == df.height > 100
    assert stats.get("malformed_lines") == 1 and stats.get("non_numeric_values") == 1
    for start, stop in ((0, df.height), (0, 37), (37, df.height)):
        want = wire.encode(df.slice(start, stop - start), "agent:gpu-007", 5)
        msg = TelemetryBatch()
        msg.ParseFromString(want)
        got = batch.encode(cols, start, stop, "agent:gpu-007", 5, produced_ns=msg.produced_ns)
        assert got == want
        assert wire.frames([wire.parse(got)]).equals(df.slice(start, stop - start))
