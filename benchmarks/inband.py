"""Benchmark: INT Telemetry Report v2.0 from a pcap file and live over UDP on loopback.

Prints one JSON object (--json) with:
  pcap_reports_per_s   reports per second of one process reading a pcap file into canonical
                       samples: read + Ethernet/IP/UDP checks + parse + per-interval aggregation
                       (CPU time of that process, so the figure is per core)
  pcap_parse_reports_per_s   the same without aggregation (reader + parser only)
  pcap_parse_inner_reports_per_s   reader + parser asked for the inner packet's 5-tuple too
  udp_reports_per_s    reports per second received, parsed and aggregated live from a UDP socket
                       on 127.0.0.1, sent by a separate process as fast as it can (wall time)
  udp_sent / udp_received / udp_drops   datagrams: what the sender sent, what the ring took,
                       what was dropped (ring full or by the kernel)
and the conditions (reports per datagram, datagram size, switches, ports). Every report is laid
out as Telemetry Report v2.0 writes it and carries a truncated IPv4 packet as inner contents.

  python benchmarks/inband.py --json [--datagrams 100000] [--reports-per-datagram 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent
]

T0 = 1_795_946_400_000_000_000
SWITCHES = 16
PORTS = 64
CELL = 256


def log(msg: str) -> None:
    print(f"[inband-bench] {msg}", file=sys.stderr, flush=True)


def topology() -> dict:
    return {
        "fabric": "bench",
        "switches": [
            {
                "name": f"leaf-{s}",
                "role": "leaf",
                "int_node_id": s + 1,
                "int_cell_bytes": CELL,
                "buffer_bytes": 64 << 20,
                "int_ports": {p + 1: f"Ethernet{p + 1}" for p in range(PORTS)},
            }
            for s in range(SWITCHES)
        ],
        "nodes": [{"name": "gpu-0", "nics": [{"nic": "mlx5_0"}]}],
    }


def datagrams(n: int, per: int) -> list[bytes]:
    """``n`` datagrams of ``per`` reports each, round-robin over switches, 10 µs apart.

    Laid out with numpy as Telemetry Report v2.0 writes them (checked against ``build_report``
    on the first datagram): level-1 port ids, hop latency, queue id + occupancy and egress
    timestamp per report, then as inner contents (InType 4) the truncated headers of a RoCEv2
    packet: IPv4, UDP and the 12-octet InfiniBand BTH (40 octets).
    """
    import numpy as np

    from collector.inband import build_report
    from collector.inband.report import (
        INTYPE_IPV4,
        REPTYPE_INT,
        IndividualReport,
        ReportMetadata,
        group_header,
        md_bit,
        truncated_ipv4,
    )

    rng = np.random.default_rng(5)
    bth = bytes.fromhex("0a40ffff0000001100000001")  # RC SEND-only to QP 0x11
    inner = [
        truncated_ipv4(f"10.0.{s}.1", f"10.1.{p // 256}.{p % 256}", 17, 49152 + p, 4791) + bth
        for s in range(SWITCHES)
        for p in range(1, PORTS + 1)
    ]
    rep = np.dtype(
        [
            ("b0", "u1"), ("rep_len", "u1"), ("md_len", "u1"), ("flags", "u1"),
            ("bits", ">u2"), ("dsid", ">u2"), ("dsbits", ">u2"), ("dsstat", ">u2"),
            ("ingress", ">u2"), ("egress", ">u2"), ("lat", ">u4"), ("queue", ">u4"),
            ("ts", ">u8"), ("inner", "u1", (len(inner[0]),)),
        ]
    )  # fmt: skip
    dg = np.dtype([("w0", ">u4"), ("node", ">u4"), ("r", rep, (per,))])
    a = np.zeros(n, dtype=dg)
    i = np.arange(n)
    sw = i % SWITCHES
    seq = i // SWITCHES
    a["w0"] = np.frombuffer(group_header(0, 0), dtype=">u4")[0] | (seq & 0x3FFFFF)
    a["node"] = sw + 1
    r = a["r"]
    r["b0"] = (REPTYPE_INT << 4) | INTYPE_IPV4
    r["rep_len"] = (rep.itemsize - 4) // 4  # every word after the first
    r["md_len"] = 5  # 4 + 4 + 4 + 8 octets of baseline metadata
    r["flags"] = 0x20  # F: a tracked flow
    r["bits"] = md_bit(1) | md_bit(2) | md_bit(3) | md_bit(5)
    r["ingress"] = rng.integers(1, PORTS + 1, (n, per))
    r["egress"] = 1 + (i[:, None] * per + np.arange(per)) % PORTS
    r["lat"] = rng.integers(500, 5500, (n, per))
    r["queue"] = (3 << 24) | rng.integers(0, 1 << 16, (n, per))
    r["ts"] = T0 + i[:, None] * 10_000 + np.arange(per)
    table = np.frombuffer(b"".join(inner), dtype=np.uint8).reshape(len(inner), -1)
    r["inner"] = table[sw[:, None] * PORTS + r["egress"].astype(np.int64) - 1]
    raw = a.tobytes()
    size = dg.itemsize
    out = [raw[k * size : (k + 1) * size] for k in range(n)]
    check = build_report(
        1,
        0,
        [
            IndividualReport(
                md=ReportMetadata(
                    ingress_port=int(x["ingress"]),
                    egress_port=int(x["egress"]),
                    hop_latency_ns=int(x["lat"]),
                    queue_id=3,
                    queue_occupancy_cells=int(x["queue"]) & 0xFFFFFF,
                    egress_ts=int(x["ts"]),
                ),
                in_type=INTYPE_IPV4,
                inner=inner[int(x["egress"]) - 1],
                flags=2,
            )
            for x in r[0]
        ],
    )
    assert out[0] == check, "benchmark datagrams differ from build_report's layout"
    return out


def bench_pcap(
    path: Path, topo: object, aggregate: bool, repeat: int = 3, inner: bool = False
) -> tuple[float, int]:
    from collector.inband import iter_pcap_chunks, parse_buffer
    from collector.inband.aggregate import IntAggregator
    from rocewatch.core.stats import Stats

    best = float("inf")
    reports = 0
    for _ in range(repeat):
        agg = IntAggregator(topo, Stats())  # type: ignore[arg-type]
        reports = 0
        t0 = time.process_time()
        for c in iter_pcap_chunks(path):
            rows, _ = parse_buffer(c.buf, c.starts, c.lens, rx_ts=c.ts, seq=agg.seq, inner=inner)
            reports += rows.height
            if aggregate:
                agg.add(rows)
        if aggregate:
            from collector.inband.report import empty_reports

            agg.add(empty_reports(), final=True)
        best = min(best, time.process_time() - t0)
    return reports / best, reports


SENDER = r"""
import socket, sys, time
path, port, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
data = open(path, "rb").read()
msgs, off = [], 0
while off < len(data):
    n = int.from_bytes(data[off:off + 4], "little")
    msgs.append(data[off + 4:off + 4 + n])
    off += 4 + n
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
addr = ("127.0.0.1", port)
sys.stdin.readline()
t0 = time.perf_counter()
for i, m in enumerate(msgs):
    if rate and i % 32 == 0:
        ahead = i / rate - (time.perf_counter() - t0)
        if ahead > 0:
            time.sleep(ahead)
    while True:
        try:
            s.sendto(m, addr); break
        except BlockingIOError:
            time.sleep(0)
