"""TransportErrors on hand-built frames: retransmissions and out-of-sequence packets beyond a
NIC's own and the fabric's baseline; healthy reordering, stray errors and counter clears must
not fire."""

import dataclasses

import numpy as np
import polars as pl
import pytest

from detectors.transport_errors import TransportErrorsConfig
from rocewatch.config import Config, config_from_dict
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import conform
from rocewatch.core.topology import Topology
from rocewatch.pipeline import Pipeline
from tests import cadence
from tests.support.restart import restart_pipeline

S = 1_000_000_000
STEP = S // 10
T0 = 1_795_946_400 * S

NICS = [(f"gpu-00{i}", f"mlx5_{r}") for i in range(1, 5) for r in range(2)]
TOPO = Topology.from_dict(
    {
        "switches": [{"name": "leaf-0", "role": "leaf", "rail": 0}],
        "nodes": [
            {
                "name": f"gpu-00{i}",
                "nics": [
                    {"nic": f"mlx5_{r}", "switch_port": f"leaf-0/Ethernet1/{2 * i + r}"}
                    for r in range(2)
                ],
            }
            for i in range(1, 5)
        ],
        "jobs": [{"name": "llm", "tenant": "a", "nodes": ["gpu-001", "gpu-002", "gpu-003"]}],
    }
)
SICK = ("gpu-002", "mlx5_1")
# healthy per second: adaptive routing reorders a little; errors are stray single events
OOS_PPS = 25.0
STRAY = {
    "nic_packet_seq_err": 0.02,
    "nic_local_ack_timeout": 0.002,
    "nic_implied_nak_seq_err": 0.03,
}
# a sick NIC per second (the simulator's TransportErrors fault, a little weaker)
FAULT = {
    "nic_out_of_sequence": 2_500.0,
    "nic_packet_seq_err": 200.0,
    "nic_local_ack_timeout": 25.0,
    "nic_implied_nak_seq_err": 60.0,
}
METRICS = ["nic_out_of_sequence", *STRAY, "nic_rnr_nak_retry_err"]


def ticks(seconds, fault=lambda t, nic: {}, oos=lambda nic: OOS_PPS, clears=(), seed=1):
    """One snapshot per NIC every 100 ms, counts drawn from Poisson with the per-second rates
    of the healthy baseline (``oos(nic)`` for out_of_sequence) plus ``fault(t, nic)`` for the
    interval ending at ``t``; ``clears`` (t, node): that node's counters restart from 0."""
    rng = np.random.default_rng(seed)
    cum = {k: 10_000 for k in ((n, m) for n in NICS for m in METRICS)}
    for i in range(int(seconds * 10) + 1):
        t = round(i / 10, 1)
        ts = T0 + i * STEP + 2_000_000
        rows = []
        for nic in NICS:
            if (t, nic[0]) in clears:
                for m in METRICS:
                    cum[(nic, m)] = 0
            extra = fault(t, nic)
            for m in METRICS:
                rate = (oos(nic) if m == "nic_out_of_sequence" else STRAY.get(m, 0.0)) + extra.get(
                    m, 0.0
                )
                cum[(nic, m)] += int(rng.poisson(rate / 10)) if i else 0
                rows.append((ts, *nic, "", m, float(cum[(nic, m)]), cum[(nic, m)]))
        yield conform(
            pl.DataFrame(
                rows,
                schema=["ts", "device", "port", "qual", "metric", "value", "raw"],
                orient="row",
            )
        )


def run(frames, config=None):
    p = Pipeline(TOPO, config or Config(), rollup_s=None)
    # the real pipeline, with the detector this file is about
    p.detectors = [d for d in p.detectors if d.name == "transport_errors"]
    for f in frames:
        p.ingest(f)
        p.advance(int(f["ts"].max()) - p.engine.lateness_ns())
    p.finish()
    return p


def found(p):
    return [a for a in p.all_alerts() if a.name == "TransportErrors"]


def sick(a, b, rates=FAULT):
    return lambda t, nic: rates if nic == SICK and a < t <= b + 1e-9 else {}


def test_sick_nic_found_with_labels_and_onset():
    p = run(ticks(18, sick(12.0, 15.0)))
    (a,) = found(p)
    assert a.labels == {
        "alertname": "TransportErrors",
        "severity": "warning",
        "node": "gpu-002",
        "nic": "mlx5_1",
        "rail": "0",
        "job": "llm",
        "tenant": "a",
    }
    ttd = (a.starts_at - (T0 + 12 * S)) / 1e9
    assert 1.9 <= ttd <= 2.3, ttd
    assert a.ends_at and T0 + 15 * S < a.ends_at < T0 + 18 * S
    ev = a.annotations["evidence"]
    assert "NAK sequence errors" in ev and "local ACK timeouts" in ev and "threshold 5/s" in ev
    assert "30x baseline: own" in ev and "fabric median" in ev


