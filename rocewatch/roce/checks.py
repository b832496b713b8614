"""RoCE configuration checks over the fabric's cables, in the spirit of NVIDIA NetQ's
``netq check roce`` (mode, classification, PFC, ECN, ETS, misc) and its host tests (trust, RoCE
version), on both ends of every cable.

Every check looks at a cable (a NIC and its switch port, or two switch ports) and names both ends
with what each holds; a value that was not read is unknown and never makes a finding. The
expected values come from :class:`Intent` (the RoCE conventions: priority 3, DSCP 26, CNPs on
DSCP 48 / priority 6), whose priority defaults to the topology's jobs' priority.

>>> from rocewatch.core.roce import RoceEnd, RoceFabric
>>> from rocewatch.core.topology import Topology
>>> t = Topology.from_dict({"switches": [{"name": "leaf-0", "role": "leaf"}],
...     "nodes": [{"name": "gpu-1", "nics": [{"nic": "mlx5_0", "switch_port": "leaf-0/swp1"}]}]})
>>> fab = RoceFabric()
>>> fab.add(RoceEnd("nic", "gpu-1", "mlx5_0", trust="pcp"))
>>> fab.add(RoceEnd("switch", "leaf-0", "swp1", trust="dscp"))
>>> [f.message for f in run_checks(t, fab)]
['gpu-1/mlx5_0 trusts pcp; leaf-0/swp1 trusts dscp']
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rocewatch.core.roce import NIC, RoceEnd, RoceFabric
from rocewatch.core.topology import Topology

ERROR, WARNING, INFO = "error", "warning", "info"
SEVERITIES = (ERROR, WARNING, INFO)
MAX_DETECTION_MS = 1000  # a watchdog slower than this lets a storm spread fabric-wide


@dataclass(frozen=True)
class Intent:
    """What a correct RoCE fabric holds."""

    priority: int = 3  # the lossless priority RoCE runs on
    dscp: int = 26  # RoCE's DSCP
    cnp_dscp: int = 48
    cnp_priority: int = 6


@dataclass(frozen=True)
class Finding:
    check: str
    severity: str
    ends: tuple[str, ...]  # "device/port" of both ends
    message: str  # what each end holds
    consequence: str
    fix: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "severity": self.severity,
            "ends": list(self.ends),
            "message": self.message,
            "consequence": self.consequence,
            "fix": self.fix,
        }


@dataclass(frozen=True)
class Link:
    """A cable: ``a`` is the NIC (or the lower-tier switch port), ``b`` the switch port."""

    a: str
    b: str
    nic: bool
    ea: RoceEnd | None
    eb: RoceEnd | None

    def ends(self) -> list[RoceEnd]:
        return [e for e in (self.ea, self.eb) if e is not None]


def links(topo: Topology, fab: RoceFabric) -> list[Link]:
    out = []
    for (node, nic), n in sorted(topo.nics.items()):
        if n.switch_port is None:
            continue
        sp = n.switch_port
        out.append(
            Link(
                f"{node}/{nic}",
                str(sp),
                True,
                fab.get(node, nic),
                fab.get(sp.switch, sp.port),
            )
        )
    for a, b in topo.links:
        ra = topo.switches[a.switch].role
        rb = topo.switches[b.switch].role
        if ("leaf", "spine", "core").index(ra) > ("leaf", "spine", "core").index(rb):
            a, b = b, a
        out.append(
            Link(str(a), str(b), False, fab.get(a.switch, a.port), fab.get(b.switch, b.port))
        )
    return out


def _say(link: Link, show: Callable[[RoceEnd], str]) -> str:
    """'A holds x; B holds y', an unknown end said as such."""
    parts = []
    for name, e in ((link.a, link.ea), (link.b, link.eb)):
        parts.append(show(e) if e is not None else f"{name}: configuration unknown")
    return "; ".join(parts)


def _roce_tc(e: RoceEnd, prio: int) -> int:
    if e.prio_to_tc and prio in e.prio_to_tc:
        return e.prio_to_tc[prio]
    return prio


def _prios(s: frozenset[int] | None) -> str:
    if s is None:
        return "unknown"
    return ",".join(str(p) for p in sorted(s)) if s else "none"


# --- the checks: each yields findings for one cable ---------------------------------------------


def check_trust(link: Link, it: Intent) -> Iterator[Finding]:
    bad = [e for e in link.ends() if e.trust is not None and e.trust not in ("dscp", "both")]
    if not bad:
        return
    yield Finding(
        "trust",
        ERROR,
        (link.a, link.b),
        _say(link, lambda e: f"{e.name} trusts {e.trust or 'unknown'}"),
        "RoCE packets are classified by their 802.1p bits instead of DSCP "
        f"{it.dscp}: they miss the lossless priority {it.priority} and are dropped or paused "
        "on the wrong class",
        "trust DSCP on both ends: NIC `dcb apptrust set dev NETDEV order dscp` (or "
        "`mlnx_qos -i NETDEV --trust dscp`); switch: bind a dscp_to_tc_map / trust dscp",
    )


def check_mode(link: Link, it: Intent) -> Iterator[Finding]:
    def mode(e: RoceEnd) -> str | None:
        if e.mode is not None:
            return e.mode
        if e.pfc is not None:
            return "lossless" if e.pfc else "lossy"
        return None

    modes = {e.name: mode(e) for e in link.ends()}
    if "lossy" not in modes.values():
        return
    yield Finding(
        "mode",
        ERROR,
        (link.a, link.b),
        _say(link, lambda e: f"{e.name} is {modes[e.name] or 'of unknown mode'}"),
        "RoCE runs lossy on this cable: every buffer overflow is a drop and a go-back-N "
        "retransmission, collectives slow down under load",
        f"enable PFC on priority {it.priority} on both ends (NVUE `nv set qos roce mode "
        f"lossless`; SONiC pfc_enable; NIC `dcb pfc set dev NETDEV prio-pfc {it.priority}:on`)",
    )


def check_pfc(link: Link, it: Intent) -> Iterator[Finding]:
    want = frozenset({it.priority})
    ends = [e for e in link.ends() if e.pfc]  # an empty set is the mode check's finding
    wrong = [e for e in ends if it.priority not in e.pfc]  # type: ignore[operator]
    extra = [e for e in ends if e.pfc != want and e not in wrong]
    if not wrong and not extra:
        return
    yield Finding(
        "pfc",
        ERROR if wrong else WARNING,
        (link.a, link.b),
        _say(link, lambda e: f"{e.name} PFC on priority {_prios(e.pfc)}"),
        f"priority {it.priority} is not protected on this cable: RoCE frames are dropped "
        "under congestion while pauses stall a class nobody expects"
        if wrong
        else "PFC on more priorities than RoCE's: lossy traffic can be paused, and storms "
        "spread on those classes too",
        f"enable PFC on priority {it.priority} only, on both ends",
    )


def check_classification(link: Link, it: Intent) -> Iterator[Finding]:
    def dscp_prio(e: RoceEnd) -> int | None:
        if e.dscp_to_prio is None or e.trust == "pcp":
            return None
        return e.dscp_to_prio.get(it.dscp, -1)

    bad = [e for e in link.ends() if dscp_prio(e) not in (None, it.priority)]
    if not bad:
        return

    def show(e: RoceEnd) -> str:
        p = dscp_prio(e)
        return f"{e.name} maps DSCP {it.dscp} to " + (
            "unknown" if p is None else "nothing" if p < 0 else f"priority {p}"
        )

    yield Finding(
        "classification",
        ERROR,
        (link.a, link.b),
        _say(link, show),
        f"RoCE (DSCP {it.dscp}) lands outside the lossless priority {it.priority} on one end",
        f"map DSCP {it.dscp} to priority {it.priority} on both ends (NIC `dcb app add dev "
        f"NETDEV dscp-prio {it.dscp}:{it.priority}`; switch DSCP_TO_TC_MAP / qos mapping)",
    )


def check_roce_tos(link: Link, it: Intent) -> Iterator[Finding]:
    e = link.ea
    if not link.nic or e is None or e.roce_tos is None or e.roce_tos >> 2 == it.dscp:
        return
    yield Finding(
        "classification",
        WARNING,
        (link.a, link.b),
        f"{link.a} marks rdma_cm traffic with ToS {e.roce_tos} (DSCP {e.roce_tos >> 2}), not "
        f"DSCP {it.dscp}; its cable goes to {link.b}",
        "RoCE connections that take the default ToS (rdma_cm applications; NCCL without "
        "NCCL_IB_TC) land outside the lossless priority",
        f"`cma_roce_tos -d NIC -t {it.dscp << 2 | 2}` (DSCP {it.dscp}, ECT(0)), or set NCCL_IB_TC "
        f"to {it.dscp << 2}",
    )


def classification_outliers(lks: list[Link], it: Intent) -> Iterator[Finding]:
    """Switch priority -> PG and -> TC of the RoCE and CNP priorities, the same on every switch
    port (the fabric's majority is the reference)."""
    switch_ends = {e.name: e for lk in lks for e in lk.ends() if e.kind != NIC}
    peer: dict[str, str] = {}
    for lk in lks:
        peer[lk.a], peer[lk.b] = lk.b, lk.a
    for attr, what in (("prio_to_pg", "priority group"), ("prio_to_tc", "traffic class")):
        for prio in (it.priority, it.cnp_priority):
            vals = {
                n: getattr(e, attr).get(prio)
                for n, e in switch_ends.items()
                if getattr(e, attr) is not None
            }
            known = [v for v in vals.values() if v is not None]
            if not known:
                continue
            ref, _ = Counter(known).most_common(1)[0]
            for n, v in sorted(vals.items()):
                if v is None or v == ref:  # a priority the port does not map is unknown
                    continue
                yield Finding(
                    "classification",
                    WARNING,
                    (n, peer.get(n, "")),
                    f"{n} puts priority {prio} in {what} {v}; the fabric's other ports "
                    f"use {ref} (its peer {peer.get(n, 'unknown')})",
                    f"priority {prio} is buffered or queued differently on this port: its "
                    "PFC headroom or ECN thresholds do not apply where expected",
                    f"map priority {prio} to {what} {ref} as on the rest of the fabric",
                )


def check_ecn(link: Link, it: Intent) -> Iterator[Finding]:
    def problem(e: RoceEnd) -> str | None:
        if e.kind == NIC:
            off = [
                side
                for side, m in (("roce_np", e.ecn_np), ("roce_rp", e.ecn_rp))
                if m is not None and m.get(it.priority) is False
            ]
            return f"DCQCN {'/'.join(off)} off on priority {it.priority}" if off else None
        if e.wred is None:
            return None
        tc = _roce_tc(e, it.priority)
        w = e.wred.get(tc)
        if w is None:
            return None
        if not w.ecn:
            return f"no ECN on queue {tc}"
        if w.min_bytes is None or w.max_bytes is None:
            return f"ECN thresholds missing on queue {tc}"
        if w.min_bytes >= w.max_bytes:
            return f"ECN min {w.min_bytes} >= max {w.max_bytes} on queue {tc}"
        return None

    probs = {e.name: problem(e) for e in link.ends()}
    if not any(probs.values()):
        return

    def show(e: RoceEnd) -> str:
        p = probs[e.name]
        if p:
            return f"{e.name}: {p}"
        if e.kind == NIC:
            return f"{e.name}: DCQCN on"
        w = (e.wred or {}).get(_roce_tc(e, it.priority))
        if w is None:
            return f"{e.name}: ECN unknown"
        return f"{e.name}: ECN {w.min_bytes}..{w.max_bytes} B"

    yield Finding(
        "ecn",
        ERROR,
        (link.a, link.b),
        _say(link, show),
        "congestion on the RoCE queue is not signalled: DCQCN cannot slow senders down, "
        "PFC takes over and pauses spread (storms, victim flows)",
        f"set a WRED/ECN profile with min < max thresholds on queue of priority {it.priority} "
        "(SONiC WRED_PROFILE + QUEUE wred_profile; NVUE congestion-control); on NICs enable "
        f"/sys/class/net/NETDEV/ecn/roce_np|roce_rp/enable/{it.priority}",
    )


def check_ets(link: Link, it: Intent) -> Iterator[Finding]:
    def problem(e: RoceEnd) -> str | None:
        if e.tc_tsa is None:
            return None
        tc = _roce_tc(e, it.priority)
        tsa = e.tc_tsa.get(tc)
        if tsa is None:
            return None
        if tsa == "strict":
            return f"RoCE TC {tc} is strict priority"
        bw = (e.tc_bw or {}).get(tc)
        if bw == 0:
            return f"RoCE TC {tc} has an ETS share of 0"
        return None

    probs = {e.name: problem(e) for e in link.ends()}
    if not any(probs.values()):
        return
    yield Finding(
        "ets",
        WARNING,
        (link.a, link.b),
        _say(link, lambda e: f"{e.name}: {probs[e.name] or 'ETS ok'}"),
        "RoCE's bandwidth is not guaranteed by ETS: it starves other classes (strict) or is "
        "starved by them (share 0)",
        "schedule the RoCE TC with ETS/DWRR and a non-zero share (NIC `dcb ets set dev NETDEV "
        "tc-tsa` / `tc-bw`; switch SCHEDULER DWRR weight)",
    )


def check_cnp(link: Link, it: Intent) -> Iterator[Finding]:
    def problem(e: RoceEnd) -> str | None:
        if e.kind == NIC:
            bad = []
            if e.cnp_dscp is not None and e.cnp_dscp != it.cnp_dscp:
                bad.append(f"CNP DSCP {e.cnp_dscp}")
            if e.cnp_prio is not None and e.cnp_prio != it.cnp_priority:
                bad.append(f"CNP 802.1p priority {e.cnp_prio}")
            return ", ".join(bad) or None
        if e.dscp_to_prio is not None and e.trust != "pcp":
            p = e.dscp_to_prio.get(it.cnp_dscp)
            if p != it.cnp_priority:
                return f"DSCP {it.cnp_dscp} goes to priority {p if p is not None else 'none'}"
        if e.tc_tsa is not None:
            tc = _roce_tc(e, it.cnp_priority)
            if tc in e.tc_tsa and e.tc_tsa[tc] != "strict":
                return f"CNP queue {tc} is not strict priority"
        return None

    probs = {e.name: problem(e) for e in link.ends()}
    if not any(probs.values()):
        return
    yield Finding(
        "cnp",
        WARNING,
        (link.a, link.b),
        _say(link, lambda e: f"{e.name}: {probs[e.name] or 'CNP path ok'}"),
        "congestion notifications queue behind the data they are meant to slow down: DCQCN "
        "reacts late and PFC does its job instead",
        f"NIC roce_np cnp_dscp {it.cnp_dscp} and cnp_802p_prio {it.cnp_priority}; switch "
        f"DSCP {it.cnp_dscp} -> priority {it.cnp_priority} on a strict-priority queue",
    )


def check_gid(link: Link, it: Intent) -> Iterator[Finding]:
    e = link.ea
    if not link.nic or e is None or e.gids is None:
        return
    if any(routable_v2(g.gid, g.type) and g.ndev in (None, e.netdev) for g in e.gids):
        return
    have = sorted({f"{g.type or '?'}{' link-local' if _link_local(g.gid) else ''}" for g in e.gids})
    yield Finding(
        "gid",
        ERROR,
        (link.a, link.b),
        f"{link.a} ({e.netdev or 'netdev unknown'}) has no routable RoCE v2 GID"
        + (f" (only {', '.join(have)})" if have else " (GID table empty)")
        + f"; its cable goes to {link.b}",
        "NCCL (NCCL_IB_GID_INDEX) and rdma_cm find no routable RoCE v2 address on this port: "
        "jobs placed here cannot connect",
        "give the netdev its IP address (RoCE v2 GIDs follow the netdev's addresses); check "
        "with `show_gids` / `rdma link`",
    )


def check_acs(link: Link, it: Intent) -> Iterator[Finding]:
    e = link.ea
    if not link.nic or e is None or not e.acs_redirect:
        return
    yield Finding(
        "pcie_acs",
        WARNING,
        (link.a, link.b),
        f"{link.a}: PCIe switch ports {', '.join(e.acs_redirect)} above it redirect "
        f"peer-to-peer traffic (ACS ReqRedir/CmpltRedir on); its cable goes to {link.b}",
        "GPUDirect RDMA between this NIC and the GPUs under the same PCIe switch detours "
        "through the root complex: NCCL's bandwidth on this rail drops",
        "disable ACS redirection on the PCIe switch's downstream ports (BIOS, or `setpci -s "
        "BDF ECAP_ACS+0x6.w=0000` at boot) where IOMMU isolation is not needed",
    )


def _link_local(gid: str) -> bool:
    return gid.lower().startswith("fe80")


def routable_v2(gid: str, gid_type: str | None) -> bool:
    """A RoCE v2 GID of an IPv4 or global IPv6 address: what NCCL_IB_GID_INDEX should pick
    (a link-local fe80:: GID does not cross the leaf's routed hop)."""
    return gid_type == "RoCE v2" and not _link_local(gid)


def check_pause(link: Link, it: Intent) -> Iterator[Finding]:
    on = [e for e in link.ends() if e.pause_rx or e.pause_tx]
    if not on:
        return

    def show(e: RoceEnd) -> str:
        if e.pause_rx is None and e.pause_tx is None:
            return f"{e.name} global pause unknown"
        rx, tx = ("on" if v else "off" for v in (e.pause_rx, e.pause_tx))
        return f"{e.name} global pause rx {rx} tx {tx}"

    yield Finding(
        "pause",
        ERROR,
        (link.a, link.b),
        _say(link, show),
        "802.3x pause stops every class on the link, not just RoCE's: lossy traffic blocks "
        "behind RoCE and a stalled receiver stalls everything",
        "turn global pause off: `ethtool -A NETDEV rx off tx off` (PFC does RoCE's flow control)",
    )


def check_mtu(link: Link, it: Intent) -> Iterator[Finding]:
    a, b = link.ea, link.eb
    if a is None or b is None or a.mtu is None or b.mtu is None:
        return
    if link.nic:
        if a.mtu <= b.mtu:
            return
        msg = f"{a.name} MTU {a.mtu}; {b.name} MTU {b.mtu}"
    elif a.mtu == b.mtu:
        return
    else:
        msg = f"{a.name} MTU {a.mtu}; {b.name} MTU {b.mtu}"
    yield Finding(
        "mtu",
        ERROR,
        (link.a, link.b),
        msg,
        "frames larger than the smaller MTU are dropped on this cable: RDMA connections with "
        "a larger path MTU stall and time out",
        "set the same MTU (9000 on NICs, the switch's jumbo MTU on every fabric port) end to end",
    )


def mtu_paths(lks: list[Link]) -> Iterator[Finding]:
    """An uplink whose two ends agree but carry less than the NIC-facing ports of its leaf."""
    down: dict[str, tuple[int, str]] = {}
    for lk in lks:
        if lk.nic and lk.eb is not None and lk.eb.mtu is not None:
            have = down.get(lk.eb.device)
            if have is None or lk.eb.mtu > have[0]:
                down[lk.eb.device] = (lk.eb.mtu, lk.b)
    for lk in lks:
        if lk.nic or lk.ea is None or lk.eb is None:
            continue
        if lk.ea.mtu is None or lk.ea.mtu != lk.eb.mtu or lk.ea.device not in down:
            continue
        mtu, port = down[lk.ea.device]
        if lk.ea.mtu < mtu:
            yield Finding(
                "mtu",
                ERROR,
                (lk.a, lk.b),
                f"{lk.a} and {lk.b} MTU {lk.ea.mtu}; the leaf's NIC-facing {port} MTU {mtu}",
                "frames the NICs send do not fit the path to the spine: they are dropped there",
                f"raise the uplink's MTU to {mtu} on both ends",
            )


def check_watchdog(link: Link, it: Intent) -> Iterator[Finding]:
    def problem(e: RoceEnd) -> tuple[str, str] | None:
        wd = e.pfc_watchdog
        if e.kind == NIC or wd is None:
            return None
        if wd.action == "off":
            return WARNING, "no PFC watchdog"
        if wd.detection_ms is not None and wd.detection_ms > MAX_DETECTION_MS:
            return WARNING, f"PFC watchdog detects after {wd.detection_ms} ms"
        if (
            wd.detection_ms is not None
            and wd.restoration_ms is not None
            and wd.restoration_ms < wd.detection_ms
        ):
            return WARNING, (
                f"PFC watchdog restores after {wd.restoration_ms} ms, before its "
                f"{wd.detection_ms} ms detection"
            )
        if wd.action == "alert":
            return INFO, "PFC watchdog only alerts (no drop or forward)"
        return None

    probs = {e.name: problem(e) for e in link.ends()}
    found = [p for p in probs.values() if p is not None]
    if not found:
        return

    def show(e: RoceEnd) -> str:
        p = probs[e.name]
        if p:
            return f"{e.name}: {p[1]}"
        wd = e.pfc_watchdog
        if wd is None:
            return f"{e.name}: PFC watchdog " + ("n/a" if e.kind == NIC else "unknown")
        return f"{e.name}: PFC watchdog {wd.action} {wd.detection_ms}/{wd.restoration_ms} ms"

    sev = WARNING if any(s == WARNING for s, _ in found) else INFO
    yield Finding(
        "pfc_watchdog",
        sev,
        (link.a, link.b),
        _say(link, show),
        "a PFC storm on this port is not broken by the switch: it spreads upstream until a "
        "person acts",
        "enable the PFC watchdog with action drop, detection 200 ms, restoration >= detection "
        "(SONiC `pfcwd start --action drop ... 200 --restoration-time 200`)",
    )


LINK_CHECKS: dict[str, Callable[[Link, Intent], Iterator[Finding]]] = {
    "mode": check_mode,
    "trust": check_trust,
    "classification": check_classification,
    "pfc": check_pfc,
    "ecn": check_ecn,
    "ets": check_ets,
    "cnp": check_cnp,
    "gid": check_gid,
    "mtu": check_mtu,
    "pause": check_pause,
    "pfc_watchdog": check_watchdog,
    "pcie_acs": check_acs,
    "roce_tos": check_roce_tos,
}


def intent_for(topo: Topology, **overrides: int) -> Intent:
    """The intent, its priority from the topology's jobs when they agree on one."""
    prios = {j.priority for j in topo.jobs.values() if j.priority is not None}
    kw: dict[str, int] = {}
    if len(prios) == 1:
        kw["priority"] = prios.pop()
    kw.update({k: v for k, v in overrides.items() if v is not None})
    return Intent(**kw)


def run_checks(topo: Topology, fab: RoceFabric, intent: Intent | None = None) -> list[Finding]:
    """Every finding over the topology's cables, errors first."""
    it = intent or intent_for(topo)
    lks = links(topo, fab)
    out: list[Finding] = []
    for lk in lks:
        for check in LINK_CHECKS.values():
            out.extend(check(lk, it))
    out.extend(classification_outliers(lks, it))
    out.extend(mtu_paths(lks))
    out.sort(key=lambda f: (SEVERITIES.index(f.severity), f.check, f.ends))
    return out
