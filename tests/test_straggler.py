"""Straggler on a hand-built job: a NIC that backs up and sends less than its peers."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import polars as pl
import pytest

from detectors.straggler import StragglerConfig
from rocewatch.config import Config
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import Alert, conform
from rocewatch.core.topology import Topology
from rocewatch.pipeline import Pipeline
from tests import cadence
from tests.support.restart import restart_pipeline, through_codec

S = 1_000_000_000
STEP = S // 10
T0 = 1_795_946_400 * S

JOB = [f"gpu-00{i}" for i in range(1, 9)]
SPARE = ["gpu-101", "gpu-102", "gpu-103", "gpu-104"]  # in no job: compared within their rail
TOPO = Topology.from_dict(
    {
        "switches": [{"name": f"leaf-{r}", "role": "leaf", "rail": r} for r in range(2)],
        "nodes": [
            {
                "name": n,
                "nics": [
                    {"nic": f"mlx5_{r}", "rail": r, "switch_port": f"leaf-{r}/Ethernet1/{i + 1}"}
                    for r in range(2)
                ],
            }
            for i, n in enumerate(JOB + SPARE)
        ],
        "jobs": [{"name": "llm", "tenant": "a", "nodes": JOB}],
    }
)
NICS = [(n, f"mlx5_{r}") for n in JOB + SPARE for r in range(2)]
LINE = 5e9  # bytes per 0.1 s tick at ~400 Gb/s


def active(t: float) -> float:
    """NCCL all-reduce: 60% of each 0.5 s iteration communicating (same for the whole job)."""
    return 1.0 if (t % 0.5) < 0.3 else 0.1


# (node, nic, t, rng) -> (tx bytes, pause µs, ECN-marked packets) in the tick ending at t
Signals = Callable[[str, str, float, np.random.Generator], tuple[float, float, float]]


def healthy(node: str, nic: str, t: float, rng: np.random.Generator) -> tuple[float, float, float]:
    a = active(t)
    return (
        LINE * a * rng.uniform(0.98, 1.0),
        rng.exponential(150.0) * a,
        float(rng.poisson(80 * a)),
    )


def feed(
    seconds: float,
    sig: Signals,
    seed: int = 1,
    silent: Callable[[str, float], bool] = lambda n, t: False,
    clear: Callable[[str, float], bool] = lambda n, t: False,
    pcie: Callable[[str, str, float], float] = lambda n, c, t: 32.0,
) -> Iterator[pl.DataFrame]:
    rng = np.random.default_rng(seed)
    cum: dict[tuple[str, str, str], int] = {}
    metrics = ("nic_tx_rdma_bytes", "nic_tx_pause_us", "nic_ecn_marked_pkts")
    for i in range(int(seconds * 10) + 1):
        t = i / 10
        ts = T0 + i * STEP + 4_000_000
        rows = []
        for node, nic in NICS:
            incs = sig(node, nic, t, rng) if i else (0.0, 0.0, 0.0)
            for m, x in zip(metrics, incs, strict=True):
                k = (node, nic, m)
                if clear(node, t):
                    cum[k] = 0
                cum[k] = cum.get(k, 10**12) + int(x)
                if not silent(node, t):
                    q = "3" if m == "nic_tx_pause_us" else ""
                    rows.append((ts, node, nic, q, m, float(cum[k]), cum[k]))
            if not silent(node, t):
                rows.append((ts, node, nic, "", "nic_pcie_speed_gts", pcie(node, nic, t), None))
                rows.append((ts, node, nic, "", "nic_pcie_max_speed_gts", 32.0, None))
        yield conform(
            pl.DataFrame(
                rows,
                schema=["ts", "device", "port", "qual", "metric", "value", "raw"],
                orient="row",
            )
        )


def run(
    frames: Iterator[pl.DataFrame], cut: int | None = None, after: Config | None = None
) -> list[Alert]:
    """Replay ``frames``; with ``cut``, stop after that many and start again from the state
    through the product's checkpoint codec (the service's restart), with the configuration
    ``after`` if given."""
    p = Pipeline(TOPO, rollup_s=None)
    p.detectors = [d for d in p.detectors if d.name == "straggler"]  # this detector alone
    for n, f in enumerate(frames):
        if n == cut:
            p = restart_pipeline(p, after, only=("straggler",))
        p.ingest(f)
        p.advance(int(f["ts"].max()) - p.engine.lateness_ns())  # type: ignore[arg-type]
    p.finish()
    return [a for a in p.all_alerts() if a.name == "Straggler"]


ONSET = 4.0
CULPRIT = ("gpu-003", "mlx5_1")
# the alone_slow cases at 0.1 s cost 1-3 s each: the full suite runs them, the fast tier
# keeps the same cases at the coarser cadences
AT_01S = pytest.param(0.1, id="0.1", marks=pytest.mark.slow)


def pcie_slow(t: float) -> bool:
    return t >= ONSET


def straggling(node: str, nic: str, t: float, rng: np.random.Generator) -> tuple[float, ...]:
    """From ONSET, gpu-003/mlx5_1 cannot drain its receive buffers (PCIe Gen4 behind a 400G
    port): it pauses its leaf and gets ECN-marked traffic; its whole rail's ring slows."""
    tx, pause, ecn = healthy(node, nic, t, rng)
    if pcie_slow(t) and nic == "mlx5_1" and node in JOB:
        tx *= 0.55  # the ring waits for its slowest member
        if node == CULPRIT[0]:
            pause = rng.uniform(0.2, 0.3) * 1e5 * active(t)
            ecn = float(rng.poisson(20_000 * active(t)))
    return tx, pause, ecn