def test_errors_alone_fire_while_the_baseline_is_learning():
    # 3 s into the run no NIC has its own out_of_sequence baseline yet: retransmissions and
    # timeouts alone still make the case
    (a,) = found(run(ticks(7, sick(3.0, 6.0))))
    assert (a.labels["node"], a.labels["nic"]) == SICK
    assert "not judged: its own baseline is still learning" in a.annotations["evidence"]


def test_out_of_sequence_alone_against_the_baselines():
    # reordering 100x its usual rate, no retransmissions: judged once the NIC knows its normal;
    # a NIC that always reorders 10x more than its peers is not a fault
    only_oos = {"nic_out_of_sequence": 2_500.0}
    noisy = ("gpu-003", "mlx5_0")
    p = run(ticks(16, sick(12.0, 15.0, only_oos), oos=lambda n: 250.0 if n == noisy else OOS_PPS))
    (a,) = found(p)
    assert (a.labels["node"], a.labels["nic"]) == SICK
    assert "retransmission errors 0.0/s" in a.annotations["evidence"]


def test_a_fault_does_not_become_its_own_baseline():
    # a 12 s fault with a 3 s baseline time constant: the NIC's baseline is frozen while it is
    # suspect, so the alert holds for the whole fault instead of fading as the EWMA catches up
    cfg = Config(detectors={"transport_errors": TransportErrorsConfig(baseline_tau_s=3.0)})
    only_oos = {"nic_out_of_sequence": 2_500.0}
    (a,) = found(run(ticks(26, sick(12.0, 24.0, only_oos)), cfg))
    assert a.ends_at > T0 + 24 * S


def test_healthy_reordering_and_stray_errors_do_not_fire():
    assert found(run(ticks(20, seed=7))) == []


def test_counter_clears_do_not_fire():
    # a node's agent restarts the driver: every counter of its NICs drops to 0 at 5 s
    clears = {(5.0, "gpu-001"), (14.0, "gpu-004")}
    p = run(ticks(18, clears=clears))
    assert found(p) == []
    assert p.stats.get("counter_resets") > 0


def test_config_validation():
    cfg = config_from_dict({"detectors": {"transport_errors": {"error_min_rate": 2}}})
    assert cfg.detectors["transport_errors"].error_min_rate == 2
    with pytest.raises(ConfigError, match="exit_ratio"):
        config_from_dict({"detectors": {"transport_errors": {"exit_ratio": 0}}})
    with pytest.raises(ConfigError, match="oos_factor"):
        TransportErrorsConfig(oos_factor=0.5)


# --- cadence: the same rules at any sampling interval ---------------------------------------


def nic_series(interval, fault=None, sick=SICK, oos_fault=0.0, jitter=0.0, lost=frozenset()):
    """Every NIC's transport counters read every ``interval`` s; ``fault`` = (from, until,
    {metric: extra per second}) on ``sick``."""
    out = []
    for k, nic in enumerate(NICS):
        for m in METRICS:
            base = OOS_PPS if m == "nic_out_of_sequence" else 0.0
            extra = []
            if fault is not None and nic == sick and fault[2].get(m):
                extra = [(fault[0], fault[1], fault[2][m])]
            out.append(
                cadence.Series(
                    *nic,
                    m,
                    rate=cadence.Rate(base, extra),
                    interval=interval,
                    phase=0.003 + 0.37 * k % interval,  # NICs are read out of step
                    jitter=jitter,
                    lost=lost,
                )
            )
    return out


ONLY = ("transport_errors",)


def test_field_report_nic_counters_every_second():
    # 40 NAK sequence errors and 15 ACK timeouts a second for half a minute, NIC counters read
    # every second (ethtool / hw_counters polling): one alert, in time, for the whole fault
    fault = (10.0, 40.0, {"nic_packet_seq_err": 40.0, "nic_local_ack_timeout": 15.0})
    r = cadence.run(TOPO, nic_series(1.0, fault), 50.0)  # every detector
    (a,) = r.named("TransportErrors")
    assert (a.labels["node"], a.labels["nic"]) == SICK
    assert 0 < cadence.ttd(a, 10.0) <= cadence.bound(1.0)
    assert cadence.still_firing_or_ended_after(a, 40.0)
    assert a.ends_at and a.ends_at < cadence.T0 + 50 * S


