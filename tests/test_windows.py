"""The window engine's fast paths give what the general Polars group-by gives."""

import numpy as np
import polars as pl

from detectors.state import NS, counter_timing
from detectors.windows import AGG_SCHEMA, WindowEngine, window_by_group_by
from rocewatch.core.model import SAMPLE_SCHEMA, SERIES_KEY
from rocewatch.sim import Simulator
from rocewatch.sim.scenarios import SCENARIOS
from tests import cadence
from tests.support.restart import restart_part


def reference(parts: list[pl.DataFrame]) -> pl.DataFrame:
    return window_by_group_by(parts).sort(SERIES_KEY)


def run(batch: int) -> tuple[WindowEngine, int]:
    """Feed a small simulated fabric, ``batch`` ticks per frame; check every 2-step window."""
    sim = Simulator(SCENARIOS["default"](nodes=4, duration_s=2.0, seed=1))
    eng = WindowEngine()
    frames = list(sim.ticks())
    checked = 0
    for i in range(0, len(frames), batch):
        f = pl.concat(frames[i : i + batch])
        eng.add(f)
        for step in eng.close_until(int(f["ts"].max()) - eng.lateness_ns()):
            eng.enter(step)
            if len(eng.history) < 2:
                continue
            for metric in eng.series.metrics:
                parts = [s.get(metric) for s in list(eng.history)[-2:]]
                parts = [p for p in parts if p.height]
                if len(parts) < 2:
                    continue
                got = eng.window(metric, 0.2)
                assert got.schema == pl.Schema(AGG_SCHEMA)
                assert got.sort(SERIES_KEY).equals(reference(parts)), metric
                checked += 1
    return eng, checked


def test_two_step_windows_match_the_group_by():
    eng, checked = run(batch=1)  # one sample per series and step: rows taken as they are
    assert checked > 100
    # a restored engine (its state through the checkpoint codec, into an engine built anew)
    # has no series positions: it takes the general path, same windows
    restored = restart_part(eng, WindowEngine())
    assert all(s.positions is None for s in restored.history)
    for metric in ("pfc_rx_pause_us", "queue_depth_bytes", "nic_link_speed_mbps"):
        a, b = eng.window(metric, 0.2), restored.window(metric, 0.2)
        assert a.height and a.sort(SERIES_KEY).equals(b.sort(SERIES_KEY))


def test_several_samples_per_step_are_reduced():
    ms = 1_000_000
    rows = [
        (0, "leaf-0", "Ethernet1", "3", "pfc_rx_pause_us", 0.0, 0),
        (110 * ms, "leaf-0", "Ethernet1", "3", "pfc_rx_pause_us", 0.0, 1_000),
        (150 * ms, "leaf-0", "Ethernet1", "3", "pfc_rx_pause_us", 0.0, 46_000),
        (160 * ms, "leaf-0", "Ethernet1", "3", "queue_depth_bytes", 500.0, None),
        (170 * ms, "leaf-0", "Ethernet1", "3", "queue_depth_bytes", 200.0, None),
    ]
    eng = WindowEngine()
    eng.add(pl.DataFrame(rows, schema=list(SAMPLE_SCHEMA.items()), orient="row"))
    steps = eng.close_until(300 * ms)
    by_start = {s.start: s for s in steps}
    pause = by_start[100 * ms].get("pfc_rx_pause_us").row(0, named=True)
    assert pause["n"] == 2 and pause["delta"] == 46_000.0
    assert abs(pause["dt"] - 0.15) < 1e-12
    assert pause["last"] == 45_000 / 0.04 and pause["max"] == pause["last"]
    assert pause["min"] == 1_000 / 0.11 and pause["ts"] == 150 * ms
    depth = by_start[100 * ms].get("queue_depth_bytes").row(0, named=True)
    assert depth["n"] == 2 and depth["delta"] is None and depth["dt"] is None
    assert (depth["last"], depth["max"], depth["min"]) == (200.0, 500.0, 200.0)


def test_coded_samples_give_the_same_steps_and_checkpoint_as_strings():
    """The Kafka readers feed the engine samples whose key is coded (``wire.coded_frames``):
    the steps are the ones the strings give; a checkpoint taken with coded samples buffered
    holds strings, and the restored engine takes coded samples again."""
    from rocewatch import wire

    sim = Simulator(SCENARIOS["default"](nodes=4, duration_s=2.0, seed=1))
    ticks = list(sim.ticks())
    plain, coded = WindowEngine(), WindowEngine()
    got: dict[str, list[pl.DataFrame]] = {"plain": [], "coded": []}
    half = len(ticks) // 2
    for i, f in enumerate(ticks):
        if i == half:  # a checkpoint and restore mid-stream, samples still buffered
            assert coded.pending
            coded = restart_part(coded, WindowEngine())
            for p, _, _ in coded.pending:  # codes mean nothing in another process
                assert p["device"].dtype == pl.String and "sid" not in p.columns
        wm = int(f["ts"].max()) - plain.lateness_ns()
        plain.add(f)
        coded.add(wire.coded_frames([wire.parse(wire.encode(f))]))
        got["plain"] += [s.frame for s in plain.close_until(wm)]
        got["coded"] += [s.frame for s in coded.close_until(wm)]
    assert len(got["plain"]) > 10
    assert len(got["plain"]) == len(got["coded"])
    for a, b in zip(got["plain"], got["coded"], strict=True):
        assert a.schema == b.schema == pl.Schema(AGG_SCHEMA)
        assert a.sort(SERIES_KEY).equals(b.sort(SERIES_KEY))


