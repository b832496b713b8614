"""Interference between tenants in the simulator: one job's all-to-all into the leaf uplinks
another job's ring crosses (the ``TenantIncast`` fault of rocewatch/sim/faults.py).

The aggressor job's NICs below one leaf push toward line rate (an all-to-all whose
destinations sit behind the spines); the leaf's uplink egress queues fill to ``fill`` of the
buffer and mark ``ecn`` of their packets; the leaf, its ingress buffer over XOFF, holds
(PFC) every NIC below it on the lossless priority, the other jobs' NICs included: those are
paused by traffic that is not theirs. The truth names the victim job and tenant (the other
jobs below the leaf, else the aggressor's own job) and the aggressor job and tenant, or no
aggressor when every job below the leaf belongs to the aggressor's tenant (a tenant
congesting only itself is not interference).

>>> from rocewatch.sim.fabric import Fabric, JobSpec
>>> from rocewatch.sim.simulator import SimConfig
>>> from rocewatch.sim.faults import TenantIncast
>>> cfg = SimConfig(nodes=8, nics_per_node=1, spines=2, nodes_per_leaf=4, jobs=(
...     JobSpec("a2a", "team-a", ("gpu-001", "gpu-002", "gpu-003", "gpu-005")),
...     JobSpec("ring", "team-b", ("gpu-004", "gpu-008"))))
>>> f = resolve_incast(Fabric(cfg), TenantIncast(onset_s=1.0, job="a2a"), None)
>>> f.switch, f.fill
('leaf-r0-p0', 0.9)
>>> t = incast_truth(Fabric(cfg), f, "3")
>>> t["victim_job"], t["victim_tenant"], t["aggressor_job"], t["aggressor_tenant"]
('ring', 'team-b', 'a2a', 'team-a')
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rocewatch.core.errors import ConfigError
from rocewatch.sim.fabric import Fabric
from rocewatch.sim.faults import Fault, TenantIncast


def _job_index(fab: Fabric, name: str | None) -> int:
    if not fab.jobs:
        raise ConfigError("TenantIncast: the fabric runs no job")
    if name is None:
        return 0
    names = [j.name for j in fab.jobs]
    if name not in names:
        raise ConfigError(f"TenantIncast: unknown job {name!r}")
    return names.index(name)


def resolve_incast(
    fab: Fabric,
    f: TenantIncast,
    rng: np.random.Generator | None,
    prefer: list[int] | None = None,
) -> TenantIncast:
    """``f`` with its job, leaf and levels filled in (a leaf where the job has NICs, the first
    that also carries another job's, of ``prefer`` first where one fits; the fill drawn from
    ``rng``, or typical)."""
    j = _job_index(fab, f.job)
    leaves = [int(x) for x in np.unique(fab.nic_leaf[fab.nic_job == j])]
    if f.switch is not None:
        if f.switch not in fab.leaves:
            raise ConfigError(f"TenantIncast: {f.switch!r} is not a leaf")
        leaf = fab.leaves.index(f.switch)
        if leaf not in leaves:
            raise ConfigError(f"TenantIncast: job {fab.jobs[j].name} has no NIC on {f.switch}")
    else:
        if not leaves:
            raise ConfigError(f"TenantIncast: job {fab.jobs[j].name} has no NIC on any leaf")
        shared = [lf for lf in leaves if _others(fab, lf, j).size]
        first = [lf for lf in prefer or () if lf in shared] + [
            lf for lf in prefer or () if lf in leaves
        ]
        leaf = (first or shared or leaves)[0]
    fill = f.fill
    if fill is None:
        fill = round(float(rng.uniform(0.86, 0.94)), 3) if rng is not None else 0.9
    if not 0 < fill <= 1:
        raise ConfigError("TenantIncast: fill must be within (0, 1]")
    return replace(f, job=fab.jobs[j].name, switch=fab.leaves[leaf], fill=fill)


def _others(fab: Fabric, leaf: int, job: int) -> np.ndarray:
    """NICs below ``leaf`` of jobs other than ``job``."""
    on = fab.nic_leaf == leaf
    return np.flatnonzero(on & (fab.nic_job >= 0) & (fab.nic_job != job))


def incast_truth(fab: Fabric, f: TenantIncast, prio: str) -> dict[str, Any]:
    """The truth record's fields of a resolved ``TenantIncast``: the alert's labels (the first
    uplink's queue), what matches (any port of the leaf), who suffers and who causes it."""
    j = _job_index(fab, f.job)
    leaf = fab.leaves.index(str(f.switch))
    aggressor = fab.jobs[j]
    others = _others(fab, leaf, j)
    victim_jobs = sorted({fab.jobs[int(x)].name for x in fab.nic_job[others]})
    foreign = [
        v
        for v in victim_jobs
        if next(x for x in fab.jobs if x.name == v).tenant != aggressor.tenant
    ]
    # a tenant congesting only itself: the victim is its own (the aggressor's) job
    victim = (foreign or [aggressor.name])[0]
    victim_tenant = next(x for x in fab.jobs if x.name == victim).tenant
    up = fab.port_labels(fab.uplink_port(leaf, 0))
    q = {**up, "queue": prio}
    interference = bool(foreign)
    senders = np.flatnonzero((fab.nic_leaf == leaf) & (fab.nic_job == j))
    return {
        "labels": q,
        "match": [{"switch": str(f.switch)}],
        "culprit_node": None,
        "victims": [],
        "victim_job": victim,
        "victim_tenant": victim_tenant,
        "aggressor_job": aggressor.name if interference else None,
        "aggressor_tenant": aggressor.tenant if interference else None,
        "details": {
            "fill": f.fill,
            "senders": ["{node}/{nic}".format(**fab.nic_labels(int(e))) for e in senders],
            "uplinks": [
                fab.port_labels(fab.uplink_port(leaf, s))["port"] for s in range(fab.n_spines)
            ],
        },
    }


@dataclass(frozen=True)
class _Incast:
    t0: float
    t1: float
    senders: np.ndarray  # the aggressor's NICs below the leaf
    held: np.ndarray  # every NIC below the leaf that runs a job: the leaf holds them all
    uplinks: np.ndarray  # the leaf -> spine directions (the congested egress queues)
    fill: float
    ecn: float | None


def _ov(a: float, b: float, t0: float, t1: float) -> float:
    return max(0.0, min(b, t1) - max(a, t0)) / (t1 - t0)


class TenantPhysics:
    """The interval hooks of the simulator for its ``TenantIncast`` faults (no fault: no
    effect and no random draw, so other runs stay as they were)."""

    def __init__(self, fab: Fabric, faults: list[Fault], run_s: float) -> None:
        self.items: list[_Incast] = []
        E, S = fab.n_nics, fab.n_spines
        for f in faults:
            if not isinstance(f, TenantIncast):
                continue
            j = _job_index(fab, f.job)
            leaf = fab.leaves.index(str(f.switch))
            on = fab.nic_leaf == leaf
            cables = E + leaf * S + np.arange(S)
            self.items.append(
                _Incast(
                    f.onset_s,
                    f.end_s(run_s),
                    np.flatnonzero(on & (fab.nic_job == j)),
                    np.flatnonzero(on & (fab.nic_job >= 0)),
                    2 * cables,
                    float(f.fill or 0.9),
                    f.ecn,
                )
            )
        self._now: list[tuple[_Incast, float]] = []

    def begin(self, t0: float, t1: float) -> bool:
        """Note which incasts overlap the interval; whether any does."""
        self._now = [(it, f) for it in self.items if (f := _ov(it.t0, it.t1, t0, t1)) > 0]
        return bool(self._now)

    def transmit(self, tx: np.ndarray, line: float) -> None:
        """The aggressor's NICs push toward line rate."""
        for it, f in self._now:
            tx[it.senders] += np.maximum(0.0, line * 0.97 - tx[it.senders]) * f

    def pauses(self, pf: np.ndarray, rng: np.random.Generator) -> None:
        """The leaf holds every NIC below it (share of the interval paused)."""
        for it, f in self._now:
            d = 2 * it.held
            pf[d] = np.maximum(pf[d], f * rng.uniform(0.05, 0.15, len(d)))

    def queues(
        self,
        depth: np.ndarray,
        peak: np.ndarray,
        pm: np.ndarray,
        buffer: float,
        rng: np.random.Generator,
    ) -> None:
        """The leaf's uplink egress queues stand near ``fill`` of the buffer and mark."""
        for it, f in self._now:
            d = it.uplinks
            n = len(d)
            depth[d] = (
                f * it.fill * buffer * (1 + 0.004 * rng.standard_normal(n)) + (1 - f) * depth[d]
            )
            peak[d] = np.maximum(
                depth[d], np.minimum(buffer, depth[d] * (1 + 0.02 * rng.random(n)))
            )
            mark = rng.uniform(0.3, 0.6, n) if it.ecn is None else it.ecn * rng.uniform(0.9, 1.1, n)
            pm[d] = f * mark + (1 - f) * pm[d]
