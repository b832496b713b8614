"""`rocewatch evaluate`: score the detectors on labelled simulated scenarios.

Two suites: the default one (``suite``: every source every 100 ms, in process) and the matrix
(``matrix``, ``--matrix``: cadences, fabrics, vendor naming and fault magnitudes, each cell
replayed from its recording). Both score alerts against the simulator's ground truth by the
same rules (``scoring``); ``report`` and ``plot`` write what a run found, ``commands`` is the
CLI's side. docs/evaluation.md says what the figures mean.

The names below are the package's public surface (tests, the CLI, benchmarks).
"""

from rocewatch.evaluate.commands import run_evaluate, run_evaluate_matrix
from rocewatch.evaluate.matrix import (
    MAGNITUDES,
    MATRIX,
    Cell,
    cell_config,
    cell_report,
    matrix_report,
    run_cell,
    run_matrix,
    storm_origin,
)
from rocewatch.evaluate.report import markdown, matrix_table, summary_lines, text_table
from rocewatch.evaluate.scoring import (
    RunScore,
    S,
    aggregate,
    alert_views,
    hits,
    in_window,
    labels_match,
    late_bound,
    needed_sources,
    percentile,
    score_run,
)
from rocewatch.evaluate.suite import FULL_SUITE, QUICK_SUITE, Case, RunResult, evaluate, run_case

__all__ = [
    "FULL_SUITE",
    "MAGNITUDES",
    "MATRIX",
    "QUICK_SUITE",
    "Case",
    "Cell",
    "RunResult",
    "RunScore",
    "S",
    "aggregate",
    "alert_views",
    "cell_config",
    "cell_report",
    "evaluate",
    "hits",
    "in_window",
    "labels_match",
    "late_bound",
    "markdown",
    "matrix_report",
    "matrix_table",
    "needed_sources",
    "percentile",
    "run_case",
    "run_cell",
    "run_evaluate",
    "run_evaluate_matrix",
    "run_matrix",
    "score_run",
    "storm_origin",
    "summary_lines",
    "text_table",
]
