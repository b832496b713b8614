"""``rocewatch check roce DIR``: load a recorded directory's configuration, print a table like
``netq show roce-config`` and the findings, exit non-zero when an error is found.

DIR holds ``topology.yaml`` and any of ``nic_config.jsonl``, ``switch_config.jsonl`` and
``nvue/<switch>.json`` (``nv show qos roce -o json`` of that switch). A bad line is counted and
skipped; a missing input leaves its values unknown.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import orjson

from collector.roce_config.nic import parse_snapshot
from collector.roce_config.nvue import parse_nvue_roce
from collector.roce_config.switch import SwitchConfigReader
from rocewatch.core.errors import ConfigError
from rocewatch.core.roce import NIC, RoceEnd, RoceFabric
from rocewatch.core.topology import Topology
from rocewatch.roce.checks import ERROR, Finding, Intent, intent_for, links, run_checks

log = logging.getLogger(__name__)

NIC_CONFIG = "nic_config.jsonl"
SWITCH_CONFIG = "switch_config.jsonl"
NVUE_DIR = "nvue"


def load_nic_config(path: Path, fab: RoceFabric) -> None:
    with path.open("rb") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError:
                fab.skip("nic_config:bad_json")
                continue
            if not isinstance(doc, dict):
                fab.skip("nic_config:not_an_object")
                continue
            try:
                fab.add(parse_snapshot(doc))
            except ValueError:
                fab.skip("nic_config:no_node_or_nic")


def load_dir(d: Path, topo: Topology | None = None) -> tuple[Topology, RoceFabric]:
    """The topology and every end's configuration from a recorded directory."""
    if not d.is_dir():
        raise ConfigError(f"{d}: not a directory")
    topo = topo or Topology.load(d / "topology.yaml")
    fab = RoceFabric()
    if (d / NIC_CONFIG).exists():
        load_nic_config(d / NIC_CONFIG, fab)
    if (d / SWITCH_CONFIG).exists():
        r = SwitchConfigReader(topo)
        with (d / SWITCH_CONFIG).open("rb") as f:
            r.feed_lines(f)
        r.fabric(fab)
    nv = d / NVUE_DIR
    if nv.is_dir():
        for p in sorted(nv.glob("*.json")):
            try:
                fab.defaults[p.stem] = parse_nvue_roce(json.loads(p.read_text()), p.stem)
            except ValueError:  # json.JSONDecodeError is a ValueError
                fab.skip("nvue:bad_json")
    return topo, fab


# --- the table ---------------------------------------------------------------------------------


def _m(d: dict[int, int] | None, k: int) -> str:
    if d is None:
        return "?"
    v = d.get(k)
    return "-" if v is None else str(v)


def row(e: RoceEnd, it: Intent) -> dict[str, Any]:
    """One line of the table, as ``netq show roce-config`` has it (RoCE mode, trust, DSCP->SP,
    SP->PG, SP->TC, PFC priorities, ECN thresholds, ETS, CNP, MTU)."""
    tc = e.prio_to_tc.get(it.priority, it.priority) if e.prio_to_tc else it.priority
    w = (e.wred or {}).get(tc)
    mode = e.mode or (None if e.pfc is None else "lossless" if e.pfc else "lossy")
    ecn = "?"
    if e.kind == NIC and e.ecn_np is not None:
        ecn = "np:" + ("on" if e.ecn_np.get(it.priority) else "off")
        if e.ecn_rp is not None:
            ecn += " rp:" + ("on" if e.ecn_rp.get(it.priority) else "off")
    elif w is not None:
        ecn = f"{w.min_bytes}/{w.max_bytes}" if w.ecn else "off"
    ets = "?"
    if e.tc_tsa is not None and tc in e.tc_tsa:
        ets = e.tc_tsa[tc] + (f":{e.tc_bw[tc]}" if e.tc_bw and tc in e.tc_bw else "")
    cnp = "?"
    if e.kind == NIC and (e.cnp_dscp is not None or e.cnp_prio is not None):
        cnp = f"{e.cnp_dscp}/{e.cnp_prio}"
    elif e.dscp_to_prio is not None:
        cnp = f"{it.cnp_dscp}->{_m(e.dscp_to_prio, it.cnp_dscp)}"
    gid = "?"
    if e.gids is not None:
        gid = "v2" if any(g.type == "RoCE v2" for g in e.gids) else "none"
    return {
        "device": e.device,
        "port": e.port,
        "kind": e.kind,
        "mode": mode or "?",
        "trust": e.trust or "?",
        "dscp_sp": f"{it.dscp}->{_m(e.dscp_to_prio, it.dscp)}",
        "sp_pg": _m(e.prio_to_pg, it.priority),
        "sp_tc": _m(e.prio_to_tc, it.priority),
        "pfc": "?" if e.pfc is None else ",".join(map(str, sorted(e.pfc))) or "none",
        "ecn": ecn,
        "ets": ets,
        "cnp": cnp,
        "mtu": "?" if e.mtu is None else str(e.mtu),
        "gid": gid if e.kind == NIC else "",
        "source": e.source,
    }


