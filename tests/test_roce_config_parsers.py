"""Parsers of RoCE configuration, each on a fixture in its real format (fixtures/roce_config)."""

from __future__ import annotations

import json
from pathlib import Path

from collector.roce_config.nic import parse_ethtool_pause, parse_snapshot, read_snapshot, run_tool
from collector.roce_config.nvue import parse_nvue_roce, parse_size
from collector.roce_config.switch import SwitchConfigReader, split_path
from rocewatch.core.roce import RoceFabric

FIX = Path(__file__).parent / "fixtures" / "roce_config"
TS = 1795946400000000000


def recorded_tools(argv: list[str]) -> str | None:
    """dcb and ethtool as they answered on a ConnectX-7 port (the fixtures)."""
    if argv[:2] == ["dcb", "-j"]:
        p = FIX / "dcb" / f"{argv[2]}.json"
        return p.read_text() if p.exists() else None
    if argv[:3] == ["ethtool", "--json", "-a"]:
        return (FIX / "ethtool" / "a.json").read_text()
    return None


def test_live_nic_snapshot_from_dcb_ethtool_and_sysfs() -> None:
    snap = read_snapshot("h100-0012", "mlx5_0", "ens1f0np0", TS, FIX / "sys", recorded_tools)
    # the contract's layout: dcb verbatim, pause as booleans, ecn per file, gids populated only
    assert snap["mtu"] == 9000
    assert snap["dcb"]["app"] == {"dscp_prio": [[26, 3], [48, 6]]}
    assert snap["dcb"]["pfc"]["prio_pfc"][3] is True
    assert snap["pause"] == {"autonegotiate": False, "rx": False, "tx": False}
    assert snap["ecn"]["roce_np"]["enable"] == {str(p): int(p == 3) for p in range(8)}
    assert snap["ecn"]["roce_np"]["cnp_dscp"] == 48
    assert snap["ecn"]["roce_np"]["cnp_802p_prio"] == 6
    assert snap["ecn"]["roce_rp"]["rpg_ai_rate"] == 5
    assert [g["index"] for g in snap["gids"]] == [0, 1, 2, 3]  # all-zero entries left out
    assert snap["gids"][3] == {
        "port": 1,
        "index": 3,
        "gid": "0000:0000:0000:0000:0000:ffff:c000:0201",
        "type": "RoCE v2",
        "ndev": "ens1f0np0",
    }
    assert snap["qos"] == {"trust": "dscp"}
    json.dumps(snap)  # a JSON line as it is

    end = parse_snapshot(snap)
    assert (end.device, end.port, end.netdev) == ("h100-0012", "mlx5_0", "ens1f0np0")
    assert end.trust == "dscp"  # dcb apptrust order
    assert end.dscp_to_prio == {26: 3, 48: 6}
    assert end.pfc == frozenset({3})
    assert end.prio_to_tc == {p: p for p in range(8)}
    assert end.tc_tsa is not None and end.tc_tsa[3] == "ets" and end.tc_tsa[6] == "strict"
    assert end.tc_bw is not None and end.tc_bw[3] == 50
    assert end.prio_to_pg is not None and end.prio_to_pg[3] == 1
    assert end.ecn_np == {p: p == 3 for p in range(8)}
    assert (end.cnp_dscp, end.cnp_prio) == (48, 6)
    assert (end.pause_rx, end.pause_tx) == (False, False)
    assert end.gids is not None and [g.type for g in end.gids].count("RoCE v2") == 2


def test_nic_without_address_has_no_roce_v2_gid_and_missing_tools_are_unknown() -> None:
    snap = read_snapshot("h100-0012", "mlx5_1", "ens1f1np1", TS, FIX / "sys", lambda a: None)
    assert "dcb" not in snap and "pause" not in snap and "ecn" not in snap
    end = parse_snapshot(snap)
    assert end.mtu == 1500
    assert end.gids is not None and [g.type for g in end.gids] == ["IB/RoCE v1"]
    # unknown, not wrong
    assert end.trust is None and end.pfc is None and end.dscp_to_prio is None
    assert end.ecn_np is None and end.pause_rx is None


def test_real_tools_on_a_device_without_dcb_give_unknown() -> None:
    """iproute2's dcb and ethtool are installed here; loopback has neither DCB nor pause."""
    assert run_tool(["dcb", "-j", "app", "show", "dev", "lo"]) is None
    assert run_tool(["no-such-tool-rocewatch"]) is None
    snap = read_snapshot("host", "mlx5_9", "lo", TS, "/sys")
    assert snap["mtu"] == int(Path("/sys/class/net/lo/mtu").read_text())
    assert "dcb" not in snap and "pause" not in snap and "gids" not in snap
    end = parse_snapshot(snap)
    assert end.trust is None and end.gids is None


