"""A NIC's RoCE configuration, read live (``dcb -j``, ``ethtool -a``, sysfs) into a snapshot in
the layout of ``nic_config.jsonl`` (docs/formats/roce_config.md); :class:`ConfigWatcher` takes
them at the agent's configuration cadence and at once when sysfs shows a change. The agent's
side: imports nothing beyond the standard library (collector/roce_config/nic.py parses the
snapshots for the checks).

Sources, each kept as the tool or file gives it (a missing one is unknown, never wrong):

- ``dcb``: iproute2's ``dcb -j <obj> show dev NETDEV`` for ``app`` (``dscp_prio``: a list of
  ``[dscp, prio]`` pairs; ``pcp_prio``, ``default_prio``), ``pfc`` (``prio_pfc``: eight booleans),
  ``ets`` (``tc_tsa``: ``strict``/``ets``/...; ``tc_bw``; ``prio_tc``), ``buffer``
  (``prio_buffer``, ``buffer_size``, ``total_size``) and ``apptrust`` (``order``), as
  iproute2's dcb/dcb_{app,pfc,ets,buffer,apptrust}.c print them.
- ``pause``: ``ethtool -a`` (``--json`` where ethtool has it, else its text), as booleans.
- ``ecn``: ``/sys/class/net/NETDEV/ecn/{roce_np,roce_rp}/`` (mlx5): one key per file, the
  per-priority ``enable/<p>`` directory as a map.
- ``gids``: populated entries of ``/sys/class/infiniband/NIC/ports/<p>/gids/`` with
  ``gid_attrs/types/<i>`` and ``gid_attrs/ndevs/<i>`` (unpopulated entries read as all zeros, and
  their attributes refuse to be read).
- ``qos``: ``/sys/class/net/NETDEV/qos/trust`` where the driver has it (MLNX_OFED mlx5).
- ``mtu``: ``/sys/class/net/NETDEV/mtu``; ``roce_tos``: the rdma_cm configfs
  ``/sys/kernel/config/rdma_cm/NIC/ports/1/default_roce_tos`` where it has been created.
- ``pcie_acs``: for each PCIe bridge above the NIC (the path ``/sys/class/infiniband/NIC/device``
  resolves to), its port type and ``ACSCtl`` flags as ``lspci -vvv -s BDF`` prints them
  (``{"0000:44:00.0": {"port": "Downstream Port", "acs_ctl": {"ReqRedir": true, ...}}}``);
  left out when lspci is missing or may not read the capabilities (it needs root).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DCB_OBJECTS = ("app", "pfc", "ets", "buffer", "apptrust")
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
ROCE_V2 = "RoCE v2"

Runner = Callable[[list[str]], str | None]


def run_tool(argv: list[str], timeout: float = 5.0) -> str | None:
    """A tool's stdout, or None when it is missing, fails or hangs (unknown, not wrong)."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


# --- reading a live NIC ---------------------------------------------------------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:  # missing, or an attribute that refuses reads (EINVAL on unused GIDs)
        return None


def _num(s: str | None) -> int | str | None:
    if s is None:
        return None
    try:
        return int(s, 0)
    except ValueError:
        return s


def read_ecn(sys_root: Path, netdev: str) -> dict[str, Any] | None:
    base = sys_root / "class/net" / netdev / "ecn"
    if not base.is_dir():
        return None
    out: dict[str, Any] = {}
    for side in ("roce_np", "roce_rp"):
        d = base / side
        if not d.is_dir():
            continue
        sec: dict[str, Any] = {}
        for f in sorted(d.iterdir()):
            if f.is_dir():
                sec[f.name] = {p.name: _num(_read(p)) for p in sorted(f.iterdir()) if p.is_file()}
            else:
                v = _num(_read(f))
                if v is not None:
                    sec[f.name] = v
        out[side] = sec
    return out


def read_gids(sys_root: Path, nic: str) -> list[dict[str, Any]] | None:
    ports = sys_root / "class/infiniband" / nic / "ports"
    if not ports.is_dir():
        return None
    out: list[dict[str, Any]] = []
    for pdir in sorted(ports.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0):
        gdir = pdir / "gids"
        if not pdir.name.isdigit() or not gdir.is_dir():
            continue
        for g in sorted(gdir.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0):
            if not g.name.isdigit():
                continue
            gid = _read(g)
            if not gid or gid == ZERO_GID:
                continue
            out.append(
                {
                    "port": int(pdir.name),
                    "index": int(g.name),
                    "gid": gid,
                    "type": _read(pdir / "gid_attrs/types" / g.name),
                    "ndev": _read(pdir / "gid_attrs/ndevs" / g.name),
                }
            )
    return out


def parse_ethtool_pause(text: str) -> dict[str, bool] | None:
    """``ethtool --json -a`` (a one-element list) or the text of ``ethtool -a``."""
    text = text.strip()
    if text.startswith("["):
        with contextlib.suppress(ValueError):
            doc = json.loads(text)
            if isinstance(doc, list) and doc and isinstance(doc[0], dict):
                return {k: bool(doc[0][k]) for k in ("autonegotiate", "rx", "tx") if k in doc[0]}
        return None
    out: dict[str, bool] = {}
    for line in text.splitlines():
        key, sep, val = line.partition(":")
        k = key.strip().lower()
        if sep and k in ("autonegotiate", "rx", "tx"):
            out[k] = val.strip().lower() == "on"
    return out or None


