"""The NCCL cases: the job's own view of a fault, scored, with the checks a user relies on.

Each case simulates a small fabric whose jobs write NCCL Inspector, NCCL_DEBUG and CoMMA
output (``write_scenario(nccl=True)``), replays the recording (so the NCCL collector's file
readers, the rank join and the detectors run as in ``rocewatch replay``), scores the alerts
against the simulator's truth like the default suite (``score_run``), and checks what the
issue asks of each fault (docs/nccl.md):

- ``pcie_mid_job``: a NIC's PCIe link trains down mid-job. SlowRank names the rank, its host,
  GPU and NIC, with the PCIeDowngrade alert as its cause; BusBandwidthDrop fires on the
  communicator; SlowEdge on the NIC's ring edges with the same cause; the PCIeDowngrade alert
  names the job and rank on that NIC.
- ``slow_gpu``: one GPU runs slow on a clean fabric. SlowRank with "host or GPU side", no
  fabric alert, no drain.
- ``storm``: a NIC of a job sends a PFC storm. The storm pages; the job's NCCL alerts name
  it as their cause and are inhibited by it (``inhibited.jsonl``), none is notified.

``rocewatch evaluate --nccl`` runs them; tests/test_evaluate_nccl.py replays each as a golden
case and asserts every check and its recall.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rocewatch.core.model import (
    BUS_BANDWIDTH_DROP,
    ECN_CONGESTION,
    FABRIC_INCIDENT,
    FLAKY_LINK,
    PCIE_DOWNGRADE,
    PFC_STORM,
    PORT_ANOMALY,
    QUEUE_BUILDUP,
    SLOW_EDGE,
    SLOW_RANK,
    STRAGGLER,
    TRANSPORT_ERRORS,
    Action,
    Alert,
)
from rocewatch.evaluate.scoring import S, aggregate, score_run

if TYPE_CHECKING:
    from rocewatch.config import Config
    from rocewatch.sim.simulator import SimConfig

HOST_SIDE = "host or GPU side"  # detectors/slow_rank.py: the cause of a late rank on a clean path
JOB_ALERTS = (SLOW_RANK, SLOW_EDGE, BUS_BANDWIDTH_DROP)
FABRIC = (
    PFC_STORM,
    FLAKY_LINK,
    STRAGGLER,
    PCIE_DOWNGRADE,
    ECN_CONGESTION,
    QUEUE_BUILDUP,
    TRANSPORT_ERRORS,
    PORT_ANOMALY,
    FABRIC_INCIDENT,
)


@dataclass(frozen=True)
class NcclCase:
    name: str
    nodes: int
    duration_s: float
    seed: int
    fault: str  # pcie | slow_gpu | storm

    def scenario(self) -> SimConfig:
        from rocewatch.sim import PcieDowngrade, PfcStorm, SlowGpu
        from rocewatch.sim.scenarios import healthy_scenario

        cfg = healthy_scenario(nodes=self.nodes, duration_s=self.duration_s, seed=self.seed)
        f: Any
        if self.fault == "pcie":
            f = PcieDowngrade(onset_s=4.0, node="gpu-002", nic="mlx5_1")
        elif self.fault == "slow_gpu":
            f = SlowGpu(onset_s=4.0, node="gpu-003", nic="mlx5_2")
        else:
            f = PfcStorm(onset_s=6.0, duration_s=4.0, node="gpu-001", nic="mlx5_3")
        return dataclasses.replace(cfg, faults=(f,))


NCCL_CASES: tuple[NcclCase, ...] = (
    NcclCase("pcie_mid_job", 4, 12, 2, "pcie"),
    NcclCase("slow_gpu", 4, 12, 2, "slow_gpu"),
    NcclCase("storm", 4, 12, 2, "storm"),
)


@dataclass
class NcclResult:
    case: NcclCase
    checks: list[tuple[str, bool, str]]  # (what, held, what was seen)
    score: Any  # RunScore
    seconds: float

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.checks)


def _read(path: Path, cls: Any) -> list[Any]:
    if not path.exists():
        return []
    return [cls.from_json(json.loads(x)) for x in path.read_text().splitlines() if x.strip()]


def run_nccl_case(case: NcclCase, work: Path, config: Config | None = None) -> NcclResult:
    """Simulate, replay and judge one case in ``work`` (module docstring)."""
    from rocewatch.replay import replay
    from rocewatch.sim.writers import write_scenario

    t0 = time.perf_counter()
    scen = write_scenario(case.scenario(), work / "scenario", nccl=True)
    out = work / "out"
    replay(scen, out, config=config)
    truth = json.loads((scen / "truth.json").read_text())
    alerts: list[Alert] = _read(out / "alerts.jsonl", Alert)
    held: list[Alert] = _read(out / "inhibited.jsonl", Alert)
    actions: list[Action] = _read(out / "actions.jsonl", Action)
    score = score_run(truth, alerts, actions, held)
    fault = truth["faults"][0]
    checks = CHECKS[case.fault](fault, alerts, held, actions)
    return NcclResult(case, checks, score, time.perf_counter() - t0)


def _named(alerts: Sequence[Alert], name: str) -> list[Alert]:
    return [a for a in alerts if a.name == name]


def _check_pcie(
    fault: dict[str, Any], alerts: list[Alert], held: list[Alert], actions: list[Action]
) -> list[tuple[str, bool, str]]:
    node, nic = fault["labels"]["node"], fault["labels"]["nic"]
    gpu = nic.removeprefix("mlx5_")
    onset = int(fault["onset_ns"])
    out: list[tuple[str, bool, str]] = []
    slow = _named(alerts, SLOW_RANK)
    who = [(a.labels.get("node"), a.labels.get("nic"), a.labels.get("gpu")) for a in slow]
    out.append(("SlowRank names the rank's host, GPU and NIC", who == [(node, nic, gpu)], str(who)))
    causes = [a.annotations.get("cause") for a in slow]
    out.append(("SlowRank's cause is the PCIeDowngrade", causes == [PCIE_DOWNGRADE], str(causes)))
    ttd = [round((a.starts_at - onset) / S, 2) for a in slow]
    out.append(("SlowRank within 6 s of the onset", bool(ttd) and 0 < ttd[0] <= 6, f"{ttd} s"))
    drops = _named(alerts, BUS_BANDWIDTH_DROP)
    comms = {a.labels.get("comm") for a in slow}
    seen = [(a.labels.get("comm"), a.annotations.get("cause")) for a in drops]
    out.append(
        (
            "BusBandwidthDrop on the rank's communicator, caused by the PCIeDowngrade",
            len(drops) == 1 and seen[0][0] in comms and seen[0][1] == PCIE_DOWNGRADE,
            str(seen),
        )
    )
    edges = _named(alerts, SLOW_EDGE)
    e = [(a.labels.get("node"), a.labels.get("nic"), a.annotations.get("cause")) for a in edges]
    out.append(
        (
            "SlowEdge on the NIC's edges, caused by the PCIeDowngrade",
            bool(e) and all(x == (node, nic, PCIE_DOWNGRADE) for x in e),
            str(e),
        )
    )
    ends = sorted(
        (a.labels.get("src_rank"), a.labels.get("dst_rank"), a.labels.get("peer_node"))
        for a in edges
    )
    out.append(
        (
            "SlowEdge names both ranks and the peer's host",
            len(ends) == 2 and all(s and d and p and p != node for s, d, p in ends),
            str(ends),
        )
    )
    paths = [a.annotations.get("path_alerts", "") for a in slow]
    out.append(
        (
            "SlowRank lists the fabric alerts on its path",
            bool(paths) and paths[0].startswith("PCIeDowngrade:"),
            str(paths),
        )
    )
    pcie = _named(alerts, PCIE_DOWNGRADE)
    ranks = [a.annotations.get("ranks", "") for a in pcie]
    out.append(
        (
            "the PCIeDowngrade alert names the job's rank on that NIC",
            len(ranks) == 1 and f"({node} GPU {gpu} {nic})" in ranks[0],
            str(ranks),
        )
    )
    return out


def _check_slow_gpu(
    fault: dict[str, Any], alerts: list[Alert], held: list[Alert], actions: list[Action]
) -> list[tuple[str, bool, str]]:
    node, nic = fault["labels"]["node"], fault["labels"]["nic"]
    slow = _named(alerts, SLOW_RANK)
    seen = [(a.labels.get("node"), a.labels.get("nic"), a.annotations.get("cause")) for a in slow]
    fabric = [a.name for a in alerts if a.name in FABRIC]
    drains = [x.node for x in actions if x.action == "drain"]
    return [
        ("SlowRank on the slow GPU's rank, host or GPU side",
         seen == [(node, nic, HOST_SIDE)], str(seen)),
        ("no fabric alert", fabric == [], str(fabric)),
        ("no SlowEdge (the wire is clean)", not _named(alerts, SLOW_EDGE), ""),
        ("no drain", drains == [], str(drains)),
    ]  # fmt: skip


def _check_storm(
    fault: dict[str, Any], alerts: list[Alert], held: list[Alert], actions: list[Action]
) -> list[tuple[str, bool, str]]:
    storms = [a for a in alerts if a.name == PFC_STORM and a.labels.get("role") == "origin"]
    shown = [a.name for a in alerts if a.name in JOB_ALERTS]
    job_held = [a for a in held if a.name in JOB_ALERTS]
    by = [a.annotations.get("inhibited_by", "") for a in job_held]
    causes = [a.annotations.get("cause") for a in job_held]
    return [
        ("the storm's origin pages", bool(storms), str(len(storms))),
        ("no job alert is notified", shown == [], str(shown)),
        ("the job's alerts are held by the storm", bool(job_held) and all(by), str(by)),
        ("and name it as their cause", bool(causes) and set(causes) == {PFC_STORM}, str(causes)),
    ]


CHECKS: dict[str, Callable[..., list[tuple[str, bool, str]]]] = {
    "pcie": _check_pcie,
    "slow_gpu": _check_slow_gpu,
    "storm": _check_storm,
}


def evaluate_nccl(
    cases: Sequence[NcclCase] = NCCL_CASES,
    config: Config | None = None,
    progress: Callable[[int, NcclResult], None] | None = None,
) -> dict[str, Any]:
    """Run the NCCL cases; the report (``evaluation_nccl.json``)."""
    t0 = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="rocewatch-nccl-") as tmp:
        for i, case in enumerate(cases):
            r = run_nccl_case(case, Path(tmp) / case.name, config)
            results.append(r)
            if progress is not None:
                progress(i, r)
    agg = aggregate([r.score for r in results])
    return {
        "suite": "nccl",
        "kinds": agg["kinds"],
        "alertnames": agg["alertnames"],
        "checks_failed": sum(not ok for r in results for _, ok, _ in r.checks),
        "wrong_drains": sum(len(r.score.wrong_drains) for r in results),
        "cases": [
            {
                "name": r.case.name,
                **dataclasses.asdict(r.case),
                "ok": r.ok,
                "checks": [{"check": c, "ok": ok, "seen": s} for c, ok, s in r.checks],
                "detected": dict(r.score.detected),
                "ttd_s": dict(r.score.ttd_s),
                "alerts": r.score.alerts,
                "inhibited": r.score.inhibited,
                "false_positives": r.score.false_positives,
                "seconds": round(r.seconds, 2),
            }
            for r in results
        ],
        "runtime_s": round(time.perf_counter() - t0, 1),
    }


def nccl_table(rep: dict[str, Any]) -> str:
    lines = []
    for c in rep["cases"]:
        lines.append(f"{c['name']}: {'ok' if c['ok'] else 'FAILED'} ({c['seconds']} s)")
        for ch in c["checks"]:
            mark = "ok  " if ch["ok"] else "FAIL"
            lines.append(f"  {mark} {ch['check']}" + (f"  [{ch['seen']}]" if not ch["ok"] else ""))
    lines.append("")
    lines.append("kind            faults  found  recall  precision  TTD median s")
    for kind, k in sorted(rep["kinds"].items()):
        lines.append(
            f"{kind:<15} {k.get('faults', 0):>6} {k.get('detected', 0):>6} "
            f"{k.get('recall')!s:>7} {k.get('precision')!s:>10} {k.get('ttd_median_s')!s:>13}"
        )
    return "\n".join(lines)


def run_evaluate_nccl(out: Path, as_json: bool, config_path: Path | None = None) -> int:
    """The `rocewatch evaluate --nccl` command."""
    import sys

    from rocewatch.config import load_config

    config = load_config(config_path)

    def progress(i: int, r: NcclResult) -> None:
        print(
            f"[{i + 1}/{len(NCCL_CASES)}] {r.case.name}: "
            f"{sum(ok for _, ok, _ in r.checks)}/{len(r.checks)} checks, {r.seconds:.1f} s",
            file=sys.stderr,
            flush=True,
        )

    rep = evaluate_nccl(NCCL_CASES, config, progress)
    out.mkdir(parents=True, exist_ok=True)
    (out / "evaluation_nccl.json").write_text(json.dumps(rep, indent=2) + "\n")
    print(json.dumps(rep, indent=2) if as_json else nccl_table(rep))
    return 0 if rep["checks_failed"] == 0 else 1