def test_the_slow_nic_is_found_not_its_rail_peers() -> None:
    pcie = lambda n, c, t: 16.0 if (n, c) == CULPRIT and pcie_slow(t) else 32.0  # noqa: E731
    alerts = run(feed(10.0, straggling, pcie=pcie), cut=55)
    assert [(a.labels["node"], a.labels["nic"]) for a in alerts] == [CULPRIT]
    a = alerts[0]
    assert a.labels["severity"] == "warning" and a.labels["job"] == "llm"
    assert a.labels["rail"] == "1" and a.labels["tenant"] == "a"
    # three 1 s windows in a row: found 2-4 s after the onset
    ttd = (a.starts_at - (T0 + int(ONSET * S))) / S
    assert 2.5 <= ttd <= 4.0, ttd
    ev = a.annotations["evidence"]
    assert "among job:llm (16 NICs)" in ev and "3 in a row" in ev, ev
    assert "pause requested" in ev and "RDMA transmit" in ev and "upper quartile" in ev
    assert "its rail 1 runs at" in ev
    assert a.annotations["pcie"] == "PCIe link 16 GT/s below its maximum 32 GT/s"


def test_a_restored_detector_takes_todays_min_windows() -> None:
    """Restarted mid-fault (at 5.5 s, the slow windows counting) with ``min_windows`` 5
    instead of 3: the alert waits for today's 5 windows in a row, those before the stop
    counted."""
    pcie = lambda n, c, t: 16.0 if (n, c) == CULPRIT and pcie_slow(t) else 32.0  # noqa: E731
    cfg = Config(detectors={"straggler": StragglerConfig(min_windows=5)})
    alerts = run(feed(10.0, straggling, pcie=pcie), cut=55, after=cfg)
    (a,) = alerts
    assert (a.labels["node"], a.labels["nic"]) == CULPRIT
    ttd = (a.starts_at - (T0 + int(ONSET * S))) / S
    assert 4.5 <= ttd <= 6.0, ttd
    assert "5 in a row" in a.annotations["evidence"]