def read_snapshot(
    node: str,
    nic: str,
    netdev: str,
    timestamp: int,
    sys_root: str | Path = "/sys",
    run: Runner = run_tool,
) -> dict[str, Any]:
    """One NIC's configuration snapshot (a ``nic_config.jsonl`` line); sections it cannot read
    are left out."""
    root = Path(sys_root)
    snap: dict[str, Any] = {"timestamp": timestamp, "node": node, "nic": nic, "netdev": netdev}
    mtu = _num(_read(root / "class/net" / netdev / "mtu"))
    if isinstance(mtu, int):
        snap["mtu"] = mtu
    dcb: dict[str, Any] = {}
    for obj in DCB_OBJECTS:
        out = run(["dcb", "-j", obj, "show", "dev", netdev])
        if out:
            with contextlib.suppress(ValueError):
                dcb[obj] = json.loads(out)
    if dcb:
        snap["dcb"] = dcb
    pause = run(["ethtool", "--json", "-a", netdev]) or run(["ethtool", "-a", netdev])
    if pause:
        p = parse_ethtool_pause(pause)
        if p is not None:
            snap["pause"] = p
    ecn = read_ecn(root, netdev)
    if ecn is not None:
        snap["ecn"] = ecn
    gids = read_gids(root, nic)
    if gids is not None:
        snap["gids"] = gids
    trust = _read(root / "class/net" / netdev / "qos/trust")
    if trust:
        snap["qos"] = {"trust": trust}
    tos = _num(_read(root / "kernel/config/rdma_cm" / nic / "ports/1/default_roce_tos"))
    if isinstance(tos, int):
        snap["roce_tos"] = tos
    acs = read_acs(root, nic, run)
    if acs:
        snap["pcie_acs"] = acs
    return snap


_BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_PORT_RE = re.compile(r"Express \(v\d\) ([A-Za-z ]+?Port)")


def pci_bridges(sys_root: Path, nic: str) -> list[str]:
    """The PCI addresses of the bridges between the root complex and the NIC, top first."""
    try:
        real = (sys_root / "class/infiniband" / nic / "device").resolve(strict=True)
    except OSError:
        return []
    bdfs = [p for p in real.parts if _BDF_RE.match(p)]
    return bdfs[:-1]


def parse_lspci_acs(text: str) -> dict[str, Any] | None:
    """The port type and ``ACSCtl`` flags of one device's ``lspci -vvv`` text; None without
    an ACS capability (or when lspci could not read it: ``<access denied>``)."""
    port = _PORT_RE.search(text)
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("ACSCtl:"):
            flags = {
                tok[:-1]: tok.endswith("+")
                for tok in line.removeprefix("ACSCtl:").split()
                if tok[-1:] in ("+", "-")
            }
            return {"port": port.group(1) if port else None, "acs_ctl": flags}
    return None


def read_acs(sys_root: Path, nic: str, run: Runner) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    for bdf in pci_bridges(sys_root, nic):
        text = run(["lspci", "-vvv", "-s", bdf])
        if text:
            acs = parse_lspci_acs(text)
            if acs is not None:
                out[bdf] = acs
    return out or None


# --- watching ------------------------------------------------------------------------------------

# what a cheap sysfs pass compares; dcb and ethtool are read at the configuration cadence only
# (they fork a process each)
SYSFS_KEYS = ("mtu", "ecn", "gids", "qos", "roce_tos")


def _without_ts(snap: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in snap.items() if k != "timestamp"}


class ConfigWatcher:
    """Configuration snapshots of the agent's NICs: each NIC's first :meth:`poll` takes one, then
    one every ``interval_s`` (the configuration cadence), and one at once when a cheap sysfs pass
    every ``check_s`` finds its MTU, DCQCN settings, GIDs or trust changed.

    >>> w = ConfigWatcher("n1", [("mlx5_0", "lo")], "/nonexistent", run=lambda a: None)
    >>> [s["nic"] for s in w.poll()], w.poll()
    (['mlx5_0'], [])
    """

    def __init__(
        self,
        node: str,
        nics: list[tuple[str, str | None]],
        sys_root: str | Path = "/sys",
        interval_s: float = 60.0,
        check_s: float = 5.0,
        run: Runner = run_tool,
        clock: Callable[[], int] | None = None,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        import time

        self.node = node
        self.nics = [(nic, netdev) for nic, netdev in nics if netdev]
        self.root = Path(sys_root)
        self.interval_s = interval_s
        self.check_s = check_s
        self.run = run
        self.clock = clock or time.time_ns
        self.monotonic = monotonic or time.monotonic
        self._full_due: dict[str, float] = {}
        self._check_due: dict[str, float] = {}
        self._seen: dict[str, dict[str, Any]] = {}
        self.changes = 0  # snapshots sent because sysfs changed between cadences

    def _cheap(self, nic: str, netdev: str) -> dict[str, Any]:
        snap = read_snapshot(self.node, nic, netdev, 0, self.root, lambda argv: None)
        return {k: snap.get(k) for k in SYSFS_KEYS}

    def poll(self) -> list[dict[str, Any]]:
        """The snapshots due now (none most of the time)."""
        now = self.monotonic()
        out = []
        for nic, netdev in self.nics:
            assert netdev is not None
            due = now >= self._full_due.get(nic, now)
            if not due and now >= self._check_due.get(nic, now):
                self._check_due[nic] = now + self.check_s
                if self._cheap(nic, netdev) != self._seen.get(nic):
                    due = True
                    self.changes += 1
            if not due:
                continue
            snap = read_snapshot(self.node, nic, netdev, self.clock(), self.root, self.run)
            self._seen[nic] = {k: snap.get(k) for k in SYSFS_KEYS}
            self._full_due[nic] = now + self.interval_s
            self._check_due[nic] = now + self.check_s
            out.append(snap)
        return out

    def lines(self) -> list[bytes]:
        return [json.dumps(s, separators=(",", ":")).encode() + b"\n" for s in self.poll()]
