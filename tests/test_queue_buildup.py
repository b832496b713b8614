"""QueueBuildup on hand-built frames: queues held near their buffer limit, and the paused,
bursty or unsized queues that must not raise it."""

import polars as pl
import pytest

from detectors.queue_buildup import QueueBuildupConfig
from rocewatch.config import Config, config_from_dict
from rocewatch.errors import ConfigError
from rocewatch.model import conform
from rocewatch.pipeline import Pipeline
from rocewatch.topology import Topology

S = 1_000_000_000
STEP = S // 10
T0 = 1_795_946_400 * S
MIB = 2**20
BUF = 64 * MIB

TOPO = Topology.from_dict(
    {
        "switches": [
            {"name": "leaf-0", "role": "leaf", "rail": 0, "buffer_bytes": BUF},
            {"name": "spine-0", "role": "spine", "buffer_bytes": BUF},
            {"name": "leaf-x", "role": "leaf"},  # no buffer_bytes: occupancy unknown
        ],
        "links": [{"a": "leaf-0/Ethernet1/9", "b": "spine-0/Ethernet1/1"}],
        "nodes": [
            {"name": "gpu-001", "nics": [{"nic": "mlx5_0", "switch_port": "leaf-0/Ethernet1/1"}]},
            {"name": "gpu-002", "nics": [{"nic": "mlx5_0", "switch_port": "leaf-0/Ethernet1/2"}]},
            {"name": "gpu-003", "nics": [{"nic": "mlx5_0", "switch_port": "leaf-x/Ethernet1/1"}]},
        ],
    }
)
QUEUES = [
    ("leaf-0", "Ethernet1/1"),
    ("leaf-0", "Ethernet1/2"),
    ("leaf-0", "Ethernet1/9"),
    ("spine-0", "Ethernet1/1"),
    ("leaf-x", "Ethernet1/1"),
]


def ticks(seconds, depth, paused=lambda t, q: 0.0, clears=()):
    """One read per switch every 100 ms: ``depth(t, queue)`` is the occupancy share of the
    buffer read at ``t`` (the peak a little above), ``paused(t, queue)`` the share of the
    interval ending at ``t`` the queue was paused by PFC; ``clears`` (t, switch): that switch's
    counters are cleared 60% into the interval ending at t."""
    cum: dict = {}
    for i in range(int(seconds * 10) + 1):
        t = round(i / 10, 1)
        ts = T0 + i * STEP + 3_000_000
        rows = []
        cleared = [dev for ct, dev in clears if ct == t]
        for k in [k for k in cum if k[0] in cleared]:
            cum[k] = 0
        for dev, port in QUEUES:
            q = (dev, port)
            d = depth(t, q) * BUF
            rows.append((ts, dev, port, "3", "queue_depth_bytes", d, None))
            rows.append((ts, dev, port, "3", "queue_peak_bytes", min(BUF, d * 1.02), None))
            p = paused(t, q)
            for metric, inc in (
                ("pfc_rx_pause_us", p * 100_000),
                ("queue_tx_pkts", 0 if p >= 0.99 else 500_000 * (1 - p)),
            ):
                k = (dev, port, metric)
                if dev in cleared:
                    inc *= 0.4  # cleared 60% into the interval: only the rest counts
                cum[k] = cum.get(k, 0) + (int(inc) if i else 0)
                rows.append((ts, dev, port, "3", metric, float(cum[k]), cum[k]))
        yield conform(
            pl.DataFrame(
                rows,
                schema=["ts", "device", "port", "qual", "metric", "value", "raw"],
                orient="row",
            )
        )


def run(frames, config=None):
    p = Pipeline(TOPO, config or Config(), rollup_s=None)
    # the real pipeline, with the detector this file is about (and the storm detector)
    p.detectors = [d for d in p.detectors if d.name in ("pfc_storm", "queue_buildup")]
    for f in frames:
        p.ingest(f)
        p.advance(int(f["ts"].max()) - p.engine.lateness_ns())
    p.finish()
    return p


def buildups(p):
    return [a for a in p.all_alerts() if a.name == "QueueBuildup"]


def quiet(t, q):
    return 0.02  # healthy all-reduce: a few % of the buffer


def test_incast_queue_found_with_labels_and_onset():
    def depth(t, q):
        return 0.9 if q == ("leaf-0", "Ethernet1/1") and 2.0 <= t < 6.0 else 0.02

    p = run(ticks(9, depth))
    (a,) = buildups(p)
    assert a.labels == {
        "alertname": "QueueBuildup",
        "severity": "warning",
        "switch": "leaf-0",
        "port": "Ethernet1/1",
        "queue": "3",
        "rail": "0",
    }
    ttd = (a.starts_at - (T0 + 2 * S)) / 1e9
    assert 0.9 <= ttd <= 1.1, ttd  # held 1 s (sustain_s) from the first full read
    assert a.ends_at and T0 + 6 * S < a.ends_at < T0 + 8 * S
    ev = a.annotations["evidence"]
    assert "occupancy 91.8% of 64.0 MiB" in ev and "threshold 80% held 1 s" in ev


def test_near_full_queue_is_critical_once():
    def depth(t, q):
        return 0.97 if q == ("leaf-0", "Ethernet1/2") and t >= 1.0 else 0.02

    p = run(ticks(4, depth))
    assert [a.labels["severity"] for a in buildups(p)] == ["critical"]


def test_storm_stalled_queue_is_left_to_pfc_storm():
    # a queue paused by PFC for the whole interval sits full because it is paused; a counter
    # clear makes one interval look only 40% paused, which must not start a buildup either
    stalled = {("leaf-0", "Ethernet1/9"), ("spine-0", "Ethernet1/1")}

    def depth(t, q):
        return 0.92 if q in stalled and t >= 1.0 else 0.02

    def paused(t, q):
        return 1.0 if q in stalled and t >= 1.0 else 0.0

    p = run(ticks(6, depth, paused, clears=[(3.0, "leaf-0")]))
    assert buildups(p) == []
    assert any(a.name == "PFCStorm" for a in p.all_alerts())


def test_bursts_and_microbursts_do_not_fire():
    # MoE: deep bursts (30%) every other read, and one microburst to 95% for a single read
    def depth(t, q):
        if q == ("leaf-0", "Ethernet1/1") and t == 2.0:
            return 0.95
        return 0.3 if round(t * 10) % 2 else 0.01

    assert buildups(run(ticks(6, depth))) == []


def test_unsized_switch_needs_a_default_buffer():
    def depth(t, q):
        return 0.9 if q == ("leaf-x", "Ethernet1/1") and t >= 1.0 else 0.02

    assert buildups(run(ticks(3, depth))) == []
    cfg = Config(detectors={"queue_buildup": QueueBuildupConfig(default_buffer_bytes=BUF)})
    (a,) = buildups(run(ticks(3, depth), cfg))
    assert (a.labels["switch"], a.labels["port"]) == ("leaf-x", "Ethernet1/1")


def test_config_validation():
    cfg = config_from_dict({"detectors": {"queue_buildup": {"warning_fraction": 0.7}}})
    assert cfg.detectors["queue_buildup"].warning_fraction == 0.7
    with pytest.raises(ConfigError, match="exit_fraction <= warning_fraction"):
        config_from_dict({"detectors": {"queue_buildup": {"warning_fraction": 0.99}}})
    with pytest.raises(ConfigError, match="default_buffer_bytes"):
        QueueBuildupConfig(default_buffer_bytes=0)
