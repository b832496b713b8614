"""PFC storm origin vs victim on a hand-built fabric (independent of the simulator)."""

import dataclasses

import polars as pl
import pytest

from detectors.pfc_storm import PfcStormConfig
from rocewatch.config import Config
from rocewatch.core.model import conform
from rocewatch.core.topology import Topology
from rocewatch.pipeline import Pipeline
from tests import cadence
from tests.support.restart import restart_pipeline

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
    # one alert for the storm's victims, naming the origin that paused them; it lists them all
    grouped = [a for a in storms if a.labels["role"] == "victim"]
    assert [a.labels["origin"] for a in grouped] == ["gpu-001/mlx5_0"]
    victims = {tuple(v.split("/", 1)) for v in grouped[0].annotations["victims"].split(", ")}
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


# --- cadence: the same storm read every 0.1, 1 or 5 s, or each source at its own pace ---------


HOP = {  # receiver -> seconds after the onset its pause starts (the storm spreads hop by hop)
    ("leaf-0", "Ethernet1/1"): 0.0,
    ("gpu-002", "mlx5_0"): 0.2,
    ("spine-0", "Ethernet1/1"): 0.2,
    ("leaf-1", "Ethernet1/9"): 0.4,
    ("gpu-003", "mlx5_0"): 0.6,
}


SWITCHES = {dev for dev, _ in SWITCH_PORTS}


def storm_series(switch_iv, nic_iv=None, queue_iv=None, storm=None, jitter=0.2, hops=None):
    """The fabric's pause, queue and NIC counters, each source read at its own interval;
    ``storm`` = (onset, end) s: gpu-001 sends pause, the others (``hops``) are paused in turn."""
    queue_iv = queue_iv or switch_iv
    hops = HOP if hops is None else hops

    def window(key):
        if storm is None or key not in hops:
            return []
        return [(storm[0] + hops[key], storm[1] + hops[key])]

    def pause(base, spans):
        return cadence.Rate(base, [(a, b, 1e6 - base) for a, b in spans])

    out = []
    for k, (dev, port) in enumerate(SWITCH_PORTS):
        spans = window((dev, port))
        sw = {
            "interval": switch_iv,
            "phase": 0.003 + 0.29 * sorted(SWITCHES).index(dev) % switch_iv,
        }
        q = {"interval": queue_iv, "phase": 0.007 + 0.31 * k % queue_iv}
        out += [
            cadence.Series(dev, port, "pfc_rx_pause_us", "3", rate=pause(7_000, spans), **sw),
            cadence.Series(
                dev,
                port,
                "queue_tx_pkts",
                "3",
                rate=cadence.Rate(500_000, [(a, b, -500_000) for a, b in spans]),
                **q,
            ),
            cadence.Series(
                dev,
                port,
                "queue_depth_bytes",
                "3",
                gauge=lambda t, spans=spans: 6e6 if any(a <= t < b for a, b in spans) else 2e4,
                **q,
            ),
        ]
    if nic_iv is not None:
        for k, (node, nic) in enumerate(NICS):
            n = {"interval": nic_iv, "phase": 0.011 + 0.23 * k % nic_iv}
            sending = [storm] if storm is not None and node == "gpu-001" else []
            out += [
                cadence.Series(
                    node, nic, "nic_rx_pause_us", "3", rate=pause(4_000, window((node, nic))), **n
                ),
                cadence.Series(node, nic, "nic_tx_pause_us", "3", rate=pause(3_000, sending), **n),
            ]
    return [dataclasses.replace(s, jitter=jitter) for s in out]


def storm_times(interval):
    """(onset, end, run length) s: a storm that lasts several detection bounds, then time to
    resolve (the restoration time and two and a half intervals, and the alert lifecycle's)."""
    onset = 2.0 + 2 * interval
    end = onset + max(4.0, 4 * interval)
    return onset, end, end + 3.0 + 4 * interval


def check_storm(r, onset, end, fastest, with_agents):
    storms = r.named("PFCStorm")
    origins = [a for a in storms if a.labels["role"] == "origin"]
    # one alert for the culprit, from onset to end: never a victim, never flapping
    assert [(a.labels.get("node"), a.labels.get("nic")) for a in origins] == [
        ("gpu-001", "mlx5_0")
    ], [a.labels for a in origins]
    (o,) = origins
    assert 0 < cadence.ttd(o, onset) <= storm_bound(fastest), cadence.ttd(o, onset)
    assert cadence.still_firing_or_ended_after(o, end)
    assert o.ends_at, "resolved once the storm ended"
    victims = [a for a in storms if a.labels["role"] == "victim"]
    assert victims and all(a.labels.get("node") != "gpu-001" for a in victims)
    assert [a.node for a in r.pipeline.actions if a.action == "drain"] == ["gpu-001"]


