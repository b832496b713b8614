"""FlakyLink on a hand-built fabric: BER against each link's own baseline, errors, flaps."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import polars as pl
import pytest

from detectors.flaky_link import FlakyLinkConfig
from detectors.state import EntitySlots
from rocewatch.config import Config, config_from_dict
from rocewatch.core.checkpoint import StateTypes
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import Alert, conform
from rocewatch.core.topology import Topology
from rocewatch.pipeline import Pipeline
from tests import cadence
from tests.support.restart import restart_pipeline, through_codec

S = 1_000_000_000
STEP = S // 10
T0 = 1_795_946_400 * S
BITS = 400e9 * 0.1  # bits a 400G link carries per 0.1 s tick

TOPO = Topology.from_dict(
    {
        "switches": [
            {"name": "leaf-0", "role": "leaf", "rail": 0},
            {"name": "spine-0", "role": "spine"},
        ],
        "links": [{"a": "leaf-0/Ethernet2/1", "b": "spine-0/Ethernet1/1"}],
        "nodes": [
            {
                "name": f"gpu-00{i}",
                "nics": [{"nic": "mlx5_0", "switch_port": f"leaf-0/Ethernet1/{i}"}],
            }
            for i in range(1, 5)
        ],
        "jobs": [{"name": "llm", "tenant": "a", "nodes": [f"gpu-00{i}" for i in range(1, 5)]}],
    }
)
NICS = [(f"gpu-00{i}", "mlx5_0") for i in range(1, 5)]
PORTS = [("leaf-0", f"Ethernet1/{i}") for i in range(1, 5)] + [
    ("leaf-0", "Ethernet2/1"),
    ("spine-0", "Ethernet1/1"),
]
# each link's own healthy pre-FEC BER: two decades apart
BASE = {"gpu-001": 1e-8, "gpu-002": 5e-8, "gpu-003": 9e-7, "gpu-004": 2e-7}
NIC_COUNTERS = (
    "nic_rx_corrected_bits",
    "nic_rx_crc_errors",
    "nic_rx_symbol_errors",
    "nic_rx_uncorrectable",
    "nic_link_down_events",
)
PORT_COUNTERS = ("port_in_fcs_errors", "port_carrier_transitions")

Incs = Callable[[str, str, str, float], float]  # (device, port, metric, t) -> increase per tick


def healthy(rng: np.random.Generator) -> Incs:
    def inc(dev: str, port: str, metric: str, t: float) -> float:
        if metric == "nic_rx_corrected_bits":
            return float(rng.poisson(BASE[dev] * BITS))
        return 0.0

    return inc


def feed(
    seconds: float,
    inc: Incs,
    silent: Callable[[str, float], bool] = lambda dev, t: False,
    clear: Callable[[str, float], bool] = lambda dev, t: False,
) -> Iterator[pl.DataFrame]:
    """Every 0.1 s, each device reads its cumulative counters a few ms after the tick.

    A ``silent`` device sends nothing (its counters keep counting); a ``clear`` one has its
    counters zeroed just before the read.
    """
    cum: dict[tuple[str, str, str], int] = {}
    for i in range(int(seconds * 10) + 1):
        t = i / 10
        ts = T0 + i * STEP + 3_000_000
        rows = []
        series = [(d, p, m) for d, p in NICS for m in NIC_COUNTERS]
        series += [(d, p, m) for d, p in PORTS for m in PORT_COUNTERS]
        for dev, port, metric in series:
            k = (dev, port, metric)
            if clear(dev, t):
                cum[k] = 0
            cum[k] = cum.get(k, 10**9) + (int(inc(dev, port, metric, t)) if i else 0)
            if not silent(dev, t):
                rows.append((ts, dev, port, "", metric, float(cum[k]), cum[k]))
        for dev, port in NICS:
            if not silent(dev, t):
                rows.append((ts, dev, port, "", "nic_link_speed_mbps", 400_000.0, None))
        yield conform(
            pl.DataFrame(
                rows,
                schema=["ts", "device", "port", "qual", "metric", "value", "raw"],
                orient="row",
            )
        )


def run(
    frames: Iterable[pl.DataFrame], cut: int | None = None, after: Config | None = None
) -> list[Alert]:
    """Replay ``frames``; with ``cut``, stop after that many and start again: the state
    through the product's checkpoint codec, laid over a pipeline built anew (from ``after``,
    the configuration it restarts with, if given)."""
    p = Pipeline(TOPO, rollup_s=None)
    p.detectors = [d for d in p.detectors if d.name == "flaky_link"]  # this detector alone
    for n, f in enumerate(frames):
        if n == cut:
            p = restart_pipeline(p, after, only=("flaky_link",))
        p.ingest(f)
        p.advance(int(f["ts"].max()) - p.engine.lateness_ns())  # type: ignore[arg-type]
    p.finish()
    return [a for a in p.all_alerts() if a.name == "FlakyLink"]


def test_ber_rise_over_own_baseline_names_both_ends() -> None:
    rng = np.random.default_rng(1)
    base = healthy(rng)
    onset, end = 6.0, 9.0

    def inc(dev: str, port: str, metric: str, t: float) -> float:
        # gpu-002's link degrades to 100x+ its own baseline, still below the absolute maximum
        if dev == "gpu-002" and metric == "nic_rx_corrected_bits" and onset < t <= end:
            return float(rng.poisson(8e-6 * BITS))
        return base(dev, port, metric, t)

    alerts = run(feed(22.0, inc))
    assert len(alerts) == 1, [a.labels for a in alerts]
    a = alerts[0]
    assert a.labels["severity"] == "warning"
    # the cable: node+nic and the leaf port at its other end, from the topology
    assert {k: a.labels[k] for k in ("node", "nic", "switch", "port")} == {
        "node": "gpu-002",
        "nic": "mlx5_0",
        "switch": "leaf-0",
        "port": "Ethernet1/2",
    }
    assert a.labels["job"] == "llm" and a.labels["rail"] == "0"
    assert a.annotations["strands"] == "gpu-002"
    assert a.annotations["cable"] == "gpu-002/mlx5_0 <-> leaf-0/Ethernet1/2"
    ev = a.annotations["evidence"]
    assert "pre-FEC BER 8.0e-06" in ev and "100x baseline 5.0e-08" in ev, ev
    # two readings 0.5 s apart above threshold: flagged within ~1 s of the rise
    ttd = (a.starts_at - (T0 + int(onset * S))) / S
    assert 0.4 <= ttd <= 1.2, ttd
    # and resolved once the link is clean again for clear_s
    assert a.ends_at and T0 + int((end + 9) * S) < a.ends_at < T0 + int((end + 12) * S)


def ber_rise() -> list[pl.DataFrame]:
    """gpu-002's link at 100x its own BER from 6 to 9 s (as the test above), 22 s."""
    rng = np.random.default_rng(1)
    base = healthy(rng)

    def inc(dev: str, port: str, metric: str, t: float) -> float:
        if dev == "gpu-002" and metric == "nic_rx_corrected_bits" and 6.0 < t <= 9.0:
            return float(rng.poisson(8e-6 * BITS))
        return base(dev, port, metric, t)

    return list(feed(22.0, inc))


