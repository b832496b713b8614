import polars as pl
import pytest

from detectors.rates import RateEngine
from rocewatch.core.model import SAMPLE_SCHEMA

S = 1_000_000_000


def frame(rows):
    return pl.DataFrame(rows, schema=list(SAMPLE_SCHEMA.items()), orient="row")


def c(ts, raw, metric="m", port="p"):
    return (ts, "dev", port, "", metric, float(raw), raw)


def test_rates_resets_wraps_duplicates_and_stale():
    e = RateEngine()
    out = e.apply(frame([c(0, 100), c(S, 300), c(S, 300), c(2 * S, 50)]))
    assert out["delta"].to_list() == [200.0, 50.0]  # the drop to 50 is a reset: 50 since it
    assert out["reset"].to_list() == [False, True]
    assert e.stats.get("duplicate_samples") == 1
    top = 2**64 - 1000
    out = e.apply(frame([c(0, top, "w"), c(S, 500, "w")]))
    assert out["delta"].to_list() == [1500.0]  # wrapped, exact
    assert e.stats.get("counter_wraps") == 1
    out = e.apply(frame([c(S // 2, 200), c(3 * S, 150)]))  # an old sample arrives late
    assert e.stats.get("stale_samples") == 1
    assert out["delta"].to_list() == [100.0]
    assert out["value"].to_list() == [100.0]


def test_gap_gives_average_rate_and_is_counted():
    e = RateEngine()
    out = e.apply(frame([c(0, 0), c(60 * S, 600)]))
    assert out["value"].to_list() == pytest.approx([10.0])
    assert e.stats.get("series_gaps") == 1


def test_gauges_pass_through_and_out_of_order_batches():
    e = RateEngine()
    rows = [(S, "dev", "p", "", "g", 7.0, None), c(2 * S, 20), c(S, 10)]
    out = e.apply(frame(rows))
    g = out.filter(pl.col("metric") == "g")
    assert g["value"].to_list() == [7.0] and g["delta"].to_list() == [None]
    assert out.filter(pl.col("metric") == "m")["delta"].to_list() == [10.0]


def test_steady_batches_of_the_same_series():
    # every batch holds each known series once (the usual step), in varying row order
    e = RateEngine()
    e.apply_narrow(frame([c(0, 100, port="a"), c(0, 10, port="b")]))
    out = e.apply_narrow(frame([c(S, 10, port="b"), c(S, 300, port="a")]))
    got = dict(zip(out["i"].to_list(), out["delta"].to_list(), strict=True))
    assert got == {0: 0.0, 1: 200.0}
    out = e.apply_narrow(frame([c(2 * S, 50, port="a"), c(2 * S, 20, port="b")]))
    assert sorted(out["delta"].to_list()) == [10.0, 50.0]  # a was reset: 50 since it
    assert e.stats.get("counter_resets") == 1
    # one series' reading is not newer than its last one: dropped, the other goes on
    out = e.apply_narrow(frame([c(2 * S, 60, port="a"), c(3 * S, 25, port="b")]))
    assert e.stats.get("stale_samples") == 1
    assert out["delta"].to_list() == [5.0] and out["i"].to_list() == [1]
    out = e.apply_narrow(frame([c(3 * S, 80, port="a"), c(4 * S, 30, port="b")]))
    assert sorted(out["delta"].to_list()) == [5.0, 30.0]  # a: 80 - 50