def test_ethtool_pause_text_and_trust_inferred_from_the_app_table() -> None:
    assert parse_ethtool_pause((FIX / "ethtool" / "a_pause_on.txt").read_text()) == {
        "autonegotiate": False,
        "rx": True,
        "tx": True,
    }
    app = json.loads((FIX / "dcb" / "app.json").read_text())
    # no apptrust (older kernels): mlx5 trusts DSCP once DSCP entries are installed
    assert parse_snapshot({"node": "n", "nic": "m", "dcb": {"app": app}}).trust == "dscp"
    assert parse_snapshot({"node": "n", "nic": "m", "dcb": {"app": {}}}).trust == "pcp"
    pcp = {"node": "n", "nic": "m", "dcb": {"app": app, "apptrust": {"order": ["pcp"]}}}
    assert parse_snapshot(pcp).trust == "pcp"


def test_sonic_config_db_over_gnmi() -> None:
    r = SwitchConfigReader()
    with (FIX / "sonic_config_db.jsonl").open("rb") as f:
        r.feed_lines(f)
    fab = r.fabric()
    assert fab.skipped == {"switch_config:bad_json": 1}
    e0 = fab.get("tor-p0-r3", "Ethernet0")
    assert e0 is not None and e0.source == "CONFIG_DB"
    assert e0.trust == "dscp"
    assert e0.dscp_to_prio is not None and e0.dscp_to_prio[26] == 3 and e0.dscp_to_prio[48] == 6
    assert e0.prio_to_pg is not None and e0.prio_to_pg[3] == 3
    assert e0.prio_to_tc is not None and e0.prio_to_tc[3] == 3
    assert e0.pfc == frozenset({3})
    assert e0.mtu == 9100
    assert e0.wred is not None
    w = e0.wred[3]
    assert (w.min_bytes, w.max_bytes, w.ecn) == (1048576, 2097152, True)
    assert w.profile == "AZURE_LOSSLESS"
    assert e0.wred[6].ecn is False and e0.wred[1].ecn is False  # queues without a WRED profile
    assert e0.tc_tsa == {3: "ets", 6: "strict", 0: "ets", 1: "ets", 2: "ets"}
    assert e0.tc_bw is not None and e0.tc_bw[3] == 15
    wd = e0.pfc_watchdog
    assert wd is not None and (wd.action, wd.detection_ms, wd.restoration_ms) == ("drop", 200, 200)
    e8 = fab.get("tor-p0-r3", "Ethernet8")
    assert e8 is not None and e8.pfc == frozenset({3, 4})
    up = fab.get("tor-p0-r3", "Ethernet256")
    assert up is not None and up.mtu == 1500  # the later event wins


def test_config_db_entries_keyed_by_port_lists() -> None:
    """Older SONiC qos templates key PORT_QOS_MAP and QUEUE entries by comma-separated ports."""
    tags = {"source": "tor-1:8080", "target": "CONFIG_DB"}
    r = SwitchConfigReader()
    r.feed_event(
        {
            "tags": tags,
            "values": {
                "/PORT_QOS_MAP/Ethernet0,Ethernet4/pfc_enable": "3,4",
                "/QUEUE/Ethernet0,Ethernet4|3-4/wred_profile": "[WRED_PROFILE|AZURE_LOSSLESS]",
                "/WRED_PROFILE/AZURE_LOSSLESS/green_min_threshold": "104000",
                "/WRED_PROFILE/AZURE_LOSSLESS/green_max_threshold": "312000",
                "/WRED_PROFILE/AZURE_LOSSLESS/ecn": "ecn_all",
            },
        }
    )
    fab = r.fabric()
    for port in ("Ethernet0", "Ethernet4"):
        e = fab.get("tor-1", port)
        assert e is not None and e.pfc == frozenset({3, 4})
        assert e.wred is not None and e.wred[4].max_bytes == 312000 and e.wred[3].ecn


def test_openconfig_qos_and_interface_mtu() -> None:
    r = SwitchConfigReader()
    with (FIX / "openconfig_qos.jsonl").open("rb") as f:
        r.feed_lines(f)
    e = r.fabric().get("10.0.0.21", "Ethernet1/1")
    assert e is not None and e.source == "openconfig"
    assert e.mtu == 9216
    assert e.wred is not None
    assert (e.wred[3].min_bytes, e.wred[3].max_bytes, e.wred[3].ecn) == (153600, 1536000, True)
    assert e.dscp_to_prio == {26: 3, 48: 6}
    assert e.tc_tsa == {6: "strict", 3: "ets", 0: "ets"}
    assert e.tc_bw == {3: 50, 0: 50}
    assert e.pfc is None and e.trust is None  # OpenConfig QoS has neither: unknown


