"""A NIC's RoCE configuration: read live (``dcb -j``, ``ethtool -a``, sysfs) into a snapshot in
the layout of ``nic_config.jsonl`` (docs/formats/roce_config.md), and parsed from such a snapshot
into the normalised :class:`rocewatch.roce.model.EndConfig`.

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
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rocewatch.roce.model import NIC, EndConfig, Gid

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
    return snap


# --- parsing a snapshot ---------------------------------------------------------------------


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        with contextlib.suppress(ValueError):
            return int(v, 0)
    return None


def _array(v: Any) -> dict[int, Any] | None:
    """dcb's eight-element arrays (index = priority or TC)."""
    if not isinstance(v, list):
        return None
    return dict(enumerate(v))


def dscp_map(app: Any) -> dict[int, int] | None:
    """``dcb -j app show``'s ``dscp_prio`` pairs as {dscp: priority}; {} when the table is read
    and holds none; None when ``app`` is not an object."""
    if not isinstance(app, dict):
        return None
    out: dict[int, int] = {}
    for pair in app.get("dscp_prio") or []:
        if isinstance(pair, list) and len(pair) == 2:
            d, p = _int(pair[0]), _int(pair[1])
            if d is not None and p is not None:
                out[d] = p
    return out


def nic_trust(snap: dict[str, Any], dcb: dict[str, Any]) -> str | None:
    """What the NIC classifies received RoCE by. ``dcb apptrust``'s first selector where the
    kernel has it; else the driver's ``qos/trust``; else inferred from the APP table: mlx5
    switches to DSCP trust when the first DSCP entry is installed (``ieee_setapp``), so a table
    with DSCP entries means DSCP trust and one without means PCP."""
    at = dcb.get("apptrust")
    if isinstance(at, dict) and isinstance(at.get("order"), list) and at["order"]:
        first = str(at["order"][0])
        return {"dscp": "dscp", "pcp": "pcp"}.get(first, first)
    qos = snap.get("qos")
    if isinstance(qos, dict) and isinstance(qos.get("trust"), str):
        return qos["trust"].strip().lower()
    app = dcb.get("app")
    if isinstance(app, dict):
        return "dscp" if app.get("dscp_prio") else "pcp"
    return None


def _enable_map(sec: Any) -> dict[int, bool] | None:
    if not isinstance(sec, dict) or not isinstance(sec.get("enable"), dict):
        return None
    out: dict[int, bool] = {}
    for k, v in sec["enable"].items():
        p, on = _int(k), _int(v)
        if p is not None and on is not None:
            out[p] = bool(on)
    return out


def parse_snapshot(snap: dict[str, Any]) -> EndConfig:
    """A ``nic_config.jsonl`` line as an :class:`EndConfig`. Raises ValueError without node/nic."""
    node, nic = snap.get("node"), snap.get("nic")
    if not isinstance(node, str) or not isinstance(nic, str) or not node or not nic:
        raise ValueError("snapshot without node or nic")
    end = EndConfig(kind=NIC, device=node, port=nic, source="nic-agent")
    end.timestamp = _int(snap.get("timestamp"))
    end.netdev = snap.get("netdev") if isinstance(snap.get("netdev"), str) else None
    end.mtu = _int(snap.get("mtu"))
    end.roce_tos = _int(snap.get("roce_tos"))
    dcb = snap.get("dcb") if isinstance(snap.get("dcb"), dict) else {}
    assert isinstance(dcb, dict)
    end.trust = nic_trust(snap, dcb)
    end.dscp_to_prio = dscp_map(dcb.get("app"))
    pfc = dcb.get("pfc")
    if isinstance(pfc, dict) and isinstance(pfc.get("prio_pfc"), list):
        end.pfc = frozenset(i for i, on in enumerate(pfc["prio_pfc"]) if on is True)
    ets = dcb.get("ets")
    if isinstance(ets, dict):
        prio_tc = _array(ets.get("prio_tc"))
        if prio_tc is not None:
            end.prio_to_tc = {p: t for p, v in prio_tc.items() if (t := _int(v)) is not None}
        tsa = _array(ets.get("tc_tsa"))
        if tsa is not None:
            end.tc_tsa = {t: str(v) for t, v in tsa.items()}
        bw = _array(ets.get("tc_bw"))
        if bw is not None:
            end.tc_bw = {t: b for t, v in bw.items() if (b := _int(v)) is not None}
    buf = dcb.get("buffer")
    if isinstance(buf, dict):
        pb = _array(buf.get("prio_buffer"))
        if pb is not None:
            end.prio_to_pg = {p: b for p, v in pb.items() if (b := _int(v)) is not None}
    pause = snap.get("pause")
    if isinstance(pause, dict):
        end.pause_rx = pause["rx"] if isinstance(pause.get("rx"), bool) else None
        end.pause_tx = pause["tx"] if isinstance(pause.get("tx"), bool) else None
    ecn = snap.get("ecn")
    if isinstance(ecn, dict):
        end.ecn_np = _enable_map(ecn.get("roce_np"))
        end.ecn_rp = _enable_map(ecn.get("roce_rp"))
        np_ = ecn.get("roce_np")
        if isinstance(np_, dict):
            end.cnp_dscp = _int(np_.get("cnp_dscp"))
            end.cnp_prio = _int(np_.get("cnp_802p_prio"))
    gids = snap.get("gids")
    if isinstance(gids, list):
        end.gids = []
        for g in gids:
            if not isinstance(g, dict) or not isinstance(g.get("gid"), str):
                continue
            port, index = _int(g.get("port")), _int(g.get("index"))
            if port is None or index is None:
                continue
            t, nd = g.get("type"), g.get("ndev")
            end.gids.append(
                Gid(
                    port,
                    index,
                    g["gid"],
                    t if isinstance(t, str) else None,
                    nd if isinstance(nd, str) else None,
                )
            )
    return end
