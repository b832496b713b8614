"""QueueBuildup on hand-built telemetry: a standing queue against its own baseline at the
cadences switches are polled at (0.1-10 s, jittered, readings lost), the bursty and busy queues
that must stay silent, the absolute limit without history, and PFC-paused queues."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import polars as pl
import pytest

from detectors.queue_buildup import QueueBuildupConfig
from rocewatch.config import Config, config_from_dict
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import Alert, conform
from rocewatch.core.topology import Topology
from rocewatch.pipeline import Pipeline
from tests.support.restart import restart_pipeline

S = 1_000_000_000
T0 = 1_795_946_400 * S
MIB = 2**20
BUF = {"leaf-0": 32 * MIB, "leaf-1": 64 * MIB, "spine-0": 64 * MIB}

# ports named as four vendors name them; never parsed
HOSTS = {
    "leaf-0": ["Ethernet1/1", "Ethernet1/2", "Ethernet1/3", "Ethernet1/4", "Ethernet1/5"],
    "leaf-1": ["swp1", "swp2", "swp3", "swp4", "swp5"],
}
UPLINKS = [("leaf-0", "et-0/0/48"), ("leaf-1", "swp49")]
SPINE = [("spine-0", "TwoHundredGigE1/0/1:1"), ("spine-0", "TwoHundredGigE1/0/2:1")]
QUEUES = [(d, p) for d, ps in HOSTS.items() for p in ps] + UPLINKS + SPINE
FIELD = ("leaf-0", "Ethernet1/3")  # the field report's port


def topology(**extra: dict) -> Topology:
    nodes = []
    for d, ps in HOSTS.items():
        for i, p in enumerate(ps):
            nodes.append(
                {"name": f"{d}-gpu{i}", "nics": [{"nic": "mlx5_0", "switch_port": f"{d}/{p}"}]}
            )
    return Topology.from_dict(
        {
            "switches": [
                {"name": "leaf-0", "role": "leaf", "rail": 0, "buffer_bytes": BUF["leaf-0"]},
                {"name": "leaf-1", "role": "leaf", "rail": 0, "buffer_bytes": BUF["leaf-1"]},
                {"name": "spine-0", "role": "spine", "buffer_bytes": BUF["spine-0"]},
                *extra.get("switches", []),
            ],
            "links": [
                {"a": f"{a[0]}/{a[1]}", "b": f"{b[0]}/{b[1]}"}
                for a, b in zip(UPLINKS, SPINE, strict=True)
            ],
            "nodes": nodes + extra.get("nodes", []),
        }
    )


TOPO = topology()
Depth = Callable[[float, tuple[str, str], np.random.Generator], float]


def healthy(t: float, q: tuple[str, str], rng: np.random.Generator, bursts: float = 0.03) -> float:
    """A healthy queue: ~1% of its buffer, and MoE all-to-all bursts that fill it to 20-35%
    for milliseconds (a share ``bursts`` of the readings land in one); a few microbursts near
    the limit."""
    r = rng.random()
    if r < 0.002:
        return 0.95
    if r < bursts:
        return rng.uniform(0.2, 0.35)
    return 0.01 * rng.lognormal(0.0, 0.5)


def field_report(onset: float, length: float = 25.0) -> Depth:
    """The field report: half the buffer held for 25 s on one leaf port (baseline ~1%)."""

    def depth(t: float, q: tuple[str, str], rng: np.random.Generator) -> float:
        if q == FIELD and onset <= t < onset + length:
            return 0.5 * (1 + 0.04 * rng.standard_normal())
        return healthy(t, q, rng)

    return depth


def telemetry(
    seconds: float,
    interval: float,
    depth: Depth,
    seed: int = 1,
    paused: Callable[[float, tuple[str, str]], float] = lambda t, q: 0.0,
    queues: list[tuple[str, str]] = QUEUES,
    start: Callable[[tuple[str, str]], float] = lambda q: 0.0,
) -> list[pl.DataFrame]:
    """Frames of 0.1 s of telemetry: each switch polled every ``interval`` (jitter of a fifth of
    an interval, 1% of polls lost), reading every queue's depth (``depth(t, queue, rng)`` as a
    share of its switch's buffer) and its cumulative received pause (``paused(t, queue)``: the
    share of the time)."""
    rng = np.random.default_rng(seed)
    rows: list[tuple] = []
    for dev in sorted({d for d, _ in queues}):
        mine = [q for q in queues if q[0] == dev]
        t = rng.uniform(0, interval)
        prev, pause = 0.0, dict.fromkeys(mine, 0.0)
        while t < seconds:
            for q in mine:
                pause[q] += paused(t, q) * (t - prev) * 1e6
            if rng.random() >= 0.01 and t >= 0:
                ts = T0 + round(t * S)
                for q in mine:
                    if t < start(q):
                        continue
                    d = min(max(depth(t, q, rng), 0.0), 1.0) * BUF.get(dev, 32 * MIB)
                    rows.append((ts, *q, "3", "queue_depth_bytes", float(round(d)), None))
                    raw = round(pause[q])
                    rows.append((ts, *q, "3", "pfc_rx_pause_us", float(raw), raw))
            prev = t
            t += interval * (1 + rng.uniform(-0.1, 0.1))
    f = pl.DataFrame(
        rows,
        schema=["ts", "device", "port", "qual", "metric", "value", "raw"],
        orient="row",
    ).sort("ts")
    chunk = (f["ts"] // (S // 10)).alias("c")
    return [
        conform(x.drop("c")) for x in f.with_columns(chunk).partition_by("c", maintain_order=True)
    ]


def run(
    frames: list[pl.DataFrame], config: Config | None = None, topo: Topology = TOPO
) -> Pipeline:
    p = Pipeline(topo, config or Config(), rollup_s=None)
    # the real pipeline, with the detector this file is about
    p.detectors = [d for d in p.detectors if d.name == "queue_buildup"]
    for f in frames:
        p.ingest(f)
        p.advance(int(f["ts"].max()) - p.engine.lateness_ns())
    p.finish()
    return p


def buildups(p: Pipeline) -> list[Alert]:
    return [a for a in p.all_alerts() if a.name == "QueueBuildup"]


def entity(a: Alert) -> tuple[str, str]:
    return (a.labels["switch"], a.labels["port"])


@pytest.mark.parametrize("interval", [0.1, 1.0, 5.0])
def test_field_report_standing_queue_found_once_at_any_cadence(interval: float) -> None:
    # half the buffer for 25 s on a port whose baseline is ~1%: far below the 80% absolute
    # limit, but many times the queue's own normal, and it never drains
    onset = 15.0 if interval < 5 else 30.0  # after the baselines are learned
    seconds = onset + 30 + 4 * interval  # the fault, then time to resolve
    p = run(telemetry(seconds, interval, field_report(onset), seed=round(interval * 10)))
    alerts = buildups(p)
    assert [entity(a) for a in alerts] == [FIELD], [a.annotations["evidence"] for a in alerts]
    (a,) = alerts
    assert a.labels["severity"] == "warning" and a.labels["queue"] == "3"
    ttd = (a.starts_at - (T0 + onset * S)) / S
    assert 0 < ttd <= max(10.0, 3 * interval), ttd
    # one alert until it ends (no flapping), resolved once the queue drained
    end = T0 + (onset + 25) * S
    assert a.ends_at and end < a.ends_at <= end + (3 + 3.5 * interval) * S
    ev = a.annotations["evidence"]
    assert "rule=baseline" in ev
    base = re.search(r"own typical occupancy \(median\) ([0-9.]+) MiB", ev)
    assert base and float(base.group(1)) < 0.05 * BUF["leaf-0"] / MIB, ev  # ~1% learned
    share = re.search(r"occupancy ([0-9.]+)% of 32.0 MiB", ev)
    assert share and 40 <= float(share.group(1)) <= 55, ev


@pytest.mark.parametrize("interval", [0.1, 1.0, 5.0, 10.0])
@pytest.mark.parametrize("bursts", [0.03, 0.15])
def test_bursty_healthy_queues_stay_silent(interval: float, bursts: float) -> None:
    # MoE bursts to 20-35% of the buffer caught by 3% (or 15%) of the readings and microbursts
    # to 95% on every queue: they drain between readings, so nothing stands. At 5-10 s, ten
    # minutes: the readings of bursty queues line up now and then
    seconds = {0.1: 30, 1.0: 60}.get(interval, 600)

    def depth(t: float, q: tuple[str, str], rng: np.random.Generator) -> float:
        return healthy(t, q, rng, bursts)

    assert buildups(run(telemetry(seconds, interval, depth, seed=7))) == []


def test_always_busy_uplink_is_judged_against_its_own_normal() -> None:
    # one uplink runs 30-45% full all the time (its peers ~1%): its normal, learned as such;
    # later it doubles to 70-75% while never reaching the absolute limit: still within 3x of
    # what it always does, so silent too
    busy = UPLINKS[0]

    def depth(t: float, q: tuple[str, str], rng: np.random.Generator) -> float:
        if q == busy:
            return rng.uniform(0.3, 0.45) if t < 50 else rng.uniform(0.7, 0.75)
        return healthy(t, q, rng)

    assert buildups(run(telemetry(80, 1.0, depth, seed=3))) == []


def test_absolute_limit_fires_without_history() -> None:
    # a queue whose first reading is already near the limit: no baseline of its own, peers
    # with none either (all started together): the absolute rule, critical, within ~1 s
    new = ("leaf-1", "swp4")

    def depth(t: float, q: tuple[str, str], rng: np.random.Generator) -> float:
        return 0.97 if q == new else healthy(t, q, rng)

    p = run(telemetry(6, 0.1, depth, start=lambda q: 2.0 if q == new else 0.0))
    (a,) = buildups(p)
    assert entity(a) == new and a.labels["severity"] == "critical"
    assert (a.starts_at - (T0 + 2 * S)) / S <= 1.5
    ev = a.annotations["evidence"]
    assert "rule=absolute" in ev and "baseline: none learned yet" in ev
    assert "occupancy 9" in ev and "of 64.0 MiB" in ev


def test_new_queue_is_judged_against_its_peers() -> None:
    # a queue that appears after its peers learned their normal, already standing at 40%:
    # no baseline of its own, so its peers' (the other host ports of its role and rail)
    late = ("leaf-0", "Ethernet1/5")

    def depth(t: float, q: tuple[str, str], rng: np.random.Generator) -> float:
        return 0.4 if q == late else healthy(t, q, rng)

    p = run(telemetry(45, 1.0, depth, start=lambda q: 30.0 if q == late else 0.0))
    (a,) = buildups(p)
    assert entity(a) == late
    assert "rule=peers" in a.annotations["evidence"]
    assert "peers' median typical occupancy" in a.annotations["evidence"]


def test_queue_paused_by_its_receiver_is_left_to_pfc() -> None:
    # a slow receiver pauses the queue 30% of the time and it stands at 40%, and a storm
    # stalls another queue full: neither is a buildup (the storm is PFCStorm's to find)
    slow, stalled = ("leaf-0", "Ethernet1/1"), ("leaf-1", "swp2")

    def depth(t: float, q: tuple[str, str], rng: np.random.Generator) -> float:
        if t >= 20 and q == slow:
            return 0.4
        if t >= 20 and q == stalled:
            return 0.99
        return healthy(t, q, rng)

    def paused(t: float, q: tuple[str, str]) -> float:
        return {slow: 0.3, stalled: 1.0}.get(q, 0.0) if t >= 20 else 0.0

    p = run(telemetry(30, 0.1, depth, paused=paused))
    assert buildups(p) == []


def test_unsized_switch_uses_the_default_buffer() -> None:
    topo = topology(
        switches=[{"name": "leaf-x", "role": "leaf", "rail": 1}],
        nodes=[{"name": "gpu-x", "nics": [{"nic": "mlx5_0", "switch_port": "leaf-x/Eth9"}]}],
    )
    q = ("leaf-x", "Eth9")

    def depth(t: float, x: tuple[str, str], rng: np.random.Generator) -> float:
        return 0.95 if x == q and t >= 2 else healthy(t, x, rng)

    frames = telemetry(5, 0.1, depth, queues=[*QUEUES, q])
    (a,) = buildups(run(frames, topo=topo))  # 95% of the default 32 MiB
    assert (
        entity(a) == q and "(assumed: no buffer_bytes in the topology)" in a.annotations["evidence"]
    )
    cfg = Config(detectors={"queue_buildup": QueueBuildupConfig(default_buffer_bytes=None)})
    assert buildups(run(frames, cfg, topo=topo)) == []  # no default: unsized queues unjudged


def run_restarted(frames: list[pl.DataFrame], after: Config | None = None) -> Pipeline:
    """``frames`` into the detector, stopped 21 s in (a run under way on the field report's
    queue) and started again from its state through the product's checkpoint codec, with the
    configuration ``after`` if given."""
    p = Pipeline(TOPO, Config(), rollup_s=None)
    p.detectors = [d for d in p.detectors if d.name == "queue_buildup"]
    cut = next(i for i, f in enumerate(frames) if int(f["ts"].min()) > T0 + 21 * S)
    for f in frames[:cut]:
        p.ingest(f)
        p.advance(int(f["ts"].max()) - p.engine.lateness_ns())
    assert not buildups(p)  # mid-fault: not raised yet
    p = restart_pipeline(p, after, only=("queue_buildup",))
    for f in frames[cut:]:
        p.ingest(f)
        p.advance(int(f["ts"].max()) - p.engine.lateness_ns())
    p.finish()
    return p


def test_a_checkpoint_taken_mid_run_carries_on() -> None:
    frames = telemetry(40, 1.0, field_report(20.0, 15.0))
    p = run_restarted(frames)
    (a,) = buildups(p)
    assert entity(a) == FIELD and 0 < (a.starts_at - (T0 + 20 * S)) / S <= 10
    # the alert of the uninterrupted run: same startsAt, same end
    assert [x.to_json() for x in buildups(p)] == [x.to_json() for x in buildups(run(frames))]


def test_a_restored_detector_takes_todays_standing_s_and_baseline_tau() -> None:
    """Restarted mid-run with ``standing_s`` 8 s instead of 2 and ``baseline_tau_s`` 60: the
    alert needs today's 8 s of standing queue; the restored baseline sketch keeps what it
    learned and forgets at today's pace (``Sketch.PARAMS``)."""
    from detectors.queue_buildup import QueueBuildupDetector

    frames = telemetry(40, 1.0, field_report(20.0, 15.0))
    cfg = Config(
        detectors={"queue_buildup": QueueBuildupConfig(standing_s=8.0, baseline_tau_s=60.0)}
    )
    p = run_restarted(frames, cfg)
    (det,) = p.detectors
    assert isinstance(det, QueueBuildupDetector)
    assert det.sketch.tau_s == 60.0 and det.sketch.counts(np.arange(1)).sum() > 0
    (a,) = buildups(p)
    assert entity(a) == FIELD and 8 <= (a.starts_at - (T0 + 20 * S)) / S <= 12


def test_config_validation() -> None:
    cfg = config_from_dict({"detectors": {"queue_buildup": {"baseline_factor": 4}}})
    assert cfg.detectors["queue_buildup"].baseline_factor == 4
    with pytest.raises(ConfigError, match="exit_fraction <= warning_fraction"):
        config_from_dict({"detectors": {"queue_buildup": {"warning_fraction": 0.99}}})
    with pytest.raises(ConfigError, match="default_buffer_bytes"):
        QueueBuildupConfig(default_buffer_bytes=0)
    with pytest.raises(ConfigError, match="baseline_factor"):
        QueueBuildupConfig(baseline_factor=1.0)