def test_paths_with_keys_origin_and_module_prefixes() -> None:
    assert split_path("openconfig:/interfaces/interface[name=Ethernet1/1]/config/mtu") == (
        ["interfaces", "interface", "config", "mtu"],
        {"interface_name": "Ethernet1/1"},
    )
    r = SwitchConfigReader()
    r.feed_event(
        {
            "timestamp": TS,
            "tags": {"source": "leaf-1:9339"},
            "values": {
                "/openconfig-interfaces:interfaces/interface[name=Ethernet1/1]/"
                "openconfig-interfaces:state/mtu": "9216"
            },
        }
    )
    r.feed_event({"tags": {}, "values": {"/x": 1}})
    r.feed_event("junk")
    fab = r.fabric()
    e = fab.get("leaf-1", "Ethernet1/1")
    assert e is not None and e.mtu == 9216
    assert fab.skipped == {"switch_config:unknown_source": 1, "switch_config:not_an_event": 1}


def test_nvue_show_qos_roce() -> None:
    assert parse_size("146.48 KB") == 149995
    assert parse_size("1.43 MB") == 1499463
    e = parse_nvue_roce(json.loads((FIX / "nvue_qos_roce.json").read_text()), "leaf-01")
    assert e.mode == "lossless"
    assert e.pfc == frozenset({3})
    assert e.trust == "both"
    assert e.dscp_to_prio is not None and e.dscp_to_prio[26] == 3 and e.dscp_to_prio[48] == 6
    assert e.prio_to_tc is not None and e.prio_to_tc[3] == 3 and e.prio_to_tc[6] == 6
    assert e.tc_tsa is not None and e.tc_tsa[6] == "strict" and e.tc_tsa[3] == "ets"
    assert e.wred is not None and e.wred[3].ecn and e.wred[3].min_bytes == 149995
    assert e.wred[6].ecn is False
    # a switch-wide default: every port of the switch inherits it
    fab = RoceFabric()
    fab.defaults["leaf-01"] = e
    p = fab.get("leaf-01", "swp13")
    assert p is not None and p.pfc == frozenset({3}) and p.port == "swp13"


def test_pcie_acs_of_the_bridges_above_the_nic(tmp_path: Path) -> None:
    """The NIC's device link resolves through a root port and a PCIe switch; lspci of each
    bridge (recorded) tells whether ACS redirects peer-to-peer traffic."""
    import shutil

    root = tmp_path / "sys"
    shutil.copytree(FIX / "sys", root)
    pci = root / "devices/pci0000:40/0000:40:01.1/0000:43:00.0/0000:44:00.0/0000:45:00.0"
    pci.mkdir(parents=True)
    dev = root / "class/infiniband/mlx5_0/device"
    dev.symlink_to(
        Path("../../../devices/pci0000:40/0000:40:01.1/0000:43:00.0/0000:44:00.0/0000:45:00.0")
    )

    def lspci(argv: list[str]) -> str | None:
        if argv[:3] == ["lspci", "-vvv", "-s"]:
            p = FIX / "lspci" / f"{argv[3]}.txt"
            return p.read_text() if p.exists() else None
        return None

    snap = read_snapshot("h100-0012", "mlx5_0", "ens1f0np0", TS, root, lspci)
    assert snap["pcie_acs"] == {
        "0000:40:01.1": {
            "port": "Root Port",
            "acs_ctl": {
                "SrcValid": True,
                "TransBlk": False,
                "ReqRedir": True,
                "CmpltRedir": True,
                "UpstreamFwd": True,
                "EgressCtrl": False,
                "DirectTrans": False,
            },
        },
        "0000:44:00.0": {
            "port": "Downstream Port",
            "acs_ctl": {
                "SrcValid": True,
                "TransBlk": False,
                "ReqRedir": True,
                "CmpltRedir": True,
                "UpstreamFwd": True,
                "EgressCtrl": False,
                "DirectTrans": False,
            },
        },
    }
    # only the switch's downstream port matters for NIC <-> GPU peer-to-peer
    assert parse_snapshot(snap).acs_redirect == ["0000:44:00.0"]
    # lspci missing (or not root): unknown
    assert "pcie_acs" not in read_snapshot("h", "mlx5_0", "ens1f0np0", TS, root, lambda a: None)
    assert parse_snapshot({"node": "h", "nic": "m", "pcie_acs": None}).acs_redirect is None
