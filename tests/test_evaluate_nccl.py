"""The NCCL golden cases (rocewatch/evaluate/nccl.py), replayed by one parametrised test: each
simulated with its jobs' NCCL Inspector, NCCL_DEBUG and CoMMA output, replayed, scored against
the simulator's truth, and checked for what a user relies on (the cause, the rank named, no
wrong drain, the storm's inhibition)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocewatch.evaluate.nccl import NCCL_CASES, NcclCase, nccl_table, run_nccl_case

pytestmark = pytest.mark.slow  # each simulates and replays a 4-node, 12 s scenario (3-6 s)


@pytest.mark.parametrize("case", NCCL_CASES, ids=[c.name for c in NCCL_CASES])
def test_nccl_case(case: NcclCase, tmp_path: Path) -> None:
    r = run_nccl_case(case, tmp_path)
    failed = [(c, seen) for c, ok, seen in r.checks if not ok]
    assert not failed, failed
    assert len(r.checks) >= 4
    # scored like the default suite: the fault found, nothing else blamed, no wrong drain
    assert all(r.score.detected.values()) and r.score.detected
    assert r.score.fp == {}, r.score.false_positives
    assert r.score.wrong_drains == []
    if case.fault == "storm":
        assert r.score.inhibited >= 1  # the job's alerts, held by the storm


def test_the_report_table_lists_every_check() -> None:
    rep = {
        "cases": [
            {"name": "x", "ok": False, "seconds": 1.0, "checks": [
                {"check": "a", "ok": True, "seen": ""}, {"check": "b", "ok": False, "seen": "z"}
            ]}
        ],
        "kinds": {"SlowRank": {"faults": 1, "detected": 1, "recall": 1.0, "precision": 1.0,
                               "ttd_median_s": 3.75}},
    }  # fmt: skip
    t = nccl_table(rep)
    assert "x: FAILED" in t and "ok   a" in t and "FAIL b  [z]" in t and "SlowRank" in t