def test_look_alikes_gaps_and_clears_are_not_stragglers() -> None:
    """An incast receiver (congested, sends at full rate), a PFC storm's origin (pauses all the
    time, but its whole job stalls with it), a rail whose ring runs slow (slow, not pressed), a
    NIC 7% slower (transport retries), MoE-like pause spikes, an agent gap and a counter clear.
    """

    def sig(node: str, nic: str, t: float, rng: np.random.Generator) -> tuple[float, ...]:
        tx, pause, ecn = healthy(node, nic, t, rng)
        if rng.random() < 0.03:
            pause = rng.uniform(0.3, 0.6) * 1e5  # a brief heavy pause
        if (node, nic) == ("gpu-005", "mlx5_0") and 1.0 <= t < 5.0:
            ecn = float(rng.poisson(60_000))  # incast target
        if 2.0 <= t < 5.0 and node in JOB:
            tx *= 0.02  # the storm stalls the whole job
            if (node, nic) == ("gpu-006", "mlx5_0"):
                pause = 1e5
        if 6.0 <= t < 10.0 and nic == "mlx5_0" and node in JOB:
            tx *= 0.6  # rail 0's ring slow, no NIC backs up
        if (node, nic) == ("gpu-007", "mlx5_1"):
            tx *= 0.93
        return tx, pause, ecn

    alerts = run(
        feed(
            11.0,
            sig,
            seed=2,
            silent=lambda n, t: n == "gpu-008" and 3.0 <= t < 5.5,
            clear=lambda n, t: n in ("gpu-002", "gpu-101") and abs(t - 7.0) < 0.05,
        )
    )
    assert alerts == [], [a.labels for a in alerts]


def test_outside_jobs_peers_are_the_rail() -> None:
    def sig(node: str, nic: str, t: float, rng: np.random.Generator) -> tuple[float, ...]:
        tx, pause, ecn = healthy(node, nic, t, rng)
        if (node, nic) == ("gpu-102", "mlx5_0") and t >= 1.0:
            tx, pause = tx * 0.5, 3e4 * active(t)
        return tx, pause, ecn

    alerts = run(feed(6.0, sig, seed=3))
    assert [(a.labels["node"], a.labels["nic"]) for a in alerts] == [("gpu-102", "mlx5_0")]
    assert "job" not in alerts[0].labels
    assert "among rail:0 (4 NICs)" in alerts[0].annotations["evidence"]


def test_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="max_throughput_ratio"):
        StragglerConfig(max_throughput_ratio=1.5)
    with pytest.raises(ConfigError, match="min_windows"):
        StragglerConfig(min_windows=2.5)


# --- cadence: NIC counters read every 0.1, 1 or 5 s -------------------------------------------

RATE = LINE * 10 * 0.64  # bytes per second: the all-reduce's average


def nic_series(interval: float, fault: tuple[float, float] | None = None) -> list[cadence.Series]:
    """Every NIC's three signals read every ``interval`` s (out of step, jittered); during
    ``fault`` (from, until) gpu-003/mlx5_1 backs up and its rail's ring slows with it."""
    out = []
    for k, (node, nic) in enumerate(NICS):
        slow = fault is not None and nic == "mlx5_1" and node in JOB
        culprit = fault is not None and (node, nic) == CULPRIT
        tput = RATE * (1 - 0.002 * (k % 5))
        a, b = fault or (0.0, 0.0)
        rates = {
            "nic_tx_rdma_bytes": cadence.Rate(tput, [(a, b, -0.45 * tput)] if slow else []),
            "nic_tx_pause_us": cadence.Rate(1_000.0, [(a, b, 160_000.0)] if culprit else []),
            "nic_ecn_marked_pkts": cadence.Rate(500.0, [(a, b, 128_000.0)] if culprit else []),
        }
        for m, rate in rates.items():
            out.append(
                cadence.Series(
                    node,
                    nic,
                    m,
                    qual="3" if m == "nic_tx_pause_us" else "",
                    rate=rate,
                    interval=interval,
                    phase=0.004 + 0.17 * (k % 6) % interval,
                    jitter=0.2,
                    start=10**12,
                )
            )
    return out


@pytest.mark.parametrize("interval", cadence.CADENCES)
def test_straggler_at_any_cadence(interval: float) -> None:
    onset, until, seconds = cadence.timeline(interval, learn_s=2.0)
    r = cadence.run(TOPO, nic_series(interval, (onset, until)), seconds, only=("straggler",))
    (a,) = r.named("Straggler")  # one alert while it lasts: never resolved and re-raised
    assert (a.labels["node"], a.labels["nic"]) == CULPRIT
    assert 0 < cadence.ttd(a, onset) <= cadence.bound(interval), cadence.ttd(a, onset)
    assert cadence.still_firing_or_ended_after(a, until)
    assert a.ends_at, "resolved once it sped up again"


@pytest.mark.parametrize("interval", cadence.CADENCES)
def test_healthy_job_at_any_cadence(interval: float) -> None:
    r = cadence.run(TOPO, nic_series(interval), cadence.timeline(interval)[2], only=("straggler",))
    assert r.named("Straggler") == []


