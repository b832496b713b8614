"""The `rocewatch evaluate` command (with ``--matrix``): run a suite, print and write reports."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rocewatch.evaluate.matrix import MATRIX, Cell, run_matrix
from rocewatch.evaluate.report import matrix_table, summary_lines, text_table, write_outputs
from rocewatch.evaluate.roce_config import config_lines, evaluate_config_faults
from rocewatch.evaluate.suite import FULL_SUITE, QUICK_SUITE, RunResult, evaluate


def run_evaluate_matrix(
    out: Path,
    as_json: bool,
    config_path: Path | None = None,
    jobs: int | None = None,
    only: str | None = None,
) -> int:
    """The `rocewatch evaluate --matrix` command."""
    import os

    cells: Sequence[Cell] = MATRIX
    if only:
        wanted = [w.strip() for w in only.split(",") if w.strip()]
        cells = [c for c in MATRIX if any(w in c.name for w in wanted)]
        if not cells:
            print(f"no matrix cell matches {only!r}", file=sys.stderr)
            return 2
    jobs = jobs or min(len(cells), os.cpu_count() or 1)

    def progress(n: int, total: int, c: dict[str, Any]) -> None:
        found = sum(k["detected"] for k in c["kinds"].values())
        n_faults = sum(k["faults"] for k in c["kinds"].values())
        print(
            f"[{n + 1}/{total}] {c['name']}: {found}/{n_faults} faults found, {c['alerts']} "
            f"alerts ({c['inhibited']} inhibited), healthy alerts {c['healthy_alerts']}, "
            f"wrong drains {c['wrong_drains']}, late {c['late']}, {c['seconds']} s",
            file=sys.stderr,
            flush=True,
        )

    print(f"evaluate --matrix: {len(cells)} cells in {jobs} process(es)", file=sys.stderr)
    rep = run_matrix(cells, config_path, jobs, progress)
    out.mkdir(parents=True, exist_ok=True)
    (out / "evaluation_matrix.json").write_text(json.dumps(rep, indent=2) + "\n")
    if as_json:
        print(json.dumps(rep, indent=2))
    else:
        print(matrix_table(rep))
        print(
            f"\n{len(cells)} cells in {rep['runtime_s']} s; wrote evaluation_matrix.json to {out}"
        )
    return 0


def run_evaluate(
    out: Path, as_json: bool, quick: bool, config_path: Path | None = None, verbose: bool = False
) -> int:
    """The `rocewatch evaluate` command."""
    from rocewatch.config import load_config

    if not verbose:  # the pipeline's per-decision log lines would bury the progress lines
        logging.getLogger().setLevel(logging.ERROR)
    config = load_config(config_path)
    cases = QUICK_SUITE if quick else FULL_SUITE

    def progress(i: int, r: RunResult) -> None:
        s = r.score
        found = sum(s.detected.values())
        print(
            f"[{i + 1}/{len(cases)}] {r.case.name}: {found}/{len(s.faults)} faults found, "
            f"{s.alerts} alerts ({sum(s.tp.values())} TP, {sum(s.fp.values())} FP, "
            f"{s.neutral} victims), {s.drains} drains ({len(s.wrong_drains)} wrong), "
            f"{r.seconds:.1f} s",
            file=sys.stderr,
            flush=True,
        )

    rep = {"suite": "quick" if quick else "full", **evaluate(cases, config, progress)}
    # the simulator's RoCE configuration faults: exactly their RoCEConfigMismatch alerts
    rep["roce_config"] = evaluate_config_faults(config)
    write_outputs(rep, out)
    if as_json:
        print(json.dumps(rep, indent=2))
    else:
        print(text_table(rep))
        print()
        print("\n".join(summary_lines(rep)))
        print("\n".join(config_lines(rep["roce_config"])))
        files = ", ".join(f"evaluation.{x}" for x in ("json", "md", "png"))
        print(f"\n{len(cases)} runs in {rep['runtime_s']} s; wrote {files} to {out}")
    return 0
