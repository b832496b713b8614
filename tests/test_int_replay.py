"""INT reports in a scenario's int.pcap: a queue building up is found by replay; garbage is
counted and skipped."""

from __future__ import annotations

import random
import re
import struct
from pathlib import Path

import orjson
import pytest
import yaml

from collector.inband import build_report, write_pcap
from rocewatch.core.model import parse_rfc3339
from rocewatch.replay import replay

T0 = 1_795_946_400_000_000_000
MS = 1_000_000
BUFFER = 64 * 1024 * 1024
CELL = 80


def topology() -> dict:
    return {
        "fabric": "int-test",
        "switches": [
            {
                "name": "leaf-0",
                "role": "leaf",
                "int_node_id": 11,
                "int_cell_bytes": CELL,
                "buffer_bytes": BUFFER,
                "int_ports": {1: "Ethernet1/1", 2: "Ethernet1/2"},
            },
            {
                "name": "leaf-1",
                "role": "leaf",
                "int_node_id": 12,
                "int_cell_bytes": CELL,
                "buffer_bytes": BUFFER,
            },
        ],
        "nodes": [
            {"name": "gpu-001", "nics": [{"nic": "mlx5_0", "switch_port": "leaf-0/Ethernet1/1"}]},
            {"name": "gpu-002", "nics": [{"nic": "mlx5_0", "switch_port": "leaf-0/Ethernet1/2"}]},
        ],
    }


def occupancy(t_s: float, port: int, rng: random.Random) -> float:
    """Share of the buffer: bursty and low, except port 1 queue 3 from 3 s on (incast)."""
    if port == 1 and t_s >= 3.0:
        return 0.90 + 0.05 * rng.random()
    return 0.02 * rng.random()


def int_payloads() -> list[bytes]:
    """6 s of reports from two switches, port 1 of leaf-0 filling up from 3 s on; garbage,
    truncated datagrams and five lost ones mixed in."""
    rng = random.Random(1)
    payloads: list[bytes] = []
    seq = {11: 0, 12: 0}
    for i in range(600):  # 6 s, one datagram per switch every 10 ms
        ts = T0 + i * 10 * MS
        for node, ports in ((11, (1, 2)), (12, (5,))):
            reports = [
                {
                    "ingress_port": 9,
                    "egress_port": p,
                    "hop_latency_ns": 800 + rng.randrange(400),
                    "queue_id": 3,
                    "queue_occupancy_cells": int(occupancy(i / 100, p, rng) * BUFFER / CELL),
                    "egress_ts": ts + p,
                }
                for p in ports
            ]
            payloads.append(build_report(node, seq[node], reports))
            seq[node] += 1
        if i % 50 == 7:
            payloads.append(b"\x20garbage that is not a report")
            payloads.append(payloads[-2][:17])  # truncated mid-report
        if i == 300:
            seq[11] += 5  # five datagrams lost on the way
    return payloads


def test_queue_buildup_from_int_pcap(tmp_path: Path) -> None:
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(topology()))
    write_pcap(tmp_path / "int.pcap", int_payloads())
    res = replay(tmp_path, tmp_path / "out")
    builds = [a for a in res.alerts if a["labels"]["alertname"] == "QueueBuildup"]
    assert [(a["labels"]["switch"], a["labels"]["port"], a["labels"]["queue"]) for a in builds] == [
        ("leaf-0", "Ethernet1/1", "3")
    ]
    ttd = (parse_rfc3339(builds[0]["startsAt"]) - (T0 + 3_000 * MS)) / 1e9
    assert 0 < ttd <= 2.0, ttd
    share = re.search(r"occupancy ([0-9.]+)% of 64.0 MiB", builds[0]["annotations"]["evidence"])
    assert share and 90.0 <= float(share.group(1)) <= 95.0  # INT cells x int_cell_bytes
    # nothing else fires on a fabric whose other queues stay low
    assert {a["labels"]["alertname"] for a in res.alerts} <= {"QueueBuildup", "ECNCongestion"}
    st = res.stats
    assert st.get("int_malformed_datagrams", 0) + st.get("int_truncated_reports", 0) >= 24
    assert st.get("int_report_loss") == 5


# --- unusable and damaged int.pcap files: `rocewatch replay` as a user runs it ------------------


