"""Simulated INT Telemetry Reports (docs/formats.md section 4): to a pcap file and over UDP.

Every switch sends one Telemetry Report datagram per tick holding one INT report per port:
level-1 ingress/egress port ids (the topology's ``int_ports``), hop latency (a base plus the
queue's drain time at line rate), the lossless queue's id and its peak occupancy of the tick in
``int_cell_bytes`` cells, and the egress timestamp (the switch's read time), then, as inner
contents (InType 4), the truncated IPv4 / UDP headers of a RoCEv2 packet that left by that port.
The reports are laid out as Telemetry Report v2.0 writes them (``collector.inband.report``).
Sequence numbers run per switch (hw_id 0) and wrap at 22 bits, as a real exporter's do.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Iterable, Iterator

import numpy as np

from collector.inband import build_report
from collector.inband.report import (
    INTYPE_IPV4,
    IndividualReport,
    ReportMetadata,
    truncated_ipv4,
)
from rocewatch.sim.fabric import INT_CELL_BYTES, LINE_GBPS
from rocewatch.sim.simulator import SW_GAUGES, Simulator, Tick

BASE_LATENCY_NS = 600
ROCE_V2_PORT = 4791
_PEAK = SW_GAUGES.index("queue_peak_bytes")


class IntReportWriter:
    """One tick of switch readings -> Telemetry Report datagrams, one per switch."""

    def __init__(self, sim: Simulator) -> None:
        fab = sim.fabric
        self.queue = int(fab.priority)
        self.ports_of = [np.flatnonzero(fab.port_switch == s) for s in range(len(fab.switches))]
        self.seq = [0] * len(fab.switches)
        # one made-up RoCEv2 flow per port (10.0.0.0/9 -> 10.128.0.0/9, by port index)
        self.inner = [
            truncated_ipv4(
                str(ipaddress.IPv4Address(0x0A000000 + p)),
                str(ipaddress.IPv4Address(0x0A800000 + p)),
                17,
                49152 + p % 16384,
                ROCE_V2_PORT,
            )
            for p in range(len(fab.port_switch))
        ]

    def datagrams(self, t: Tick) -> list[bytes]:
        peak = t.sw_g[_PEAK]
        cells = np.minimum(peak // INT_CELL_BYTES, (1 << 24) - 1).astype(np.int64)
        lat = (BASE_LATENCY_NS + peak * 8 / LINE_GBPS).astype(np.int64)
        out = []
        for s in np.argsort(t.sw_ts, kind="stable").tolist():
            ports = self.ports_of[s]
            ts = int(t.sw_ts[s])
            reports = [
                IndividualReport(
                    md=ReportMetadata(
                        ingress_port=0,
                        egress_port=j + 1,
                        hop_latency_ns=int(lat[p]),
                        queue_id=self.queue,
                        queue_occupancy_cells=int(cells[p]),
                        egress_ts=ts,
                    ),
                    in_type=INTYPE_IPV4,
                    inner=self.inner[p],
                )
                for j, p in enumerate(ports.tolist())
            ]
            out.append(build_report(s + 1, self.seq[s], reports))
            self.seq[s] = (self.seq[s] + 1) & 0x3FFFFF
        return out


class UdpSender:
    """Sends datagrams to an INT collector, optionally paced to ``rate`` datagrams per second."""

    def __init__(self, host: str, port: int, rate: float = 0.0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.addr = (host, port)
        self.rate = rate
        self.sent = 0
        self._t0 = time.monotonic()

    def send(self, datagrams: Iterable[bytes]) -> int:
        sendto, addr = self.sock.sendto, self.addr
        n = 0
        for d in datagrams:
            if self.rate > 0 and self.sent % 64 == 0:
                ahead = self.sent / self.rate - (time.monotonic() - self._t0)
                if ahead > 0:
                    time.sleep(ahead)
            sendto(d, addr)
            self.sent += 1
            n += 1
        return n

    def close(self) -> None:
        self.sock.close()


def simulated_datagrams(sim: Simulator) -> Iterator[bytes]:
    """Every datagram of a whole simulated run, in time order."""
    w = IntReportWriter(sim)
    for t in sim.steps():
        yield from w.datagrams(t)
