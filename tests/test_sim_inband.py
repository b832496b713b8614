"""The simulator's INT reports (int.pcap) carry the same queue occupancy as its gNMI events."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from collector.decode import GnmicEventDecoder
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology
from rocewatch.sim import SimConfig, write_scenario
from rocewatch.sim.fabric import INT_CELL_BYTES
from rocewatch.sources import PcapSource


def test_simulated_int_pcap_matches_switch_queues(tmp_path: Path) -> None:
    write_scenario(SimConfig(nodes=4, duration_s=2.0, seed=3), tmp_path, int_pcap=True)
    topo = Topology.load(tmp_path / "topology.yaml")
    stats = Stats()
    src = PcapSource(tmp_path / "int.pcap", topo, stats)
    frames = []
    while (df := src.next()) is not None:
        frames.append(df)
    intq = pl.concat(frames).filter(pl.col("metric") == "queue_peak_bytes")
    gnmi = GnmicEventDecoder(topo, Stats()).decode_lines(
        (tmp_path / "switch.jsonl").read_bytes().splitlines()
    )
    gq = gnmi.filter(pl.col("metric") == "queue_peak_bytes")
    key = ["device", "port", "qual"]
    a = intq.group_by(key).agg(pl.col("value").max().alias("int_max"), pl.len().alias("n"))
    b = gq.group_by(key).agg(pl.col("value").max().alias("gnmi_max"))
    both = a.join(b, on=key, how="full", coalesce=True)
    assert both.height == b.height and both["int_max"].null_count() == 0
    assert (both["gnmi_max"] - both["int_max"]).abs().max() < INT_CELL_BYTES  # type: ignore[operator]
    assert both["gnmi_max"].max() > 0  # type: ignore[operator]
    assert not {k for k in stats.counts if stats.counts[k]}  # nothing skipped, nothing lost