def look_alike_series(interval: float, fault: tuple[float, float]) -> list[cadence.Series]:
    """The straggler of ``nic_series`` and, while it lasts, what made false Stragglers in the
    evaluation matrix: a ring peer of the straggler (slow, as its whole rail) caught in a DCQCN
    marking burst; an incast target on the other rail (marked, at full rate); and a NIC its
    leaf holds (a storm's victim: it receives pause, sends a little, and is slow)."""
    a, b = fault
    peer, target, held = ("gpu-005", "mlx5_1"), ("gpu-006", "mlx5_0"), ("gpu-007", "mlx5_0")
    burst = [(a + 1.0, a + 5.0, 300_000.0), (a + 7.0, a + 10.0, 250_000.0)]
    out = []
    for s in nic_series(interval, fault):
        key = (s.device, s.port)
        if s.metric == "nic_ecn_marked_pkts" and key in (peer, target):
            s = dataclasses.replace(s, rate=cadence.Rate(500.0, burst))
        elif s.metric == "nic_tx_rdma_bytes" and key == held:
            s = dataclasses.replace(s, rate=cadence.Rate(RATE, [(a, b, -0.4 * RATE)]))
        elif s.metric == "nic_tx_pause_us" and key == held:
            s = dataclasses.replace(s, rate=cadence.Rate(1_000.0, [(a, b, 120_000.0)]))
        out.append(s)
        if s.metric == "nic_tx_pause_us":  # every NIC also reports the pause it receives
            rx = cadence.Rate(500.0, [(a, b, 400_000.0)] if key == held else [])
            out.append(dataclasses.replace(s, metric="nic_rx_pause_us", rate=rx))
    return out


@pytest.mark.parametrize("interval", [1.0, 2.0])
def test_ring_peers_incast_targets_and_held_nics_are_not_stragglers(interval: float) -> None:
    # the matrix's false Stragglers at 1-2 s NIC cadence: ring peers of a real straggler in a
    # DCQCN burst (ECN-marked and slow, but asking for no pause), incast targets, held NICs
    onset, until, seconds = cadence.timeline(interval, learn_s=2.0)
    r = cadence.run(TOPO, look_alike_series(interval, (onset, until)), seconds, only=("straggler",))
    (a,) = r.named("Straggler")  # the straggler alone, once
    assert (a.labels["node"], a.labels["nic"]) == CULPRIT
    assert 0 < cadence.ttd(a, onset) <= cadence.bound(interval), cadence.ttd(a, onset)
    assert "pause received" in a.annotations["evidence"]


@pytest.mark.parametrize("interval", [1.0, 2.0])
def test_a_ten_percent_straggler_is_found(interval: float) -> None:
    # a mild thermal straggler: 10 % slow (its rail with it), asking for pause 10 % of the time
    onset, until, seconds = cadence.timeline(interval, learn_s=2.0)
    series = []
    for s in nic_series(interval):
        key = (s.device, s.port)
        if s.metric == "nic_tx_rdma_bytes" and s.port == "mlx5_1" and s.device in JOB:
            base = s.rate.base if s.rate is not None else RATE
            s = dataclasses.replace(s, rate=cadence.Rate(base, [(onset, until, -0.1 * base)]))
        elif s.metric == "nic_tx_pause_us" and key == CULPRIT:
            s = dataclasses.replace(s, rate=cadence.Rate(1_000.0, [(onset, until, 100_000.0)]))
        series.append(s)
    (a,) = cadence.run(TOPO, series, seconds, only=("straggler",)).named("Straggler")
    assert (a.labels["node"], a.labels["nic"]) == CULPRIT
    assert 0 < cadence.ttd(a, onset) <= cadence.bound(interval), cadence.ttd(a, onset)


# --- the second rule: a NIC that alone is slow, asking for no pause ----------------------------


