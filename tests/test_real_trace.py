"""The shared slice of a real production fabric (../shared/data/zhejiang): nothing in it is
known to be a fault, so replaying it must raise no alert."""

from __future__ import annotations

import shutil
from pathlib import Path

from rocewatch.replay import replay

TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "zhejiang"


def test_the_zhejiang_trace_replays_compressed_and_stays_silent(tmp_path: Path) -> None:
    assert (TRACE / "switch.jsonl.gz").exists(), f"the shared real trace is missing: {TRACE}"
    scenario = tmp_path / "zhejiang"
    scenario.mkdir()
    for name in ("topology.yaml", "switch.jsonl.gz"):
        shutil.copy(TRACE / name, scenario / name)
    res = replay(scenario, tmp_path / "out")
    # 2 leaves, 190 ports, ~12 minutes at ~0.5 s: every sample of it was read and used
    assert res.samples > 800_000
    assert res.alerts == [], [(a["labels"], a["annotations"].get("evidence")) for a in res.alerts]
    assert res.actions == []
    assert not res.stats.get("clock_ahead_samples") and not res.stats.get("late_samples")
    assert (tmp_path / "out" / "alerts.jsonl").read_bytes() == b""
