"""The NCCL detectors' state is data: it goes through rocewatch's checkpoint codec with the
record types each declares, and a detector built anew from today's config takes it back."""

from __future__ import annotations

from detectors.bus_bandwidth_drop import BusBandwidthDropConfig, BusBandwidthDropDetector, _Key
from detectors.slow_rank import SlowRankConfig, SlowRankDetector, _Rank
from rocewatch.core import checkpoint
from rocewatch.core.topology import Topology


def test_slow_rank_and_bus_bandwidth_state_round_trip() -> None:
    topo = Topology.from_dict({"switches": [], "nodes": []})
    sr = SlowRankDetector(topo, SlowRankConfig())
    sr.ranks[("gpu-002", "rank9", "0xabc")] = _Rank(
        seen=[(1, 1, 1, 200.0)], active=True, fired_ts=1, evidence="late"
    )
    sr.places[("gpu-002", "rank9", "0xabc")] = (1, "mlx5_1", 1)
    bw = BusBandwidthDropDetector(topo, BusBandwidthDropConfig())
    bw.keys["0xabc/AllReduce/1024"] = _Key(baseline=[180.0] * 3, recent=[(5, 90.0)], hosts=["a"])
    for det in (sr, bw):
        types = checkpoint.StateTypes(det.STATE_TYPES)
        data = checkpoint.loads(checkpoint.dumps(det.state(), "test", types), "test", types)
        fresh = type(det)(topo)
        fresh.restore(data)
        assert fresh.state() == det.state()
    assert sr.config.min_lag_us == 50.0
