"""ECMPImbalance: a leaf's uplinks (one ECMP group) unequally loaded while the group is busy.

Hand-built interface counters at the cadences switches report (0.1, 1 and 5 s, jittered, a
reading lost, a counter cleared) for a static-ECMP collision (two elephants on one uplink,
another idle), and the cases that must stay silent: balanced traffic, an idle fabric, an uplink
that is down or flapping (FlakyLink's case), a group paused by a storm; then the simulator's
collision and its adaptive-routing twin (rocewatch/sim/ecmp.py) through the whole pipeline,
where the congestion on the hot uplink is inhibited by the collision.
"""

from __future__ import annotations

from typing import Any

import polars as pl
import pytest

from detectors.ecmp_imbalance import (
    UPLINKS,
    EcmpImbalanceConfig,
    EcmpImbalanceDetector,
    ecmp_groups,
)
from detectors.registry import DETECTORS
from rocewatch.config import Config, config_from_dict
from rocewatch.core.errors import ConfigError
from rocewatch.core.members import parse_members
from rocewatch.core.model import ALERTNAMES, Alert
from rocewatch.core.topology import Topology
from rocewatch.pipeline import Pipeline
from tests.cadence import CADENCES, T0, Rate, Series, frames, run
from tests.support.restart import restart_pipeline

S = 1_000_000_000
LINE = 400e9 / 8  # bytes/s at 400G
LEAF = "leaf-r0"
UP = ["Ethernet2/1", "Ethernet2/2", "Ethernet2/3", "Ethernet2/4"]
SPINES = [f"spine-{i}" for i in range(4)]
TOPO = Topology.from_dict(
    {
        "switches": [
            {"name": LEAF, "role": "leaf", "rail": 0},
            {"name": "leaf-r1", "role": "leaf", "rail": 1},
            *({"name": s, "role": "spine"} for s in SPINES),
        ],
        "links": [
            {"a": f"{LEAF}/{p}", "b": f"{s}/Ethernet1/1"} for p, s in zip(UP, SPINES, strict=True)
        ]
        + [{"a": f"leaf-r1/swp{49 + i}", "b": f"{s}/Ethernet1/2"} for i, s in enumerate(SPINES)],
        "nodes": [
            {
                "name": "gpu-001",
                "nics": [
                    {"nic": "mlx5_0", "speed_gbps": 400, "switch_port": f"{LEAF}/Ethernet1/1"}
                ],
            }
        ],
    }
)
ONSET, END, RUN = 12.0, 40.0, 50.0
BALANCED = [0.5, 0.5, 0.5, 0.5]
COLLISION = [0.0, 0.95, 0.95, 0.91]  # Ethernet2/1 idle, Ethernet2/4 carries two squeezed flows


def timeline(interval: float) -> tuple[float, float, float]:
    """(onset, end, run length): a shorter run where readings come often (the fast tier)."""
    return (ONSET, END, RUN) if interval >= 5 else (6.0, 18.0, 24.0)


def uplinks(
    before: list[float],
    during: list[float],
    interval: float,
    jitter: float = 0.2,
    reverse: float = 0.3,
    lost: frozenset[float] = frozenset(),
) -> list[Series]:
    """Out- and in-octets of the four uplinks: ``before`` utilisations until the onset,
    ``during`` until the end (``timeline``), ``before`` again after; the spines send back
    ``reverse`` of line rate."""
    onset, end, _ = timeline(interval)
    out = []
    for p, b, d in zip(UP, before, during, strict=True):
        rate = Rate(b * LINE, [(onset, end, (d - b) * LINE)])
        for metric, r in (("port_out_octets", rate), ("port_in_octets", Rate(reverse * LINE))):
            out.append(Series(LEAF, p, metric, rate=r, interval=interval, jitter=jitter, lost=lost))
    return out


def ecmp(r: list[Alert]) -> list[Alert]:
    return [a for a in r if a.name == "ECMPImbalance"]


def go(series: list[Series], config: Config | None = None) -> list[Alert]:
    seconds = timeline(min(s.interval for s in series))[2]
    return ecmp(run(TOPO, series, seconds, config, only=("ecmp_imbalance",)).alerts)


def test_the_group_is_a_leafs_uplinks_to_the_spines() -> None:
    assert ecmp_groups(TOPO) == {
        LEAF: tuple(UP),
        "leaf-r1": ("swp49", "swp50", "swp51", "swp52"),
    }