def storm_bound(interval):
    """The time a storm may take to find: two and a half intervals of the fastest source that
    sees it (the sample it began in counts toward the 200 ms detection time when it was paused a
    quarter of it), never less than 2.5 of the window engine's 0.1 s steps."""
    return 2.5 * max(interval, 0.1)


@pytest.mark.parametrize("interval", cadence.CADENCES)
@pytest.mark.parametrize("with_agents", [True, False], ids=["agents", "switches-only"])
def test_storm_at_any_cadence(interval, with_agents):
    onset, end, seconds = storm_times(interval)
    series = storm_series(interval, interval if with_agents else None, storm=(onset, end))
    r = cadence.run(TOPO, series, seconds)
    check_storm(r, onset, end, interval, with_agents)


@pytest.mark.parametrize(
    "nic_iv,switch_iv,queue_iv",
    [(0.5, 1.0, 5.0), (2.0, 1.0, 10.0), (None, 1.0, 5.0)],
    ids=["nic0.5-switch1-queue5", "nic2-switch1-queue10", "switch1-queue5"],
)
def test_storm_sources_at_different_cadences(nic_iv, switch_iv, queue_iv):
    onset, end, seconds = storm_times(max(switch_iv, nic_iv or 0))
    series = storm_series(switch_iv, nic_iv, queue_iv, storm=(onset, end))
    r = cadence.run(TOPO, series, seconds)
    fastest = min(switch_iv, nic_iv or switch_iv)
    check_storm(r, onset, end, fastest, nic_iv is not None)


@pytest.mark.parametrize("interval", cadence.CADENCES)
def test_healthy_fabric_at_any_cadence(interval):
    r = cadence.run(TOPO, storm_series(interval, interval), storm_times(interval)[2])
    assert r.alerts == []


def test_a_second_storm_from_a_switch_that_relayed_the_first_is_found() -> None:
    # the first storm (from gpu-001) paused only leaf-0, which left the storm last; a
    # while later a second storm starts at leaf-0 itself (its own transmit-pause counters show
    # it sending): leaf-0 is its origin, not a device still marked paused from the first storm
    first, second = (2.0, 6.0), (40.0, 46.0)
    full = 1e6 - 4_000.0

    def second_storm(x: cadence.Series) -> cadence.Series:
        if (x.device, x.port, x.metric) != ("gpu-002", "mlx5_0", "nic_rx_pause_us"):
            return x
        assert x.rate is not None
        return dataclasses.replace(x, rate=cadence.Rate(4_000.0, [*x.rate.extra, (*second, full)]))

    only_leaf = {("leaf-0", "Ethernet1/1"): 0.0}
    series = [second_storm(x) for x in storm_series(1.0, 1.0, storm=first, hops=only_leaf)]
    sending = cadence.Rate(3_000.0, [(second[0], second[1], 1e6 - 3_000.0)])
    series.append(
        cadence.Series("leaf-0", "Ethernet1/2", "pfc_tx_pause_us", "3", rate=sending, interval=1.0)
    )
    r = cadence.run(TOPO, series, 52.0)
    origins = [a for a in r.named("PFCStorm") if a.labels["role"] == "origin"]
    second_origins = [a for a in origins if a.starts_at >= cadence.T0 + 40 * S]
    assert [(a.labels.get("switch"), a.labels.get("port")) for a in second_origins] == [
        ("leaf-0", "Ethernet1/2")
    ], [a.labels for a in origins]


# --- at 100 ms: within 2.5 intervals whatever the storm's phase; short bursts stay silent -------


def _phased(series, phase):
    return [dataclasses.replace(x, phase=phase, jitter=0.2) for x in series]


@pytest.mark.parametrize("phase", [0.005, 0.03, 0.055, 0.08, 0.099])
def test_storm_at_100ms_within_two_and_a_half_intervals_at_any_phase(phase):
    # every source read every 100 ms, `phase` after the onset's tick: the sample the storm
    # began in is paused for `phase` of its interval; the bound is 250 ms all the same
    onset, end = 2.2, 3.2
    r = cadence.run(TOPO, _phased(storm_series(0.1, 0.1, storm=(onset, end)), phase), 5.0)
    origins = [a for a in r.named("PFCStorm") if a.labels["role"] == "origin"]
    assert [(a.labels.get("node"), a.labels.get("nic")) for a in origins] == [("gpu-001", "mlx5_0")]
    # at least the one wholly paused sample, at most the two of the detection time
    assert 0.1 <= cadence.ttd(origins[0], onset) <= 0.25, cadence.ttd(origins[0], onset)
    # the evidence says when the onset sample counted
    if 0.03 <= phase <= 0.08:
        assert "of the sample it began in" in origins[0].annotations["evidence"]