def alone_series(
    interval: float,
    fault: tuple[float, float],
    slow: Callable[[str, str], float],
    held: float = 0.0,
    marked: float = 0.0,
) -> list[cadence.Series]:
    """Healthy NICs (as ``nic_series``), each also reporting the pause it receives; during
    ``fault`` every NIC's transmit drops by ``slow(node, nic)`` (a share of its rate), and the
    culprit receives pause ``held`` of the time and ``marked`` more ECN-marked packets a second.
    No NIC asks for pause."""
    a, b = fault
    out = []
    for s in nic_series(interval):
        key = (s.device, s.port)
        if s.metric == "nic_tx_rdma_bytes" and slow(*key) > 0:
            base = s.rate.base if s.rate is not None else RATE
            s = dataclasses.replace(s, rate=cadence.Rate(base, [(a, b, -slow(*key) * base)]))
        elif s.metric == "nic_ecn_marked_pkts" and key == CULPRIT and marked:
            s = dataclasses.replace(s, rate=cadence.Rate(500.0, [(a, b, marked)]))
        out.append(s)
        if s.metric == "nic_tx_pause_us":
            rx = cadence.Rate(500.0, [(a, b, held * 1e6)] if key == CULPRIT and held else [])
            out.append(dataclasses.replace(s, metric="nic_rx_pause_us", rate=rx))
    return out


def found_alone(interval: float, slower: float) -> tuple[Any, float, float]:
    """The culprit alone ``slower`` (a fraction) than its peers: its one Straggler alert, found
    in bound, with the fault's onset and end."""
    onset, until, seconds = cadence.timeline(interval, learn_s=2.0)
    series = alone_series(interval, (onset, until), lambda n, c: slower * ((n, c) == CULPRIT))
    (a,) = cadence.run(TOPO, series, seconds, only=("straggler",)).named("Straggler")
    assert (a.labels["node"], a.labels["nic"]) == CULPRIT
    assert 0 < cadence.ttd(a, onset) <= cadence.bound(interval), cadence.ttd(a, onset)
    return a, onset, until


@pytest.mark.parametrize("interval", cadence.CADENCES)
def test_a_nic_alone_slow_without_pause_is_found(interval: float) -> None:
    # a thermally throttled GPU on a fabric without PFC: 20 % slower than every peer, its ring
    # peers included, asking for no pause and marked no more than they are
    a, _, until = found_alone(interval, 0.2)
    assert cadence.still_firing_or_ended_after(a, until)
    assert a.ends_at, "resolved once it sped up again"
    ev = a.annotations["evidence"]
    assert ev.startswith("rule=alone_slow: gpu-003/mlx5_1 among job:llm (16 NICs)"), ev
    assert "of its ring peers' median" in ev and "rail 1, 7 other NICs" in ev, ev


ALONE_LOOK_ALIKES: dict[str, dict[str, object]] = {
    # the ring's pace: every NIC of rail 1 in the job 20 % slow (they wait for someone)
    "ring": {"slow": lambda n, c: 0.2 * (c == "mlx5_1" and n in JOB)},
    # idle: its job's work ended on it, a little background traffic left
    "idle": {"slow": lambda n, c: 0.99 * ((n, c) == CULPRIT)},
    # a victim: its leaf holds it 25 % of the time, so it sends 20 % less
    "held": {"slow": lambda n, c: 0.2 * ((n, c) == CULPRIT), "held": 0.25},
    # congested: DCQCN slows what it sends, its traffic marked far above its peers'
    "marked": {"slow": lambda n, c: 0.2 * ((n, c) == CULPRIT), "marked": 200_000.0},
    # a NIC 7 % slower (transport retries): within what collectives tolerate
    "retries": {"slow": lambda n, c: 0.07 * ((n, c) == CULPRIT)},
}


@pytest.mark.parametrize("interval", [AT_01S, 1.0])
@pytest.mark.parametrize("case", list(ALONE_LOOK_ALIKES))
def test_alone_slow_is_silent_on_look_alikes(case: str, interval: float) -> None:
    onset, until, seconds = cadence.timeline(interval, learn_s=2.0)
    series = alone_series(interval, (onset, until), **ALONE_LOOK_ALIKES[case])  # type: ignore[arg-type]
    r = cadence.run(TOPO, series, seconds, only=("straggler",))
    assert r.named("Straggler") == [], [a.annotations for a in r.named("Straggler")]