def cli_replay(scenario: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from rocewatch.cli import main

    code = main(["replay", str(scenario), "--out", str(scenario / "out")])
    got = capsys.readouterr()
    return code, got.out, got.err


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("garbage", "not a classic pcap file (magic"),
        ("empty", "not a classic pcap file (short header)"),
        ("pcapng", "not a classic pcap file (magic 0a0d0d0a)"),
        ("wifi", "link type 105 is not Ethernet"),
        ("directory", "cannot read: Is a directory"),
    ],
)
def test_replay_of_an_unusable_int_pcap_exits_2_with_one_line(
    kind: str, reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(topology()))
    pcap = tmp_path / "int.pcap"
    if kind == "garbage":
        pcap.write_bytes(random.Random(7).randbytes(300))
    elif kind == "empty":
        pcap.write_bytes(b"")
    elif kind == "pcapng":  # the newer format, which tcpdump -w does not write but Wireshark does
        pcap.write_bytes(bytes.fromhex("0a0d0d0a") + bytes(60))
    elif kind == "wifi":
        pcap.write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 105))
    else:
        pcap.mkdir()
    code, out, err = cli_replay(tmp_path, capsys)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"rocewatch: error: {pcap}: {reason}"), lines[0]
    assert lines[0].count(pcap.name) == 1  # the file named once
    assert not (tmp_path / "out" / "alerts.jsonl").exists()


def test_replay_of_a_damaged_int_pcap_counts_what_it_skips_and_still_finds_the_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bytes damaged across the file (frames, and a record header whose length made the reader
    stop there: the incast, 3 s in, was never read) and its last record cut short: the replay
    completes (exit 0), says what it skipped, and the incast is still found."""
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(topology()))
    pcap = tmp_path / "int.pcap"
    write_pcap(pcap, int_payloads())
    data = bytearray(pcap.read_bytes())
    rng = random.Random(3)
    for _ in range(40):  # damage frames (an Ethernet / IP / UDP header or a report)
        i = rng.randrange(24, len(data) * 9 // 10)
        data[i] ^= 0xFF
    pcap.write_bytes(bytes(data[: len(data) - 7]))  # the last record cut short
    code, out, err = cli_replay(tmp_path, capsys)
    assert code == 0, err
    assert "counted and skipped:" in out and "pcap_corrupt=" in out, out
    alerts = [
        orjson.loads(x) for x in (tmp_path / "out" / "alerts.jsonl").read_bytes().splitlines()
    ]
    assert ("QueueBuildup", "leaf-0", "Ethernet1/1") in {
        (a["labels"]["alertname"], a["labels"].get("switch"), a["labels"].get("port"))
        for a in alerts
    }


def switch_events(n: int) -> bytes:
    """``n`` gnmic events of an FCS counter on leaf-0, 10 ms apart."""
    return b"".join(
        orjson.dumps(
            {
                "timestamp": T0 + i * 10 * MS,
                "tags": {"source": "leaf-0", "interface_name": "Ethernet1/1"},
                "values": {"/interfaces/interface/state/counters/in-fcs-errors": str(i)},
            }
        )
        + b"\n"
        for i in range(n)
    )


def test_replay_of_a_cut_short_gzip_recording_keeps_what_it_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A compressed recording cut short (an interrupted copy) raised EOFError with a traceback:
    what it holds is replayed, the cut is counted, exit 0."""
    import gzip

    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(topology()))
    data = gzip.compress(switch_events(4_000))
    (tmp_path / "switch.jsonl.gz").write_bytes(data[: len(data) // 2])
    code, out, err = cli_replay(tmp_path, capsys)
    assert code == 0, err
    assert "truncated_files=1" in out, out
    samples = int(re.search(r"replayed (\d+) samples", out).group(1))  # type: ignore[union-attr]
    assert 500 < samples < 4_000, out


def test_replay_of_a_gz_that_is_not_gzip_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(topology()))
    gz = tmp_path / "switch.jsonl.gz"
    gz.write_bytes(switch_events(10))  # not compressed, though its name says so
    code, _, err = cli_replay(tmp_path, capsys)
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith(f"rocewatch: error: {gz}: cannot read: Not a gzipped file"), line
