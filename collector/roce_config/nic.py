"""A NIC's RoCE configuration snapshot (a ``nic_config.jsonl`` line, taken by the agent with
:func:`collector.nic.roce_config.read_snapshot`) parsed into the normalised
:class:`rocewatch.core.roce.RoceEnd`.

What each section holds: docs/formats/roce_config.md and collector/nic/roce_config.py.
"""

from __future__ import annotations

from typing import Any

from collector.nic.roce_config import (
    ROCE_V2,
    ZERO_GID,
    parse_ethtool_pause,
    read_snapshot,
    run_tool,
)
from rocewatch.core.roce import NIC, Gid, RoceEnd

__all__ = [
    "ROCE_V2",
    "ZERO_GID",
    "dscp_map",
    "nic_trust",
    "parse_ethtool_pause",
    "parse_snapshot",
    "read_snapshot",
    "run_tool",
]


# --- parsing a snapshot ---------------------------------------------------------------------


def _int(v: Any) -> int | None:
    if isinstance(v, int):  # bool included: dcb's on/off arrays
        return int(v)
    if isinstance(v, str):
        try:
            return int(v, 0)
        except ValueError:
            return None
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


def parse_snapshot(snap: dict[str, Any]) -> RoceEnd:
    """A ``nic_config.jsonl`` line as an :class:`RoceEnd`. Raises ValueError without node/nic."""
    node, nic = snap.get("node"), snap.get("nic")
    if not isinstance(node, str) or not isinstance(nic, str) or not node or not nic:
        raise ValueError("snapshot without node or nic")
    end = RoceEnd(kind=NIC, device=node, port=nic, source="nic-agent")
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
    acs = snap.get("pcie_acs")
    if isinstance(acs, dict):
        end.acs_redirect = sorted(
            bdf
            for bdf, a in acs.items()
            if isinstance(a, dict)
            and a.get("port") == "Downstream Port"
            and isinstance(a.get("acs_ctl"), dict)
            and (a["acs_ctl"].get("ReqRedir") or a["acs_ctl"].get("CmpltRedir"))
        )
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