# four rails: a slow ring is a quarter of the job, so only the ring check can tell it apart
RAILS4 = [f"node-{i}" for i in range(1, 5)]
TOPO4_SPEC: dict[str, object] = {
    "switches": [{"name": f"leaf-{r}", "role": "leaf", "rail": r} for r in range(4)],
    "nodes": [
        {
            "name": n,
            "nics": [
                {"nic": f"mlx5_{r}", "rail": r, "switch_port": f"leaf-{r}/swp{i + 1}"}
                for r in range(4)
            ],
        }
        for i, n in enumerate(RAILS4)
    ],
    "jobs": [{"name": "moe", "tenant": "b", "nodes": RAILS4}],
}
TOPO4 = Topology.from_dict(TOPO4_SPEC)


def four_rails(
    interval: float, fault: tuple[float, float], slow: set[str], dips: Sequence[float] = ()
) -> list[cadence.Series]:
    """Four nodes, four rails, one job; during ``fault`` the NICs named "node/nic" in ``slow``
    send 20 % less (or, with ``dips``, nothing for 1.1 s from each of those times), asking for
    and receiving no pause."""
    a, b = fault
    out = []
    for k, (node, nic) in enumerate((n, f"mlx5_{r}") for n in RAILS4 for r in range(4)):
        tput = RATE * (1 - 0.002 * (k % 5))
        extra = [(a, b, -0.2 * tput)] if f"{node}/{nic}" in slow and not dips else []
        if f"{node}/{nic}" in slow:
            extra += [(d, d + 1.1, -tput) for d in dips]
        for m, rate in (
            ("nic_tx_rdma_bytes", cadence.Rate(tput, extra)),
            ("nic_tx_pause_us", cadence.Rate(1_000.0)),
            ("nic_rx_pause_us", cadence.Rate(500.0)),
            ("nic_ecn_marked_pkts", cadence.Rate(500.0)),
        ):
            q = "3" if "pause" in m else ""
            phase = 0.004 + 0.17 * (k % 6) % interval
            out.append(
                cadence.Series(
                    node, nic, m, q, rate, interval=interval, phase=phase, jitter=0.2, start=10**12
                )
            )
    return out


@pytest.mark.parametrize("interval", [AT_01S, 1.0])
def test_alone_slow_is_silent_on_a_slow_ring(interval: float) -> None:
    # rail 2's whole ring 20 % slow: one pace, the ring waits for someone (with four rails the
    # ring is a quarter of the job: only the ring check tells it from a straggler)
    onset, until, seconds = cadence.timeline(interval, learn_s=2.0)
    ring = {f"{n}/mlx5_2" for n in RAILS4}
    r = cadence.run(TOPO4, four_rails(interval, (onset, until), ring), seconds, only=("straggler",))
    assert r.named("Straggler") == [], [a.annotations for a in r.named("Straggler")]


@pytest.mark.parametrize("interval", [AT_01S, 1.0])
def test_alone_slow_in_a_ring_that_keeps_its_pace(interval: float) -> None:
    onset, until, seconds = cadence.timeline(interval, learn_s=2.0)
    one = {"node-3/mlx5_2"}
    r = cadence.run(TOPO4, four_rails(interval, (onset, until), one), seconds, only=("straggler",))
    (a,) = r.named("Straggler")
    assert (a.labels["node"], a.labels["nic"]) == ("node-3", "mlx5_2")
    assert 0 < cadence.ttd(a, onset) <= cadence.bound(interval), cadence.ttd(a, onset)
    assert "rail 2, 3 other NICs" in a.annotations["evidence"]


FLAPPER = "node-1/mlx5_2"
RING2 = {f"{n}/mlx5_2" for n in RAILS4}
ALL16 = {f"{n}/mlx5_{r}" for n in RAILS4 for r in range(4)}


@pytest.mark.parametrize("interval", [AT_01S, 1.0, 2.0, 5.0])
@pytest.mark.parametrize("stalled", ["ring", "job"])
def test_alone_slow_is_silent_when_another_link_of_its_job_flaps(
    stalled: str, interval: float
) -> None:
    # node-1/mlx5_2's cable flaps (down ~1.1 s every 3-4 s): its ring (or, waiting at the
    # step's barrier, the whole job) stalls with it. Each NIC's samples catch a stall whole or
    # split over two, as its sampling phase falls, so some NICs dip more, sample after sample,
    # than the ring peers they are compared with: victims, not stragglers (the matrix's false
    # Stragglers at 1 s NIC cadence)
    onset, until, seconds = cadence.timeline(interval, learn_s=2.0)
    dips = [onset + x for x in (0.5, 4.0, 7.5, 10.5, 13.6, 16.9)]
    series = four_rails(interval, (onset, until), RING2 if stalled == "ring" else ALL16, dips)
    r = cadence.run(TOPO4, series, seconds, only=("straggler",))
    assert r.named("Straggler") == [], [a.annotations for a in r.named("Straggler")]


