"""NIC counters and link state from sysfs (the root is configurable: a container's /host/sys,
or a fake tree the simulator lays out).

- RDMA: ``<root>/class/infiniband/<nic>/ports/<p>/hw_counters/*`` (mlx5: ``np_cnp_sent``,
  ``out_of_sequence``, ...) and ``.../counters/*`` (IB port counters: ``port_xmit_data``,
  ``symbol_error``, ...), file names kept exactly.
- PCIe: ``<root>/class/infiniband/<nic>/device/{current,max}_link_{speed,width}``; speeds kept as
  the kernel spells them ("16.0 GT/s PCIe" on new kernels, "16 GT/s" or "8.0 GT/s" on older).
- The netdev of an RDMA device: ``<root>/class/infiniband/<nic>/device/net/*``; its link speed:
  ``<root>/class/net/<netdev>/speed`` (Mb/s; -1 or unreadable while the link is down: left out).

Attribute files are kept open and re-read with ``pread`` at offset 0 (sysfs regenerates the
value on every read from the start), so a sample costs one system call per counter.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

PCIE_ATTRS = ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width")
MAX_OPEN_FILES = 2048  # beyond this, attribute files are opened for each read


class AttrFiles:
    """Small text files read again and again; keeps up to MAX_OPEN_FILES descriptors."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self.errors = 0

    def read(self, path: str) -> str | None:
        fd = self._fds.get(path)
        try:
            if fd is None:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                if len(self._fds) < MAX_OPEN_FILES:
                    self._fds[path] = fd
                else:
                    try:
                        return os.read(fd, 256).decode("ascii", "replace").strip()
                    finally:
                        os.close(fd)
            return os.pread(fd, 256, 0).decode("ascii", "replace").strip()
        except OSError as e:
            # some port counters refuse reads on Ethernet ports (EINVAL, EOPNOTSUPP)
            if e.errno not in (errno.ENOENT, errno.EINVAL, errno.EOPNOTSUPP, errno.EIO):
                raise
            self.errors += 1
            return None

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text, 0) if text.startswith("0x") else int(text)
    except ValueError:
        return None


class RdmaDevice:
    """One RDMA device (``mlx5_0``) under ``<root>/class/infiniband``."""

    def __init__(self, root: Path, nic: str, files: AttrFiles) -> None:
        self.nic = nic
        self.base = root / "class" / "infiniband" / nic
        self.files = files
        ports = sorted(
            (p for p in (self.base / "ports").glob("*") if p.name.isdigit()),
            key=lambda p: int(p.name),
        )
        self.port = ports[0] if ports else None  # RoCE devices have one port
        self._hw = self._list(self.port / "hw_counters") if self.port else []
        self._port_counters = self._list(self.port / "counters") if self.port else []
        dev = self.base / "device"
        self.netdevs = sorted(p.name for p in (dev / "net").glob("*")) if dev.exists() else []

    @staticmethod
    def _list(d: Path) -> list[tuple[str, str]]:
        if not d.is_dir():
            return []
        return sorted((p.name, str(p)) for p in d.iterdir() if p.is_file())

    def _read_all(self, entries: list[tuple[str, str]]) -> dict[str, int]:
        out: dict[str, int] = {}
        read = self.files.read
        for name, path in entries:
            v = _int(read(path))
            if v is not None:
                out[name] = v
        return out

    def hw_counters(self) -> dict[str, int]:
        return self._read_all(self._hw)

    def port_counters(self) -> dict[str, int]:
        return self._read_all(self._port_counters)

    def pcie(self) -> dict[str, str | int]:
        out: dict[str, str | int] = {}
        dev = self.base / "device"
        for attr in PCIE_ATTRS:
            text = self.files.read(str(dev / attr))
            if not text:
                continue
            if attr.endswith("width"):
                w = _int(text)
                if w is not None:
                    out[attr] = w
            else:
                out[attr] = text
        return out


def rdma_devices(root: Path) -> list[str]:
    d = root / "class" / "infiniband"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def netdev_speed(root: Path, netdev: str, files: AttrFiles) -> int | None:
    """Link speed in Mb/s; None while the link is down or the driver does not say."""
    v = _int(files.read(str(root / "class" / "net" / netdev / "speed")))
    return v if v is not None and v > 0 else None
