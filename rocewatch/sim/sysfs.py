"""A fake sysfs tree per node, laid out as the mlx5 driver and the PCI core lay out the real one.

``write_node_sysfs(root, snapshots)`` turns a node's agent snapshots (docs/formats.md section 3,
as the simulator writes them) back into the files the agent reads::

    devices/pci0000:00/0000:<bus>:00.0/{current,max}_link_{speed,width}
    devices/pci0000:00/0000:<bus>:00.0/net/<netdev>/speed
    devices/pci0000:00/0000:<bus>:00.0/infiniband/<nic>/ports/1/{hw_counters,counters}/*
    class/infiniband/<nic>      -> ../../devices/.../infiniband/<nic>   (symlink)
    class/infiniband/<nic>/device -> ../../../0000:<bus>:00.0            (symlink)
    class/net/<netdev>          -> ../../devices/.../net/<netdev>        (symlink)

``hw_counters`` keep the snapshot's names (the driver's); the IB port ``counters`` are derived
from the Ethernet ones as mlx5 reports them for RoCE ports (data in 4-byte words). ``ethtool``
counters cannot live in sysfs: the agent reads them through the ioctl of a real netdev.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# IB port counter -> (ethtool counter, divisor)
_PORT_COUNTERS = {
    "port_xmit_data": ("tx_bytes_phy", 4),
    "port_rcv_data": ("rx_bytes_phy", 4),
    "port_xmit_packets": ("tx_packets_phy", 1),
    "port_rcv_packets": ("rx_packets_phy", 1),
    "symbol_error": ("rx_symbol_err_phy", 1),
    "link_downed": ("link_down_events_phy", 1),
    "port_rcv_errors": ("rx_crc_errors_phy", 1),
}
_ZERO_PORT_COUNTERS = (
    "excessive_buffer_overrun_errors",
    "link_error_recovery",
    "local_link_integrity_errors",
    "port_rcv_constraint_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_discards",
    "port_xmit_wait",
    "VL15_dropped",
)


def _write(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(target, link.parent))


def write_node_sysfs(root: str | Path, snapshots: list[dict[str, Any]]) -> Path:
    """Lay out ``root`` for one node's NIC snapshots (the newest one of each NIC wins)."""
    root = Path(root)
    for i, snap in enumerate(snapshots):
        nic, netdev = snap["nic"], snap.get("netdev")
        pci = root / "devices" / "pci0000:00" / f"0000:{0x17 + 0x10 * i:02x}:00.0"
        for attr, v in (snap.get("pcie") or {}).items():
            _write(pci / attr, v)
        dev = pci / "infiniband" / nic
        port = dev / "ports" / "1"
        for name, v in (snap.get("hw_counters") or {}).items():
            _write(port / "hw_counters" / name, v)
        eth = snap.get("ethtool") or {}
        for name, (src, div) in _PORT_COUNTERS.items():
            _write(port / "counters" / name, int(eth.get(src, 0)) // div)
        for name in _ZERO_PORT_COUNTERS:
            _write(port / "counters" / name, 0)
        _link(root / "class" / "infiniband" / nic, dev)
        _link(dev / "device", pci)
        if netdev:
            nd = pci / "net" / netdev
            _write(nd / "speed", snap.get("speed_mbps", -1))
            _link(root / "class" / "net" / netdev, nd)
    return root


def write_scenario_sysfs(scenario: str | Path) -> Path:
    """``<scenario>/sysfs/<node>/``: a tree per node from the newest snapshot of each NIC in the
    scenario's ``nic.jsonl``."""
    import orjson

    scenario = Path(scenario)
    newest: dict[str, dict[str, dict[str, Any]]] = {}
    with (scenario / "nic.jsonl").open("rb") as fh:
        for line in fh:
            s = orjson.loads(line)
            per = newest.setdefault(s["node"], {})
            old = per.get(s["nic"])
            if old is None or s["timestamp"] >= old["timestamp"]:
                per[s["nic"]] = s
    out = scenario / "sysfs"
    for node, nics in newest.items():
        write_node_sysfs(out / node, [nics[k] for k in sorted(nics)])
    return out