COLUMNS = (
    ("device", "Device"),
    ("port", "Port"),
    ("mode", "Mode"),
    ("trust", "Trust"),
    ("dscp_sp", "DSCP->SP"),
    ("sp_pg", "SP->PG"),
    ("sp_tc", "SP->TC"),
    ("pfc", "PFC"),
    ("ecn", "ECN min/max"),
    ("ets", "ETS"),
    ("cnp", "CNP"),
    ("mtu", "MTU"),
    ("gid", "GID"),
)


def table(rows: list[dict[str, Any]]) -> str:
    widths = {k: max([len(h)] + [len(str(r[k])) for r in rows]) for k, h in COLUMNS}
    lines = ["  ".join(h.ljust(widths[k]) for k, h in COLUMNS).rstrip()]
    lines.append("  ".join("-" * widths[k] for k, _ in COLUMNS))
    for r in rows:
        lines.append("  ".join(str(r[k]).ljust(widths[k]) for k, _ in COLUMNS).rstrip())
    return "\n".join(lines)


def cabled_ends(topo: Topology, fab: RoceFabric) -> list[RoceEnd]:
    seen: dict[str, RoceEnd] = {}
    for lk in links(topo, fab):
        for e in lk.ends():
            seen.setdefault(e.name, e)
    return [seen[k] for k in sorted(seen)]


def check_dir(d: Path, intent: Intent | None = None) -> dict[str, Any]:
    """The whole result as data: rows, findings, counts, skipped input."""
    topo, fab = load_dir(d)
    it = intent or intent_for(topo)
    findings = run_checks(topo, fab, it)
    rows = [row(e, it) for e in cabled_ends(topo, fab)]
    counts = {s: sum(1 for f in findings if f.severity == s) for s in ("error", "warning", "info")}
    return {
        "intent": {
            "priority": it.priority,
            "dscp": it.dscp,
            "cnp_dscp": it.cnp_dscp,
            "cnp_priority": it.cnp_priority,
        },
        "rows": rows,
        "findings": [f.to_dict() for f in findings],
        "counts": counts,
        "skipped": dict(sorted(fab.skipped.items())),
        "unknown_ends": sum(1 for lk in links(topo, fab) for e in (lk.ea, lk.eb) if e is None),
    }


def _device(end: str) -> str:
    return end.split("/", 1)[0]


def format_findings(findings: list[Finding] | list[dict[str, Any]], show: int = 3) -> str:
    """The findings as text. A fault on one device shows on each of its cables: findings of one
    check and consequence that all touch the same device are shown ``show`` at a time, then
    counted (``--json`` has every one)."""
    ds = [f.to_dict() if isinstance(f, Finding) else f for f in findings]
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for d in ds:
        groups.setdefault((d["severity"], d["check"], d["consequence"]), []).append(d)
    lines = []
    for (sev, check, consequence), group in groups.items():
        common = set.intersection(*({_device(e) for e in d["ends"]} for d in group))
        cut = group[:show] if len(group) > show + 1 and common else group
        for d in cut:
            lines.append(f"{sev.upper():7} {check}: {d['message']}")
        if len(cut) < len(group):
            lines.append(
                f"        ... and {len(group) - len(cut)} more {check} findings on the cables of "
                f"{', '.join(sorted(common))} ({len(group)} in all)"
            )
        lines.append(f"        consequence: {consequence}")
        lines.append(f"        fix: {group[0]['fix']}")
    return "\n".join(lines)


def cmd_check_roce(
    directory: Path,
    as_json: bool = False,
    priority: int | None = None,
    show_table: bool = True,
) -> int:
    """Print the table and findings; 1 when an error-severity finding exists, else 0."""
    it = None
    if priority is not None:
        it = Intent(priority=priority)
    res = check_dir(directory, it)
    if as_json:
        print(json.dumps(res, indent=2))
    else:
        if show_table:
            print(table(res["rows"]))
            print()
        if res["findings"]:
            print(format_findings(res["findings"]))
        c = res["counts"]
        print(
            f"{len(res['rows'])} ends checked: {c['error']} errors, {c['warning']} warnings, "
            f"{c['info']} info; {res['unknown_ends']} cable ends without configuration"
        )
        if res["skipped"]:
            skipped = ", ".join(f"{k}={v}" for k, v in res["skipped"].items())
            print(f"counted and skipped: {skipped}")
    return 1 if res["counts"][ERROR] else 0