def test_a_checkpoint_taken_mid_fault_carries_on() -> None:
    """Stopped at 8 s, the alert firing, and started again from its state through the
    codec: the same alert (same startsAt, one alert), resolved when the uninterrupted run
    resolves it."""
    frames = ber_rise()
    whole = run(frames)
    assert len(whole) == 1 and whole[0].ends_at
    assert whole[0].starts_at < T0 + 8 * S
    cut = run(frames, cut=80)
    assert [a.to_json() for a in cut] == [a.to_json() for a in whole]


def test_a_restored_detector_takes_todays_clear_s() -> None:
    """Restarted mid-fault with ``clear_s`` 3 s instead of 10: the restored cable resolves
    after today's 3 s, not the 10 s it was flagged under; the alert is the same one."""
    frames = ber_rise()
    (whole,) = run(frames)
    cfg = Config(detectors={"flaky_link": FlakyLinkConfig(clear_s=3.0)})
    (a,) = run(frames, cut=80, after=cfg)
    assert a.starts_at == whole.starts_at and a.ends_at and whole.ends_at
    assert T0 + int(12 * S) < a.ends_at < T0 + int(14.5 * S) < T0 + int(18 * S) < whole.ends_at


def test_a_link_that_always_ran_high_is_not_flagged() -> None:
    """gpu-003's link runs at 9e-7 from the start (its own normal): the same BER that flags a
    clean link that rises to it."""
    rng = np.random.default_rng(2)
    base = healthy(rng)

    def inc(dev: str, port: str, metric: str, t: float) -> float:
        if dev == "gpu-001" and metric == "nic_rx_corrected_bits" and t > 6.0:
            return float(rng.poisson(9e-7 * 1.3 * BITS))  # 117x its 1e-8 baseline
        return base(dev, port, metric, t)

    alerts = run(feed(10.0, inc))
    assert [a.labels["node"] for a in alerts] == ["gpu-001"]


