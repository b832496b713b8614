"""The evaluation's reports: text and Markdown tables, the output files, where figures came from."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rocewatch.core.model import (
    ECN_CONGESTION,
    FLAKY_LINK,
    PCIE_DOWNGRADE,
    PFC_STORM,
    QUEUE_BUILDUP,
    STRAGGLER,
    TRANSPORT_ERRORS,
)


def generated() -> dict[str, Any]:
    """When, from which commit and on what machine the figures were made."""
    import contextlib
    import datetime
    import os
    import platform
    import subprocess

    def git(*args: str) -> str:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            return subprocess.run(
                ["git", *args],
                cwd=Path(__file__).resolve().parent,
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
        return ""

    commit = git("rev-parse", "--short", "HEAD") or None
    if commit and git("status", "--porcelain", "--untracked-files=no"):
        commit += "+dirty"  # figures of a tree with uncommitted changes
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit,
        "machine": f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        # other work on the machine slows the wall clock, not the CPU seconds
        "load_average_1m": round(os.getloadavg()[0], 1),
    }


def matrix_table(rep: Mapping[str, Any]) -> str:
    """The matrix as a text table: one row per cell, precision/recall per kind."""
    kinds = sorted({k for c in rep["cells"] for k in c["kinds"]})
    short = {
        PFC_STORM: "storm",
        FLAKY_LINK: "flaky",
        PCIE_DOWNGRADE: "pcie",
        ECN_CONGESTION: "ecn",
        QUEUE_BUILDUP: "queue",
        TRANSPORT_ERRORS: "transp",
        STRAGGLER: "strag",
    }
    header = ["cell", "nic/sw s", *(short.get(k, k) for k in kinds), "healthy", "wrong", "late"]
    rows = []
    for c in rep["cells"]:
        row = [c["name"], f"{c['nic_interval_s']:g}/{c['switch_interval_s']:g}"]
        for k in kinds:
            x = c["kinds"].get(k)
            row.append("" if x is None else f"{_fmt(x['precision'])}/{_fmt(x['recall'])}")
        row += [str(c["healthy_alerts"]), str(c["wrong_drains"]), str(c["late"])]
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(x.ljust(w) for x, w in zip(r, widths, strict=True)) for r in rows]
    out.append(
        f"worst precision {_fmt(rep['worst_precision'])}, worst recall {_fmt(rep['worst_recall'])}"
        f", healthy alerts {rep['healthy_alerts']}, wrong drains {rep['wrong_drains']}, "
        f"late {rep['late']} (P/R per kind; goal >= 0.95, 0, 0, 0)"
    )
    return "\n".join(out)


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}"


def table_rows(rep: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["kind", "faults", "found", "precision", "recall", "F1", "TTD median s", "TTD p95 s"]
    header += ["TP", "FP"]
    rows = []
    for kind, k in rep["kinds"].items():
        rows.append(
            [
                kind,
                str(k["faults"]),
                str(k["detected"]),
                _fmt(k["precision"]),
                _fmt(k["recall"]),
                _fmt(k["f1"]),
                _fmt(k["ttd_median_s"]),
                _fmt(k["ttd_p95_s"]),
                str(k["tp_alerts"]),
                str(k["fp_alerts"]),
            ]
        )
    for name, n in rep["alertnames"].items():
        if name in rep["kinds"]:
            continue
        tp, fp = str(n["tp_alerts"]), str(n["fp_alerts"])
        rows.append([f"({name})", "", "", _fmt(n["precision"]), "", "", "", "", tp, fp])
    o = rep["overall"]
    rows.append(
        [
            "all",
            str(o["faults"]),
            str(o["detected"]),
            _fmt(o["precision"]),
            _fmt(o["recall"]),
            _fmt(o["f1"]),
            "",
            "",
            str(o["tp_alerts"]),
            str(o["fp_alerts"]),
        ]
    )
    return header, rows


def text_table(rep: Mapping[str, Any]) -> str:
    header, rows = table_rows(rep)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def summary_lines(rep: Mapping[str, Any]) -> list[str]:
    fi = rep["fabric_incidents"]
    healthy = rep["healthy_alerts_by_alertname"]
    by_name = f" ({', '.join(f'{k} {v}' for k, v in healthy.items())})" if healthy else ""
    return [
        f"wrong-node drains: {rep['wrong_drains']} (of {rep['drains']} drains not refused)",
        f"alerts on healthy runs (all-reduce, MoE): {rep['healthy_alerts']}{by_name}",
        f"storm victims left neutral: {rep['overall']['neutral_victim_alerts']}; "
        f"FabricIncidents: {fi['total']} ({fi['outside_fault_windows']} outside any fault window)",
        "anchors: SONiC PFC watchdog 0.2 s; Minder precision 0.90 / F1 0.89, detects in 3.6-30 s",
    ]


def markdown(rep: Mapping[str, Any]) -> str:
    header, rows = table_rows(rep)
    out = [
        f"# rocewatch evaluation ({rep.get('suite', '')} suite)",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    out += [""] + [f"- {x}" for x in summary_lines(rep)]
    out += [
        "",
        "Kinds are the alertnames of the injected faults; `(name)` rows are alertnames that only "
        "count as an alternative hit (`also`). Precision is over the alerts of the kind's own "
        "alertname; recall over its faults. TTD = first matching startsAt - onset.",
        "",
        "## Runs",
        "",
        "| run | faults found | alerts | TP | FP | victims | drains | wrong | seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rep["runs"]:
        found = sum(1 for f in r["faults"] if f["detected"])
        out.append(
            f"| {r['name']} | {found}/{len(r['faults'])} | {r['alerts']} | {r['tp_alerts']} | "
            f"{r['fp_alerts']} | {r['neutral_victim_alerts']} | {r['drains']} | "
            f"{len(r['wrong_drains'])} | {r['seconds']} |"
        )
    missed = [
        f"{r['name']}: {f['id']} on {'/'.join(map(str, f['entity'].values()))} at {f['onset_s']} s"
        for r in rep["runs"]
        for f in r["faults"]
        if not f["detected"]
    ]
    if missed:
        out += ["", "## Missed faults", ""] + [f"- {m}" for m in missed]
    fps = [
        f"{r['name']}: {fp['alertname']} {fp['labels']} at {fp['starts_s']} s"
        + (f" (near {fp['near']})" if fp["near"] else "")
        for r in rep["runs"]
        for fp in r["false_positives"]
    ]
    if fps:
        out += ["", "## False positives", ""] + [f"- {m}" for m in fps]
    if "roce_config" in rep:  # rocewatch/evaluate/roce_config.py
        rc = rep["roce_config"]
        out += [
            "",
            "## RoCE configuration faults",
            "",
            f"{rc['exact']} of {rc['of']} runs gave exactly their RoCEConfigMismatch alerts "
            "(the fault's check on every cable it touches, both ends named, nothing else).",
            "",
            "| fault | target | cables found | alerts | false | precision | recall | exact |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in rc["runs"]:
            out.append(
                f"| {r['kind']} | {r['target'] or '-'} | {r['hits']}/{r['expected']} | "
                f"{r['alerts']} | {r['false']} | {r['precision']:.2f} | {r['recall']:.2f} | "
                f"{'yes' if r['exact'] else 'no'} |"
            )
    return "\n".join(out) + "\n"


def write_outputs(rep: Mapping[str, Any], out: Path) -> None:
    """``evaluation.json``, ``evaluation.md`` and ``evaluation.png`` in ``out``."""
    from rocewatch.evaluate.plot import plot

    out.mkdir(parents=True, exist_ok=True)
    (out / "evaluation.json").write_text(json.dumps(rep, indent=2) + "\n")
    (out / "evaluation.md").write_text(markdown(rep))
    plot(rep, out / "evaluation.png")