@pytest.mark.parametrize(
    "interval",
    # (0.1 s: 24 s of ten readings a second: 3-4 s)
    [pytest.param(c, marks=pytest.mark.slow) if c < 1 else c for c in CADENCES],
)
def test_a_collision_is_found_once_at_any_cadence(interval: float) -> None:
    """Two elephants on Ethernet2/4, none on Ethernet2/1, read every 0.1, 1 or 5 s with 20 %
    jitter and a reading lost: one alert, naming the leaf, the hot and cold uplinks and the
    imbalance, within sustain_s plus two readings (at 5 s: the second reading wholly inside)."""
    onset, end, _ = timeline(interval)
    lost = frozenset({round(onset + 5 * interval, 6)})
    marks = Rate(2_000.0, [(onset, end, 2.4e6)])  # the shared uplink's queue marks
    series = [
        *uplinks(BALANCED, COLLISION, interval, lost=lost),
        Series(LEAF, UP[3], "queue_ecn_marked_pkts", "3", rate=marks, interval=interval),
        Series(LEAF, UP[1], "queue_ecn_marked_pkts", "3", rate=Rate(2_000.0), interval=interval),
    ]
    (a,) = go(series)
    ttd = (a.starts_at - (T0 + round(onset * S))) / S
    assert 0 < ttd <= 3.0 + 2.5 * max(interval, 1.0), ttd
    assert a.labels["switch"] == LEAF and a.labels["rail"] == "0"
    assert a.annotations["hot_uplinks"] == UP[3]
    assert a.annotations["cold_uplinks"] == UP[0]
    assert 1.3 <= float(a.annotations["imbalance"]) <= 1.4  # 0.95 / 0.70
    members = {(m["switch"], m["port"]) for m in map(dict, parse_members(a.annotations[UPLINKS]))}
    assert members == {
        (LEAF, UP[3]),
        ("spine-3", "Ethernet1/1"),
        (LEAF, UP[0]),
        ("spine-0", "Ethernet1/1"),
    }
    ev = a.annotations["evidence"]
    assert "Ethernet2/1 0%" in ev and "max/mean 1.3" in ev and "ECN marks" in ev
    # it resolves once the flows are rehashed (within clear_s plus 2.5 judgements)
    assert a.ends_at and (a.ends_at - (T0 + round(end * S))) / S <= 3.0 + 3.5 * max(interval, 1.0)


def test_without_ecn_marks_the_busiest_uplinks_are_named_hot() -> None:
    (a,) = go(uplinks(BALANCED, [0.0, 0.95, 0.6, 0.6], 1.0))
    assert a.annotations["hot_uplinks"] == UP[1] and a.annotations["cold_uplinks"] == UP[0]


@pytest.mark.parametrize(
    ("what", "during"),
    [
        ("balanced and busy", [0.93, 0.95, 0.94, 0.95]),
        ("idle", [0.02, 0.0, 0.05, 0.03]),
        ("lightly loaded and unequal", [0.0, 0.35, 0.2, 0.2]),  # the busiest well below hot
        ("mildly unequal", [0.7, 0.95, 0.8, 0.9]),  # no cold uplink
    ],
)
def test_silent_on_healthy_groups(what: str, during: list[float]) -> None:
    assert go(uplinks(BALANCED, during, 1.0)) == [], what


@pytest.mark.parametrize("interval", [pytest.param(0.1, marks=pytest.mark.slow), 5.0])
def test_silent_when_an_uplink_is_down(interval: float) -> None:
    """A cable that is down carries nothing either way: FlakyLink's case (or the operator's),
    not a hash; the three left are balanced."""
    series = uplinks(BALANCED, [0.0, 0.95, 0.95, 0.95], interval)
    dead = [s for s in series if s.port == UP[0]]
    series = [s for s in series if s.port != UP[0]]
    series += [Series(s.device, s.port, s.metric, rate=Rate(0.0), interval=interval) for s in dead]
    assert go(series) == []


def test_silent_when_an_uplink_flaps() -> None:
    """An uplink whose carrier flaps (FlakyLink) carries little between its flaps: left out."""
    series = uplinks(BALANCED, [0.1, 0.95, 0.95, 0.95], 1.0)
    onset = timeline(1.0)[0]
    flaps = Rate(0.0, [(onset - 1.0, onset + 1.0, 1.0), (onset + 10.0, onset + 11.0, 2.0)])
    series.append(Series(LEAF, UP[0], "port_carrier_transitions", rate=flaps, interval=1.0))
    assert go(series) == []


