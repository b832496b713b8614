"""The evaluation's figure: per-kind precision/recall/F1 and time to detect (matplotlib)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rocewatch.evaluate.scoring import (
    MINDER_F1,
    MINDER_PRECISION,
    PUBLISHED_DETECT_S,
    SONIC_DETECT_S,
)


def plot(rep: Mapping[str, Any], path: Path) -> None:
    """Per-kind precision/recall/F1 bars and the time-to-detect distribution."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(rep["kinds"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.26
    bars_of = (("precision", "precision"), ("recall", "recall"), ("f1", "F1"))
    for j, (key, label) in enumerate(bars_of):
        vals = [rep["kinds"][k][key] for k in kinds]
        xs = [i + (j - 1) * width for i in range(len(kinds))]
        bars = ax1.bar(xs, [v or 0.0 for v in vals], width, label=label)
        for b, v in zip(bars, vals, strict=True):
            if v is None:
                ax1.text(b.get_x() + b.get_width() / 2, 0.02, "n/a", ha="center", fontsize=7)
    ax1.axhline(MINDER_PRECISION, color="grey", ls="--", lw=0.8, label="Minder P 0.90")
    ax1.axhline(MINDER_F1, color="grey", ls=":", lw=0.8, label="Minder F1 0.89")
    ax1.set_xticks(range(len(kinds)), kinds, rotation=20, fontsize=8)
    ax1.set_ylim(0, 1.25)
    ax1.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax1.set_title("per kind: precision, recall, F1")
    ax1.legend(fontsize=7, loc="upper center", ncol=5, frameon=False)

    data = [[max(x, 1e-3) for x in rep["kinds"][k]["ttd_s"]] for k in kinds]
    for i, d in enumerate(data):
        if d:
            ax2.boxplot([d], positions=[i], widths=0.5, showfliers=False)
            ax2.scatter([i] * len(d), d, s=12, alpha=0.6, zorder=3)
        else:
            ax2.text(i, 0.3, "not\ndetected", ha="center", fontsize=7)
    ax2.set_yscale("log")
    ax2.set_ylim(0.05, 60)
    ax2.axhline(SONIC_DETECT_S, color="grey", ls="--", lw=0.8)
    ax2.text(-0.4, 0.21, "SONiC 200 ms", fontsize=7, color="grey")
    lo, hi = PUBLISHED_DETECT_S
    ax2.axhspan(lo, hi, color="grey", alpha=0.12)
    ax2.text(-0.4, lo * 1.1, "published 3.6-30 s", fontsize=7, color="grey")
    ax2.set_xticks(range(len(kinds)), kinds, rotation=20, fontsize=8)
    ax2.set_xlim(-0.6, len(kinds) - 0.4)
    ax2.set_ylabel("time to detect (s)")
    ax2.set_title("time to detect (telemetry time)")
    fig.suptitle(
        f"rocewatch evaluation: {len(rep['runs'])} runs, wrong-node drains "
        f"{rep['wrong_drains']}, alerts on healthy runs {rep['healthy_alerts']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
