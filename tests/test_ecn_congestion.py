"""ECNCongestion on hand-built telemetry: sustained marking on one queue and the NIC behind it,
which its peers do not share, at the cadences switches and NICs report (0.1-5 s, jittered,
readings lost, counters cleared); and the healthy DCQCN marking, busy ports and fabric-wide
congestion that must stay silent."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import polars as pl
import pytest

from detectors.ecn_congestion import EcnCongestionConfig, EcnCongestionDetector
from rocewatch.config import Config, config_from_dict
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import Alert, conform
from rocewatch.core.topology import Topology
from rocewatch.pipeline import Pipeline
from tests.support.restart import restart_pipeline

S = 1_000_000_000
T0 = 1_795_946_400 * S
MIB = 2**20
PPS = 10e6  # packets/s at full load (~330G of 4 KiB packets)

HOSTS = {
    "leaf-0": ["Ethernet1/1", "Ethernet1/2", "Ethernet1/3", "Ethernet1/4", "Ethernet1/5"],
    "leaf-1": ["swp1", "swp2", "swp3", "swp4", "swp5"],
}
UPLINKS = [("leaf-0", "et-0/0/48"), ("leaf-1", "swp49")]
SPINE = [("spine-0", "TwoHundredGigE1/0/1:1"), ("spine-0", "TwoHundredGigE1/0/2:1")]
QUEUES = [(d, p) for d, ps in HOSTS.items() for p in ps] + UPLINKS + SPINE
NODE = {(d, p): f"gpu-{d[-1]}{i}" for d, ps in HOSTS.items() for i, p in enumerate(ps)}
NICS = [(n, "mlx5_0") for n in NODE.values()]
FIELD = ("leaf-0", "Ethernet1/3")
FIELD_NIC = (NODE[FIELD], "mlx5_0")

TOPO = Topology.from_dict(
    {
        "switches": [
            {"name": "leaf-0", "role": "leaf", "rail": 0, "buffer_bytes": 32 * MIB},
            {"name": "leaf-1", "role": "leaf", "rail": 1, "buffer_bytes": 64 * MIB},
            {"name": "spine-0", "role": "spine", "buffer_bytes": 64 * MIB},
        ],
        "links": [
            {"a": f"{a[0]}/{a[1]}", "b": f"{b[0]}/{b[1]}"}
            for a, b in zip(UPLINKS, SPINE, strict=True)
        ],
        "nodes": [
            {"name": n, "nics": [{"nic": "mlx5_0", "switch_port": f"{d}/{p}"}]}
            for (d, p), n in NODE.items()
        ],
        "jobs": [{"name": "llm", "tenant": "a", "nodes": list(NODE.values())}],
    }
)
Share = Callable[[float, tuple[str, str]], float]


def bursting(t: float) -> bool:
    """Collectives send 0.3 s in every 0.5 s at line rate, a tenth of it between."""
    return round(t * 10 - 0.5) % 5 < 3


def dcqcn(seed: int = 5) -> Share:
    """Healthy DCQCN: each queue and NIC marks its own 2-10% of its packets (a quarter of that
    between the collectives' bursts, when queues drain)."""
    rng = np.random.default_rng(seed)
    normal = dict(zip(QUEUES + NICS, rng.uniform(0.02, 0.1, 99), strict=False))

    def share(t: float, e: tuple[str, str]) -> float:
        return normal[e] * (1.0 if bursting(t) else 0.25)

    return share


def with_fault(base: Share, onset: float, length: float = 25.0, share: float = 1 / 3) -> Share:
    """The field report: a third of the packets marked for 25 s on one leaf queue and the NIC
    behind it, on top of ``base``."""

    def f(t: float, e: tuple[str, str]) -> float:
        if e in (FIELD, FIELD_NIC) and onset <= t < onset + length:
            return share
        return base(t, e)

    return f


def telemetry(
    seconds: float,
    interval: float,
    share: Share,
    nic_interval: float | None = None,
    seed: int = 1,
    clears: tuple[tuple[float, str], ...] = (),
    start: Callable[[tuple[str, str]], float] = lambda e: 0.0,
) -> list[pl.DataFrame]:
    """Frames of 0.1 s: each switch polled every ``interval`` and each NIC every
    ``nic_interval`` (default the same, at most 2 s), with jitter of a fifth of an interval and
    1% of polls lost. Counters accumulate ``share(t, entity)`` of the packets as ECN marks, 0.1 s
    at a time; ``clears`` (t, device) restart a device's counters from 0."""
    nic_iv = nic_interval or min(interval, 2.0)
    rng = np.random.default_rng(seed)
    cum: dict[tuple, float] = {}
    rows: list[tuple] = []
    devices = {d: interval for d, _ in QUEUES} | {n: nic_iv for n, _ in NICS}
    polls = []
    for dev, iv in devices.items():
        t = rng.uniform(0, iv)
        while t < seconds:
            if rng.random() >= 0.01:
                polls.append((t, dev))
            t += iv * (1 + rng.uniform(-0.1, 0.1))
    polls.sort()
    sub = 0.0  # counters advance in 0.1 s slices up to each poll
    ents = [(d, p, "3") for d, p in QUEUES] + [(n, c, "") for n, c in NICS]
    last_sub = dict.fromkeys(ents, 0.0)

    def add(k: tuple, inc: float) -> None:
        cum[k] = cum.get(k, 0.0) + inc

    for t, dev in polls:
        for ct, cdev in clears:
            if sub < ct <= t:
                for k in [k for k in cum if k[0] == cdev]:
                    cum[k] = 0.0
        sub = t
        for e in [e for e in ents if e[0] == dev]:
            x = last_sub[e]
            while x + 0.1 <= t:
                mid = x + 0.05
                pk = PPS * 0.1 * (1.0 if bursting(mid) else 0.1)
                marks = pk * min(share(mid, e[:2]), 1.0)
                if e[2] == "3":
                    add((*e, "queue_tx_pkts"), pk)
                    add((*e, "queue_ecn_marked_pkts"), marks)
                    add((e[0], e[1], "", "port_out_pkts"), pk * 1.02)
                else:
                    add((*e, "nic_rx_rdma_bytes"), pk * 4096)
                    add((*e, "nic_ecn_marked_pkts"), marks)
                    add((*e, "nic_cnp_sent"), marks * 0.5)
                x += 0.1
            last_sub[e] = x
        ts = T0 + round(t * S)
        for k, v in cum.items():
            if k[0] == dev and t >= start(k[:2]):
                raw = int(v)
                rows.append((ts, k[0], k[1], k[2], k[3], float(raw), raw))
    f = pl.DataFrame(
        rows, schema=["ts", "device", "port", "qual", "metric", "value", "raw"], orient="row"
    ).sort("ts")
    chunk = (f["ts"] // (S // 10)).alias("c")
    return [
        conform(x.drop("c")) for x in f.with_columns(chunk).partition_by("c", maintain_order=True)
    ]


def pipeline(config: Config | None = None) -> Pipeline:
    """The real pipeline, with the detector this file is about."""
    p = Pipeline(TOPO, config or Config(), rollup_s=None)
    p.detectors = [d for d in p.detectors if d.name == "ecn_congestion"]
    return p


def feed(p: Pipeline, frames: list[pl.DataFrame]) -> Pipeline:
    for f in frames:
        p.ingest(f)
        p.advance(int(f["ts"].max()) - p.engine.lateness_ns())
    return p


def run(frames: list[pl.DataFrame], config: Config | None = None) -> Pipeline:
    p = feed(pipeline(config), frames)
    p.finish()
    return p


def ecn(p: Pipeline) -> list[Alert]:
    return [a for a in p.all_alerts() if a.name == "ECNCongestion"]


def entity(a: Alert) -> tuple[str, str]:
    return (a.labels.get("switch") or a.labels["node"], a.labels.get("port") or a.labels["nic"])


@pytest.mark.parametrize("interval", [0.1, 1.0, 5.0])
def test_field_report_queue_and_nic_found_once_at_any_cadence(interval: float) -> None:
    # a third of the packets marked for 25 s on one leaf queue and the NIC behind it, while
    # every other queue and NIC marks its usual 2-10% in bursts
    onset = 15.0 if interval < 5 else 30.0  # after the baselines are learned
    seconds = onset + 33 + 4 * interval  # the fault, then time to resolve
    p = run(telemetry(seconds, interval, with_fault(dcqcn(), onset), seed=round(interval * 10)))
    alerts = ecn(p)
    assert sorted(entity(a) for a in alerts) == sorted([FIELD, FIELD_NIC]), [
        a.annotations["evidence"] for a in alerts
    ]
    for a in alerts:
        iv = interval if "queue" in a.labels else min(interval, 2.0)
        ttd = (a.starts_at - (T0 + onset * S)) / S
        assert 0 < ttd <= max(10.0, 3 * iv), (ttd, a.labels)
        end = T0 + (onset + 25) * S
        # the smoothed share falls to the stay level (~1.5 s), clears after clear_s and 2.5
        # intervals (the last reading may straddle the end), resolves after the lifecycle's 1 s
        assert a.ends_at and end < a.ends_at <= end + (4.5 + 3.5 * iv) * S, a.labels
        ev = a.annotations["evidence"]
        assert "rule=peers" in ev, ev
        base = re.search(r"own normal ([0-9.]+)% of packets marked", ev)
        assert base and 2 <= float(base.group(1)) <= 12, ev  # learned before the onset
        assert re.search(r"peers' median [0-9.]+% \(\d+ same role/rail peers\)", ev), ev
    q = next(a for a in alerts if "queue" in a.labels)
    assert q.labels["queue"] == "3" and q.labels["rail"] == "0"
    n = next(a for a in alerts if "nic" in a.labels)
    assert n.labels["job"] == "llm" and "CNPs sent/s" in n.annotations["evidence"]


@pytest.mark.parametrize("interval", [0.1, 1.0, 5.0])
def test_healthy_dcqcn_marking_stays_silent(interval: float) -> None:
    # every queue and NIC marks its own 2-10% (a quarter of it between bursts), counters of a
    # switch and a NIC are cleared mid-run
    seconds = {0.1: 30, 1.0: 40}.get(interval, 200)
    clears = ((13.0, "leaf-0"), (17.0, NODE[FIELD]))
    p = run(telemetry(seconds, interval, dcqcn(), seed=3, clears=clears))
    assert ecn(p) == []
    assert p.stats.get("counter_resets") > 0


def test_busy_port_is_judged_against_its_own_normal() -> None:
    # one uplink always marks 20% (its peers 2-10%): not enough without a learned normal
    # (25%), and later its own normal
    busy = UPLINKS[0]
    base = dcqcn()

    def share(t: float, e: tuple[str, str]) -> float:
        return 0.2 if e == busy else base(t, e)

    assert ecn(run(telemetry(40, 0.5, share))) == []


def test_fabric_wide_marking_is_not_blamed_on_each_queue() -> None:
    # every queue and NIC marks 30%: the whole fabric congested, not one queue beyond its peers
    p = run(telemetry(30, 0.5, lambda t, e: 0.3))
    assert ecn(p) == []


def test_absolute_share_fires_without_history() -> None:
    # a queue whose first reading already marks 60%: no baseline of its own, but no healthy
    # DCQCN loop marks more than half its packets for seconds
    late = lambda e: 2.0 if e == FIELD else 0.0  # noqa: E731
    p = run(telemetry(8, 0.1, lambda t, e: 0.6 if e == FIELD else 0.02, start=late))
    (a,) = [a for a in ecn(p) if "queue" in a.labels]
    assert entity(a) == FIELD and "rule=absolute" in a.annotations["evidence"]
    assert "own normal not learned yet" in a.annotations["evidence"]
    assert (a.starts_at - (T0 + 2 * S)) / S <= 3.0


def test_a_checkpoint_taken_mid_episode_carries_on() -> None:
    """The detector's state through the product's codec (rocewatch/core/checkpoint.py)
    while a run is under way, laid over a pipeline built anew from the configuration: the
    alerts are those of the uninterrupted run, with the same startsAt."""
    frames = telemetry(40, 1.0, with_fault(dcqcn(), 20.0, 15.0))
    cut = next(i for i, f in enumerate(frames) if int(f["ts"].min()) > T0 + 21 * S)
    whole = run(frames)
    p = feed(pipeline(), frames[:cut])
    det = next(d for d in p.detectors if isinstance(d, EcnCongestionDetector))
    assert det.runs  # a run under way, not yet an alert
    p = restart_pipeline(p, only=("ecn_congestion",))
    back = next(d for d in p.detectors if isinstance(d, EcnCongestionDetector))
    assert back is not det and back.runs.keys() == det.runs.keys()
    p = feed(p, frames[cut:])
    p.finish()
    assert sorted(entity(a) for a in ecn(p)) == sorted([FIELD, FIELD_NIC])
    assert [a.to_json() for a in ecn(p)] == [a.to_json() for a in ecn(whole)]


@pytest.mark.slow  # 40 s of telemetry twice: 3 to 5 s on a loaded machine
def test_a_restored_detector_takes_todays_sustain() -> None:
    """Restarted mid-run with ``sustain_s`` 5 s instead of 2: the restored run keeps its start,
    and the alerts wait for today's 5 s (``Sustain.PARAMS``)."""
    frames = telemetry(40, 1.0, with_fault(dcqcn(), 20.0, 15.0))
    cut = next(i for i, f in enumerate(frames) if int(f["ts"].min()) > T0 + 21 * S)
    whole = {entity(a): a.starts_at for a in ecn(run(frames))}
    p = feed(pipeline(), frames[:cut])
    cfg = Config(detectors={"ecn_congestion": EcnCongestionConfig(sustain_s=5.0)})
    p = restart_pipeline(p, cfg, only=("ecn_congestion",))
    (det,) = p.detectors
    assert isinstance(det, EcnCongestionDetector) and det.sustain.sustain_s == 5.0
    p = feed(p, frames[cut:])
    p.finish()
    later = {entity(a): a.starts_at for a in ecn(p)}
    assert later.keys() == whole.keys() == {FIELD, FIELD_NIC}
    for k, t in later.items():
        # (readings every second: 2 to 3 s later than under the 2 s it started with)
        assert 1.5 <= (t - whole[k]) / S <= 3.5, (k, (t - whole[k]) / S)


def test_config_from_file_and_validation() -> None:
    cfg = config_from_dict({"detectors": {"ecn_congestion": {"min_mark_share": 0.15}}})
    assert cfg.detectors["ecn_congestion"].min_mark_share == 0.15
    with pytest.raises(ConfigError, match="min_mark_share <= new_mark_share"):
        config_from_dict({"detectors": {"ecn_congestion": {"min_mark_share": 0.5}}})
    with pytest.raises(ConfigError, match="unknown setting"):
        config_from_dict({"detectors": {"ecn_congestion": {"share": 0.5}}})
    with pytest.raises(ConfigError):
        EcnCongestionConfig(sustain_s=0)