print(time.perf_counter() - t0, flush=True)
"""


def bench_udp(
    dgrams: list[bytes], per: int, topo: object, work: Path, rate: float
) -> dict[str, float]:
    from collector.inband.live import IntCollector
    from collector.inband.udp import UdpListener, UdpListenerConfig
    from rocewatch.core.stats import Stats

    blob = work / "dgrams.bin"
    with blob.open("wb") as fh:
        for d in dgrams:
            fh.write(len(d).to_bytes(4, "little") + d)
    listener = UdpListener(UdpListenerConfig(host="127.0.0.1", port=0))
    samples: list[object] = []
    coll = IntCollector(topo, listener, samples.append, Stats())  # type: ignore[arg-type]
    sender = subprocess.Popen(
        [sys.executable, "-c", SENDER, str(blob), str(listener.port), str(rate)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert sender.stdin is not None and sender.stdout is not None
    t_start = time.perf_counter()
    cpu0 = time.process_time()
    sender.stdin.write("go\n")
    sender.stdin.flush()
    st = listener.stats
    last_count, last_change = -1, time.monotonic()
    t_last = t_start
    while True:  # until everything sent is accounted for, or nothing arrives for 1 s
        coll.step(timeout=0.05)
        done = st.received + st.kernel_drops + st.oversize
        if done >= len(dgrams):
            break
        if done != last_count:
            last_count, last_change = done, time.monotonic()
            t_last = time.perf_counter()
        elif time.monotonic() - last_change > 1.0:
            break
    coll.flush()
    t_end = t_last
    cpu = time.process_time() - cpu0
    send_s = float(sender.stdout.readline())
    sender.wait()
    listener.close()
    wall = t_end - t_start
    return {
        "udp_reports_per_s": round(coll.reports / wall),
        "udp_offered_reports_per_s": round(rate * per) if rate else 0,
        "udp_sent": len(dgrams),
        "udp_received": st.received,
        "udp_drops": st.kernel_drops + st.oversize,
        "udp_cpu_s": round(cpu, 3),
        "udp_send_s": round(send_s, 3),
        "udp_wall_s": round(wall, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--datagrams", type=int, default=100_000)
    ap.add_argument("--reports-per-datagram", type=int, default=8)
    ap.add_argument("--udp-datagrams", type=int, default=60_000)
    ap.add_argument(
        "--udp-rate", type=float, default=50_000, help="datagrams/s the sender offers (0: max)"
    )
    args = ap.parse_args()

    from collector.inband import write_pcap
    from rocewatch.core.topology import Topology

    topo = Topology.from_dict(topology())
    with tempfile.TemporaryDirectory(prefix="rw-inband-bench-") as tmp:
        work = Path(tmp)
        t = time.perf_counter()
        dg = datagrams(args.datagrams, args.reports_per_datagram)
        pcap = work / "int.pcap"
        write_pcap(pcap, dg)
        log(f"generated {len(dg)} datagrams in {time.perf_counter() - t:.1f} s")
        full, n = bench_pcap(pcap, topo, aggregate=True)
        parse_only, _ = bench_pcap(pcap, topo, aggregate=False)
        parse_inner, _ = bench_pcap(pcap, topo, aggregate=False, inner=True)
        log(
            f"pcap: {full:,.0f} reports/s with aggregation, {parse_only:,.0f} parse only, "
            f"{parse_inner:,.0f} parse with the inner 5-tuple"
        )
        per = args.reports_per_datagram
        udp = bench_udp(dg[: args.udp_datagrams], per, topo, work, args.udp_rate)
        log(f"udp: {udp}")
    out = {
        "pcap_reports_per_s": round(full),
        "pcap_parse_reports_per_s": round(parse_only),
        "pcap_parse_inner_reports_per_s": round(parse_inner),
        **udp,
        "pcap_reports": n,
        "reports_per_datagram": args.reports_per_datagram,
        "datagram_bytes": len(dg[0]),
        "inner": "IPv4 + UDP + BTH (40 octets)",
        "switches": SWITCHES,
        "ports_per_switch": PORTS,
        "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