@pytest.mark.parametrize("phase", [0.005, 0.03, 0.055, 0.08])
@pytest.mark.parametrize("burst_s", [0.11, 0.12])
def test_pause_burst_shorter_than_a_storm_is_silent_at_any_phase(phase, burst_s):
    # gpu-001 pauses its leaf wholly for 110-120 ms (an all-to-all burst whose receiver
    # caught up): one sample wholly paused at most, the one before it less than a quarter
    onset = 2.2
    burst = {k: 0.0 for k in (("leaf-0", "Ethernet1/1"),)}
    series = storm_series(0.1, 0.1, storm=(onset, onset + burst_s), hops=burst)
    r = cadence.run(TOPO, _phased(series, phase), 4.0)
    assert r.alerts == []


@pytest.mark.parametrize("leaf_phase", [0.38, 0.45, 0.6])
def test_a_relay_read_every_second_is_not_blamed_for_a_victim_read_every_100ms(leaf_phase):
    # spine-0 pauses both leaves' uplinks (nothing pauses it: a switch origin); 200 ms later
    # the leaves pause their NICs. The NICs, read every 100 ms, stall long before the leaves'
    # 1 s counters show them paused: a leaf's first sample after its NIC's stall may hold
    # only 40 % of pause. The leaves are relays, never origins.
    onset, end = 3.0, 5.5
    hops = {
        ("leaf-0", "Ethernet1/9"): 0.0,
        ("leaf-1", "Ethernet1/9"): 0.0,
        ("gpu-001", "mlx5_0"): 0.2,
        ("gpu-002", "mlx5_0"): 0.2,
        ("gpu-003", "mlx5_0"): 0.2,
    }
    series = []
    for x in storm_series(1.0, 0.1, storm=(onset, end), hops=hops, jitter=0.0):
        if x.metric == "nic_tx_pause_us":  # no NIC sends the storm
            x = dataclasses.replace(x, rate=cadence.Rate(3_000.0))
        if x.device.startswith("leaf"):
            x = dataclasses.replace(x, phase=leaf_phase)
        series.append(x)
    sending = cadence.Rate(3_000.0, [(onset, end, 1e6 - 3_000.0)])
    series += [
        cadence.Series("spine-0", p, "pfc_tx_pause_us", "3", rate=sending, interval=1.0)
        for p in ("Ethernet1/1", "Ethernet1/2")
    ]
    r = cadence.run(TOPO, series, end + 2.5)
    origins = {a.labels.get("switch") for a in r.named("PFCStorm") if a.labels["role"] == "origin"}
    assert origins == {"spine-0"}, origins
    assert not [a for a in r.pipeline.actions if a.action == "drain"]


# --- a restart mid-storm ---------------------------------------------------------------------


def run_restarted(frames, cut=None, after=None):
    """``frames`` into a pipeline of this detector alone; stopped before frame ``cut`` and
    started again as the service does: each part's state through the product's checkpoint
    codec, laid over a pipeline built anew from the configuration ``after`` (the same if
    none)."""
    p = Pipeline(TOPO, Config(), rollup_s=None)
    p.detectors = [d for d in p.detectors if d.name == "pfc_storm"]
    for i, f in enumerate(frames):
        if i == cut:
            p = restart_pipeline(p, after, only=("pfc_storm",))
        p.ingest(f)
        p.advance(int(f["ts"].max()) - p.engine.lateness_ns())
    p.finish()
    return p


def storm_alerts(p):
    return [a.to_json() for a in p.all_alerts() if a.name == "PFCStorm"]


def test_a_checkpoint_taken_mid_storm_carries_on():
    """Stopped 2.5 s in, the storm's origin and victims alerting: the restarted pipeline
    raises no second alert, keeps the same ones (same startsAt) and resolves them when the
    uninterrupted one does; the one drain is not made again."""
    frames = list(ticks(seconds=6.0))
    whole = run_restarted(frames)
    p = run_restarted(frames, cut=25)
    assert storm_alerts(whole) and storm_alerts(p) == storm_alerts(whole)
    assert [a.to_json() for a in p.actions] == [a.to_json() for a in whole.actions]
    assert [a.node for a in p.actions if a.action == "drain"] == ["gpu-001"]


def test_a_restored_storm_detector_takes_todays_restoration_time():
    """Restarted mid-storm with ``restoration_time_s`` 1.5 s instead of 0.2: the origin's alert
    (the same alert) resolves after today's 1.5 s of calm, not the 0.2 s it started under."""
    frames = list(ticks())
    (before,) = [a for a in run_restarted(frames).all_alerts() if a.labels.get("role") == "origin"]
    cfg = Config(detectors={"pfc_storm": PfcStormConfig(restoration_time_s=1.5)})
    p = run_restarted(frames, cut=25, after=cfg)
    (after,) = [a for a in p.all_alerts() if a.labels.get("role") == "origin"]
    assert after.fingerprint == before.fingerprint and after.starts_at == before.starts_at
    assert before.ends_at and after.ends_at
    assert 1.2 <= (after.ends_at - before.ends_at) / S <= 1.6, (after.ends_at - before.ends_at) / S