def test_series_beyond_the_limit_are_dropped_and_counted():
    """Telemetry that names ever new series (a buggy agent) cannot grow the engine's tables
    without end: past ``max_series`` the samples of new series are dropped and counted, the
    series already admitted flow on, and the limit holds after a checkpoint round trip."""
    import pytest

    from detectors.windows import WindowConfig
    from rocewatch.core.errors import ConfigError

    ms = 1_000_000

    def batch(t: int, names: list[str]) -> pl.DataFrame:
        rows = []
        for n in names:  # one counter and one gauge per port
            rows.append((t * 100 * ms, "leaf-0", n, "3", "pfc_rx_pause_us", 0.0, t * 1000))
            rows.append((t * 100 * ms, "leaf-0", n, "3", "queue_depth_bytes", 1.0 * t, None))
        return pl.DataFrame(rows, schema=SAMPLE_SCHEMA, orient="row")

    eng = WindowEngine(WindowConfig(max_series=50))
    steady = [f"Ethernet{i}" for i in range(20)]  # 40 series
    refused = 0
    seen: set[tuple[str, str]] = set()
    for t in range(12):
        if t == 6:
            # restored mid-flood, into an engine built anew from the same configuration (the
            # counts are the pipeline's state: its stats carry on)
            eng = restart_part(eng, WindowEngine(WindowConfig(max_series=50), eng.stats))
        # every tick, 15 ports never seen before (30 series) besides the steady ones
        flood = [f"Bogus{t}-{j}" for j in range(15)]
        eng.add(batch(t, steady + flood))
        for step in eng.close_until(t * 100 * ms):
            eng.enter(step)
            if step.frame is not None:
                seen |= set(step.frame.select("port", "metric").iter_rows())
        refused += 2 * 15
    steps = [s for s in eng.close_until(12 * 100 * ms)] + eng.finish()
    for s in steps:
        if s.frame is not None:
            seen |= set(s.frame.select("port", "metric").iter_rows())
    # the first batch: room for 10 series after the 40 steady ones, the first 5 bogus ports'.
    # The restore: the admitted set is rebuilt from the counters the rate state kept (25), so
    # the steady ports' gauges come back in (they are flowing) and the 5 series of room left
    # go to the first new ones of the next batch closed (tick 5's, pending at the checkpoint)
    refused -= 10 + 5
    assert eng.stats.get("series_over_limit") == refused
    admitted = {p for p, _ in seen}
    # (Bogus5-2 got in with its counter only, whose first reading makes no row)
    bogus = {f"Bogus0-{j}" for j in range(5)} | {f"Bogus5-{j}" for j in range(2)}
    assert admitted == set(steady) | bogus
    assert len(eng.series) <= 50 and len(eng.rates) <= 50
    with pytest.raises(ConfigError, match="max_series"):
        WindowConfig(max_series=0)


def test_step_rows_carry_each_series_sampling_interval() -> None:
    """What the detectors judge durations by (``state.counter_timing``): a counter read every
    50 ms has two samples in a 0.1 s step (dt 0.1 s, n 2: a 50 ms interval), one read every
    second a row in one step of ten (dt 1 s, n 1); gauges carry no dt."""
    series = [
        cadence.Series("int-0", "Ethernet1", "queue_tx_pkts", rate=cadence.Rate(1000.0)),
        cadence.Series("leaf-0", "Ethernet1", "pfc_rx_pause_us", rate=cadence.Rate(500.0)),
        cadence.Series("leaf-0", "Ethernet1", "queue_depth_bytes", gauge=lambda t: 2e4),
    ]
    series = [series[0].every(0.05), series[1].every(1.0), series[2].every(1.0)]
    eng = WindowEngine()
    rows: dict[str, list[tuple[int, int, float | None]]] = {}
    for f in cadence.frames(series, 6.0):
        eng.add(f)
        for step in eng.close_until(int(f["ts"].max()) - eng.lateness_ns()):
            for metric, part in step.by_metric.items():
                iv, held = counter_timing(part)
                rows.setdefault(metric, []).append((int(iv[0]), int(held[0]), part["dt"][0]))
    fast, slow, gauge = rows["queue_tx_pkts"], rows["pfc_rx_pause_us"], rows["queue_depth_bytes"]
    assert np.allclose([iv for iv, _, _ in fast[1:-1]], 0.05 * NS, rtol=1e-3)
    assert np.allclose([held for _, held, _ in fast[1:-1]], 0.1 * NS, rtol=1e-3)
    assert len(slow) == 5 and np.allclose([iv for iv, _, _ in slow], NS, rtol=1e-3)
    assert all(dt is None for _, _, dt in gauge) and all(iv == 0 for iv, _, _ in gauge)


def test_a_state_of_another_step_length_is_refused_not_laid_over():
    """An engine's state holds steps of its step length: restored into an engine built with
    another ``window.step_s`` it is refused (``StateMismatch``: the caller starts afresh), and
    the engine is left as built."""
    import pytest

    from detectors.windows import WindowConfig
    from rocewatch.core.state import StateMismatch

    eng, _ = run(batch=1)
    assert eng.history
    other = WindowEngine(WindowConfig(step_s=0.2))
    with pytest.raises(StateMismatch, match="step_s changed"):
        restart_part(eng, other)
    assert not other.history and not other.pending and other.closed_ns is None