@pytest.mark.parametrize("interval", [1.0, 5.0])
def test_a_straggler_is_found_after_its_ring_stalled(interval: float) -> None:
    # the victim check looks back a few windows only (2.5 sampling intervals at least): a NIC
    # that stays slow once its ring's stall (a flap that ended) is over is a straggler again
    onset, until, seconds = cadence.timeline(interval, learn_s=2.0)
    stall = onset + 0.5
    until, seconds = until + 3 * interval, seconds + 3 * interval  # the look back, then 2 samples
    series = [
        dataclasses.replace(
            s,
            rate=cadence.Rate(
                s.rate.base,
                [*s.rate.extra, (stall, stall + 1.1, -s.rate.base)]
                if f"{s.device}/{s.port}" in RING2 and s.metric == "nic_tx_rdma_bytes"
                else s.rate.extra,
            ),
        )
        if s.rate is not None
        else s
        for s in four_rails(interval, (onset, until), {"node-3/mlx5_2"})
    ]
    (a,) = cadence.run(TOPO4, series, seconds, only=("straggler",)).named("Straggler")
    assert (a.labels["node"], a.labels["nic"]) == ("node-3", "mlx5_2")
    assert "rule=alone_slow" in a.annotations["evidence"]


def test_alone_slow_is_silent_when_the_whole_job_is_idle() -> None:
    # a job between steps (every NIC near zero, one at half of that): nobody waits for anyone
    onset, until, seconds = cadence.timeline(1.0, learn_s=2.0)

    def slow(n: str, c: str) -> float:
        return 0.9995 if (n, c) == CULPRIT else (0.999 if n in JOB else 0.0)

    r = cadence.run(TOPO, alone_series(1.0, (onset, until), slow), seconds, only=("straggler",))
    assert r.named("Straggler") == []


def test_alone_slow_can_be_turned_off() -> None:
    onset, until, seconds = cadence.timeline(1.0, learn_s=2.0)
    series = alone_series(1.0, (onset, until), lambda n, c: 0.2 * ((n, c) == CULPRIT))
    cfg = Config(detectors={"straggler": StragglerConfig(alone_slow=False)})
    r = cadence.run(TOPO, series, seconds, config=cfg, only=("straggler",))
    assert r.named("Straggler") == []


@pytest.mark.parametrize("interval", [AT_01S, 2.0])
def test_a_ten_percent_straggler_without_pause_is_found(interval: float) -> None:
    # the mildest thermal straggler worth finding, alone, on a fabric without PFC
    a, _, _ = found_alone(interval, 0.1)
    assert "rule=alone_slow" in a.annotations["evidence"]


@pytest.mark.parametrize("older", [False, True])
def test_alone_slow_survives_a_checkpoint(older: bool) -> None:
    # the service's state file is taken mid-fault (rocewatch.core.checkpoint, as the detect stage
    # writes it); one of a build from before alone_slow has no look back: it is rebuilt
    interval = 1.0
    onset, until, seconds = cadence.timeline(interval, learn_s=2.0)
    series = alone_series(interval, (onset, until), lambda n, c: 0.2 * ((n, c) == CULPRIT))
    p = Pipeline(TOPO, Config(), rollup_s=None)
    p.detectors = [d for d in p.detectors if d.name == "straggler"]
    cut = cadence.T0 + round((onset + 1.5) * cadence.S)
    for f in cadence.frames(series, seconds):
        if cut is not None and int(f["ts"].min()) >= cut:  # type: ignore[arg-type]
            cut = None
            if not older:
                p = restart_pipeline(p, only=("straggler",))
            else:
                data = through_codec(p.state(), Pipeline.state_types())
                st = data["detectors"]["straggler"]
                for name in ("roll", "roll_med", "roll_at"):
                    del st[name]
                p = Pipeline(TOPO, Config(), rollup_s=None)
                p.detectors = [d for d in p.detectors if d.name == "straggler"]
                p.restore(data)
        p.ingest(f)
        p.advance(int(f["ts"].max()) - p.engine.lateness_ns())  # type: ignore[arg-type]
    p.finish()
    (a,) = [a for a in p.all_alerts() if a.name == "Straggler"]
    assert (a.labels["node"], a.labels["nic"]) == CULPRIT
    assert 0 < cadence.ttd(a, onset) <= cadence.bound(interval), cadence.ttd(a, onset)


