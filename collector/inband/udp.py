"""Live INT Telemetry Reports over UDP (docs/formats.md section 4): a bounded receive ring.

``poll`` drains the socket with ``socket.recv_into`` straight into one preallocated buffer,
datagrams packed one after the other (no bytes object per datagram, and the parser's gathers stay
in a few cache-friendly megabytes), until the socket is empty, ``batch_datagrams`` arrived or the
buffer has no room for a datagram of ``max_datagram_bytes``; then it hands the whole batch to the
vectorised parser (``parse_buffer``) and reuses the buffer. Receiving and
parsing run in the caller's thread: a receiver thread would fight the parser for the GIL and
lose most wake-ups. Memory is fixed: ``ring_bytes`` plus the socket's receive
buffer (``rcvbuf_bytes``, forced above ``net.core.rmem_max`` when the process may). Under a
flood the kernel drops what does not fit in that buffer; those drops are read from
``/proc/net/udp`` (``kernel_drops``). Datagrams longer than ``max_datagram_bytes`` are dropped
and counted (``oversize``); malformed and truncated reports are counted by the parser. Nothing in
the input can stop the listener. Each datagram is stamped with the time it was read (``clock``,
ns since the epoch): the ``rx_ts`` of reports that carry no timestamp of their own. The group
headers go to ``seq`` (a ``SequenceTracker``) to count lost reports.

>>> import socket
>>> from collector.inband.report import build_report
>>> lis = UdpListener(UdpListenerConfig(host="127.0.0.1", port=0))
>>> tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
>>> _ = tx.sendto(build_report(11, 1, [{"hop_latency_ns": 7}]), ("127.0.0.1", lis.port))
>>> reports = lis.poll(timeout=5.0)
>>> reports["hop_latency_ns"].to_list()
[7]
>>> lis.close(); tx.close()
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import polars as pl

from collector.inband.report import DEFAULT_PORT, InbandStats, empty_reports, parse_buffer
from collector.inband.sequence import SequenceTracker
from rocewatch.core.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UdpListenerConfig:
    """Where to listen and how much memory the ring may hold."""

    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    ring_bytes: int = 8 << 20  # the receive buffer datagrams are packed into
    max_datagram_bytes: int = 9216  # the largest datagram accepted (jumbo frames)
    batch_datagrams: int = 16384  # parsed together at most
    rcvbuf_bytes: int = 32 << 20  # SO_RCVBUF asked of the kernel
    inner: bool = False  # add the inner packet's 5-tuple columns (INNER_SCHEMA)

    def validate(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"inband.port: {self.port} is not a UDP port")
        if self.max_datagram_bytes < 64 or self.batch_datagrams < 1:
            raise ConfigError("inband: max_datagram_bytes must be >= 64, batch_datagrams >= 1")
        if not self.max_datagram_bytes <= self.ring_bytes <= 1 << 31:
            raise ConfigError("inband: ring_bytes must hold one datagram and stay under 2 GiB")


@dataclass
class UdpStats:
    received: int = 0  # datagrams taken into the ring
    oversize: int = 0  # longer than max_datagram_bytes: dropped
    kernel_drops: int = 0  # dropped by the kernel, its receive buffer full (/proc/net/udp)


def _kernel_drops(sock: socket.socket) -> int | None:
    """The socket's drop counter from /proc/net/udp{,6} (Linux); None elsewhere."""
    try:
        inode = os.fstat(sock.fileno()).st_ino
    except OSError:
        return None
    for name in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            with open(name) as fh:
                next(fh, None)
                for line in fh:
                    f = line.split()
                    if len(f) >= 13 and f[9] == str(inode):
                        return int(f[12])
        except OSError:
            continue
    return None


class UdpListener:
    """Drains a UDP socket into a fixed ring and parses the ring in one batch per ``poll``."""

    def __init__(
        self, cfg: UdpListenerConfig | None = None, clock: Callable[[], int] = time.time_ns
    ) -> None:
        self.cfg = cfg or UdpListenerConfig()
        self.cfg.validate()
        self.clock = clock
        self.stats = UdpStats()
        self.parse_stats = InbandStats()
        self.seq = SequenceTracker()
        self._ring = np.zeros(self.cfg.ring_bytes, dtype=np.uint8)
        self._mv = memoryview(self._ring.data)
        self._lens = np.zeros(self.cfg.batch_datagrams, dtype=np.int64)
        self._starts = np.zeros(self.cfg.batch_datagrams, dtype=np.int64)
        self._rx = np.zeros(self.cfg.batch_datagrams, dtype=np.int64)
        family = socket.AF_INET6 if ":" in self.cfg.host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self._set_rcvbuf(self.cfg.rcvbuf_bytes)
        try:
            self.sock.bind((self.cfg.host, self.cfg.port))
        except OSError as e:
            self.sock.close()
            raise ConfigError(f"cannot listen on {self.cfg.host}:{self.cfg.port}: {e}") from e
        self.sock.setblocking(False)
        self.port: int = self.sock.getsockname()[1]
        self.rcvbuf: int = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        self._drops0 = _kernel_drops(self.sock) or 0

    def _set_rcvbuf(self, size: int) -> None:
        force = getattr(socket, "SO_RCVBUFFORCE", None)  # Linux, CAP_NET_ADMIN
        if force is not None:
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, force, size)
                return
            except OSError:
                pass
        with contextlib.suppress(OSError):  # capped by net.core.rmem_max
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)

    def _drain(self) -> int:
        """Read datagrams into the buffer until the socket is empty or the batch full."""
        recv_into = self.sock.recv_into
        size = self.cfg.max_datagram_bytes
        mv, starts, lens, rx, clock = self._mv, self._starts, self._lens, self._rx, self.clock
        last = self.cfg.ring_bytes - size  # the last offset with room for any datagram
        batch = self.cfg.batch_datagrams
        trunc = socket.MSG_TRUNC  # Linux returns a datagram's real length with it
        i = off = oversize = 0
        while i < batch and off <= last:
            try:
                n = recv_into(mv[off:], size, trunc)
            except (BlockingIOError, InterruptedError):
                break
            if n > size:
                oversize += 1
                continue
            starts[i] = off
            lens[i] = n
            rx[i] = clock()
            off += (n + 7) & ~7
            i += 1
        self.stats.received += i
        self.stats.oversize += oversize
        return i

    def poll(self, timeout: float = 0.1) -> pl.DataFrame:
        """Receive what is waiting (up to a ring's worth; waiting up to ``timeout`` s for the
        first datagram) and parse it; returns report rows (``REPORT_SCHEMA``)."""
        n = self._drain()
        if n == 0 and timeout > 0:
            ready, _, _ = select.select([self.sock], [], [], timeout)
            if ready:
                n = self._drain()
        self._update_kernel_drops()
        if n == 0:
            return empty_reports()
        reports, _ = parse_buffer(
            self._ring,
            self._starts[:n],
            self._lens[:n],
            self.parse_stats,
            rx_ts=self._rx[:n],
            seq=self.seq,
            inner=self.cfg.inner,
        )
        return reports

    def _update_kernel_drops(self) -> None:
        d = _kernel_drops(self.sock)
        if d is not None:
            self.stats.kernel_drops = d - self._drops0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> UdpListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
