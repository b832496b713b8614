"""Per-netdev driver statistics, as ``ethtool -S`` shows them: the ethtool ioctl, or its output.

``EthtoolReader`` asks the kernel directly (``SIOCETHTOOL``: ``ETHTOOL_GDRVINFO`` for the count,
``ETHTOOL_GSTRINGS`` for the names once, then one ``ETHTOOL_GSTATS`` per sample), which costs a
fraction of forking ``ethtool``. The names are re-read when the driver reports another count
(mlx5 adds per-channel counters when channels change). ``parse_ethtool_s`` reads the text
``ethtool -S`` prints, for hosts where the ioctl is not allowed and for recorded output.
"""

from __future__ import annotations

import ctypes
import fcntl
import socket
import struct
import subprocess

SIOCETHTOOL = 0x8946
ETHTOOL_GDRVINFO = 0x00000003
ETHTOOL_GSTRINGS = 0x0000001B
ETHTOOL_GSTATS = 0x0000001D
ETH_SS_STATS = 1
ETH_GSTRING_LEN = 32
_DRVINFO_LEN = 196
_DRVINFO_N_STATS = 180  # offset of n_stats in struct ethtool_drvinfo
_IFNAMSIZ = 16


class EthtoolError(OSError):
    """The ioctl failed (no such device, not permitted, no statistics)."""


def parse_ethtool_s(text: str) -> dict[str, int]:
    """``ethtool -S IFACE`` output -> {counter: value}; lines that are not ``name: int`` are
    skipped (the "NIC statistics:" header, per-queue headers some drivers print)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, value = line.strip().rpartition(":")
        if not sep or not name:
            continue
        try:
            out[name.strip()] = int(value.strip())
        except ValueError:
            continue
    return out


def ethtool_s_command(netdev: str, timeout: float = 5.0) -> dict[str, int]:
    """Run ``ethtool -S netdev`` and parse it (the slow path)."""
    try:
        res = subprocess.run(
            ["ethtool", "-S", netdev], capture_output=True, text=True, timeout=timeout, check=True
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise EthtoolError(f"ethtool -S {netdev}: {e}") from e
    return parse_ethtool_s(res.stdout)


class EthtoolReader:
    """``ethtool -S`` of one netdev through the ioctl; the socket and buffers are reused."""

    def __init__(self, netdev: str) -> None:
        if not netdev or len(netdev.encode()) >= _IFNAMSIZ:
            raise EthtoolError(f"{netdev!r} is not a netdev name")
        self.netdev = netdev
        self._name = netdev.encode()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.names: list[str] = []
        self._buf: ctypes.Array[ctypes.c_char] = ctypes.create_string_buffer(8)
        self._load_names()

    def _ioctl(self, buf: ctypes.Array[ctypes.c_char]) -> None:
        ifr = bytearray(struct.pack(f"{_IFNAMSIZ}sP", self._name, ctypes.addressof(buf)))
        ifr += bytes(40 - len(ifr))
        try:
            fcntl.ioctl(self._sock.fileno(), SIOCETHTOOL, ifr)
        except OSError as e:
            raise EthtoolError(e.errno, f"ethtool ioctl on {self.netdev}: {e.strerror}") from e

    def _load_names(self) -> None:
        info = ctypes.create_string_buffer(_DRVINFO_LEN)
        struct.pack_into("I", info, 0, ETHTOOL_GDRVINFO)
        self._ioctl(info)
        (n,) = struct.unpack_from("I", info, _DRVINFO_N_STATS)
        # room for twice as many: the kernel writes as many values as the driver has *now*
        cap = 2 * n + 64
        strings = ctypes.create_string_buffer(12 + cap * ETH_GSTRING_LEN)
        struct.pack_into("III", strings, 0, ETHTOOL_GSTRINGS, ETH_SS_STATS, n)
        self._ioctl(strings)
        (got,) = struct.unpack_from("I", strings, 8)
        raw = strings.raw[12 : 12 + got * ETH_GSTRING_LEN]
        self.names = [
            raw[i : i + ETH_GSTRING_LEN].split(b"\0", 1)[0].decode("ascii", "replace")
            for i in range(0, len(raw), ETH_GSTRING_LEN)
        ]
        self._cap = cap
        self._buf = ctypes.create_string_buffer(8 + 8 * cap)
        self._fmt = struct.Struct(f"{len(self.names)}Q")

    def read(self) -> dict[str, int]:
        """Every driver counter of the netdev, by its ``ethtool -S`` name."""
        for _ in range(3):
            buf = self._buf
            struct.pack_into("II", buf, 0, ETHTOOL_GSTATS, len(self.names))
            self._ioctl(buf)
            (n,) = struct.unpack_from("I", buf, 4)
            if n == len(self.names):
                return dict(zip(self.names, self._fmt.unpack_from(buf, 8), strict=True))
            self._load_names()  # the driver's counter set changed: names first
        raise EthtoolError(f"ethtool ioctl on {self.netdev}: the counter set keeps changing")

    def close(self) -> None:
        self._sock.close()