def test_flaps_and_uncorrectable_blocks_are_critical() -> None:
    rng = np.random.default_rng(3)
    base = healthy(rng)
    flaps = [(4.0, 4.6), (6.0, 6.5)]  # down, up

    def inc(dev: str, port: str, metric: str, t: float) -> float:
        near = any(abs(t - x) < 0.05 for f in flaps for x in f)
        if dev == "leaf-0" and port == "Ethernet1/4" and metric == "port_carrier_transitions":
            return 1.0 if near else 0.0
        if dev == "gpu-004" and metric == "nic_link_down_events":
            return 1.0 if any(abs(t - f[0]) < 0.05 for f in flaps) else 0.0
        if dev == "gpu-004" and metric == "nic_rx_corrected_bits":
            return 0.0 if any(a <= t < b for a, b in flaps) else base(dev, port, metric, t)
        if dev == "gpu-001" and metric == "nic_rx_uncorrectable" and 3.0 < t <= 5.0:
            return 2.0  # post-FEC errors: data reaches the host corrupted
        return base(dev, port, metric, t)

    alerts = run(feed(9.0, inc))
    by_node = {a.labels["node"]: a for a in alerts}
    assert set(by_node) == {"gpu-001", "gpu-004"}, [a.labels for a in alerts]
    assert all(a.labels["severity"] == "critical" for a in alerts)
    flap = by_node["gpu-004"]
    assert flap.labels["switch"] == "leaf-0" and flap.labels["port"] == "Ethernet1/4"
    assert "flap" in flap.annotations["evidence"]
    # the second flap makes it flapping: startsAt is the read that saw it
    assert abs((flap.starts_at - T0) / S - 6.0) < 0.1, (flap.starts_at - T0) / S
    unc = by_node["gpu-001"]
    assert "FEC-uncorrectable" in unc.annotations["evidence"]
    assert abs((unc.starts_at - T0) / S - 3.2) < 0.15, (unc.starts_at - T0) / S


def test_one_flap_alone_is_not_a_flaky_link() -> None:
    """A reboot or a re-seated cable goes down and up once."""
    rng = np.random.default_rng(4)
    base = healthy(rng)

    def inc(dev: str, port: str, metric: str, t: float) -> float:
        if dev == "leaf-0" and port == "Ethernet1/3" and metric == "port_carrier_transitions":
            return 1.0 if abs(t - 3.0) < 0.05 or abs(t - 3.5) < 0.05 else 0.0
        if dev == "gpu-003" and metric == "nic_link_down_events":
            return 1.0 if abs(t - 3.0) < 0.05 else 0.0
        return base(dev, port, metric, t)

    assert run(feed(6.0, inc)) == []


