"""Every RoCE configuration check: it fires on its fault, naming both ends, and a correct fabric
passes; unknown values never make a finding."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from rocewatch.core.roce import Gid, PfcWatchdog, RoceEnd, RoceFabric, Wred
from rocewatch.core.topology import Topology
from rocewatch.roce.checks import ERROR, INFO, WARNING, Intent, run_checks

TOPO = Topology.from_dict(
    {
        "switches": [
            {"name": "tor-p0-r3", "role": "leaf"},
            {"name": "spine-0", "role": "spine"},
        ],
        "links": [{"a": "tor-p0-r3/swp33", "b": "spine-0/swp1"}],
        "nodes": [
            {
                "name": "h100-0012",
                "nics": [{"nic": "mlx5_3", "netdev": "eth3", "switch_port": "tor-p0-r3/swp13"}],
            }
        ],
        "jobs": [{"name": "llm", "priority": 3, "nodes": ["h100-0012"]}],
    }
)
NIC_END = "h100-0012/mlx5_3"
TOR = "tor-p0-r3/swp13"
UP = "tor-p0-r3/swp33"
SPINE = "spine-0/swp1"
DSCP = {d: d // 8 for d in range(64)} | {26: 3, 48: 6}


def good_nic() -> RoceEnd:
    return RoceEnd(
        "nic",
        "h100-0012",
        "mlx5_3",
        netdev="eth3",
        trust="dscp",
        dscp_to_prio={26: 3, 48: 6},
        prio_to_tc={p: p for p in range(8)},
        prio_to_pg={p: int(p == 3) for p in range(8)},
        pfc=frozenset({3}),
        tc_tsa={t: "strict" if t == 6 else "ets" for t in range(8)},
        tc_bw={0: 50, 3: 50},
        mtu=9000,
        pause_rx=False,
        pause_tx=False,
        acs_redirect=[],
        roce_tos=106,
        ecn_np={p: p == 3 for p in range(8)},
        ecn_rp={p: p == 3 for p in range(8)},
        cnp_dscp=48,
        cnp_prio=6,
        gids=[
            Gid(1, 0, "fe80:0000:0000:0000:0e42:a1ff:fe9b:0c38", "IB/RoCE v1", "eth3"),
            Gid(1, 3, "0000:0000:0000:0000:0000:ffff:c000:0201", "RoCE v2", "eth3"),
        ],
    )


def good_port(switch: str, port: str) -> RoceEnd:
    return RoceEnd(
        "switch",
        switch,
        port,
        trust="dscp",
        dscp_to_prio=dict(DSCP),
        prio_to_pg={p: p if p in (3, 4) else 0 for p in range(8)},
        prio_to_tc={p: p for p in range(8)},
        pfc=frozenset({3}),
        tc_tsa={0: "ets", 3: "ets", 6: "strict"},
        tc_bw={0: 50, 3: 50},
        wred={3: Wred(1048576, 2097152, True, "AZURE_LOSSLESS"), 0: Wred(ecn=False)},
        mtu=9216,
        pfc_watchdog=PfcWatchdog("drop", 200, 200),
    )


def fabric(mutate: Callable[[dict[str, RoceEnd]], None] | None = None) -> RoceFabric:
    ends = {
        NIC_END: good_nic(),
        TOR: good_port("tor-p0-r3", "swp13"),
        UP: good_port("tor-p0-r3", "swp33"),
        SPINE: good_port("spine-0", "swp1"),
    }
    if mutate is not None:
        mutate(ends)
    fab = RoceFabric()
    for e in ends.values():
        fab.add(e)
    return fab


def setv(name: str, **kw: object) -> Callable[[dict[str, RoceEnd]], None]:
    def f(ends: dict[str, RoceEnd]) -> None:
        ends[name] = replace(ends[name], **kw)  # type: ignore[arg-type]

    return f


# (check, severity, fault, the two ends the finding must name, words its message must hold)
CASES = [
    ("trust", ERROR, setv(NIC_END, trust="pcp"), (NIC_END, TOR), "trusts pcp"),
    ("trust", ERROR, setv(TOR, trust="pcp"), (NIC_END, TOR), "swp13 trusts pcp"),
    ("mode", ERROR, setv(TOR, mode="lossy"), (NIC_END, TOR), "is lossy"),
    ("mode", ERROR, setv(SPINE, pfc=frozenset()), (UP, SPINE), "is lossy"),
    ("pfc", ERROR, setv(TOR, pfc=frozenset({4})), (NIC_END, TOR), "PFC on priority 4"),
    ("pfc", WARNING, setv(NIC_END, pfc=frozenset({3, 4})), (NIC_END, TOR), "priority 3,4"),
    (
        "classification",
        ERROR,
        setv(NIC_END, dscp_to_prio={26: 4}),
        (NIC_END, TOR),
        "maps DSCP 26 to priority 4",
    ),
    (
        "classification",
        WARNING,
        setv(SPINE, prio_to_pg={3: 0}),
        (SPINE, UP),
        "priority group 0",
    ),
    ("ecn", ERROR, setv(SPINE, wred={3: Wred(ecn=False)}), (UP, SPINE), "no ECN on queue 3"),
    (
        "ecn",
        ERROR,
        setv(SPINE, wred={3: Wred(None, None, True)}),
        (UP, SPINE),
        "thresholds missing",
    ),
    (
        "ecn",
        ERROR,
        setv(TOR, wred={3: Wred(2097152, 1048576, True)}),
        (NIC_END, TOR),
        ">= max",
    ),
    (
        "ecn",
        ERROR,
        setv(NIC_END, ecn_np={3: False}),
        (NIC_END, TOR),
        "roce_np off on priority 3",
    ),
    ("ets", WARNING, setv(TOR, tc_tsa={3: "strict"}), (NIC_END, TOR), "strict priority"),
    ("ets", WARNING, setv(NIC_END, tc_bw={3: 0}), (NIC_END, TOR), "share of 0"),
    ("cnp", WARNING, setv(NIC_END, cnp_dscp=46), (NIC_END, TOR), "CNP DSCP 46"),
    ("cnp", WARNING, setv(TOR, tc_tsa={3: "ets", 6: "ets"}), (NIC_END, TOR), "not strict"),
    ("cnp", WARNING, setv(TOR, dscp_to_prio={26: 3, 48: 0}), (NIC_END, TOR), "priority 0"),
    (
        "gid",
        ERROR,
        setv(
            NIC_END,
            gids=[
                Gid(1, 0, "fe80:0000:0000:0000:0e42:a1ff:fe9b:0c38", "IB/RoCE v1", "eth3"),
                Gid(1, 1, "fe80:0000:0000:0000:0e42:a1ff:fe9b:0c38", "RoCE v2", "eth3"),
            ],
        ),
        (NIC_END, TOR),
        "no routable RoCE v2 GID (only IB/RoCE v1 link-local, RoCE v2 link-local)",
    ),
    ("gid", ERROR, setv(NIC_END, gids=[]), (NIC_END, TOR), "GID table empty"),
    (
        "gid",
        ERROR,
        setv(
            NIC_END, gids=[Gid(1, 3, "0000:0000:0000:0000:0000:ffff:c000:0201", "RoCE v2", "eth9")]
        ),
        (NIC_END, TOR),
        "no routable RoCE v2 GID",
    ),
    ("mtu", ERROR, setv(UP, mtu=1500), (UP, SPINE), "MTU 1500"),
    ("mtu", ERROR, setv(TOR, mtu=1500), (NIC_END, TOR), "swp13 MTU 1500"),
    (
        "mtu",
        ERROR,
        lambda e: [setv(UP, mtu=1500)(e), setv(SPINE, mtu=1500)(e)],
        (UP, SPINE),
        "NIC-facing",
    ),
    ("pause", ERROR, setv(NIC_END, pause_rx=True), (NIC_END, TOR), "rx on"),
    (
        "classification",
        WARNING,
        setv(NIC_END, roce_tos=0),
        (NIC_END, TOR),
        "ToS 0 (DSCP 0), not DSCP 26",
    ),
    (
        "pcie_acs",
        WARNING,
        setv(NIC_END, acs_redirect=["0000:44:00.0"]),
        (NIC_END, TOR),
        "0000:44:00.0 above it redirect",
    ),
    (
        "pfc_watchdog",
        WARNING,
        setv(UP, pfc_watchdog=PfcWatchdog("off")),
        (UP, SPINE),
        "no PFC watchdog",
    ),
    (
        "pfc_watchdog",
        WARNING,
        setv(TOR, pfc_watchdog=PfcWatchdog("drop", 5000, 5000)),
        (NIC_END, TOR),
        "5000 ms",
    ),
    (
        "pfc_watchdog",
        INFO,
        setv(TOR, pfc_watchdog=PfcWatchdog("alert", 200, 200)),
        (NIC_END, TOR),
        "only alerts",
    ),
]


def test_a_correct_fabric_passes_every_check() -> None:
    assert run_checks(TOPO, fabric()) == []


def test_unknown_is_never_wrong() -> None:
    fab = RoceFabric()
    for name in (NIC_END, TOR, UP, SPINE):
        dev, port = name.split("/", 1)
        fab.add(RoceEnd("nic" if name == NIC_END else "switch", dev, port))
    assert run_checks(TOPO, fab) == []
    assert run_checks(TOPO, RoceFabric()) == []


@pytest.mark.parametrize(
    ("check", "severity", "fault", "ends", "words"),
    CASES,
    ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)],
)
def test_check_fires_on_its_fault(
    check: str,
    severity: str,
    fault: Callable[[dict[str, RoceEnd]], None],
    ends: tuple[str, str],
    words: str,
) -> None:
    found = run_checks(TOPO, fabric(fault))
    assert [(f.check, f.severity) for f in found] == [(check, severity)], found
    f = found[0]
    assert set(f.ends) == set(ends)
    # both ends named in the message (the outlier check names its peer in parentheses)
    assert ends[0] in f.message and ends[1] in f.message
    assert words in f.message
    assert f.consequence and f.fix


def test_intent_follows_the_jobs_priority_and_both_ends_are_shown() -> None:
    fab = fabric(lambda e: [setv(n, pfc=frozenset({4}))(e) for n in (NIC_END, TOR, UP, SPINE)])
    found = run_checks(TOPO, fab, Intent(priority=3))
    assert {f.check for f in found} >= {"pfc"}
    f = next(f for f in found if f.ends == (NIC_END, TOR))
    assert f.message == f"{NIC_END} PFC on priority 4; {TOR} PFC on priority 4"