def test_silent_while_a_storm_pauses_an_uplink() -> None:
    """An uplink paused by PFC for most of each reading sends little: PFCStorm's case."""
    series = uplinks(BALANCED, COLLISION, 1.0)
    onset, end, _ = timeline(1.0)
    pause = Rate(0.0, [(onset, end, 0.9e6)])  # µs paused a second
    series.append(Series(LEAF, UP[0], "pfc_rx_pause_us", "3", rate=pause, interval=1.0))
    assert go(series) == []


def feed(p: Pipeline, part: list[pl.DataFrame]) -> Pipeline:
    for f in part:
        if f.height:
            p.ingest(f)
            p.advance(int(f["ts"].max()) - p.engine.lateness_ns())  # type: ignore[arg-type]
    return p


def only_ecmp(config: Config | None = None) -> Pipeline:
    p = Pipeline(TOPO, config or Config(), rollup_s=None)
    p.detectors = [d for d in p.detectors if d.name == "ecmp_imbalance"]
    return p


def test_a_counter_clear_mid_collision_gives_one_alert() -> None:
    """The leaf's counters cleared 12 s into the collision (every uplink's next reading
    covers only the time since: a short one, at once on all of them): one alert still."""
    series = uplinks(BALANCED, COLLISION, 1.0)
    onset, _, seconds = timeline(1.0)
    cut_s = onset + 6.05
    at_cut = {(s.port, s.metric): s.value(cut_s)[1] for s in series}
    fs = []
    for f in frames(series, seconds):
        base = pl.Series(
            [
                at_cut[(p, m)] if t >= T0 + round(cut_s * S) else 0
                for p, m, t in zip(f["port"], f["metric"], f["ts"], strict=True)
            ],
            dtype=pl.UInt64,
        )
        raw = f["raw"] - base
        fs.append(f.with_columns(raw=raw, value=raw.cast(pl.Float64)))
    p = feed(only_ecmp(), fs)
    p.finish()
    assert len(ecmp(p.all_alerts())) == 1


def test_a_checkpoint_taken_mid_fault_carries_on() -> None:
    """The detector's state through the product's codec mid-collision (judgements under way,
    the alert not fired yet), laid over a pipeline built anew: the same one alert, same
    startsAt, as the uninterrupted run."""
    series = uplinks(BALANCED, COLLISION, 1.0)
    onset, _, seconds = timeline(1.0)
    fs = list(frames(series, seconds))
    whole = go(series)
    cut = next(i for i, f in enumerate(fs) if int(f["ts"].min()) > T0 + round((onset + 2.5) * S))
    p = feed(only_ecmp(), fs[:cut])
    (det,) = p.detectors
    assert isinstance(det, EcmpImbalanceDetector)
    assert det.sustain.episodes and not any(ep.ts for ep in det.sustain.episodes.values())
    p = restart_pipeline(p, only=("ecmp_imbalance",))
    (back,) = p.detectors
    assert back is not det and back.sustain.episodes.keys() == det.sustain.episodes.keys()
    feed(p, fs[cut:])
    p.finish()
    got = ecmp(p.all_alerts())
    assert len(whole) == 1 and [a.to_json() for a in got] == [a.to_json() for a in whole]


def test_the_registry_entry_is_all_it_takes() -> None:
    """Configured from the file by its registry name, built by the pipeline, raising the
    alert name the contract lists."""
    assert DETECTORS["ecmp_imbalance"].alertname == "ECMPImbalance" in ALERTNAMES
    cfg = config_from_dict({"detectors": {"ecmp_imbalance": {"min_imbalance": 1.5}}})
    p = Pipeline(TOPO, cfg, rollup_s=None)
    (det,) = [d for d in p.detectors if d.name == "ecmp_imbalance"]
    assert det.config.min_imbalance == 1.5
    assert EcmpImbalanceDetector.reads >= {"port_out_octets", "port_in_octets"}
    # max/mean 1.35 is below 1.5: that configuration sees no collision
    assert go(uplinks(BALANCED, COLLISION, 1.0), config=cfg) == []
    off = config_from_dict({"detectors": {"ecmp_imbalance": {"enabled": False}}})
    assert not [
        d for d in Pipeline(TOPO, off, rollup_s=None).detectors if d.name == "ecmp_imbalance"
    ]
    with pytest.raises(ConfigError, match="min_imbalance"):
        config_from_dict({"detectors": {"ecmp_imbalance": {"min_imbalance": 0.9}}})
    with pytest.raises(ConfigError, match="unknown setting"):
        config_from_dict({"detectors": {"ecmp_imbalance": {"ratio": 2}}})
    with pytest.raises(ConfigError):
        EcmpImbalanceConfig(busy_util=0.9, hot_util=0.6)


# --- the simulator's collision and its adaptive-routing twin, whole pipeline ----------------