@pytest.mark.parametrize("interval", cadence.CADENCES)
@pytest.mark.parametrize(
    "rates",
    [
        {"nic_packet_seq_err": 40.0, "nic_local_ack_timeout": 15.0},
        {"nic_rnr_nak_retry_err": 8.0},
        {"nic_out_of_sequence": 2_500.0},
    ],
    ids=["naks+timeouts", "rnr-retries", "out-of-sequence"],
)
def test_one_fault_one_alert_at_any_cadence(interval, rates):
    # out_of_sequence alone needs the NIC's own baseline: 10 s of history
    onset, until, seconds = cadence.timeline(interval, learn_s=12.0)
    r = cadence.run(
        TOPO, nic_series(interval, (onset, until, rates), jitter=0.2), seconds, only=ONLY
    )
    (a,) = r.named("TransportErrors")
    assert (a.labels["node"], a.labels["nic"]) == SICK
    assert 0 < cadence.ttd(a, onset) <= cadence.bound(interval), cadence.ttd(a, onset)
    assert cadence.still_firing_or_ended_after(a, until)
    assert a.ends_at, "cleared once the fault ended"


@pytest.mark.parametrize("interval", cadence.CADENCES)
def test_healthy_nics_never_fire_at_any_cadence(interval):
    # stray errors (one every few seconds) and a NIC that always reorders 10x its peers
    noisy = ("gpu-003", "mlx5_0")
    series = [
        dataclasses.replace(s, rate=cadence.Rate(0.3))
        if s.metric == "nic_packet_seq_err"
        else dataclasses.replace(s, rate=cadence.Rate(250.0))
        if (s.device, s.port) == noisy and s.metric == "nic_out_of_sequence"
        else s
        for s in nic_series(interval, jitter=0.2)
    ]
    r = cadence.run(TOPO, series, cadence.timeline(interval, learn_s=12.0)[2], only=ONLY)
    assert r.named("TransportErrors") == []


@pytest.mark.parametrize("interval", cadence.CADENCES)
def test_a_lost_sample_does_not_split_the_alert(interval):
    onset, until, seconds = cadence.timeline(interval)
    fault = (onset, until, {"nic_packet_seq_err": 40.0})
    lost = frozenset({round(k * interval, 6) for k in range(4, 400, 7)})  # one in seven
    r = cadence.run(TOPO, nic_series(interval, fault, lost=lost), seconds, only=ONLY)
    (a,) = r.named("TransportErrors")
    assert 0 < cadence.ttd(a, onset) <= cadence.bound(interval) + interval
    assert cadence.still_firing_or_ended_after(a, until)


# --- mild faults, reordering bursts, counter clears and agent gaps at the usual NIC cadences ---

# the evaluation matrix's mildest fault, 10 transport events/s: 87 % of them out-of-sequence
# packets (lost in the NIC's usual reordering), ~1.3 retransmissions or timeouts a second
MILD = {
    "nic_out_of_sequence": 8.7,
    "nic_packet_seq_err": 0.87,
    "nic_local_ack_timeout": 0.12,
    "nic_implied_nak_seq_err": 0.29,
}
HEALTHY_ERRORS = 0.05  # NAK sequence errors a second on every NIC: one every 20 s


def healthy_series(interval, fault=None, jitter=0.2, lost=frozenset()):
    """``nic_series`` with every NIC retransmitting now and then, as healthy NICs do."""
    return [
        dataclasses.replace(
            s,
            rate=cadence.Rate(HEALTHY_ERRORS, s.rate.extra if s.rate is not None else ()),
        )
        if s.metric == "nic_packet_seq_err"
        else s
        for s in nic_series(interval, fault, jitter=jitter, lost=lost)
    ]


@pytest.mark.parametrize("interval", [1.0, 2.0])
def test_a_mild_fault_is_found_in_time_once(interval):
    # ~1.3 retransmissions a second are 25x a healthy NIC's: found by their count over the
    # evidence window against the NIC's baseline, long before their rate reaches 5/s
    onset = 30.0
    until = onset + 20.0
    r = cadence.run(TOPO, healthy_series(interval, (onset, until, MILD)), until + 15.0, only=ONLY)
    (a,) = r.named("TransportErrors")  # one alert for the whole fault: no flapping
    assert (a.labels["node"], a.labels["nic"]) == SICK
    assert 0 < cadence.ttd(a, onset) <= cadence.bound(interval), cadence.ttd(a, onset)
    assert cadence.still_firing_or_ended_after(a, until)
    assert a.ends_at and a.ends_at < cadence.T0 + round((until + 15.0) * S)
    ev = a.annotations["evidence"]
    assert "rule=error_baseline" in ev and "against a baseline of" in ev and "rail peers" in ev


