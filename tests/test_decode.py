from pathlib import Path

import orjson
import polars as pl

from collector.decode import GnmicEventDecoder, NicSnapshotDecoder
from rocewatch.core.topology import Topology

TOPO = Topology.from_dict(
    {
        "switches": [{"name": "leaf-r0-p0", "role": "leaf", "address": "10.0.0.11"}],
        "nodes": [
            {"name": "gpu-001", "nics": [{"nic": "mlx5_0", "switch_port": "leaf-r0-p0/Ethernet33"}]}
        ],
    }
)
CONTRACT_EVENT = (
    b'{"name": "fabric", "timestamp": 1795946400000000000,'
    b' "tags": {"source": "leaf-r0-p0:9339", "subscription-name": "fabric",'
    b' "interface_name": "Ethernet1"},'
    b' "values": {"/interfaces/interface/state/counters/in-fcs-errors": "17"}}'
)


def test_gnmic_events_contract_example_and_paths():
    d = GnmicEventDecoder(TOPO)
    arr = orjson.dumps(
        [
            {
                "name": "f",
                "timestamp": 5,
                "tags": {
                    "source": "10.0.0.11",
                    "interface_interface-id": "Ethernet1/1",
                    "switch-priority_priority": "3",
                },
                "values": {
                    "/openconfig-qos:qos/interfaces/interface/switch-priority/state/"
                    "in-pause-duration": 1234,
                    "/qos/interfaces/interface/switch-priority/state/counters/out-pause-pkts": "9",
                },
            },
            {
                "name": "f",
                "timestamp": 6,
                "tags": {
                    "source": "leaf-r0-p0",
                    "queue_name": "3",
                    "interface_interface-id": "Ethernet2",
                },
                "values": {
                    "/qos/interfaces/interface/output/queues/queue/state/instant-queue-len": 4.5e6
                },
            },
            {
                "name": "f",
                "timestamp": 7,
                "tags": {"source": "leaf-r0-p0"},
                "values": {"/COUNTERS/Ethernet0/SAI_PORT_STAT_PFC_3_RX_PAUSE_DURATION_US": "77"},
            },
        ]
    )
    df = d.decode_lines([CONTRACT_EVENT, arr])
    rows = {r["metric"]: r for r in df.iter_rows(named=True)}
    assert (
        rows["port_in_fcs_errors"]["raw"] == 17
        and rows["port_in_fcs_errors"]["port"] == "Ethernet1"
    )
    assert rows["pfc_rx_pause_us"]["qual"] == "3" and rows["pfc_rx_pause_us"]["raw"] in (1234, 77)
    assert rows["pfc_tx_pause_frames"]["port"] == "Ethernet1/1"
    assert rows["queue_depth_bytes"]["raw"] is None and rows["queue_depth_bytes"]["value"] == 4.5e6
    # SONiC field without a tagged interface is counted, not guessed
    assert d.stats.get("malformed_events") == 1


def test_gnmic_bad_input_is_counted_and_skipped():
    d = GnmicEventDecoder(TOPO)
    lines = [
        b"{not json",
        b'{"timestamp": 1, "tags": {"source": "stranger:9339", "interface_name": "e1"},'
        b' "values": {"/interfaces/interface/state/counters/in-errors": "1"}}',
        b'{"timestamp": "yesterday", "tags": {}, "values": {}}',
        b'{"timestamp": 2, "tags": {"source": "leaf-r0-p0", "interface_name": "e1"},'
        b' "values": {"/unknown/path": "1",'
        b' "/interfaces/interface/state/counters/in-errors": "x"}}',
        CONTRACT_EVENT,
    ]
    df = d.decode_lines(lines)
    assert df.height == 1
    s = d.stats
    assert (s.get("malformed_lines"), s.get("unknown_source"), s.get("malformed_events")) == (
        1,
        1,
        1,
    )
    assert s.get("unknown_paths") == 1 and s.get("non_numeric_values") == 1


def test_nic_snapshot_contract_example():
    line = orjson.dumps(
        {
            "timestamp": 1795946400000000000,
            "node": "gpu-001",
            "nic": "mlx5_0",
            "netdev": "eth0",
            "speed_mbps": 400000,
            "ethtool": {
                "rx_prio3_pause": 0,
                "tx_prio3_pause_duration": 0,
                "rx_crc_errors_phy": 0,
                "rx_symbol_err_phy": 0,
                "rx_corrected_bits_phy": 0,
                "link_down_events_phy": 0,
                "tx_pause_storm_warning_events": 0,
                "rx_vport_rdma_unicast_bytes": 0,
                "tx_vport_rdma_unicast_bytes": 0,
                "rx_discards_phy": 3,
            },
            "hw_counters": {
                "np_ecn_marked_roce_packets": 0,
                "np_cnp_sent": 0,
                "rp_cnp_handled": 0,
                "out_of_sequence": 0,
                "packet_seq_err": 0,
                "local_ack_timeout_err": 0,
            },
            "pcie": {
                "current_link_speed": "16.0 GT/s PCIe",
                "max_link_speed": "32 GT/s",
                "current_link_width": 16,
                "max_link_width": 16,
            },
        }
    )
    d = NicSnapshotDecoder(TOPO)
    df = d.decode_lines([line, b"", b"[1,2]", b'{"node": "gpu-001"}'])
    m = dict(zip(df["metric"], df["value"], strict=True))
    assert m["nic_pcie_speed_gts"] == 16.0 and m["nic_pcie_max_speed_gts"] == 32.0
    assert m["nic_link_speed_mbps"] == 400000.0
    assert m["ethtool:rx_discards_phy"] == 3.0  # unknown counters are kept
    assert df.filter(pl.col("metric") == "nic_tx_pause_us")["qual"].to_list() == ["3"]
    assert len(m) == 21
    assert d.stats.get("malformed_snapshots") == 2


def test_nic_snapshot_port_counters_and_mlxlink():
    """The agent's port_counters and mlxlink sections reach the canonical metrics: IB port
    counters as counters (data in 4-byte words -> bytes), mlxlink BERs as readings and its
    error counts as counters; unknown port counters are kept, unknown mlxlink keys dropped."""
    from collector.nic.mlxlink import parse_mlxlink

    ber = parse_mlxlink((Path(__file__).parent / "fixtures/mlx5/mlxlink_c.txt").read_text())
    line = orjson.dumps(
        {
            "timestamp": 1795946400000000000,
            "node": "gpu-001",
            "nic": "mlx5_0",
            "port_counters": {
                "port_rcv_errors": 7,
                "port_xmit_data": 1000,
                "link_downed": 2,
                "VL15_dropped": 1,
            },
            "mlxlink": ber,
        }
    )
    d = NicSnapshotDecoder(TOPO)
    df = d.decode_lines([line, orjson.dumps({"timestamp": 1, "node": "gpu-001",
                                             "nic": "mlx5_0", "mlxlink": [1]})])  # fmt: skip
    got = {r["metric"]: (r["value"], r["raw"]) for r in df.iter_rows(named=True)}
    assert got["nic_port_rcv_errors"] == (7.0, 7)
    assert got["nic_port_tx_bytes"] == (4000.0, 4000)
    assert got["nic_port_link_downed"] == (2.0, 2)
    assert got["port:VL15_dropped"] == (1.0, 1)
    assert got["nic_mlxlink_raw_ber"] == (3e-12, None)  # a reading, not a counter
    assert got["nic_mlxlink_effective_errors"] == (0.0, 0)
    assert not any(m.startswith("mlxlink") or "clear" in m for m in got)
    assert d.stats.get("malformed_snapshots") == 1