def test_switch_to_switch_cable_names_an_end_and_its_peer() -> None:
    rng = np.random.default_rng(5)
    base = healthy(rng)

    def inc(dev: str, port: str, metric: str, t: float) -> float:
        if (dev, port, metric) == ("spine-0", "Ethernet1/1", "port_in_fcs_errors") and t > 2.0:
            return float(rng.poisson(3.0))
        return base(dev, port, metric, t)

    alerts = run(feed(5.0, inc))
    assert len(alerts) == 1
    a = alerts[0]
    assert (a.labels["switch"], a.labels["port"]) == ("spine-0", "Ethernet1/1")
    assert "node" not in a.labels and a.labels["severity"] == "warning"
    assert a.annotations["peer"] == "leaf-0/Ethernet2/1"
    assert a.annotations["strands"] == "none"
    assert "FCS/CRC errored frames" in a.annotations["evidence"]
    assert 0.1 <= (a.starts_at - (T0 + 2 * S)) / S <= 0.6


def test_counter_clears_agent_gaps_and_noise_raise_nothing() -> None:
    """Counters zeroed (a reboot, `sonic-clear counters`), an agent silent for 2 s while its
    counters keep counting, and the odd single error a healthy link shows: no alert. The
    pipeline is also checkpointed halfway, as the service does."""
    rng = np.random.default_rng(6)
    base = healthy(rng)

    def inc(dev: str, port: str, metric: str, t: float) -> float:
        if metric in ("port_in_fcs_errors", "nic_rx_crc_errors") and rng.random() < 0.003:
            return 1.0
        if metric == "nic_rx_symbol_errors" and rng.random() < 0.01:
            return 2.0
        return base(dev, port, metric, t)

    alerts = run(
        feed(
            14.0,
            inc,
            silent=lambda dev, t: dev == "gpu-003" and 5.0 <= t < 7.0,
            clear=lambda dev, t: (
                (dev == "gpu-001" and abs(t - 8.0) < 0.05)
                or (dev == "leaf-0" and abs(t - 9.0) < 0.05)
            ),
        ),
        cut=70,
    )
    assert alerts == []


def test_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="ber_ratio"):
        FlakyLinkConfig(ber_ratio=0.5)
    with pytest.raises(ConfigError, match="ber_floor"):
        FlakyLinkConfig(ber_floor=1e-3)
    cfg = config_from_dict({"detectors": {"flaky_link": {"min_flaps": 3}}})
    assert cfg.detectors["flaky_link"].min_flaps == 3
    with pytest.raises(ConfigError, match="flaky_link"):
        config_from_dict({"detectors": {"flaky_link": {"min_flaps": "many"}}})


def test_entity_slots_survive_a_checkpoint() -> None:
    s = EntitySlots()
    f = pl.DataFrame({"device": ["b", "a", "b"], "port": ["x", "y", "x"]})
    assert s.rows(f).tolist() == [0, 1, 0]
    s2 = through_codec(s, StateTypes([EntitySlots]))
    g = pl.DataFrame({"device": ["a", "c", "b"], "port": ["y", "z", "x"]})
    assert s2.rows(g).tolist() == [1, 2, 0]


# --- cadence: counters read every 0.1, 1 or 5 s ----------------------------------------------

ONLY = ("flaky_link",)


def link_series(
    interval: float, fault: dict[tuple[str, str, str], cadence.Rate] | None = None
) -> list[cadence.Series]:
    """Every counter of the fabric read every ``interval`` s (NICs and switches out of step,
    jittered by a fifth of an interval); ``fault`` replaces some series' rates."""
    fault = fault or {}
    out = []
    series = [(d, p, m) for d, p in NICS for m in NIC_COUNTERS]
    series += [(d, p, m) for d, p in PORTS for m in PORT_COUNTERS]
    for k, (dev, port, metric) in enumerate(series):
        rate = cadence.Rate(BASE[dev] * 400e9 if metric == "nic_rx_corrected_bits" else 0.0)
        out.append(
            cadence.Series(
                dev,
                port,
                metric,
                rate=fault.get((dev, port, metric), rate),
                interval=interval,
                phase=0.003 + 0.13 * (k % 7) % interval,
                jitter=0.2,
                start=10**9,
            )
        )
    for dev, port in NICS:
        out.append(
            cadence.Series(
                dev, port, "nic_link_speed_mbps", gauge=lambda t: 400_000.0, interval=interval
            )
        )
    return out


