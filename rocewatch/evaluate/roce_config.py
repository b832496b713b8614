"""The RoCE configuration faults of the simulator, scored: each run is a small fabric with one
configuration fault (``rocewatch/sim/roce_config.py``), its configuration fed to the pipeline
in process as the agents and gnmic send it, and its telemetry run for a second; the
RoCEConfigMismatch alerts are scored by ``rocewatch/roce/score.py`` (exactly the fault's
check, on every cable the fault touches, both ends named, nothing else). A correct fabric
(``none``) must raise none.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rocewatch.config import Config

CONFIG_KINDS: tuple[str, ...] = (
    "none",
    "nic_pcp_trust",
    "pfc_wrong_priority",
    "uplink_mtu",
    "spine_no_ecn",
    "no_roce_v2_gid",
)


def run_config_fault(kind: str, config: Config | None = None, seed: int = 1) -> dict[str, Any]:
    """One small simulated run with configuration fault ``kind`` (``none``: a correct fabric)."""
    from rocewatch.config import Config
    from rocewatch.pipeline import Pipeline
    from rocewatch.roce.score import score
    from rocewatch.sim.roce_config import CONFIG_FAULTS, ConfigFault, config_records
    from rocewatch.sim.simulator import SimConfig, Simulator

    t0 = time.perf_counter()
    cfg = SimConfig(
        nodes=4, nics_per_node=2, spines=2, duration_s=1.0, seed=seed, name=f"config-{kind}"
    )
    sim = Simulator(cfg)
    faults = [] if kind == "none" else [ConfigFault(kind)]
    nics, events, resolved = config_records(cfg, sim.fabric, faults)
    p = Pipeline(sim.topology, config or Config(), rollup_s=None)
    p.ingest_config("nic", nics)
    p.ingest_config("switch", events)
    lateness = p.engine.lateness_ns()
    newest = 0
    for frame in sim.ticks():
        p.ingest(frame)
        if frame.height:
            newest = max(newest, int(frame["ts"].max()))  # type: ignore[arg-type]
        p.advance(newest - lateness)
    p.finish()
    truth = [{"kind": f.kind, "target": f.target, "check": CONFIG_FAULTS[f.kind]} for f in resolved]
    s = score(sim.topology, truth, [a.to_json() for a in p.all_alerts()])
    return {
        "kind": kind,
        "target": resolved[0].target if resolved else None,
        **{k: s[k] for k in ("expected", "alerts", "hits", "false", "duplicates")},
        "precision": round(s["precision"], 3),
        "recall": round(s["recall"], 3),
        "both_ends_named": s["both_ends_named"],
        "exact": s["exact"],
        "seconds": round(time.perf_counter() - t0, 2),
    }


def evaluate_config_faults(
    config: Config | None = None, kinds: Sequence[str] = CONFIG_KINDS
) -> dict[str, Any]:
    """Every configuration fault kind (and a correct fabric), scored."""
    runs = [run_config_fault(k, config) for k in kinds]
    return {
        "runs": runs,
        "exact": sum(1 for r in runs if r["exact"]),
        "of": len(runs),
        "false_alerts": sum(r["false"] for r in runs),
    }


def config_lines(rep: dict[str, Any]) -> list[str]:
    """The scores as the report's lines."""
    out = [
        f"RoCE configuration faults: {rep['exact']}/{rep['of']} runs exactly their "
        f"RoCEConfigMismatch alerts (both ends named), {rep['false_alerts']} false"
    ]
    for r in rep["runs"]:
        out.append(
            f"  {r['kind']:<20} {r['target'] or '-':<28} {r['hits']}/{r['expected']} cables, "
            f"{r['alerts']} alerts, precision {r['precision']:.2f} recall {r['recall']:.2f}"
            + ("" if r["exact"] else "  NOT EXACT")
        )
    return out
