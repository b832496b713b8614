"""``Sustain`` at 0.1, 1 and 5 s sampling: the window engine closes 0.1 s steps, so a slower
series has a row in one step of ten or fifty. One fault must be one episode that fires in
time, does not flap, survives a missed sample and jitter, and clears once the fault ends."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from detectors.state import COLD, NS, Row, Sustain

STEP = NS // 10
T0 = 1_795_946_400 * NS
KEY = ("nic", "gpu-001", "mlx5_0")
FAULT = (10.0, 40.0)  # seconds after T0


def sample_times(
    interval: float, seconds: float, jitter: float, missed: Callable[[float], bool], seed: int
) -> list[int]:
    """Sample times (ns): every ``interval`` with uniform jitter of ``jitter`` intervals in
    all (half each side), those for which ``missed(nominal)`` holds left out."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(1, int(seconds / interval) + 1):
        nominal = k * interval
        if missed(nominal):
            continue
        off = float(rng.uniform(-jitter / 2, jitter / 2)) * interval
        out.append(T0 + round((nominal + off) * NS))
    return out


def run(
    interval: float,
    *,
    counter: bool = True,
    fault: tuple[float, float] = FAULT,
    seconds: float = 60.0,
    jitter: float = 0.2,
    missed: Callable[[float], bool] = lambda t: False,
    seed: int = 1,
    sustain: Sustain | None = None,
    tail: bool = True,
) -> list[tuple[int, int | None]]:
    """Drive ``Sustain`` step by step as a detector does; return (step end, firing ts or
    None) per step. A counter row says its rate over the sample's interval held (hot when
    the fault covered most of it); a gauge row is one reading (hot inside the fault)."""
    s = sustain or Sustain(sustain_s=2.0, gap_s=0.1, clear_s=0.5)
    a, b = (T0 + round(x * NS) for x in fault)
    times = sample_times(interval, seconds, jitter, missed, seed)
    by_step: dict[int, list[tuple[int, int]]] = {}
    prev = T0
    for t in times:
        by_step.setdefault((t - T0) // STEP, []).append((prev, t))
        prev = t
    out: list[tuple[int, int | None]] = []
    steps = round(seconds * 10) + (30 * round(interval * 10) if tail else 0)
    for i in range(steps + 1):
        start = T0 + i * STEP
        rows = []
        samples = by_step.get(i, [])
        if samples:
            lo, ts = samples[0][0], samples[-1][1]
            dt = ts - lo
            if counter:
                covered = max(0, min(ts, b) - max(lo, a))
                hot = covered >= 0.5 * dt
                rows = [Row(KEY, 1, ts, (), dt // len(samples), dt)] if hot else []
            elif a <= ts < b:
                rows = [Row(KEY, 1, ts, (), round(interval * NS), 0)]
        fired = s.update(start, start + STEP, rows)
        out.append((start + STEP, fired[0][1].ts if fired else None))
    return out


def episodes(trace: list[tuple[int, int | None]]) -> list[tuple[int, int, int]]:
    """(alert ts, first firing step end, last firing step end) per run of firing steps."""
    runs: list[tuple[int, int, int]] = []
    for end, ts in trace:
        if ts is None:
            continue
        if runs and runs[-1][2] == end - STEP and runs[-1][0] == ts:
            runs[-1] = (ts, runs[-1][1], end)
        else:
            runs.append((ts, end, end))
    return runs


def check_one_episode(
    trace: list[tuple[int, int | None]], interval: float, missed: int = 0
) -> None:
    """One episode that fires within the bound (plus an interval per sample ``missed`` before
    it fired) and clears soon after the fault ends."""
    a, b = (T0 + round(x * NS) for x in FAULT)
    (ep,) = episodes(trace)  # one alert, never resolved and re-raised while the fault lasts
    ts, first, last = ep
    ttd = (first - a) / NS
    assert ttd <= max(10.0, 3 * interval) + missed * interval, ttd  # in time at this cadence
    assert ttd >= 2.0 - 0.2 * interval  # held sustain_s first (jitter: its rows say so)
    assert a <= ts <= first
    # firing until the fault ends, cleared soon after it (clear_s and 2.5 intervals + jitter)
    assert last >= b
    assert (last - b) / NS <= 0.5 + 3.6 * interval + 0.2, (last - b) / NS


CADENCES = [0.1, 1.0, 5.0]


@pytest.mark.parametrize("interval", CADENCES)
@pytest.mark.parametrize("counter", [True, False], ids=["counter", "gauge"])
def test_one_fault_is_one_episode(interval: float, counter: bool) -> None:
    check_one_episode(run(interval, counter=counter), interval)


@pytest.mark.parametrize("interval", CADENCES)
@pytest.mark.parametrize("counter", [True, False], ids=["counter", "gauge"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_missed_sample_and_jitter_neither_restart_nor_clear(
    interval: float, counter: bool, seed: int
) -> None:
    # one sample lost before it fires, one while firing; every interval jittered by up to a
    # fifth
    lost = {round(FAULT[0] + interval, 6), round(FAULT[0] + 20.0, 6)}
    trace = run(interval, counter=counter, missed=lambda t: round(t, 6) in lost, seed=seed)
    check_one_episode(trace, interval, missed=1)


@pytest.mark.parametrize("interval", CADENCES)
def test_a_missed_sample_does_not_move_the_episode_start(interval: float) -> None:
    s = Sustain(sustain_s=20.0, gap_s=0.1, clear_s=0.5)  # still pending after the miss
    run(
        interval,
        counter=False,
        seconds=18.0,
        jitter=0.0,
        sustain=s,
        tail=False,
        missed=lambda t: abs(t - 10.0 - interval) < 1e-6,
    )
    (ep,) = s.episodes.values()
    assert abs(ep.since - (T0 + 10 * NS)) <= STEP  # where the first hot reading was


@pytest.mark.parametrize("interval", CADENCES)
def test_healthy_and_short_blips_never_fire(interval: float) -> None:
    assert episodes(run(interval, fault=(0.0, 0.0))) == []
    # a blip shorter than sustain_s, seen by a fast series, does not fire either
    if interval < 1.0:
        assert episodes(run(interval, fault=(10.0, 11.5))) == []


@pytest.mark.parametrize("interval", CADENCES)
def test_two_faults_far_apart_are_two_episodes(interval: float) -> None:
    gap = 0.5 + 3.0 * interval + 5.0  # longer than the clear time at this cadence
    trace = run(interval, fault=(10.0, 20.0 + 3 * interval), seconds=80.0)
    assert len(episodes(trace)) == 1
    end = 20.0 + 3 * interval + gap
    s = Sustain(sustain_s=2.0, gap_s=0.1, clear_s=0.5)
    run(interval, fault=(10.0, 20.0 + 3 * interval), seconds=end, sustain=s)
    assert s.episodes == {}  # the first cleared before a second could begin


def test_a_counter_row_that_spans_sustain_fires_at_once() -> None:
    # a rate measured over 5 s held over those 5 s: no need to wait for a second sample
    s = Sustain(sustain_s=2.0, gap_s=0.1, clear_s=0.5)
    ts = T0 + 5 * NS
    (fired,) = s.update(ts, ts + STEP, [Row(KEY, 1, ts, (), 5 * NS, 5 * NS)])
    assert fired[1].ts == ts and fired[1].since == T0


def test_unknown_interval_is_one_step() -> None:
    # rows without an interval: the 100 ms behaviour (a dip of one step tolerated)
    s = Sustain(sustain_s=0.5, gap_s=0.1, clear_s=0.2)
    for i in range(3):
        s.update(T0 + i * STEP, T0 + (i + 1) * STEP, [Row(KEY, 1, T0 + i * STEP, ())])
    for i in range(3, 6):  # 0.3 s without a row: past gap_s + 2.5 steps (0.35 s)? not yet
        s.update(T0 + i * STEP, T0 + (i + 1) * STEP, [])
    assert KEY in s.episodes
    s.update(T0 + 6 * STEP, T0 + 7 * STEP, [])
    assert KEY not in s.episodes  # 0.4 s without a row: gone, before it ever fired


def test_severity_escalates_at_a_slow_cadence() -> None:
    # warning rows every 5 s, then critical ones: one warning alert, then one critical alert
    s = Sustain(sustain_s=2.0, gap_s=0.1, clear_s=0.5)
    sev = []
    for k in range(1, 9):
        ts = T0 + k * 5 * NS
        level = 1 if k < 4 else 2
        out = s.update(ts, ts + STEP, [Row(KEY, level, ts, (), 5 * NS, 5 * NS)])
        sev.append(out[0][1].severity)
        for j in range(1, 50):  # the steps between samples, without rows
            assert s.update(ts + j * STEP, ts + (j + 1) * STEP, [])
    assert sev == ["warning"] * 3 + ["critical"] * 5


def test_matches_few_and_many_keys_agree() -> None:
    import polars as pl

    from detectors.state import matches

    f = pl.DataFrame(
        {
            "device": [f"leaf-{i % 7}" for i in range(200)],
            "port": [f"Ethernet1/{i % 13}" for i in range(200)],
            "qual": [str(i % 3) for i in range(200)],
        }
    )
    keys = [(f"leaf-{i}", f"Ethernet1/{i + 1}", "1") for i in range(6)] + [("nope", "x", "1")]
    for ks in (keys, [k[:2] for k in keys]):  # (device, port, qual) and (device, port)
        many = matches(f, ks)  # hashed
        few = np.zeros(f.height, dtype=bool)
        for k in ks:
            few |= matches(f, [k])  # scanned
        assert many.any() and (many == few).all()
    assert matches(f, keys).sum() < matches(f, [k[:2] for k in keys]).sum()


def test_a_sample_that_says_the_condition_ended_is_news_not_a_missed_sample() -> None:
    # 0.1 s steps. Before firing, a level-0 row (sampled, not hot) leaves only gap_s: two cold
    # readings restart the count, as at one step per sample; a silence of two steps does not
    s = Sustain(sustain_s=1.0, gap_s=0.1, clear_s=0.5)
    pattern = [1, 1, 1, 0, 0, 1, 1]
    for i, level in enumerate(pattern):
        s.update(T0 + i * STEP, T0 + (i + 1) * STEP, [Row(KEY, level, T0 + i * STEP, ())])
    assert s.episodes[KEY].since == T0 + 5 * STEP  # restarted at the hot row after the dip
    s = Sustain(sustain_s=1.0, gap_s=0.1, clear_s=0.5)
    for i, level in enumerate(pattern):
        rows = [Row(KEY, level, T0 + i * STEP, ())] if level else []  # not sampled instead
        s.update(T0 + i * STEP, T0 + (i + 1) * STEP, rows)
    assert s.episodes[KEY].since == T0
    # once firing, a COLD row (sampled, stay condition gone) clears after clear_s alone: a
    # series read every 5 s resolves at its first cold reading, not 13 s after its last warm one
    for told in (True, False):
        s = Sustain(sustain_s=2.0, gap_s=0.1, clear_s=0.5)
        ts = T0 + 5 * NS
        assert s.update(ts, ts + STEP, [Row(KEY, 1, ts, (), 5 * NS, 5 * NS)])
        nxt = T0 + 10 * NS
        rows = [Row(KEY, COLD, nxt, (), 5 * NS, 5 * NS)] if told else []
        s.update(nxt, nxt + STEP, rows)
        assert (KEY in s.episodes) is not told


def test_min_rows_keeps_one_slow_sample_from_firing_alone() -> None:
    # a rate over 5 s held over those 5 s; with min_rows=2 the next hot sample is needed
    for min_rows, fires_at in ((1, 1), (2, 2)):
        s = Sustain(sustain_s=2.0, gap_s=0.1, clear_s=0.5, min_rows=min_rows)
        fired = []
        for k in (1, 2):
            ts = T0 + k * 5 * NS
            if s.update(ts, ts + STEP, [Row(KEY, 1, ts, (), 5 * NS, 5 * NS)]):
                fired.append(k)
        assert fired[0] == fires_at
