"""NVIDIA Cumulus Linux: ``nv show qos roce -o json`` into a switch-wide :class:`RoceEnd`.

NVUE prints the same tree as its text output (``mode``; ``pfc``: ``pfc-priority``,
``rx-enabled``, ``tx-enabled``; ``congestion-control``: ``congestion-mode``, ``enabled-tc``,
``min-threshold``, ``max-threshold``; ``trust``: ``trust-mode``; ``prio-map``: per row ``pcp``,
``dscp``, ``switch-prio``; ``tc-map``: per row ``switch-prio``, ``traffic-class``,
``scheduler-weight``), with sizes as NVUE writes them (``146.48 KB``, ``1.43 MB``). The command
describes the switch's RoCE settings as a whole, so the result is a switch default: it applies
to every port the switch has no port-level entry for.

Usage: ``nv show qos roce -o json > nvue/<switch>.json`` in a recorded directory.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

from rocewatch.core.roce import SWITCH, RoceEnd, Wred

_SIZE_RE = re.compile(r"^\s*([0-9.]+)\s*([KMG]?B|bytes?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "BYTE": 1, "BYTES": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}


def parse_size(v: Any) -> int | None:
    """'146.48 KB' -> 149995; 1500000 -> 1500000."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v)
    if not isinstance(v, str):
        return None
    m = _SIZE_RE.match(v)
    if not m:
        return None
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").upper()])


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        with contextlib.suppress(ValueError):
            return int(v.strip())
    return None


def _ints(v: Any) -> list[int]:
    """'0,3' / [0, 3] / 3 -> [0, 3]; '-' -> []."""
    if isinstance(v, list):
        return [i for x in v if (i := _int(x)) is not None]
    if isinstance(v, int) and not isinstance(v, bool):
        return [v]
    if isinstance(v, str):
        return [i for s in v.split(",") if (i := _int(s)) is not None]
    return []


def _on(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("enabled", "disabled", "yes", "no", "on", "off"):
        return v.lower() in ("enabled", "yes", "on")
    return None


def _rows(v: Any) -> list[dict[str, Any]]:
    if isinstance(v, dict):
        return [r for r in v.values() if isinstance(r, dict)]
    if isinstance(v, list):
        return [r for r in v if isinstance(r, dict)]
    return []


def parse_nvue_roce(doc: Any, switch: str, port: str = "*") -> RoceEnd:
    """``nv show qos roce -o json`` of ``switch``; raises ValueError when it is not an object."""
    if not isinstance(doc, dict):
        raise ValueError("nv show qos roce: not a JSON object")
    end = RoceEnd(kind=SWITCH, device=switch, port=port, source="nvue")
    mode = doc.get("mode")
    if isinstance(mode, str):
        end.mode = "lossless" if mode.startswith("lossless") else "lossy"
    pfc = doc.get("pfc")
    if isinstance(pfc, dict) and "pfc-priority" in pfc:
        end.pfc = frozenset(_ints(pfc.get("pfc-priority")))
    trust = doc.get("trust")
    if isinstance(trust, dict) and isinstance(trust.get("trust-mode"), str):
        modes = {m.strip().lower() for m in trust["trust-mode"].split(",")}
        end.trust = "both" if {"pcp", "dscp"} <= modes else next(iter(modes), None)
    dscp: dict[int, int] = {}
    for row in _rows(doc.get("prio-map")):
        sp = _int(row.get("switch-prio"))
        if sp is not None:
            for d in _ints(row.get("dscp")):
                dscp[d] = sp
    if dscp:
        end.dscp_to_prio = dscp
    tc: dict[int, int] = {}
    tsa: dict[int, str] = {}
    bw: dict[int, int] = {}
    for row in _rows(doc.get("tc-map")):
        sp, t = _int(row.get("switch-prio")), _int(row.get("traffic-class"))
        if sp is None or t is None:
            continue
        tc[sp] = t
        w = str(row.get("scheduler-weight", "")).lower()
        if w.startswith("strict"):
            tsa[t] = "strict"
        elif m := re.search(r"(\d+)", w):
            tsa.setdefault(t, "ets")
            bw[t] = int(m.group(1))
    if tc:
        end.prio_to_tc = tc
    if tsa:
        end.tc_tsa, end.tc_bw = tsa, bw
    cc = doc.get("congestion-control")
    if isinstance(cc, dict):
        ecn = "ecn" in str(cc.get("congestion-mode", "")).lower()
        prof = Wred(
            min_bytes=parse_size(cc.get("min-threshold")),
            max_bytes=parse_size(cc.get("max-threshold")),
            ecn=ecn,
            profile="roce",
        )
        on = set(_ints(cc.get("enabled-tc")))
        end.wred = {t: prof if t in on else Wred(ecn=False) for t in range(8)}
    return end
