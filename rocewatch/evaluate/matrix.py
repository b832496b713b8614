"""The matrix (``rocewatch evaluate --matrix``): detection across what production varies.

Cadences, fabrics, vendor naming and fault magnitudes; each cell is simulated into a scenario
directory and replayed from it as a user would, then scored (docs/evaluation.md).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rocewatch.core.model import PFC_STORM, Action, Alert
from rocewatch.evaluate.ecmp import ecmp_faults
from rocewatch.evaluate.report import generated
from rocewatch.evaluate.scoring import RunScore, S, aggregate, score_run

if TYPE_CHECKING:
    from rocewatch.sim.fabric import JobSpec
    from rocewatch.sim.simulator import SimConfig


MATRIX_JITTER = 0.2  # each reading up to a fifth of its interval late
MATRIX_LOSS = 0.01  # 1 % of readings lost
MATRIX_BER = (1e-9, 2e-7)  # healthy pre-FEC BER per link direction
MATRIX_ECN_BURSTS = 0.3  # DCQCN marking bursts (2-10 %) per switch queue a minute
MATRIX_AR_REORDER = 2e-6  # out-of-order share of received packets from adaptive routing
STORM_ORIGINS = ("nic", "switch", "dark", "nic", "switch")  # by round, then again
MAGNITUDES: dict[str, dict[str, tuple[float, float]]] = {
    # fill: standing queue (share of the buffer); ecn: share of the queue's packets marked;
    # errors_per_s: transport errors; ber_factor: peak pre-FEC BER over the link's own;
    # slow: a thermal straggler's shortfall
    "mild": {
        "fill": (0.25, 0.40),
        "ecn": (0.15, 0.30),
        "errors_per_s": (10.0, 40.0),
        "ber_factor": (100.0, 300.0),
        "slow": (0.10, 0.20),
    },
    "middling": {
        "fill": (0.40, 0.70),
        "ecn": (0.30, 0.55),
        "errors_per_s": (40.0, 400.0),
        "ber_factor": (300.0, 3000.0),
        "slow": (0.20, 0.30),
    },
    "severe": {
        "fill": (0.70, 1.00),
        "ecn": (0.55, 0.80),
        "errors_per_s": (400.0, 4000.0),
        "ber_factor": (3000.0, 30000.0),
        "slow": (0.30, 0.40),
    },
}


@dataclass(frozen=True)
class Cell:
    """One cell of the matrix: a fabric, how its sources are read, and how hard it breaks.

    ``magnitude`` is ``mild``, ``middling`` or ``severe`` (``MAGNITUDES``), or ``healthy``
    (no faults: every alert is a false alarm). ``traffic``: ``allreduce``, ``moe`` or
    ``mixed`` (one job of each). Every cell has ``rounds`` rounds, each a PFC storm and then
    one fault of every other kind at once on other nodes and rails, so each kind has
    ``rounds`` faults. ``storm_pairs``: a round whose storm starts at a NIC has a second,
    independent NIC storm (another job, another rail) two seconds later: both spread to the
    spines, both origins are to be drained. ``nodes_per_leaf``: nodes per pod (a pod has a leaf
    per rail), so a fabric of two pods or more spreads each storm through the spines to the
    other pods' leaves. ``tenants`` (``other`` or ``same``): team-a's MoE job and a ring on
    every pod, and in each round the MoE job's all-to-all into the uplinks of a leaf the ring
    crosses, the ring team-b's (``other``: the alerts name both tenants) or team-a's own
    (``same``: no aggressor); rocewatch/evaluate/tenants.py.
    """

    name: str
    nic_interval_s: float
    switch_interval_s: float
    link_gbps: int
    buffer_mb: int
    naming: str
    nodes: int
    magnitude: str
    seed: int
    gauge_interval_s: float | None = None
    traffic: str = "allreduce"
    rounds: int = 5
    nics_per_node: int = 8
    storm_pairs: bool = False
    nodes_per_leaf: int = 64
    tenants: str = ""
    # "collision" / "adaptive": elephant flows over a leaf's uplinks instead of the rounds'
    # faults (rocewatch/evaluate/ecmp.py)
    ecmp: str = ""

    @property
    def healthy(self) -> bool:
        return self.magnitude == "healthy"

    def timeline(self) -> dict[str, float]:
        """Durations laid out for the cell's cadences: a baseline before the first fault, a
        storm long enough for 5 intervals of the slower of NIC and switch counters, faults
        long enough for 8 of the slowest source, gaps for counters to settle."""
        slowest = max(self.nic_interval_s, self.switch_interval_s, self.gauge_interval_s or 0.0)
        t = {
            "lead_s": max(20.0, 10 * slowest),
            "storm_s": max(4.0, 5 * max(self.nic_interval_s, self.switch_interval_s)),
            "storm_gap_s": max(4.0, 3 * slowest),
            # the 10 s bound, and room after it
            "fault_s": max(16.0, 8 * slowest),
            "fault_gap_s": max(6.0, 3 * slowest),
        }
        t["pair_s"] = 2.0 if self.storm_pairs else 0.0  # the second storm's lag
        t["round_s"] = (
            t["storm_s"] + t["pair_s"] + t["storm_gap_s"] + t["fault_s"] + t["fault_gap_s"]
        )
        n = min(2, self.rounds) if self.healthy else self.rounds  # a healthy cell: 2 at most
        t["duration_s"] = t["lead_s"] + n * t["round_s"]
        return t


MATRIX: tuple[Cell, ...] = (
    Cell("oc-100ms-400g-severe", 0.1, 0.1, 400, 64, "openconfig", 16, "severe", 101),
    Cell("oc-100ms-200g-mild", 0.1, 0.1, 200, 32, "openconfig", 16, "mild", 102, traffic="mixed"),
    Cell("sonic-100ms-1s-400g-middling", 0.1, 1.0, 400, 48, "sonic", 16, "middling", 103),
    Cell(
        "cumulus-500ms-1s-200g-middling", 0.5, 1.0, 200, 16, "cumulus", 16, "middling", 104,
        traffic="mixed",
    ),
    Cell("sonic-1s-1s-400g-mild", 1.0, 1.0, 400, 32, "sonic", 32, "mild", 105),
    Cell("oc-1s-5s-100g-middling", 1.0, 5.0, 100, 16, "openconfig", 24, "middling", 106),
    Cell(
        "cumulus-2s-1s-q5s-400g-mild", 2.0, 1.0, 400, 24, "cumulus", 16, "mild", 107,
        gauge_interval_s=5.0,
    ),
    Cell("sonic-2s-5s-800g-severe", 2.0, 5.0, 800, 64, "sonic", 16, "severe", 108, traffic="moe"),
    Cell("oc-1s-1s-400g-128n-middling", 1.0, 1.0, 400, 64, "openconfig", 128, "middling", 109),
    Cell("oc-500ms-1s-400g-storm-pairs", 0.5, 1.0, 400, 32, "openconfig", 16, "middling", 110,
         traffic="mixed", storm_pairs=True),
    # two pods: storms spread through the spines to the other pod; a tenant's incast each round
    Cell("oc-500ms-1s-400g-2pods-tenants", 0.5, 1.0, 400, 32, "openconfig", 16, "middling", 111,
         rounds=3, nodes_per_leaf=8, tenants="other"),
    Cell("sonic-1s-1s-400g-2pods-same-tenant", 1.0, 1.0, 400, 32, "sonic", 16, "mild", 112,
         rounds=3, nodes_per_leaf=8, tenants="same"),
    Cell("healthy-oc-100ms-400g", 0.1, 0.1, 400, 64, "openconfig", 16, "healthy", 201,
         traffic="mixed"),
    Cell("healthy-sonic-1s-800g-moe", 1.0, 1.0, 800, 64, "sonic", 16, "healthy", 202,
         traffic="moe"),
    Cell("healthy-cumulus-2s-5s-200g", 2.0, 5.0, 200, 16, "cumulus", 16, "healthy", 203,
         traffic="mixed"),
    # ECMP collisions at 1 s and 5 s switch cadence, and the same flows sprayed by adaptive
    # routing (silent): small fabrics, two rounds
    Cell("ecmp-oc-1s-400g-collision", 1.0, 1.0, 400, 64, "openconfig", 16, "middling", 301,
         rounds=2, nics_per_node=2, ecmp="collision"),
    Cell("ecmp-sonic-1s-5s-800g-collision", 1.0, 5.0, 800, 64, "sonic", 16, "middling", 302,
         rounds=2, nics_per_node=2, ecmp="collision"),
    Cell("healthy-ecmp-cumulus-100ms-200g-adaptive", 0.1, 0.1, 200, 32, "cumulus", 16,
         "healthy", 303, rounds=2, nics_per_node=2, ecmp="adaptive"),
)  # fmt: skip


def _jobs(cell: Cell) -> tuple[JobSpec, ...]:
    from rocewatch.sim.fabric import JobSpec, node_name

    if cell.tenants:
        from rocewatch.evaluate.tenants import tenant_jobs

        return tenant_jobs(cell.nodes, cell.nodes_per_leaf, same=cell.tenants == "same")
    if cell.traffic == "allreduce":
        return ()  # the simulator's two halves, all-reduce
    names = [node_name(i) for i in range(cell.nodes)]
    half = cell.nodes // 2
    if cell.traffic == "moe":
        return (
            JobSpec("moe-train-a", "team-a", tuple(names[:half]), traffic="moe"),
            JobSpec("moe-train-b", "team-b", tuple(names[half:]), traffic="moe"),
        )
    return (
        JobSpec("llm-train-a", "team-a", tuple(names[:half]), traffic="allreduce"),
        JobSpec("moe-train-b", "team-b", tuple(names[half:]), traffic="moe"),
    )


def cell_config(cell: Cell) -> SimConfig:
    """The simulated run of ``cell``: its rounds of faults, counter clears and agent gaps, on a
    fabric with realistic healthy noise (``MATRIX_*``). Entities come from the seed."""
    import numpy as np

    from rocewatch.sim.fabric import node_name
    from rocewatch.sim.faults import (
        AgentGap,
        CounterClear,
        EcnIncast,
        Fault,
        FlakyLink,
        PcieDowngrade,
        PfcStorm,
        QueueBuildup,
        Straggler,
        TransportErrors,
    )
    from rocewatch.sim.simulator import SimConfig

    if cell.magnitude not in MAGNITUDES and not cell.healthy:
        raise ValueError(f"{cell.name}: magnitude {cell.magnitude!r} is not one of {MAGNITUDES}")
    tl = cell.timeline()
    rng = np.random.default_rng([cell.seed, 99])
    faults: list[Fault] = []
    dark: list[str] = []
    # nodes of the dark storms: agentless for the whole run, drawn from both halves in turn
    n_dark = sum(1 for i in range(cell.rounds) if STORM_ORIGINS[i % len(STORM_ORIGINS)] == "dark")
    if not cell.healthy and n_dark:
        half = max(1, cell.nodes // 2)
        for j in range(n_dark):
            lo = (j % 2) * half
            dark.append(node_name(int(rng.integers(lo, min(cell.nodes, lo + half)))))
    agentless = list(dark)
    mag = MAGNITUDES.get(cell.magnitude, {})

    def draw(key: str, log: bool = False) -> float:
        lo, hi = mag[key]
        if log:
            return round(float(10 ** rng.uniform(np.log10(lo), np.log10(hi))), 3)
        return round(float(rng.uniform(lo, hi)), 3)

    max_gts = 64.0 if cell.link_gbps >= 800 else 32.0
    faults += ecmp_faults(cell)  # an ECMP cell's elephant flows instead of the rounds below
    for i in range(0 if cell.healthy or cell.ecmp else cell.rounds):
        r0 = tl["lead_s"] + i * tl["round_s"]
        origin = STORM_ORIGINS[i % len(STORM_ORIGINS)]
        st = tl["storm_s"]
        if origin == "switch":
            faults.append(PfcStorm(onset_s=r0, duration_s=st, origin="switch"))
        elif origin == "dark":
            faults.append(PfcStorm(onset_s=r0, duration_s=st, node=dark.pop(0)))
        else:
            faults.append(PfcStorm(onset_s=r0, duration_s=st))
        if cell.storm_pairs and origin != "switch":  # a switch's storm holds every job
            faults.append(PfcStorm(onset_s=r0 + tl["pair_s"], duration_s=st))
        f0 = r0 + tl["storm_s"] + tl["pair_s"] + tl["storm_gap_s"]
        fl = tl["fault_s"]

        def at(j: int, f0: float = f0) -> float:
            return round(f0 + 0.37 * j, 2)  # staggered: faults do not start in lockstep

        flaky: dict[str, Any] = [
            {"flaps": 3},
            {"flaps": 0},
            {"flaps": 3, "errors": False},
            {"flaps": 3, "uplink": True},
            {"flaps": 3, "uplink": True, "errors": False},
        ][i % 5]
        faults += [
            FlakyLink(
                onset_s=at(0), duration_s=fl, ber_factor=draw("ber_factor", log=True), **flaky
            ),
            PcieDowngrade(
                onset_s=at(1),
                duration_s=fl,
                speed_gts=max_gts / 2 if i % 2 == 0 else max_gts,
                width=16 if i % 2 == 0 else 8,
            ),
            EcnIncast(
                onset_s=at(2),
                duration_s=fl,
                ecn=draw("ecn"),
                fill=round(float(rng.uniform(0.05, 0.15)), 3),
            ),
            QueueBuildup(
                onset_s=at(3),
                duration_s=fl,
                fill=draw("fill"),
                ecn=round(float(rng.uniform(0.02, 0.10)), 3),
            ),
            TransportErrors(
                onset_s=at(4), duration_s=fl, rate_per_s=draw("errors_per_s", log=True)
            ),
            Straggler(onset_s=at(5), duration_s=fl, slow=draw("slow")),
        ]
        if cell.tenants:
            from rocewatch.evaluate.tenants import tenant_incast

            faults.append(tenant_incast(at(6), fl))
    run = tl["duration_s"]
    gap = max(3.0, 3 * cell.nic_interval_s)
    if cell.healthy:
        marks = (run / 4, run / 2, 3 * run / 4)
    else:  # in the baseline, in round 1's fault slot, in round 2's gaps
        r1 = tl["lead_s"] + tl["round_s"]
        marks = (
            tl["lead_s"] / 2,
            r1 - tl["fault_gap_s"] - tl["fault_s"] / 2,
            r1 + tl["round_s"] - tl["fault_gap_s"] / 2 - gap / 2,
        )
    faults += [
        CounterClear(onset_s=round(marks[0], 1) + 0.05, target="switch"),
        CounterClear(onset_s=round(marks[1], 1), target="nic"),
        AgentGap(onset_s=round(marks[2], 1), duration_s=gap),
        AgentGap(onset_s=round(marks[0] * 1.5, 1), duration_s=gap),
    ]
    return SimConfig(
        nodes=cell.nodes,
        nics_per_node=cell.nics_per_node,
        duration_s=run,
        interval_s=0.1,
        seed=cell.seed,
        faults=tuple(faults),
        jobs=_jobs(cell),
        no_agent_nodes=tuple(sorted(set(agentless))),
        traffic="moe" if cell.traffic == "moe" else "allreduce",
        name=cell.name,
        nodes_per_leaf=cell.nodes_per_leaf,
        link_gbps=cell.link_gbps,
        buffer_mb=cell.buffer_mb,
        naming=cell.naming,
        nic_interval_s=cell.nic_interval_s,
        switch_interval_s=cell.switch_interval_s,
        gauge_interval_s=cell.gauge_interval_s,
        jitter=MATRIX_JITTER,
        sample_loss=MATRIX_LOSS,
        ber_range=MATRIX_BER,
        ecn_bursts_per_min=MATRIX_ECN_BURSTS,
        ar_reorder=MATRIX_AR_REORDER,
    )


def storm_origin(fault: Mapping[str, Any]) -> str:
    """``nic``, ``dark`` (a NIC whose node has no agent) or ``switch``."""
    labels = fault.get("labels", {})
    if "node" not in labels:
        return "switch"
    return "nic" if (fault.get("details") or {}).get("agent", True) else "dark"


def run_cell(cell: Cell, config_path: Path | None = None) -> dict[str, Any]:
    """Simulate ``cell`` into a scenario directory, replay it as a user would (the vendor
    paths through the collector's mapping), score the alerts against the truth."""
    import tempfile

    from rocewatch.config import load_config
    from rocewatch.replay import replay
    from rocewatch.sim.writers import write_scenario

    logging.getLogger().setLevel(logging.ERROR)  # the drain decisions would bury the progress
    t0 = time.perf_counter()
    c0 = time.process_time()
    cfg = cell_config(cell)
    with tempfile.TemporaryDirectory(prefix="rocewatch-matrix-") as tmp:
        scen = write_scenario(cfg, Path(tmp) / "scenario")
        truth = json.loads((scen / "truth.json").read_text())
        res = replay(scen, Path(tmp) / "out", load_config(config_path))
    alerts = [Alert.from_json(a) for a in res.alerts]
    inhibited = [Alert.from_json(a) for a in getattr(res, "inhibited", [])]
    actions = [Action.from_json(a) for a in res.actions]
    score = score_run(truth, alerts, actions, inhibited)
    rep = cell_report(cell, truth, score, time.perf_counter() - t0, res.samples)
    if cell.tenants:  # the victims and aggressors the alerts name
        from rocewatch.evaluate.tenants import attribution

        rep["attribution"] = attribution(truth, alerts)
    rep["cpu_s"] = round(time.process_time() - c0, 1)  # every thread of this process
    return rep


def cell_report(
    cell: Cell, truth: Mapping[str, Any], s: RunScore, seconds: float, samples: int
) -> dict[str, Any]:
    """One cell's figures (the matrix JSON's ``cells[i]``)."""
    start = int(truth["start_ns"])
    faults = {f["id"]: f for f in truth.get("faults", []) if f.get("alertname")}
    agg = aggregate([s])
    kinds: dict[str, Any] = {}
    for kind, k in agg["kinds"].items():
        ids = [fid for fid, kd in s.faults.items() if kd == kind]
        kinds[kind] = {
            "faults": k["faults"],
            "precision": k["precision"],
            "recall": k["recall"],
            "ttd_median_s": k["ttd_median_s"],
            "ttd_p95_s": k["ttd_p95_s"],
            "detected": k["detected"],
            "tp_alerts": k["tp_alerts"],
            "fp_alerts": k["fp_alerts"],
            "late": sum(1 for fid in ids if fid in s.late),
            "bound_s": sorted({s.bound_s[fid] for fid in ids if fid in s.bound_s}),
        }
    origins: dict[str, dict[str, int]] = {}
    for fid, f in faults.items():
        if f["alertname"] != PFC_STORM:
            continue
        o = origins.setdefault(storm_origin(f), {"faults": 0, "detected": 0, "late": 0})
        o["faults"] += 1
        o["detected"] += int(s.detected.get(fid, False))
        o["late"] += int(fid in s.late)

    def where(fid: str) -> dict[str, Any]:
        f = faults[fid]
        return {
            "id": fid,
            "kind": f["alertname"],
            "entity": f["labels"],
            "onset_s": round((int(f["onset_ns"]) - start) / S, 2),
            **({"origin": storm_origin(f)} if f["alertname"] == PFC_STORM else {}),
        }

    sampling = truth.get("sampling") or {}
    return {
        "name": cell.name,
        "nic_interval_s": cell.nic_interval_s,
        "switch_interval_s": cell.switch_interval_s,
        "gauge_interval_s": cell.gauge_interval_s or cell.switch_interval_s,
        "link_gbps": cell.link_gbps,
        "buffer_mb": cell.buffer_mb,
        "naming": cell.naming,
        "nodes": cell.nodes,
        "magnitude": cell.magnitude,
        "traffic": cell.traffic,
        "seed": cell.seed,
        "duration_s": round((int(truth["end_ns"]) - start) / S, 1),
        "kinds": kinds,
        "healthy_alerts": s.alerts if cell.healthy else s.healthy_alerts,
        "wrong_drains": len(s.wrong_drains),
        "late": len(s.late),
        "storm_origins": origins,
        "alerts": s.alerts,
        "inhibited": s.inhibited,
        "neutral_victim_alerts": s.neutral,
        "fabric_incidents": s.incidents,
        "fp_by_alertname": dict(sorted(s.fp.items())),
        "missed": [where(fid) for fid, ok in s.detected.items() if not ok],
        "late_faults": [
            {**where(fid), "ttd_s": s.ttd_s[fid], "bound_s": s.bound_s[fid]} for fid in s.late
        ],
        "false_positives": s.false_positives[:20],
        "wrong_drain_list": s.wrong_drains[:20],
        "lost_samples": sum(
            len(v) for src in sampling.get("lost", {}).values() for v in src.values()
        ),
        "samples": samples,
        "seconds": round(seconds, 1),
    }


def matrix_report(cells: Sequence[dict[str, Any]], seconds: float, workers: int) -> dict[str, Any]:
    """The matrix JSON: every cell and the worst and total figures over them."""
    precisions = [
        k["precision"] for c in cells for k in c["kinds"].values() if k["precision"] is not None
    ]
    recalls = [k["recall"] for c in cells for k in c["kinds"].values() if k["recall"] is not None]
    return {
        "cells": list(cells),
        "worst_precision": min(precisions, default=None),
        "worst_recall": min(recalls, default=None),
        "healthy_alerts": sum(c["healthy_alerts"] for c in cells),
        "wrong_drains": sum(c["wrong_drains"] for c in cells),
        "late": sum(c["late"] for c in cells),
        "attribution_wrong": sum(c.get("attribution", {}).get("wrong", 0) for c in cells),
        "goal": {
            "worst_precision": 0.95,
            "worst_recall": 0.95,
            "healthy_alerts": 0,
            "wrong_drains": 0,
            "late": 0,
            "attribution_wrong": 0,
        },
        "rules": {
            "tp": "as the default suite (alertname or 'also', one 'match' label set, startsAt "
            "within [onset - 1 s, end + max(5 s, 3 intervals of the slowest source)]); a "
            "grouped alert speaks for each member and each listed port",
            "neutral": "storm victims (labels, members, victims annotation or origin) and "
            "inhibited alerts",
            "late": "first hit after its bound: PFC storms 2.5 intervals of the fastest source "
            "that sees the origin; the rest max(10 s, 3 intervals of the slowest source the "
            "detector needs); plus one interval per reading of the fault's devices lost "
            "within the bound",
            "healthy_alerts": "every alert of a healthy cell; in a fault cell, alerts that start "
            "before its first fault",
            "worst": "precision ignores kinds with no alert of their name (their recall shows)",
            "attribution": "tenant cells: each ECNCongestion or QueueBuildup alert that hits a "
            "TenantIncast is right when its victim_tenant and aggressor_tenant annotations equal "
            "the truth's (no aggressor where the truth has none)",
        },
        "runtime_s": round(seconds, 1),
        "cpu_s": round(sum(c.get("cpu_s", 0.0) for c in cells), 1),
        "workers": workers,
        "generated": generated(),
    }


def _run_cell_job(args: tuple[Cell, Path | None]) -> dict[str, Any]:
    return run_cell(*args)


def run_matrix(
    cells: Sequence[Cell] = MATRIX,
    config_path: Path | None = None,
    jobs: int = 1,
    progress: Callable[[int, int, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run ``cells`` (in ``jobs`` processes when more than one) and report the matrix.

    Biggest cells start first so the last to finish is a small one."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    t0 = time.perf_counter()
    order = sorted(
        range(len(cells)),
        key=lambda i: (
            -cells[i].nodes
            * cells[i].timeline()["duration_s"]
            / min(cells[i].nic_interval_s, cells[i].switch_interval_s)
        ),
    )
    results: dict[int, dict[str, Any]] = {}
    if jobs <= 1:
        for n, i in enumerate(order):
            results[i] = run_cell(cells[i], config_path)
            if progress is not None:
                progress(n, len(cells), results[i])
    else:
        # spawned, not forked: a fork of a process whose Polars threads run can deadlock
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            futures = {pool.submit(_run_cell_job, (cells[i], config_path)): i for i in order}
            for n, fut in enumerate(as_completed(futures)):
                i = futures[fut]
                results[i] = fut.result()
                if progress is not None:
                    progress(n, len(cells), results[i])
    return matrix_report(
        [results[i] for i in range(len(cells))], time.perf_counter() - t0, max(1, jobs)
    )
