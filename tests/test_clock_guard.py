"""A device whose clock lies cannot move telemetry time (detectors/clock_guard.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import orjson
import polars as pl
import pytest

from detectors.clock_guard import ClockGuard
from rocewatch.replay import replay

if TYPE_CHECKING:
    from tests.conftest import SimCache  # the session's recordings fixture

S = 1_000_000_000
YEAR = 365 * 86_400 * S
DAY = 86_400 * S


def frame(ts: list[int], devices: list[str]) -> pl.DataFrame:
    return pl.DataFrame({"ts": ts, "device": devices}, schema={"ts": pl.Int64, "device": pl.String})


def test_a_lying_device_is_set_aside_and_never_moves_the_reference() -> None:
    g = ClockGuard(max_ahead_s=30)
    devs = [f"gpu-{i:03d}" for i in range(8)]
    assert g.filter(frame([100 * S] * 8, devs)).height == 8
    # one snapshot a year ahead in the middle of an honest batch
    out = g.filter(frame([101 * S] * 3 + [101 * S + YEAR] + [101 * S] * 4, devs))
    assert out.height == 7 and YEAR + 101 * S not in out["ts"].to_list()
    assert g.reference == 101 * S
    # the liar goes on lying, record by record, while the fabric goes on: still set aside
    for k in range(2, 6):
        assert g.filter(frame([100 * S + k * S + YEAR], ["gpu-003"])).height == 0
        assert g.filter(frame([100 * S + k * S] * 7, devs[:3] + devs[4:])).height == 7
    assert g.reference == 105 * S
    assert g.stats.get("clock_ahead_samples") == 5
    assert g.stats.get("clock_jumps_accepted") == 0
    # its clock is fixed: it is heard again, and the guard is back on its quick path
    assert g.filter(frame([106 * S], ["gpu-003"])).height == 1
    assert not g._latest


def test_time_that_moves_for_every_device_at_once_is_accepted_without_loss() -> None:
    g = ClockGuard(max_ahead_s=30)
    devs = ["a", "b", "c"]
    g.filter(frame([10 * S] * 3, devs))
    # a recording that resumes after a ten-minute outage, in a chunk that straddles it
    out = g.filter(frame([11 * S] * 3 + [611 * S] * 3, devs * 2))
    assert sorted(out["ts"].to_list()) == [11 * S] * 3 + [611 * S] * 3
    assert g.reference == 611 * S and g.stats.get("clock_jumps_accepted") == 1


def test_a_single_device_source_resumes_after_a_gap_on_its_second_batch() -> None:
    g = ClockGuard(max_ahead_s=30)
    g.filter(frame([10 * S], ["sw"]))
    assert g.filter(frame([500 * S], ["sw"])).height == 0  # one sample proves nothing
    out = g.filter(frame([501 * S], ["sw"]))
    assert out["ts"].to_list() == [500 * S, 501 * S]  # the held one is released, in order
    assert g.reference == 501 * S


def test_samples_far_behind_are_counted_and_ahead_of_the_wall_clock_set_aside() -> None:
    wall = [1000 * S]
    g = ClockGuard(max_ahead_s=30, max_behind_s=600, wall_ns=lambda: wall[0])
    assert g.filter(frame([990 * S, 995 * S], ["a", "b"])).height == 2
    out = g.filter(frame([996 * S, 996 * S - DAY, 1100 * S], ["a", "b", "c"]))
    assert out["ts"].to_list() == [996 * S]
    assert g.stats.get("clock_behind_samples") == 1
    assert g.stats.get("clock_ahead_samples") == 1
    assert g.stats.detail["clock_off_devices"] == {"b behind": 1, "c ahead": 1}


def test_a_first_batch_with_a_liar_starts_from_the_batch_median() -> None:
    g = ClockGuard()
    out = g.filter(frame([5 * S, 5 * S, 5 * S + YEAR], ["a", "b", "c"]))
    assert out["ts"].to_list() == [5 * S, 5 * S]


def test_admit_on_arrays_without_devices() -> None:
    g = ClockGuard(max_ahead_s=1)
    assert g.admit(np.array([S, 2 * S])).all()
    assert g.admit(np.array([3 * S, 3 * S + YEAR])).tolist() == [True, False]


# the golden storm recording (tests/golden/storm): simulated and replayed once per run
STORM = ("default", 8, 20.0, 5)


def _key(a: dict) -> tuple:
    return (tuple(sorted(a["labels"].items())), a["startsAt"], a["status"])


@pytest.mark.slow  # replays an 8-node recording (and shares the run's clean replay of it)
def test_a_snapshot_a_year_ahead_and_one_a_day_behind_change_no_alert(
    recordings: SimCache, tmp_path: Path
) -> None:
    storm = recordings.scenario(*STORM)
    _, clean = recordings.replay(*STORM)
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in storm.iterdir():
        if f.is_file():
            (bad / f.name).write_bytes(f.read_bytes())
    lines = (storm / "nic.jsonl").read_bytes().splitlines(keepends=True)
    ahead = json.loads(lines[len(lines) // 3])
    ahead["timestamp"] += YEAR
    behind = json.loads(lines[len(lines) // 2])
    behind["timestamp"] -= DAY
    lines.insert(len(lines) // 3 + 1, orjson.dumps(ahead) + b"\n")
    lines.insert(len(lines) // 2 + 1, orjson.dumps(behind) + b"\n")
    (bad / "nic.jsonl").write_bytes(b"".join(lines))

    res = replay(bad, tmp_path / "out")
    assert sorted(map(_key, res.alerts)) == sorted(map(_key, clean.alerts))
    assert res.actions == clean.actions
    # the two snapshots and nothing else are set aside: every other sample was used
    assert res.stats.get("clock_ahead_samples", 0) > 0
    assert res.stats.get("clock_behind_samples", 0) > 0
    per_snapshot = res.stats["clock_ahead_samples"]
    assert res.samples == clean.samples + 2 * per_snapshot - (
        res.stats["clock_ahead_samples"] + res.stats["clock_behind_samples"]
    )
    assert res.stats.get("late_samples", 0) == clean.stats.get("late_samples", 0)
