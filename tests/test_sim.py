"""The fabric simulator: determinism, formats, ground truth and the physics detectors rely on."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import polars as pl
import pytest
import yaml

from collector.decode import GnmicEventDecoder, NicSnapshotDecoder
from collector.mapping import NIC_SECTION, OPENCONFIG_PATH
from rocewatch.core.model import METRICS, SAMPLE_SCHEMA, Kind
from rocewatch.core.topology import Topology
from rocewatch.sim import (
    AgentGap,
    CounterClear,
    EcnIncast,
    FlakyLink,
    PcieDowngrade,
    PfcStorm,
    SimConfig,
    Simulator,
    TransportErrors,
    build_topology,
    config_from_dict,
    config_to_dict,
    write_scenario,
)
from rocewatch.sim.fabric import BUFFER_BYTES
from rocewatch.sim.scenarios import (
    SCENARIOS,
    dark_storm_scenario,
    default_scenario,
    healthy_scenario,
    moe_scenario,
)

SMALL = SimConfig(nodes=4, nics_per_node=2, spines=2, duration_s=1.0, seed=3)
REAL_KINDS = {"PfcStorm", "FlakyLink", "PcieDowngrade", "EcnIncast", "TransportErrors"}


def rates(df: pl.DataFrame, start_ns: int) -> pl.DataFrame:
    """Per-series deltas over each read interval (no reset handling: callers pick series)."""
    key = ["device", "port", "qual", "metric"]
    return (
        df.filter(pl.col("raw").is_not_null())
        .sort([*key, "ts"])
        .with_columns(
            (
                pl.col("raw").cast(pl.Float64) - pl.col("raw").cast(pl.Float64).shift(1).over(key)
            ).alias("d"),
            ((pl.col("ts") - pl.col("ts").shift(1).over(key)) / 1e9).alias("dt"),
            ((pl.col("ts") - start_ns) / 1e9).alias("t"),
        )
        .filter(pl.col("dt").is_not_null())
    )


def pause_fractions(r: pl.DataFrame) -> pl.DataFrame:
    return r.filter(pl.col("metric").str.ends_with("pause_us")).with_columns(
        (pl.col("d") / (pl.col("dt") * 1e6)).alias("frac")
    )


Run = tuple[Simulator, pl.DataFrame, pl.DataFrame]


@pytest.fixture(scope="module")
def default_run() -> Run:
    sim = Simulator(default_scenario())
    df = pl.concat(list(sim.ticks()))
    return sim, df, rates(df, sim.cfg.start_ns)


# --- topology -------------------------------------------------------------------------------------


def test_topology_is_rail_optimised_and_valid() -> None:
    cfg = SimConfig(nodes=80, spines=4)
    topo = build_topology(cfg)
    again = Topology.from_dict(yaml.safe_load(yaml.safe_dump(topo.to_dict())))
    assert again.to_dict() == topo.to_dict()
    assert len([s for s in topo.switches.values() if s.role == "leaf"]) == 8 * 2  # 2 pods
    assert {s for s in topo.switches if s.startswith("spine-")} == {f"spine-{i}" for i in range(4)}
    assert len(topo.links) == 16 * 4
    for n in topo.nodes.values():
        assert [c.nic for c in n.nics] == [f"mlx5_{k}" for k in range(8)]
        for k, c in enumerate(n.nics):
            assert c.switch_port is not None and "/" in c.switch_port.port
            assert topo.switches[c.switch_port.switch].rail == k == c.rail
            assert c.speed_gbps == 400 and c.netdev == f"eth{k}"
    assert str(topo.nodes["gpu-065"].nics[3].switch_port) == "leaf-r3-p1/Ethernet1/1"
    for s in topo.switches.values():
        assert s.buffer_bytes == BUFFER_BYTES and s.address and s.int_node_id
    assert topo.resolve_device("127.0.1.1:9339") == "leaf-r0-p0"
    jobs = list(topo.jobs.values())
    assert len(jobs) == 2 and all(j.priority == 3 for j in jobs)
    assert {j.tenant for j in jobs} == {"team-a", "team-b"}
    assert sorted(n for j in jobs for n in j.nodes) == sorted(topo.nodes)


# --- frames -------------------------------------------------------------------------------------


def test_frames_follow_the_sample_schema() -> None:
    sim = Simulator(SMALL)
    frames = list(sim.ticks())
    assert len(frames) == 10
    prio = {"pfc_", "queue_"}
    for f in frames:
        assert f.schema == pl.Schema(SAMPLE_SCHEMA)
        assert set(f["metric"].unique()) <= set(METRICS)
        kinds = f["metric"].replace_strict({m: d.kind.value for m, d in METRICS.items()})
        assert (f["raw"].is_null() == (kinds == Kind.GAUGE.value)).all()
        c = f.filter(pl.col("raw").is_not_null())
        assert (c["value"] == c["raw"].cast(pl.Float64)).all()
        quals = f.select("metric", "qual").unique()
        for m, q in quals.iter_rows():
            per_prio = any(m.startswith(p) for p in prio) or ("pause" in m and "storm" not in m)
            want = "3" if per_prio else ""
            assert q == want, (m, q)
    # every switch reads once per tick, every NIC too, at their own jitter of a few ms
    f0 = frames[0]
    per_sw = (
        f0.filter(pl.col("device").str.contains("leaf|spine"))
        .group_by("device")
        .agg(pl.col("ts").n_unique())
    )
    assert (per_sw["ts"] == 1).all()
    per_nic = (
        f0.filter(pl.col("device").str.starts_with("gpu"))
        .group_by("device", "port")
        .agg(pl.col("ts").n_unique())
    )
    assert (per_nic["ts"] == 1).all()
    jit = (f0["ts"] - SMALL.start_ns) / 1e6
    assert jit.to_numpy().min() > 0 and jit.to_numpy().max() < 5
    nic = f0.filter(pl.col("device") == "gpu-001", pl.col("port") == "mlx5_0")
    assert {
        "nic_link_speed_mbps",
        "nic_pcie_speed_gts",
        "nic_pcie_max_speed_gts",
        "nic_pcie_width",
        "nic_pcie_max_width",
    } <= set(nic["metric"])


def test_same_seed_same_telemetry_other_seed_differs(tmp_path: Path) -> None:
    cfg = dataclasses.replace(SMALL, faults=(PfcStorm(onset_s=0.3),))
    a = pl.concat(list(Simulator(cfg).ticks()))
    b = pl.concat(list(Simulator(cfg).ticks()))
    assert a.equals(b)
    c = pl.concat(list(Simulator(dataclasses.replace(cfg, seed=4)).ticks()))
    assert not a.equals(c)
    d1 = write_scenario(cfg, tmp_path / "a")
    d2 = write_scenario(cfg, tmp_path / "b")
    for name in ("topology.yaml", "switch.jsonl", "nic.jsonl", "truth.json", "scenario.json"):
        assert (d1 / name).read_bytes() == (d2 / name).read_bytes(), name


def test_config_round_trips_through_json() -> None:
    cfg = default_scenario(nodes=8)
    back = config_from_dict(orjson.loads(orjson.dumps(config_to_dict(cfg))))
    assert back == cfg


# --- files --------------------------------------------------------------------------------------


def test_written_files_keep_the_contracts(tmp_path: Path) -> None:
    cfg = dataclasses.replace(default_scenario(nodes=4, duration_s=6), nics_per_node=2, spines=2)
    seen: list[tuple[int, int]] = []
    out = write_scenario(cfg, tmp_path / "s", progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (60, 60)
    topo = Topology.load(out / "topology.yaml")
    qos_paths = {p for m, p in OPENCONFIG_PATH.items() if m.startswith("pfc_")}
    queue_paths = {p for m, p in OPENCONFIG_PATH.items() if m.startswith("queue_")}
    n_sw = 0
    for line in (out / "switch.jsonl").read_bytes().splitlines():
        ev = orjson.loads(line)
        n_sw += 1
        assert ev["name"] and isinstance(ev["timestamp"], int)
        tags = ev["tags"]
        assert tags["source"].endswith(":9339") and topo.resolve_device(tags["source"])
        assert tags["subscription-name"]
        paths = set(ev["values"])
        if paths <= qos_paths:
            assert tags["switch-priority_priority"] == "3" and "interface_interface-id" in tags
        elif paths <= queue_paths:
            assert tags["queue_name"] == "3" and "interface_interface-id" in tags
            assert isinstance(ev["values"][OPENCONFIG_PATH["queue_depth_bytes"]], int)
        else:
            assert paths <= set(OPENCONFIG_PATH.values()) and "interface_name" in tags
        for p, v in ev["values"].items():
            if "queue-len" not in p:
                assert isinstance(v, str) and v.isdigit()
    assert n_sw > 0
    eth_names = {n.format(q=3) for s, n in NIC_SECTION.values() if s == "ethtool"}
    speeds = set()
    n_nic = 0
    for line in (out / "nic.jsonl").read_bytes().splitlines():
        d = orjson.loads(line)
        n_nic += 1
        assert list(d)[:5] == ["timestamp", "node", "nic", "netdev", "speed_mbps"]
        assert (d["node"], d["nic"]) in topo.nics and d["speed_mbps"] == 400000
        assert set(d) >= {"ethtool", "hw_counters", "pcie"}
        assert {
            "tx_prio3_pause_duration",
            "rx_prio3_pause",
            "rx_vport_rdma_unicast_bytes",
            "rx_discards_phy",
        } <= set(d["ethtool"])
        assert set(d["ethtool"]) - {"rx_discards_phy"} <= eth_names
        assert {
            "np_ecn_marked_roce_packets",
            "np_cnp_sent",
            "rp_cnp_handled",
            "out_of_sequence",
            "packet_seq_err",
            "local_ack_timeout_err",
        } <= set(d["hw_counters"])
        pcie = d["pcie"]
        speeds.add(pcie["current_link_speed"])
        assert pcie["max_link_speed"] == "32.0 GT/s PCIe"
        assert pcie["current_link_width"] == pcie["max_link_width"] == 16
    assert speeds == {"32.0 GT/s PCIe", "16.0 GT/s PCIe"}
    assert n_nic > 0
    truth = orjson.loads((out / "truth.json").read_bytes())
    assert {f["kind"] for f in truth["faults"]} == REAL_KINDS
    assert config_from_dict(orjson.loads((out / "scenario.json").read_bytes())) == cfg


def test_files_decode_to_the_same_samples_as_the_frames(tmp_path: Path) -> None:
    cfg = dataclasses.replace(SMALL, faults=(CounterClear(onset_s=0.45),), out_of_order=0.2)
    sim = Simulator(cfg)
    frames = pl.concat(list(sim.ticks()))
    out = write_scenario(cfg, tmp_path / "s")
    topo = Topology.load(out / "topology.yaml")
    sw = GnmicEventDecoder(topo).decode_lines((out / "switch.jsonl").read_bytes().splitlines())
    nic = NicSnapshotDecoder(topo).decode_lines((out / "nic.jsonl").read_bytes().splitlines())
    assert nic["metric"].str.starts_with("ethtool:").any()  # unknown counters are kept
    files = pl.concat([sw, nic]).filter(pl.col("metric").is_in(list(METRICS)))
    key = ["ts", "device", "port", "qual", "metric"]
    assert files.sort(key).equals(frames.sort(key))
    # out-of-order snapshots stay out of order in the file
    ts = [orjson.loads(x)["timestamp"] for x in (out / "nic.jsonl").read_bytes().splitlines()]
    assert any(b < a - 50_000_000 for a, b in itertools.pairwise(ts))


# --- ground truth -------------------------------------------------------------------------------


def test_default_truth_has_each_fault_and_the_non_faults(default_run: Run) -> None:
    sim, _, _ = default_run
    truth = orjson.loads(orjson.dumps(sim.truth()))
    faults = {f["kind"]: f for f in truth["faults"]}
    assert set(faults) == REAL_KINDS
    names = {f["kind"]: f["alertname"] for f in truth["faults"]}
    assert names == {
        "PfcStorm": "PFCStorm",
        "FlakyLink": "FlakyLink",
        "PcieDowngrade": "PCIeDowngrade",
        "EcnIncast": "ECNCongestion",
        "TransportErrors": "TransportErrors",
    }
    assert "Straggler" in faults["PcieDowngrade"]["also"]
    storm = faults["PfcStorm"]
    assert set(storm["labels"]) == {"node", "nic"}
    assert storm["culprit_node"] == storm["labels"]["node"]
    assert storm["victims"] and storm["labels"] not in storm["victims"]
    assert faults["EcnIncast"]["culprit_node"] is None
    assert set(faults["EcnIncast"]["labels"]) == {"switch", "port", "queue"}
    for f in truth["faults"]:
        assert truth["start_ns"] < f["onset_ns"] < f["end_ns"] <= truth["end_ns"]
        assert f["labels"] in f["match"]
    # faults hit different nodes
    nodes = [f["labels"].get("node") or f["match"][-1]["node"] for f in truth["faults"]]
    assert len(set(nodes)) == len(nodes)
    kinds = {x["kind"] for x in truth["not_faults"]}
    assert {"CounterClear", "AgentGap", "CounterWrap"} <= kinds
    topo = sim.topology
    for f in truth["faults"]:
        for lab in f["match"]:
            if "nic" in lab:
                assert (lab["node"], lab["nic"]) in topo.nics
            elif "switch" in lab:
                assert topo.peer_of_port(lab["switch"], lab["port"]) is not None


def test_entities_are_drawn_from_the_seed() -> None:
    a = Simulator(default_scenario(seed=1)).truth()["faults"]
    b = Simulator(default_scenario(seed=1)).truth()["faults"]
    c = Simulator(default_scenario(seed=2)).truth()["faults"]
    assert [f["labels"] for f in a] == [f["labels"] for f in b]
    assert [f["labels"] for f in a] != [f["labels"] for f in c]
    fixed = SimConfig(nodes=8, faults=(TransportErrors(onset_s=1, node="gpu-002", nic="mlx5_4"),))
    assert Simulator(fixed).truth()["faults"][0]["labels"] == {"node": "gpu-002", "nic": "mlx5_4"}


# --- physics ------------------------------------------------------------------------------------


def test_storm_origin_pauses_and_is_not_paused_victims_are(default_run: Run) -> None:
    sim, _, r = default_run
    truth = sim.truth()
    storm = next(f for f in truth["faults"] if f["kind"] == "PfcStorm")
    t_on = (storm["onset_ns"] - truth["start_ns"]) / 1e9
    t_end = (storm["end_ns"] - truth["start_ns"]) / 1e9
    pf = pause_fractions(r)
    node, nic = storm["labels"]["node"], storm["labels"]["nic"]
    during = pf.filter(pl.col("t").is_between(t_on + 0.15, t_end - 0.05))
    origin = during.filter(pl.col("device") == node, pl.col("port") == nic)
    tx = origin.filter(pl.col("metric") == "nic_tx_pause_us")["frac"]
    rx = origin.filter(pl.col("metric") == "nic_rx_pause_us")["frac"]
    assert len(tx) >= 20 and tx.to_numpy().min() >= 0.99 and rx.to_numpy().max() < 0.1
    # the leaf port it pauses: paused all along, queue full and flat, nothing sent
    sw, port = storm["origin_port"]["switch"], storm["origin_port"]["port"]
    leaf = during.filter(
        pl.col("device") == sw, pl.col("port") == port, pl.col("metric") == "pfc_rx_pause_us"
    )
    assert leaf["frac"].to_numpy().min() >= 0.99
    q = r.filter(
        pl.col("device") == sw,
        pl.col("port") == port,
        pl.col("metric") == "queue_tx_pkts",
        pl.col("t").is_between(t_on + 0.15, t_end - 0.05),
    )
    assert q["d"].to_numpy().max() == 0
    # every victim is paused once the storm reached it; victims pause nobody upstream on the NIC
    last_hop = storm["details"]["propagation"][-1]["onset_ns"]
    late = pf.filter(
        pl.col("t").is_between((last_hop - truth["start_ns"]) / 1e9 + 0.15, t_end - 0.05)
    )
    for v in storm["victims"]:
        if "node" in v:
            e = late.filter(pl.col("device") == v["node"], pl.col("port") == v["nic"])
            rx_v = e.filter(pl.col("metric") == "nic_rx_pause_us")["frac"].to_numpy()
            tx_v = e.filter(pl.col("metric") == "nic_tx_pause_us")["frac"].to_numpy()
            assert rx_v.min() >= 0.99 and tx_v.max() < 0.1, v
        else:
            e = late.filter(
                pl.col("device") == v["switch"],
                pl.col("port") == v["port"],
                pl.col("metric") == "pfc_rx_pause_us",
            )
            assert e["frac"].to_numpy().min() >= 0.99, v
    # storm warnings from the origin, none elsewhere
    w = r.filter(pl.col("metric") == "nic_tx_pause_storm_warnings", pl.col("d") > 0)
    assert set(zip(w["device"], w["port"], strict=True)) == {(node, nic)}
    # before the storm nobody is near a full pause
    assert pf.filter(pl.col("t") < t_on)["frac"].to_numpy().max() < 0.5


def test_a_storm_fills_and_marks_the_queues_it_pauses_and_silences_its_origin(
    default_run: Run,
) -> None:
    """What a paused fabric shows: the spine ports facing the paused leaf send nothing, their
    queues stand toward the buffer's limit and mark every packet they take in; the origin
    NIC sends and receives nothing and its requests time out."""
    sim, df, r = default_run
    truth = sim.truth()
    storm = next(f for f in truth["faults"] if f["kind"] == "PfcStorm")
    t_end = (storm["end_ns"] - truth["start_ns"]) / 1e9
    hop2 = storm["details"]["propagation"][1]
    t2 = (hop2["onset_ns"] - truth["start_ns"]) / 1e9
    spines = [v for v in hop2["paused"] if str(v.get("switch", "")).startswith("spine")]
    assert len(spines) == sim.cfg.spines
    t_on = (storm["onset_ns"] - truth["start_ns"]) / 1e9
    inside = pl.col("t").is_between(t2 + 0.15, t_end - 0.05)
    before = pl.col("t") < t_on - 0.1
    buffer = truth["queue_share_bytes"]
    depth = df.with_columns(((pl.col("ts") - truth["start_ns"]) / 1e9).alias("t")).filter(
        pl.col("metric") == "queue_depth_bytes"
    )
    for v in spines:
        port = (pl.col("device") == v["switch"]) & (pl.col("port") == v["port"])
        q = r.filter(port, inside)
        assert q.filter(pl.col("metric") == "queue_tx_pkts")["d"].to_numpy().max() == 0, v
        marks = q.filter(pl.col("metric") == "queue_ecn_marked_pkts")["d"].to_numpy()
        assert len(marks) >= 10 and marks.min() > 0, v
        held = depth.filter(port, inside)["value"].to_numpy()
        assert held.min() >= 0.5 * buffer, v
        assert depth.filter(port, before)["value"].to_numpy().max() < 0.3 * buffer, v
    node, nic = storm["labels"]["node"], storm["labels"]["nic"]
    me = (pl.col("device") == node) & (pl.col("port") == nic)
    quiet = r.filter(me, pl.col("t").is_between(t_on + 0.15, t_end - 0.05))
    for m in ("nic_tx_bytes", "nic_rx_bytes", "nic_tx_rdma_bytes"):
        assert quiet.filter(pl.col("metric") == m)["d"].to_numpy().max() == 0, m
        assert r.filter(me, before, pl.col("metric") == m)["d"].to_numpy().sum() > 0, m
    timeouts = quiet.filter(pl.col("metric") == "nic_local_ack_timeout")["d"].to_numpy().sum()
    assert timeouts >= 10 * (t_end - t_on)


def test_storm_spreads_hop_by_hop(default_run: Run) -> None:
    sim, _, r = default_run
    truth = sim.truth()
    storm = next(f for f in truth["faults"] if f["kind"] == "PfcStorm")
    hops = storm["details"]["propagation"]
    assert [h["hop"] for h in hops] == [1, 2, 3, 4]
    gaps = np.diff([h["onset_ns"] for h in hops]) / 1e9
    assert ((gaps >= 0.1) & (gaps <= 0.3)).all()
    pf = pause_fractions(r)
    for h in hops[1:]:
        t = (h["onset_ns"] - truth["start_ns"]) / 1e9
        first = h["paused"][0]
        who = (pl.col("device") == first.get("node", first.get("switch"))) & (
            pl.col("port") == first.get("nic", first.get("port"))
        )
        m = "nic_rx_pause_us" if "node" in first else "pfc_rx_pause_us"
        before = pf.filter(who, pl.col("metric") == m, pl.col("t").is_between(t - 0.5, t - 0.02))
        assert before["frac"].to_numpy().max() < 0.99


@pytest.mark.parametrize("make", [healthy_scenario, moe_scenario])
def test_healthy_traffic_never_pauses_twice_in_a_row(make: Callable[..., SimConfig]) -> None:
    cfg = make(nodes=8, duration_s=20)
    sim = Simulator(cfg)
    assert sim.truth()["faults"] == []
    r = rates(pl.concat(list(sim.ticks())), cfg.start_ns)
    pf = pause_fractions(r).sort("device", "port", "qual", "metric", "t")
    full = pf.with_columns(
        (pl.col("frac") >= 0.99).alias("f"),
    ).with_columns(
        (pl.col("f") & pl.col("f").shift(1).over("device", "port", "qual", "metric")).alias("ff")
    )
    assert not full["ff"].fill_null(False).any()
    peak = pf["frac"].to_numpy().max()
    assert peak < 0.7
    if cfg.traffic == "moe":
        assert peak > 0.25  # all-to-all bursts pause hard, briefly
    else:
        assert peak < 0.1
    nb = r.filter(pl.col("metric") == "nic_tx_bytes")
    gbps = nb["d"] / nb["dt"] / 1e9
    # 400G line rate is 50 GB/s; MoE bursts are shorter than an interval
    assert (15 if cfg.traffic == "moe" else 40) < gbps.to_numpy().max() < 50
    depth = pl.concat(list(Simulator(cfg).ticks())).filter(pl.col("metric") == "queue_depth_bytes")
    assert depth["value"].to_numpy().max() < 0.5 * BUFFER_BYTES
    bits = r.filter(pl.col("metric") == "nic_rx_corrected_bits")
    ber = bits["d"] / (bits["dt"] * 400e9)
    assert 1e-9 < np.median(ber.to_numpy()) < 2e-6
    errors = r.filter(pl.col("metric").is_in(["nic_rx_crc_errors", "port_in_fcs_errors"]))
    assert errors["d"].to_numpy().sum() <= 2


def test_flaky_pcie_incast_and_transport_signatures(default_run: Run) -> None:
    sim, df, r = default_run
    truth = sim.truth()
    start = truth["start_ns"]
    f = {x["kind"]: x for x in truth["faults"]}

    def window(fault: dict[str, Any], lo: float = 0.3, hi: float = 0.05) -> pl.Expr:
        return pl.col("t").is_between(
            (fault["onset_ns"] - start) / 1e9 + lo, (fault["end_ns"] - start) / 1e9 - hi
        )

    def entity(lab: dict[str, str]) -> pl.Expr:
        return (pl.col("device") == lab.get("node", lab.get("switch"))) & (
            pl.col("port") == lab.get("nic", lab.get("port"))
        )

    # flaky cable: BER toward 1e-4, CRC at the NIC, FCS at the switch, flaps on both ends
    fl = f["FlakyLink"]
    nic_end = fl["match"][1]
    bits = r.filter(entity(nic_end), pl.col("metric") == "nic_rx_corrected_bits", window(fl, 3.0))
    ber = bits["d"] / (bits["dt"] * 400e9)
    assert ber.to_numpy().max() > 3e-5 and (ber.to_numpy() > 1e-5).mean() > 0.5
    nflaps = len(fl["details"]["flaps"])
    assert nflaps >= 2
    sw_end = r.filter(entity(fl["labels"]), window(fl, 0.0, 0.0))
    assert sw_end.filter(pl.col("metric") == "port_in_fcs_errors")["d"].to_numpy().sum() > 100
    carrier = sw_end.filter(pl.col("metric") == "port_carrier_transitions")["d"].to_numpy()
    assert carrier.sum() == 2 * nflaps
    ne = r.filter(entity(nic_end), window(fl, 0.0, 0.0))
    assert ne.filter(pl.col("metric") == "nic_rx_crc_errors")["d"].to_numpy().sum() > 100
    assert ne.filter(pl.col("metric") == "nic_link_down_events")["d"].to_numpy().sum() == nflaps

    # PCIe downgrade: gauge says 16 of 32 GT/s, own pause 20-40%, throughput like its rail peers
    pc = f["PcieDowngrade"]
    g = df.filter(
        entity(pc["labels"]),
        pl.col("metric") == "nic_pcie_speed_gts",
        pl.col("ts") > pc["onset_ns"] + 10_000_000,
    )
    assert set(g["value"]) == {16.0}
    pf = pause_fractions(r).filter(window(pc))
    own = pf.filter(entity(pc["labels"]), pl.col("metric") == "nic_tx_pause_us")["frac"]
    assert 0.1 < own.to_numpy().mean() < 0.4 and own.to_numpy().max() <= 0.45
    node, nic = pc["labels"]["node"], pc["labels"]["nic"]
    job = sim.topology.node_jobs[node][0]
    peers = [n for n in sim.topology.jobs[job].nodes if n != node]
    tx = r.filter(window(pc), pl.col("metric") == "nic_tx_bytes", pl.col("port") == nic)
    slow = tx.filter(pl.col("device") == node)["d"].to_numpy().sum()
    rail = tx.filter(pl.col("device").is_in(peers)).group_by("device").agg(pl.col("d").sum())["d"]
    other = (
        tx.filter(~pl.col("device").is_in([*peers, node]))
        .group_by("device")
        .agg(pl.col("d").sum())["d"]
    )
    rail_med, other_med = np.median(rail.to_numpy()), np.median(other.to_numpy())
    assert rail_med < 0.7 * other_med  # the ring waits: the whole rail slows ...
    assert 0.8 < slow / rail_med < 1.25  # ... so throughput alone does not single it out
    peer_rx = (
        pf.filter(
            pl.col("device").is_in(peers),
            pl.col("port") == nic,
            pl.col("metric") == "nic_rx_pause_us",
        )["frac"]
        .to_numpy()
        .mean()
    )
    assert peer_rx > 0.03

    # ECN incast: the queue toward the NIC near the buffer limit, marks and CNPs way up
    ic = f["EcnIncast"]
    lab = ic["labels"]
    depth = df.filter(
        entity(lab),
        pl.col("metric") == "queue_depth_bytes",
        pl.col("ts").is_between(ic["onset_ns"] + 200_000_000, ic["end_ns"]),
    )
    share = depth["value"].to_numpy() / BUFFER_BYTES
    assert share.min() >= 0.85 and share.max() < 0.99
    marks = r.filter(
        entity(lab), pl.col("metric").is_in(["queue_ecn_marked_pkts", "queue_tx_pkts"]), window(ic)
    )
    ratio = marks.group_by("metric").agg(pl.col("d").sum())
    m = dict(zip(ratio["metric"], ratio["d"], strict=True))
    assert m["queue_ecn_marked_pkts"] > 0.3 * m["queue_tx_pkts"]
    target = ic["match"][2]
    cnp = r.filter(pl.col("metric") == "nic_cnp_sent", window(ic))
    mine = cnp.filter(entity(target))["d"].to_numpy().mean()
    assert mine > 50 * np.median(cnp.filter(~entity(target))["d"].to_numpy())
    sender = ic["details"]["senders"][0].split("/")
    h = r.filter(pl.col("metric") == "nic_cnp_handled", window(ic))
    handled = h.filter(entity({"node": sender[0], "nic": sender[1]}))["d"].to_numpy().mean()
    assert handled > 10 * np.median(h["d"].to_numpy())

    # transport errors: well above the NIC's own and everyone's baseline
    te = f["TransportErrors"]
    x = r.filter(
        entity(te["labels"]),
        pl.col("metric").is_in(
            ["nic_out_of_sequence", "nic_packet_seq_err", "nic_local_ack_timeout"]
        ),
    )
    during = x.filter(window(te)).group_by("metric").agg(pl.col("d").mean())
    before = (
        x.filter(pl.col("t") < (te["onset_ns"] - start) / 1e9)
        .group_by("metric")
        .agg(pl.col("d").mean())
    )
    d = dict(zip(during["metric"], during["d"], strict=True))
    b = dict(zip(before["metric"], before["d"], strict=True))
    assert d["nic_out_of_sequence"] > 20 * max(b["nic_out_of_sequence"], 1)
    assert d["nic_packet_seq_err"] > 10 and d["nic_local_ack_timeout"] > 1


def test_counter_clear_wrap_gap_and_late_snapshots(default_run: Run) -> None:
    sim, df, r = default_run
    truth = sim.truth()
    start = truth["start_ns"]
    nf = {x["kind"] + x["id"][-2:]: x for x in truth["not_faults"]}
    # every backwards step is a declared clear or the declared wrap
    back = r.filter(pl.col("d") < 0)
    wrap = nf["CounterWrap-1"]
    wrapped = back.filter(
        pl.col("device") == wrap["labels"]["switch"], pl.col("port") == wrap["labels"]["port"]
    )
    assert wrapped["metric"].to_list() == ["port_in_octets"]
    w = df.filter(
        pl.col("device") == wrap["labels"]["switch"],
        pl.col("port") == wrap["labels"]["port"],
        pl.col("metric") == "port_in_octets",
    ).sort("ts")["raw"]
    assert w[0] > 2**64 - 10**12 and w[-1] < 10**13
    clear_sw = nf["CounterClear-1"]
    clear_nic = nf["CounterClear-2"]
    rest = back.filter(
        (pl.col("device") != wrap["labels"]["switch"]) | (pl.col("port") != wrap["labels"]["port"])
    )
    sw_rows = rest.filter(pl.col("device") == clear_sw["labels"]["switch"])
    nic_rows = rest.filter(
        pl.col("device") == clear_nic["labels"]["node"],
        pl.col("port") == clear_nic["labels"]["nic"],
    )
    assert sw_rows.height + nic_rows.height == rest.height
    for rows, at in ((sw_rows, clear_sw["at_ns"]), (nic_rows, clear_nic["at_ns"])):
        assert rows.height > 0
        t = (at - start) / 1e9
        assert rows["t"].to_numpy().min() >= t and rows["t"].to_numpy().max() < t + 0.11
    # after the clear the switch counts up from 0
    after = df.filter(
        pl.col("device") == clear_sw["labels"]["switch"],
        pl.col("metric") == "port_in_octets",
        pl.col("ts").is_between(clear_sw["at_ns"], clear_sw["at_ns"] + 110_000_000),
    )
    assert after.height > 0 and after["raw"].to_numpy().max() < 10 * 50e9 * 0.1
    # an agent gap: no snapshots of that node in the gap
    gap = nf["AgentGap-1"]
    node = df.filter(
        pl.col("device") == gap["labels"]["node"],
        pl.col("ts").is_between(gap["onset_ns"] + 10_000_000, gap["end_ns"] - 10_000_000),
    )
    assert node.height == 0


def test_late_nic_snapshots_and_silent_nodes() -> None:
    cfg = dark_storm_scenario(nodes=8, duration_s=8)
    sim = Simulator(cfg)
    origin = cfg.no_agent_nodes[0]
    frames = list(sim.ticks())
    total = late = 0
    for k, f in enumerate(frames):
        nominal = cfg.start_ns + k * sim.interval_ns
        snaps = f.filter(pl.col("metric") == "nic_tx_bytes")
        total += snaps.height
        old = snaps.filter(pl.col("ts") < nominal)
        late += old.height
        if old.height:
            assert nominal - old["ts"].to_numpy().min() <= 300_000_000
        assert origin not in set(f["device"])
    assert 0.001 < late / total < 0.02
    # the dark origin is still seen from its leaf port
    storm = sim.truth()["faults"][0]
    assert storm["details"]["agent"] is False
    r = rates(pl.concat(frames), cfg.start_ns)
    pf = pause_fractions(r).filter(
        pl.col("device") == storm["origin_port"]["switch"],
        pl.col("port") == storm["origin_port"]["port"],
        pl.col("metric") == "pfc_rx_pause_us",
        pl.col("t").is_between(cfg.faults[0].onset_s + 0.15, cfg.faults[0].end_s(8) - 0.05),
    )
    assert pf.height > 10 and pf["frac"].to_numpy().min() >= 0.99


def test_scenarios_and_config_errors() -> None:
    for name, make in SCENARIOS.items():
        cfg = make()
        assert cfg.name == name
    demo = SCENARIOS["demo"]()
    assert demo.nodes == 64 and demo.duration_s == 40
    kinds = {type(f).__name__ for f in default_scenario().faults}
    assert kinds == REAL_KINDS | {"CounterClear", "AgentGap"}
    with pytest.raises(Exception, match="traffic"):
        Simulator(SimConfig(traffic="bogus"))
    with pytest.raises(Exception, match="unknown node"):
        Simulator(SimConfig(nodes=4, faults=(PcieDowngrade(onset_s=1, node="gpu-099"),)))
    ok = SimConfig(
        nodes=4,
        duration_s=2,
        faults=(
            FlakyLink(onset_s=0.5, uplink=True),
            EcnIncast(onset_s=0.5, senders=2),
            AgentGap(onset_s=0.2, duration_s=0.5),
        ),
    )
    assert len(Simulator(ok).truth()["faults"]) == 2


# --- cadenced runs: each source on its own schedule ----------------------------------------

S = 1_000_000_000


def _deltas(df: pl.DataFrame, metrics: set[str]) -> np.ndarray:
    """Seconds between consecutive readings of each series of ``metrics``."""
    d = (
        df.filter(pl.col("metric").is_in(sorted(metrics)))
        .sort(["device", "port", "qual", "metric", "ts"])
        .with_columns(pl.col("ts").diff().over(["device", "port", "qual", "metric"]).alias("dt"))
        .drop_nulls("dt")
    )
    return d["dt"].to_numpy() / S


def test_cadenced_sources_read_on_their_own_intervals_with_jitter_and_loss() -> None:
    cfg = SimConfig(
        nodes=2, nics_per_node=2, spines=1, duration_s=40.0, seed=5, out_of_order=0.0,
        nic_interval_s=0.5, switch_interval_s=1.0, gauge_interval_s=4.0, sample_loss=0.03,
    )  # fmt: skip
    sim = Simulator(cfg)
    df = pl.concat(list(sim.ticks()))
    for metrics, every in (
        ({"nic_rx_bytes", "nic_pcie_speed_gts"}, 0.5),
        ({"port_in_octets", "pfc_rx_pause_us", "queue_tx_pkts"}, 1.0),
        ({"queue_depth_bytes", "queue_peak_bytes"}, 4.0),
    ):
        dt = _deltas(df, metrics)
        assert np.median(dt) == pytest.approx(every, rel=0.05), metrics
        # each reading up to a fifth of its interval late: consecutive ones 0.8-1.2 apart,
        # 1.8-2.2 across a lost one
        k = np.rint(dt / every)
        assert np.all(np.abs(dt - k * every) <= 0.2 * every + 1e-6), metrics
        assert np.all(k >= 1)
        assert np.std(dt[k == 1]) > 0.03 * every  # the jitter is there
    # the lost readings are the ones the truth lists, about the share asked for
    truth = sim.truth()
    assert truth["sampling"]["nic_interval_s"] == 0.5
    lost = truth["sampling"]["lost"]
    got = set(
        df.filter(pl.col("metric") == "nic_rx_bytes")
        .select(pl.concat_str("device", pl.lit("/"), "port"), "ts")
        .iter_rows()
    )
    n_nic = cfg.nodes * cfg.nics_per_node * cfg.duration_s / 0.5
    missing = sum(len(v) for v in lost["nic"].values())
    assert 0.005 * n_nic < missing < 0.05 * n_nic
    assert not any((dev, ts) in got for dev, times in lost["nic"].items() for ts in times)
    assert len(got) + missing == pytest.approx(n_nic, abs=cfg.nodes * cfg.nics_per_node)


def test_cadenced_counters_are_read_at_their_true_time() -> None:
    """A storm's pause duration between two readings is the share of that span it covered,
    whenever in a tick the readings fall."""
    storm = PfcStorm(onset_s=10.0, duration_s=7.0, node="gpu-002", nic="mlx5_1")
    cfg = SimConfig(
        nodes=4, nics_per_node=2, spines=2, duration_s=24.0, seed=2, out_of_order=0.0,
        nic_interval_s=2.0, switch_interval_s=1.0, faults=(storm,),
    )  # fmt: skip
    sim = Simulator(cfg)
    df = pl.concat(list(sim.ticks()))
    t0 = cfg.start_ns
    port = str(sim.topology.nodes["gpu-002"].nics[1].switch_port).split("/", 1)
    for dev, p, metric in (
        ("gpu-002", "mlx5_1", "nic_tx_pause_us"),  # what the origin sent
        (port[0], port[1], "pfc_rx_pause_us"),  # what its leaf port received
    ):
        s = df.filter(
            (pl.col("device") == dev) & (pl.col("port") == p) & (pl.col("metric") == metric)
        ).sort("ts")
        ts = (s["ts"].to_numpy() - t0) / S
        v = s["raw"].to_numpy().astype(float)
        checked = 0
        for a, b, dv in zip(ts[:-1], ts[1:], np.diff(v), strict=True):
            covered = max(0.0, min(b, 17.0) - max(a, 10.0))
            # a tick's healthy background pause is a few ms at most; the storm 99.6-100 %
            assert dv == pytest.approx(covered * 1e6, abs=0.004 * covered * 1e6 + 20_000)
            checked += covered > 0
        assert checked >= 4


def test_cadenced_clears_and_gaps() -> None:
    cfg = SimConfig(
        nodes=4, nics_per_node=2, spines=1, duration_s=20.0, seed=4, out_of_order=0.0,
        nic_interval_s=0.5, switch_interval_s=1.0,
        faults=(
            CounterClear(onset_s=8.05, target="switch", switch="leaf-r0-p0"),
            CounterClear(onset_s=9.0, target="nic", node="gpu-001", nic="mlx5_0"),
            AgentGap(onset_s=12.0, duration_s=3.0, node="gpu-003"),
        ),
    )  # fmt: skip
    df = pl.concat(list(Simulator(cfg).ticks()))
    t = (pl.col("ts") - cfg.start_ns) / S
    octets = df.filter(
        (pl.col("device") == "leaf-r0-p0") & (pl.col("metric") == "port_in_octets")
    ).sort("ts")
    before = octets.filter(t < 8.05).group_by("port").agg(pl.col("raw").last())
    after = octets.filter(t > 8.05).group_by("port").agg(pl.col("raw").first())
    # every port of the switch restarts from zero: the first reading after is a second's worth
    assert after["raw"].max() < 1e11 < before["raw"].min()  # type: ignore[operator]
    nic = df.filter((pl.col("device") == "gpu-001") & (pl.col("metric") == "nic_rx_bytes"))
    assert nic.filter(t > 9.0)["raw"].min() < nic.filter(t < 9.0)["raw"].max()  # type: ignore[operator]
    gap = df.filter((pl.col("device") == "gpu-003") & (t >= 12.0) & (t < 15.0))
    assert gap.height == 0
    assert df.filter((pl.col("device") == "gpu-003") & (t >= 15.0)).height > 0


@pytest.mark.parametrize(
    ("naming", "port", "path"),
    [
        ("sonic", "Ethernet8", "/COUNTERS/Ethernet8/SAI_PORT_STAT_PFC_3_RX_PAUSE_DURATION_US"),
        ("cumulus", "swp2", "/interfaces/interface/ethernet/state/counters/in-crc-errors"),
        ("openconfig", "Ethernet1/2", OPENCONFIG_PATH["pfc_rx_pause_us"]),
    ],
)  # fmt: skip
def test_naming_writes_the_vendor_paths_the_collector_reads(
    tmp_path: Path, naming: str, port: str, path: str
) -> None:
    cfg = SimConfig(
        nodes=2, nics_per_node=2, spines=1, duration_s=4.0, seed=1, naming=naming,
        nic_interval_s=0.5, switch_interval_s=1.0, gauge_interval_s=2.0,
    )  # fmt: skip
    out = write_scenario(cfg, tmp_path / naming)
    topo = Topology.load(out / "topology.yaml")
    assert str(topo.nodes["gpu-002"].nics[0].switch_port) == f"leaf-r0-p0/{port}"
    lines = (out / "switch.jsonl").read_bytes().splitlines()
    events = [orjson.loads(x) for x in lines]
    tag = ("interface_name", "interface_interface-id")
    assert any(path in e["values"] and port in (e["tags"].get(t) for t in tag) for e in events)
    if naming == "sonic":
        q = [e for e in events if "queue_name" in e["tags"]]
        assert q and all(
            k.startswith(f"/COUNTERS/{e['tags']['interface_name']}:3/SAI_QUEUE_STAT_")
            for e in q
            for k in e["values"]
        )
    # the collector's mapping reads every value back to what the simulator read
    dec = GnmicEventDecoder(topo)
    got = dec.decode_lines(lines)
    assert dec.stats.as_dict() == {}
    frames = pl.concat(list(Simulator(cfg).ticks()))
    want = frames.filter(
        pl.col("device").str.starts_with("leaf") | pl.col("device").str.starts_with("spine")
    )
    key = ["ts", "device", "port", "qual", "metric"]
    assert got.sort(key).select([*key, "value"]).equals(want.sort(key).select([*key, "value"]))


def test_switch_origin_storm_blames_no_node() -> None:
    storm = PfcStorm(onset_s=2.0, duration_s=3.0, origin="switch", switch="leaf-r1-p0")
    cfg = SimConfig(
        nodes=4, nics_per_node=2, spines=2, duration_s=8.0, seed=3, faults=(storm,),
        nic_interval_s=0.5, switch_interval_s=0.5,
    )  # fmt: skip
    sim = Simulator(cfg)
    truth = sim.truth()
    (f,) = truth["faults"]
    assert f["culprit_node"] is None and f["labels"] == {"switch": "leaf-r1-p0"}
    assert f["match"] == [{"switch": "leaf-r1-p0"}] and f["details"]["origin"] == "switch"
    victims = f["victims"]
    assert {"node": "gpu-001", "nic": "mlx5_1"} in victims  # its own NICs
    assert {"switch": "spine-0", "port": "Ethernet1/2"} in victims  # the spines facing it
    assert not any(v.get("switch") == "leaf-r1-p0" for v in victims)  # it is paused by no one
    r = rates(pl.concat(list(sim.ticks())), cfg.start_ns)
    during = r.filter((pl.col("t") > 2.6) & (pl.col("t") < 5.0))
    leaf = during.filter(pl.col("device") == "leaf-r1-p0")
    tx = leaf.filter(pl.col("metric") == "pfc_tx_pause_us")
    rx = leaf.filter(pl.col("metric") == "pfc_rx_pause_us")
    share_tx = (tx["d"] / (tx["dt"] * 1e6)).to_numpy()
    share_rx = (rx["d"] / (rx["dt"] * 1e6)).to_numpy()
    assert share_tx.min() > 0.99  # every port pauses its neighbour
    assert share_rx.max() < 0.1  # nothing pauses it


def test_fabric_make_link_speed_buffer_and_pcie() -> None:
    """Link speed and buffer reach the topology and the NICs; a PCIe link still faster than the
    network slows nothing, one slower than it does."""

    def run(link: int) -> tuple[Simulator, pl.DataFrame]:
        pcie = PcieDowngrade(onset_s=1.0, node="gpu-001", nic="mlx5_0", speed_gts=32.0, width=8)
        cfg = SimConfig(
            nodes=4, nics_per_node=2, spines=1, duration_s=6.0, seed=6, faults=(pcie,),
            link_gbps=link, buffer_mb=16, nic_interval_s=0.5, switch_interval_s=0.5,
        )  # fmt: skip
        sim = Simulator(cfg)
        return sim, rates(pl.concat(list(sim.ticks())), cfg.start_ns)

    sim, r400 = run(400)
    topo = sim.topology
    assert topo.nodes["gpu-001"].nics[0].speed_gbps == 400
    assert all(sw.buffer_bytes == 16 << 20 for sw in topo.switches.values())
    _, r100 = run(100)

    def pause(r: pl.DataFrame) -> float:
        x = r.filter(
            (pl.col("device") == "gpu-001")
            & (pl.col("port") == "mlx5_0")
            & (pl.col("metric") == "nic_tx_pause_us")
            & (pl.col("t") > 2.0)
        )
        return float(x["d"].to_numpy().sum() / (x["dt"].to_numpy().sum() * 1e6))

    assert pause(r400) > 0.05 and pause(r100) < 0.01
    width = pl.concat(list(sim.ticks())).filter(
        (pl.col("device") == "gpu-001") & (pl.col("metric") == "nic_pcie_width")
    )
    assert set(width["value"].to_list()) == {16.0, 8.0}
