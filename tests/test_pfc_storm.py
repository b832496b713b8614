"""PFC storm origin vs victim on a hand-built fabric (independent of the simulator)."""

import polars as pl
import pytest

from rocewatch.config import Config
from rocewatch.model import conform
from rocewatch.pipeline import Pipeline
from rocewatch.topology import Topology

S = 1_000_000_000
STEP = S // 10
T0 = 1_795_946_400 * S

TOPO = Topology.from_dict(
    {
        "switches": [
            {"name": "leaf-0", "role": "leaf", "rail": 0},
            {"name": "leaf-1", "role": "leaf", "rail": 0},
            {"name": "spine-0", "role": "spine"},
        ],
        "links": [
            {"a": "leaf-0/Ethernet1/9", "b": "spine-0/Ethernet1/1"},
            {"a": "leaf-1/Ethernet1/9", "b": "spine-0/Ethernet1/2"},
        ],
        "nodes": [
            {"name": "gpu-001", "nics": [{"nic": "mlx5_0", "switch_port": "leaf-0/Ethernet1/1"}]},
            {"name": "gpu-002", "nics": [{"nic": "mlx5_0", "switch_port": "leaf-0/Ethernet1/2"}]},
            {"name": "gpu-003", "nics": [{"nic": "mlx5_0", "switch_port": "leaf-1/Ethernet1/1"}]},
        ],
        "jobs": [{"name": "llm", "tenant": "a", "nodes": ["gpu-001", "gpu-002", "gpu-003"]}],
    }
)

# receiver entity -> (paused from, paused until), seconds after T0
STORM = {
    ("leaf-0", "Ethernet1/1"): (1.0, 4.0),
    ("gpu-002", "mlx5_0"): (1.2, 4.2),
    ("spine-0", "Ethernet1/1"): (1.2, 4.2),
    ("leaf-1", "Ethernet1/9"): (1.4, 4.4),
    ("gpu-003", "mlx5_0"): (1.6, 4.6),
}
SENDING = {("gpu-001", "mlx5_0"): (1.0, 4.0)}
SWITCH_PORTS = [
    ("leaf-0", "Ethernet1/1"),
    ("leaf-0", "Ethernet1/2"),
    ("leaf-0", "Ethernet1/9"),
    ("spine-0", "Ethernet1/1"),
    ("spine-0", "Ethernet1/2"),
    ("leaf-1", "Ethernet1/1"),
    ("leaf-1", "Ethernet1/9"),
]
NICS = [("gpu-001", "mlx5_0"), ("gpu-002", "mlx5_0"), ("gpu-003", "mlx5_0")]


def active(table, key, t):
    w = table.get(key)
    return w is not None and w[0] <= t < w[1]


def ticks(seconds=8.0, with_agents=True, storm=True):
    cum: dict = {}
    rows = []
    for i in range(int(seconds * 10) + 1):
        t = i / 10
        ts = T0 + i * STEP + 3_000_000  # devices read a few ms after the tick
        rows = []

        def add(dev, port, qual, metric, inc, gauge=None, rows=rows, ts=ts, i=i):
            if gauge is not None:
                rows.append((ts, dev, port, qual, metric, float(gauge), None))
                return
            k = (dev, port, qual, metric)
            cum[k] = cum.get(k, 0) + (int(inc) if i else 0)
            rows.append((ts, dev, port, qual, metric, float(cum[k]), cum[k]))

        for dev, port in SWITCH_PORTS:
            paused = storm and active(STORM, (dev, port), t)
            add(dev, port, "3", "pfc_rx_pause_us", 100_000 if paused else 700)
            add(dev, port, "3", "queue_tx_pkts", 0 if paused else 50_000)
            add(dev, port, "3", "queue_depth_bytes", 0, gauge=6e6 if paused else 2e4)
        if with_agents:
            for node, nic in NICS:
                add(
                    node,
                    nic,
                    "3",
                    "nic_rx_pause_us",
                    100_000 if storm and active(STORM, (node, nic), t) else 400,
                )
                add(
                    node,
                    nic,
                    "3",
                    "nic_tx_pause_us",
                    100_000 if storm and active(SENDING, (node, nic), t) else 300,
                )
        yield conform(
            pl.DataFrame(
                rows,
                schema=["ts", "device", "port", "qual", "metric", "value", "raw"],
                orient="row",
            )
        )


def run(frames):
    p = Pipeline(TOPO, Config(), rollup_s=None)
    for f in frames:
        p.ingest(f)
        p.advance(int(f["ts"].max()) - p.engine.lateness_ns())
    p.finish()
    return p


@pytest.mark.parametrize("with_agents", [True, False], ids=["agents", "switches-only"])
def test_origin_found_victims_not_blamed(with_agents):
    p = run(ticks(with_agents=with_agents))
    storms = [a for a in p.all_alerts() if a.name == "PFCStorm"]
    origins = [a for a in storms if a.labels["role"] == "origin"]
    assert [(a.labels.get("node"), a.labels.get("nic")) for a in origins] == [("gpu-001", "mlx5_0")]
    o = origins[0]
    assert o.labels["priority"] == "3" and o.labels["severity"] == "critical"
    # detected from the first full 200 ms of pause: well under a second after onset
    ttd = (o.starts_at - (T0 + S)) / 1e9
    assert 0.1 <= ttd <= 0.5, ttd
    assert o.ends_at and o.ends_at > T0 + 4 * S  # resolved once the storm stopped
    assert "leaf-0/Ethernet1/1 prio 3 received pause" in o.annotations["evidence"]
    victims = {
        (
            a.labels.get("node") or a.labels.get("switch"),
            a.labels.get("nic") or a.labels.get("port"),
        )
        for a in storms
        if a.labels["role"] == "victim"
    }
    expected = set(STORM) if with_agents else {k for k in STORM if not k[0].startswith("gpu")}
    assert victims == expected
    assert ("gpu-001", "mlx5_0") not in victims
    drains = [a for a in p.actions if a.action == "drain"]
    assert [a.node for a in drains] == ["gpu-001"]
    assert drains[0].outcome == "dry-run" and drains[0].executed is False
    assert drains[0].alert_fingerprint == o.fingerprint


def test_healthy_fabric_raises_nothing():
    p = run(ticks(storm=False))
    assert p.all_alerts() == [] and p.actions == []


def test_short_pause_burst_is_not_a_storm():
    # an MoE all-to-all pauses a NIC hard for one interval: below the 200 ms detection time
    frames = list(ticks(storm=False))
    p = Pipeline(TOPO, Config(), rollup_s=None)
    cum = 0
    for i, f in enumerate(frames):
        burst = 100_000 if i == 30 else 300
        cum += burst if i else 0
        extra = conform(
            pl.DataFrame(
                {
                    "ts": [int(f["ts"][0])],
                    "device": ["gpu-001"],
                    "port": ["mlx5_0"],
                    "qual": ["3"],
                    "metric": ["nic_tx_pause_us"],
                    "value": [float(cum)],
                    "raw": [cum],
                }
            )
        )
        f = pl.concat([f.filter(pl.col("metric") != "nic_tx_pause_us"), extra])
        p.ingest(f)
        p.advance(int(f["ts"].max()) - p.engine.lateness_ns())
    p.finish()
    assert p.all_alerts() == []