def one_alert(r: cadence.Run, onset: float, until: float, interval: float) -> Alert:
    (a,) = r.named("FlakyLink")  # one alert for the whole fault: never resolved and re-raised
    assert 0 < cadence.ttd(a, onset) <= cadence.bound(interval), cadence.ttd(a, onset)
    assert cadence.still_firing_or_ended_after(a, until)
    return a


@pytest.mark.parametrize("interval", cadence.CADENCES)
def test_ber_rise_at_any_cadence(interval: float) -> None:
    # gpu-002's pre-FEC BER 200x its own baseline (5e-8 -> 1e-5)
    onset, until, seconds = cadence.timeline(interval)
    rate = cadence.Rate(5e-8 * 400e9, [(onset, until, (1e-5 - 5e-8) * 400e9)])
    r = cadence.run(
        TOPO,
        link_series(interval, {("gpu-002", "mlx5_0", "nic_rx_corrected_bits"): rate}),
        seconds + 10.0,  # clear_s: resolved 10 s after the last bad reading
        only=ONLY,
    )
    a = one_alert(r, onset, until, interval)
    assert (a.labels["node"], a.labels["switch"], a.labels["port"]) == (
        "gpu-002",
        "leaf-0",
        "Ethernet1/2",
    )
    assert a.labels["severity"] == "warning" and a.ends_at


@pytest.mark.parametrize("interval", cadence.CADENCES)
def test_fcs_errors_at_any_cadence(interval: float) -> None:
    # 20 errored frames a second at the switch end of gpu-003's cable
    onset, until, seconds = cadence.timeline(interval)
    rate = cadence.Rate(0.0, [(onset, until, 20.0)])
    r = cadence.run(
        TOPO,
        link_series(interval, {("leaf-0", "Ethernet1/3", "port_in_fcs_errors"): rate}),
        seconds,
        only=ONLY,
    )
    a = one_alert(r, onset, until, interval)
    assert (a.labels["node"], a.labels["port"]) == ("gpu-003", "Ethernet1/3")


@pytest.mark.parametrize("interval", cadence.CADENCES)
def test_flapping_at_any_cadence(interval: float) -> None:
    # the NIC's link goes down twice, 3 intervals apart (at least 3 s): critical at once
    onset = 5.0 + 3 * interval
    gap = max(3.0, 3 * interval)
    downs = [(onset, onset + 0.05, 20.0), (onset + gap, onset + gap + 0.05, 20.0)]
    r = cadence.run(
        TOPO,
        link_series(
            interval, {("gpu-004", "mlx5_0", "nic_link_down_events"): cadence.Rate(0.0, downs)}
        ),
        onset + gap + 4 * interval + 2.0,
        only=ONLY,
    )
    (a,) = r.named("FlakyLink")
    assert a.labels["severity"] == "critical" and a.labels["node"] == "gpu-004"
    assert 0 < cadence.ttd(a, onset + gap) <= 2.5 * interval + 0.1


@pytest.mark.parametrize("interval", cadence.CADENCES)
def test_healthy_links_at_any_cadence(interval: float) -> None:
    # a few stray errored frames and symbol errors, as healthy links show
    stray = {
        ("leaf-0", "Ethernet1/1", "port_in_fcs_errors"): cadence.Rate(0.05),
        ("gpu-001", "mlx5_0", "nic_rx_symbol_errors"): cadence.Rate(0.5),
        ("gpu-003", "mlx5_0", "nic_rx_crc_errors"): cadence.Rate(0.1),
    }
    r = cadence.run(TOPO, link_series(interval, stray), cadence.timeline(interval)[2], only=ONLY)
    assert r.named("FlakyLink") == []


# --- flaps alone (no error counters): the second flap, read at any cadence ----------------------


def _events(times: list[float]) -> cadence.Rate:
    """A counter that counts one event at each of ``times`` (s)."""
    return cadence.Rate(0.0, [(t, t + 0.01, 100.0) for t in times])