@pytest.mark.parametrize("interval", [0.1, 1.0, 2.0])
def test_reordering_bursts_clears_and_gaps_raise_nothing(interval):
    # adaptive routing reorders 12x a NIC's usual rate for 4 s (its bursts reach ~10x, a little
    # more as counted); one loss costs a NIC a burst of 18 retransmissions in 0.3 s (many, but
    # one moment's: no rate); a node's counters are cleared;
    # another node's agent is silent for 5 s and then reports everything it missed at once
    burst, lossy = ("gpu-003", "mlx5_1"), ("gpu-003", "mlx5_0")
    cleared, gap = "gpu-001", "gpu-004"
    clear_at, gap_from = 22.0, 30.0
    lost = frozenset(round(k * interval, 6) for k in range(int(gap_from / interval), 10**5))
    lost = frozenset(t for t in lost if t < gap_from + 5.0)
    series = []
    for s in healthy_series(interval):
        if (s.device, s.port) == burst and s.metric == "nic_out_of_sequence":
            s = dataclasses.replace(s, rate=cadence.Rate(OOS_PPS, [(25.0, 29.0, 11 * OOS_PPS)]))
        if (s.device, s.port) == lossy and s.metric == "nic_packet_seq_err":
            s = dataclasses.replace(s, rate=cadence.Rate(HEALTHY_ERRORS, [(33.0, 33.3, 60.0)]))
        if s.device == cleared:
            s = Cleared(
                **{f.name: getattr(s, f.name) for f in dataclasses.fields(s)}, clear_at=clear_at
            )
        if s.device == gap:
            s = dataclasses.replace(s, lost=lost)
        series.append(s)
    r = cadence.run(TOPO, series, 45.0, only=ONLY)
    assert r.named("TransportErrors") == []
    assert r.pipeline.stats.get("counter_resets") > 0


@dataclasses.dataclass(frozen=True)
class Cleared(cadence.Series):
    """A counter cleared to 0 at ``clear_at`` (a driver reload): it counts again from there."""

    clear_at: float = 0.0

    def value(self, t):
        v, raw = super().value(t)
        if t < self.clear_at or self.rate is None:
            return v, raw
        n = round(self.rate.integral(t)) - round(self.rate.integral(self.clear_at))
        return float(n), n


# --- a restart mid-fault ----------------------------------------------------------------------


def run_restarted(frames, cuts, after=None):
    """``run``, stopped before each frame in ``cuts`` and started again as the service does:
    each part's state through the product's checkpoint codec, laid over a pipeline built
    anew from the configuration ``after`` (the same if none)."""
    p = Pipeline(TOPO, Config(), rollup_s=None)
    p.detectors = [d for d in p.detectors if d.name == "transport_errors"]
    for i, f in enumerate(frames):
        if i in cuts:
            p = restart_pipeline(p, after, only=("transport_errors",))
        p.ingest(f)
        p.advance(int(f["ts"].max()) - p.engine.lateness_ns())
    p.finish()
    return p


def test_a_checkpoint_taken_mid_fault_carries_on():
    """Stopped at 13 s (the errors under way, not yet sustained) and at 14.5 s (the alert
    firing), started again each time: the one alert of the uninterrupted run, same startsAt,
    same end; the baselines learned before the stops still judge (same evidence)."""
    frames = list(ticks(18, sick(12.0, 15.0)))
    whole = found(run(frames))
    assert len(whole) == 1
    cut = found(run_restarted(frames, {130, 145}))
    assert [a.to_json() for a in cut] == [a.to_json() for a in whole]


def test_a_restored_detector_takes_todays_sustain():
    """Restarted at 13 s, 1 s into the errors, with ``sustain_s`` 3 s instead of 2: the
    restored episode keeps its start and the alert waits for today's 3 s (``Sustain.PARAMS``)."""
    frames = list(ticks(18, sick(12.0, 15.0)))
    cfg = Config(detectors={"transport_errors": TransportErrorsConfig(sustain_s=3.0)})
    p = run_restarted(frames, {130}, after=cfg)
    (det,) = p.detectors
    assert det.sustain.sustain_s == 3.0
    (a,) = found(p)
    ttd = (a.starts_at - (T0 + 12 * S)) / 1e9
    assert 2.9 <= ttd <= 3.3, ttd