def noisy(series: list[cadence.Series], seconds: float, spread: float) -> list[cadence.Series]:
    """Each NIC's transmit rate varies on its own by up to +-``spread``, second by second (a
    collective's chunks, PCIe and host jitter), in segments offset from its samples."""
    rng = np.random.default_rng(7)
    out = []
    for s in series:
        if s.metric == "nic_tx_rdma_bytes" and s.rate is not None:
            base = s.rate.base
            wobble = [
                (t + 0.37, t + 1.37, float(rng.uniform(-spread, spread)) * base)
                for t in range(int(seconds) + 1)
            ]
            s = dataclasses.replace(s, rate=cadence.Rate(base, [*s.rate.extra, *wobble]))
        out.append(s)
    return out


@pytest.mark.parametrize("interval", [AT_01S, 1.0])
def test_alone_slow_among_noisy_peers(interval: float) -> None:
    # every NIC's rate wobbles by +-4 % on its own: no stall (the wobbles do not line up), so
    # a NIC 20 % slow is still found, and the healthy ones stay silent
    onset, until, seconds = cadence.timeline(interval, learn_s=2.0)
    series = alone_series(interval, (onset, until), lambda n, c: 0.2 * ((n, c) == CULPRIT))
    r = cadence.run(TOPO, noisy(series, seconds, 0.08), seconds, only=("straggler",))
    (a,) = r.named("Straggler")
    assert (a.labels["node"], a.labels["nic"]) == CULPRIT
    assert 0 < cadence.ttd(a, onset) <= cadence.bound(interval), cadence.ttd(a, onset)


def test_alone_slow_judges_no_nic_outside_jobs() -> None:
    # no jobs known: a rail's NICs are peers for the backpressure rule, but hosts at other work
    # send at other steady rates (here one of rail 1's four NICs at 80 %), nothing waits for them
    onset, until, seconds = cadence.timeline(1.0, learn_s=2.0)
    topo = Topology.from_dict({k: v for k, v in TOPO4_SPEC.items() if k != "jobs"})
    slow = {f"{n}/mlx5_1" for n in RAILS4[:1]}
    r = cadence.run(topo, four_rails(1.0, (onset, until), slow), seconds, only=("straggler",))
    assert r.named("Straggler") == [], [a.annotations for a in r.named("Straggler")]
    # the same with the job known: found
    r = cadence.run(TOPO4, four_rails(1.0, (onset, until), slow), seconds, only=("straggler",))
    assert [a.labels["node"] for a in r.named("Straggler")] == ["node-1"]


@pytest.mark.parametrize("interval", [AT_01S, 2.0])
def test_alone_slow_leaves_a_retransmitting_nic_to_transport_errors(interval: float) -> None:
    # 25 NAK sequence errors a second cost the NIC 13 % of its throughput (go-back-N resends):
    # slow because of its transport (TransportErrors' fault), not at its own work; the same
    # slowness without the errors is a straggler
    onset, until, seconds = cadence.timeline(interval, learn_s=2.0)
    series = alone_series(interval, (onset, until), lambda n, c: 0.13 * ((n, c) == CULPRIT))
    naks = cadence.Series(
        *CULPRIT, "nic_packet_seq_err", rate=cadence.Rate(0.02, [(onset - 1, until, 25.0)])
    ).every(interval, phase=0.004)
    r = cadence.run(TOPO, [*series, naks], seconds, only=("straggler",))
    assert r.named("Straggler") == [], [a.annotations for a in r.named("Straggler")]
    r = cadence.run(TOPO, series, seconds, only=("straggler",))
    assert [(a.labels["node"], a.labels["nic"]) for a in r.named("Straggler")] == [CULPRIT]