def flap_faults(flaps: list[tuple[float, float]], uplink: bool = False) -> dict:
    """Carrier transitions at both ends of a cable going down and up at each (down, up), and
    for gpu-004's cable its NIC's PHY link-down events; no error counter moves."""
    ends = (
        [("leaf-0", "Ethernet2/1"), ("spine-0", "Ethernet1/1")]
        if uplink
        else [("leaf-0", "Ethernet1/4")]
    )
    carrier = _events([t for f in flaps for t in f])
    out = {(dev, port, "port_carrier_transitions"): carrier for dev, port in ends}
    if not uplink:
        out[("gpu-004", "mlx5_0", "nic_link_down_events")] = _events([d for d, _ in flaps])
    return out


@pytest.mark.parametrize("uplink", [False, True], ids=["nic-cable", "uplink"])
@pytest.mark.parametrize("interval", cadence.CADENCES)
def test_flaps_alone_found_within_the_bound_at_any_cadence(interval: float, uplink: bool) -> None:
    # a cable that only flaps: down ~1 s just after its onset, again 5 s later; the second
    # flap tells it from an admin bounce, and is read within one interval of it
    onset = 5.0 + 3 * interval
    flaps = [(onset + 0.4, onset + 1.3), (onset + 5.4, onset + 6.2)]
    r = cadence.run(
        TOPO,
        link_series(interval, flap_faults(flaps, uplink)),
        onset + 6.2 + 4 * interval + 2.0,
        only=ONLY,
    )
    (a,) = r.named("FlakyLink")
    assert a.labels["severity"] == "critical"
    if uplink:
        assert a.annotations["strands"] == "none" and "peer" in a.annotations
    else:
        assert (a.labels["node"], a.labels["port"]) == ("gpu-004", "Ethernet1/4")
    assert "2 flap(s)" in a.annotations["evidence"], a.annotations["evidence"]
    ttd = cadence.ttd(a, onset)
    assert 5.4 <= ttd <= cadence.bound(interval), ttd
    assert ttd <= 5.4 + 1.1 * interval + 0.1, ttd  # the first reading after the second flap


@pytest.mark.parametrize("interval", cadence.CADENCES)
def test_one_admin_bounce_is_silent_at_any_cadence(interval: float) -> None:
    # an operator shuts the leaf port and brings it back 2 s later (or a node reboots): one
    # down/up at both ends, two carrier transitions in one reading at 5 s
    onset = 5.0 + 3 * interval
    r = cadence.run(
        TOPO,
        link_series(interval, flap_faults([(onset, onset + 2.0)])),
        onset + 2.0 + 6 * interval + 4.0,
        only=ONLY,
    )
    assert r.named("FlakyLink") == []


@pytest.mark.parametrize("flaps", [1, 2])
def test_a_nic_counting_each_flap_in_two_counters_counts_it_once(flaps: int) -> None:
    # gpu-004's agent exports the PHY's link_down_events_phy and the RDMA port's link_downed,
    # and no switch is read: one down/up (a reboot) is one flap in both, so silent; two are
    # a flapping cable
    interval, onset = 1.0, 8.0
    downs = [onset + 5.0 * i for i in range(flaps)]
    nic = [x for x in link_series(interval) if x.device.startswith("gpu")]
    nic += [
        cadence.Series(
            "gpu-004",
            "mlx5_0",
            "nic_port_link_downed",
            rate=cadence.Rate(0.0),
            interval=interval,
            phase=0.4,
            start=10**9,
        )
    ]
    events = _events(downs)
    nic = [
        dataclasses.replace(x, rate=events)
        if (x.device, x.metric) in (("gpu-004", "nic_link_down_events"),)
        or x.metric == "nic_port_link_downed"
        else x
        for x in nic
    ]
    r = cadence.run(TOPO, nic, onset + 5.0 * flaps + 4.0, only=ONLY)
    alerts = r.named("FlakyLink")
    if flaps == 1:
        assert alerts == []
    else:
        (a,) = alerts
        assert a.labels["node"] == "gpu-004" and "2 flap(s)" in a.annotations["evidence"]
        assert 0 < cadence.ttd(a, downs[1]) <= 1.5 * interval