def simulated(adaptive: bool, interval: float) -> tuple[dict[str, Any], Pipeline]:
    """A 4-node, 2-rail fabric (two leaves, four spines) for 15 s (30 s at 5 s cadence),
    elephant flows on one leaf over its middle half (8 to 24 s of 30), its switches read
    every ``interval`` s (the NICs every second at most), through every detector and the
    inhibition stage."""
    from rocewatch.sim import Simulator
    from rocewatch.sim.scenarios import ecmp_collision_scenario

    kw: dict[str, Any] = {}
    dur = 30.0 if interval >= 5 else 15.0
    if interval != 0.1:
        kw = {"switch_interval_s": interval, "nic_interval_s": min(interval, 1.0)}
    cfg = ecmp_collision_scenario(nodes=4, duration_s=dur, adaptive=adaptive, nics_per_node=2, **kw)
    sim = Simulator(cfg)
    p = feed(Pipeline(sim.topology, Config(), rollup_s=None), list(sim.ticks()))
    p.finish()
    return sim.truth(), p


@pytest.mark.slow  # a small fabric through every detector: 3-4 s
@pytest.mark.parametrize("interval", [0.1, 5.0])
def test_the_simulated_collision_is_the_one_page(interval: float) -> None:
    """The simulator's collision (rocewatch/sim/ecmp.py) raises one ECMPImbalance naming the
    leaf and the hot and cold uplinks of the ground truth, and nothing else is shown; congestion
    on the hot uplink, where it fires, is inhibited by the collision."""
    truth, p = simulated(False, interval)
    (fault,) = truth["faults"]
    shown = p.all_alerts()
    assert [a.name for a in shown] == ["ECMPImbalance"], [(a.name, a.labels) for a in shown]
    (a,) = shown
    assert a.labels["switch"] == fault["labels"]["switch"]
    hot = [u["port"] for u in fault["details"]["hot_uplinks"]]
    cold = [u["port"] for u in fault["details"]["cold_uplinks"]]
    assert a.annotations["cold_uplinks"] == ", ".join(cold)
    assert a.annotations["hot_uplinks"] == ", ".join(hot)  # the queue that marks
    assert len(fault["details"]["colliding_flows"]) == 2
    assert (
        fault["onset_ns"]
        < a.starts_at
        <= fault["onset_ns"] + round((3.0 + 2.5 * max(interval, 1.0)) * S)
    )
    for x in p.inhibited_alerts():
        assert x.name in ("ECNCongestion", "QueueBuildup", "PortAnomaly")
        assert x.annotations["inhibited_by"] == a.fingerprint


@pytest.mark.slow  # a small fabric through every detector: 3-4 s
def test_adaptive_routing_sprays_the_same_flows_and_stays_silent() -> None:
    """The same elephant flows sprayed by adaptive routing: every uplink equally loaded, no
    alert at all (and the truth lists the phase as no fault)."""
    truth, p = simulated(True, 1.0)
    assert truth["faults"] == []
    assert "SprayedElephants" in [x.get("kind") for x in truth["not_faults"]]
    assert p.all_alerts() == [] and p.inhibited_alerts() == []


@pytest.mark.slow  # 15 s of a small fabric through every detector: ~3 s
def test_a_flapping_uplink_under_sprayed_traffic_is_flakylinks_alone() -> None:
    """Adaptive routing sprays the elephants over the uplinks that are up while one of them
    flaps (down about a second at a time, carrying nothing): FlakyLink names the cable, and
    the uplink carrying nothing is no ECMP imbalance."""
    from rocewatch.sim import SimConfig, Simulator
    from rocewatch.sim.faults import FlakyLink, SprayedElephants

    leaf = "leaf-r0-p0"
    cfg = SimConfig(
        nodes=4,
        nics_per_node=2,
        duration_s=15,
        seed=3,
        switch_interval_s=1.0,
        nic_interval_s=1.0,
        faults=(
            SprayedElephants(onset_s=2.0, duration_s=11.0, switch=leaf),
            FlakyLink(
                onset_s=3.0, duration_s=9.0, uplink=True, switch=leaf, spine="spine-1",
                errors=False,
            ),
        ),
    )  # fmt: skip
    sim = Simulator(cfg)
    p = feed(Pipeline(sim.topology, Config(), rollup_s=None), list(sim.ticks()))
    p.finish()
    shown = p.all_alerts()
    assert {a.name for a in shown} == {"FlakyLink"}, [(a.name, a.labels) for a in shown]
    assert {a.labels.get("switch") for a in shown} <= {leaf, "spine-1"}  # either end
