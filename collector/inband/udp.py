"""Live INT Telemetry Reports over UDP (CONTRACTS.md section 4): a bounded receive ring.

A receiver thread reads datagrams with ``socket.recv_into`` straight into the slots of one
preallocated buffer (no bytes object per datagram); the caller's ``poll`` hands every filled slot
to the vectorised parser as one batch (``parse_buffer`` over the ring) and frees the slots. Memory
is fixed: ``slots x slot_bytes`` of ring plus the kernel's ``SO_RCVBUF``. Under a flood the ring
fills up; then the receiver still drains the socket but drops the datagrams (``ring_full_drops``),
and whatever the kernel itself dropped is read from ``/proc/net/udp`` (``kernel_drops``).
Datagrams longer than a slot are dropped and counted (``oversize``); malformed and truncated
reports are counted by the parser. Nothing in the input can stop the listener.

>>> import socket
>>> from collector.inband.report import build_report
>>> lis = UdpListener(UdpListenerConfig(host="127.0.0.1", port=0))
>>> lis.start()
>>> tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
>>> _ = tx.sendto(build_report(11, 1, [{"hop_latency_ns": 7}]), ("127.0.0.1", lis.port))
>>> reports = lis.poll(timeout=5.0, min_datagrams=1)
>>> reports["hop_latency_ns"].to_list()
[7]
>>> lis.close(); tx.close()
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass

import numpy as np
import polars as pl

from collector.inband.report import DEFAULT_PORT, InbandStats, empty_reports, parse_buffer
from rocewatch.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UdpListenerConfig:
    """Where to listen and how much memory the ring may hold."""

    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    slots: int = 16384  # datagrams the ring holds between two polls
    slot_bytes: int = 2048  # the largest datagram accepted (jumbo reports: raise it)
    rcvbuf_bytes: int = 8 << 20  # SO_RCVBUF asked of the kernel

    def validate(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"inband.port: {self.port} is not a UDP port")
        if self.slots < 16 or self.slot_bytes < 64:
            raise ConfigError("inband: slots must be >= 16 and slot_bytes >= 64")
        if self.slots * self.slot_bytes > 1 << 31:
            raise ConfigError("inband: slots x slot_bytes must stay under 2 GiB")


@dataclass
class UdpStats:
    received: int = 0  # datagrams put in the ring
    ring_full_drops: int = 0  # read from the socket but dropped: the ring was full
    oversize: int = 0  # longer than a slot
    kernel_drops: int = 0  # dropped by the kernel before we could read them (/proc/net/udp)


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
    """Receives INT datagrams into a ring in a thread; ``poll`` parses them in batches."""

    def __init__(self, cfg: UdpListenerConfig | None = None) -> None:
        self.cfg = cfg or UdpListenerConfig()
        self.cfg.validate()
        self.stats = UdpStats()
        self.parse_stats = InbandStats()
        n, size = self.cfg.slots, self.cfg.slot_bytes
        self._ring = np.zeros(n * size, dtype=np.uint8)
        self._lens = np.zeros(n, dtype=np.int64)
        self._starts = np.arange(n, dtype=np.int64) * size
        self._views = [memoryview(self._ring.data)[i * size : (i + 1) * size] for i in range(n)]
        self._scratch = bytearray(size)
        # written only by the receiver (head) / only by poll (tail); ints are atomic under the GIL
        self._head = 0
        self._tail = 0
        self._ready = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        family = socket.AF_INET6 if ":" in self.cfg.host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.cfg.rcvbuf_bytes)
        try:
            self.sock.bind((self.cfg.host, self.cfg.port))
        except OSError as e:
            self.sock.close()
            raise ConfigError(f"cannot listen on {self.cfg.host}:{self.cfg.port}: {e}") from e
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self._drops0 = _kernel_drops(self.sock) or 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._receive, name="int-udp-rx", daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        recv_into = self.sock.recv_into
        slots, size = self.cfg.slots, self.cfg.slot_bytes
        views, lens, scratch = self._views, self._lens, self._scratch
        st = self.stats
        trunc = socket.MSG_TRUNC  # Linux returns a datagram's real length with it
        notify = 0
        while not self._stop.is_set():
            head = self._head
            full = head - self._tail >= slots
            try:
                n = recv_into(scratch if full else views[head % slots], size, trunc)
            except TimeoutError:
                with self._ready:
                    self._ready.notify_all()
                continue
            except OSError:
                if self._stop.is_set():
                    break
                raise
            if full:
                st.ring_full_drops += 1
                continue
            if n > size:
                st.oversize += 1
                continue
            lens[head % slots] = n
            self._head = head + 1
            st.received += 1
            notify += 1
            if notify >= 256:
                notify = 0
                with self._ready:
                    self._ready.notify_all()

    def pending(self) -> int:
        return self._head - self._tail

    def poll(self, timeout: float = 0.1, min_datagrams: int = 1) -> pl.DataFrame:
        """Parse every datagram in the ring (waiting up to ``timeout`` s for ``min_datagrams``).

        Returns report rows (``REPORT_SCHEMA``); counts go to ``parse_stats`` and ``stats``.
        """
        deadline = time.monotonic() + timeout
        while self.pending() < min_datagrams:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with self._ready:
                self._ready.wait(min(left, 0.05))
        tail, head = self._tail, self._head
        if head == tail:
            self._update_kernel_drops()
            return empty_reports()
        slots, count = self.cfg.slots, head - tail
        a = tail % slots
        first = min(count, slots - a)
        parts = []
        for lo, hi in ((a, a + first), (0, count - first)):  # the ring may wrap once
            if hi > lo:
                parts.append(
                    parse_buffer(
                        self._ring, self._starts[lo:hi], self._lens[lo:hi], self.parse_stats
                    )[0]
                )
        reports = pl.concat(parts, how="vertical") if len(parts) > 1 else parts[0]
        self._tail = head  # the parser copied what it needs: the slots are free again
        self._update_kernel_drops()
        return reports

    def _update_kernel_drops(self) -> None:
        d = _kernel_drops(self.sock)
        if d is not None:
            self.stats.kernel_drops = d - self._drops0

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self.sock.close()

    def __enter__(self) -> UdpListener:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
