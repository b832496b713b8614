"""Live job membership: which nodes run which job, for which tenant, read from the schedulers.

It feeds the detectors' peer groups (stragglers are judged within a job) and the drain
policy's job caps and job cooldowns, by replacing the topology's ``jobs`` on an interval.
The topology file's static ``jobs`` stay the fallback: for nodes whose scheduler has no live
source, and for every node while a source fails (the last good answer is kept meanwhile).

* Slurm: running jobs from ``squeue`` (job id, name, user, account, node list); the tenant is
  the account, or the user when the job has none. Job names in rocewatch are ``<name>-<id>``.
* Kubernetes: running pods per node; the job is the first of ``job_labels`` a pod carries
  (Job, JobSet, Kubeflow training labels), the tenant its ``tenant_label`` or its namespace.

>>> expand_hostlist("gpu-[01-03,7],login1")
['gpu-01', 'gpu-02', 'gpu-03', 'gpu-7', 'login1']
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from rocewatch.core.errors import ConfigError
from rocewatch.core.topology import Job, Topology

log = logging.getLogger(__name__)

DEFAULT_JOB_LABELS = (
    "batch.kubernetes.io/job-name",
    "job-name",
    "jobset.sigs.k8s.io/jobset-name",
    "training.kubeflow.org/job-name",
)


@dataclass(frozen=True)
class MembershipConfig:
    interval_s: float = 30.0
    slurm: bool = False  # read running jobs with squeue
    squeue: str = "squeue"
    kubernetes: bool = False  # read running pods (uses executors.kubernetes for the client)
    job_labels: tuple[str, ...] = DEFAULT_JOB_LABELS
    tenant_label: str | None = None
    timeout_s: float = 15.0

    def validate(self) -> None:
        if self.interval_s <= 0 or self.timeout_s <= 0:
            raise ConfigError("membership: interval_s and timeout_s must be positive")
        if self.kubernetes and not self.job_labels:
            raise ConfigError("membership: job_labels must name at least one pod label")

    @property
    def enabled(self) -> bool:
        return self.slurm or self.kubernetes


class JobSource(Protocol):
    scheduler: str

    def fetch(self) -> list[Job]:
        """Running jobs now; raise on failure (the caller keeps the last good answer)."""
        ...


_BRACKET = re.compile(r"^(.*?)\[([^\]]+)\](.*)$")


def expand_hostlist(expr: str) -> list[str]:
    """Expand Slurm's compressed host list (``gpu-[01-03,7]``), as ``scontrol show hostnames``."""
    out: list[str] = []
    for part in _split_top(expr):
        m = _BRACKET.match(part)
        if not m:
            if part:
                out.append(part)
            continue
        head, ranges, tail = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if not hi:
                out += [f"{head}{lo}{x}" for x in expand_hostlist(tail)] if tail else [head + lo]
                continue
            width = len(lo) if lo.startswith("0") else 0
            for i in range(int(lo), int(hi) + 1):
                name = f"{head}{i:0{width}d}"
                out += [f"{name}{x}" for x in expand_hostlist(tail)] if tail else [name]
    return out


def _split_top(expr: str) -> list[str]:
    """Split on commas outside brackets."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


class SlurmJobs:
    """Running Slurm jobs from ``squeue``."""

    scheduler = "slurm"
    # name last: the only field that may hold the separator
    FORMAT = "%i|%u|%a|%N|%j"

    def __init__(self, squeue: str = "squeue", timeout_s: float = 15.0) -> None:
        self.squeue, self.timeout_s = squeue, timeout_s

    def fetch(self) -> list[Job]:
        cmd = [self.squeue, "-h", "-t", "RUNNING", "-o", self.FORMAT]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout_s, check=False)
        if p.returncode != 0:
            raise RuntimeError((p.stderr or p.stdout).strip() or f"squeue exited {p.returncode}")
        return parse_squeue(p.stdout)


def parse_squeue(out: str) -> list[Job]:
    jobs = []
    for line in out.splitlines():
        fields = line.split("|", 4)
        if len(fields) != 5 or not fields[0].strip():
            continue
        jobid, user, account, nodelist, name = (f.strip() for f in fields)
        tenant = account if account and account != "(null)" else user
        nodes = tuple(expand_hostlist(nodelist))
        if nodes:
            jobs.append(Job(f"{name}-{jobid}", tenant or None, None, nodes))
    return jobs


class KubernetesPods:
    """Running pods grouped into jobs by label."""

    scheduler = "kubernetes"

    def __init__(self, api: Any, cfg: MembershipConfig) -> None:
        self.api, self.cfg = api, cfg  # api: kubernetes.client.CoreV1Api

    def fetch(self) -> list[Job]:
        resp = self.api.list_pod_for_all_namespaces(
            _preload_content=False, _request_timeout=self.cfg.timeout_s
        )
        return pods_to_jobs(json.loads(resp.data).get("items") or [], self.cfg)


def pods_to_jobs(pods: list[dict[str, Any]], cfg: MembershipConfig) -> list[Job]:
    members: dict[str, set[str]] = {}
    tenants: dict[str, str] = {}
    for p in pods:
        meta, spec = p.get("metadata") or {}, p.get("spec") or {}
        node = spec.get("nodeName")
        if not node or (p.get("status") or {}).get("phase") != "Running":
            continue
        labels = meta.get("labels") or {}
        job = next((labels[k] for k in cfg.job_labels if labels.get(k)), None)
        if job is None:
            continue
        ns = meta.get("namespace") or "default"
        key = f"{ns}/{job}"
        members.setdefault(key, set()).add(node)
        tenant = labels.get(cfg.tenant_label, "") if cfg.tenant_label else ""
        tenants[key] = tenant or ns
    return [Job(k, tenants[k], None, tuple(sorted(v))) for k, v in sorted(members.items())]


class LiveJobs:
    """Refreshes the topology's jobs from live sources; the static jobs are the fallback.

    With ``background`` the sources are asked in a thread of their own, so a slow scheduler
    (``squeue`` may take its whole timeout) never stalls the caller; the answers are applied
    to the topology by a later ``maybe_refresh`` in the caller's thread, which owns the topology.
    """

    def __init__(
        self,
        topology: Topology,
        sources: list[JobSource],
        interval_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        static: list[Job] | None = None,
        background: bool = False,
    ) -> None:
        """``static``: the topology file's jobs (default: the topology's jobs now)."""
        self.topology = topology
        self.sources = sources
        self.interval_s = interval_s
        self.clock = clock
        self.static = list(topology.jobs.values()) if static is None else list(static)
        self.background = background
        self._last: dict[str, list[Job]] = {}  # scheduler -> last good answer
        self._next = 0.0
        self._fetcher: threading.Thread | None = None
        self._answers: dict[str, list[Job]] = {}
        self.failures = 0

    def maybe_refresh(self) -> bool:
        """Refresh when the interval has passed; True when membership was applied."""
        applied = False
        if self._fetcher is not None and not self._fetcher.is_alive():
            self._fetcher = None
            self._last.update(self._answers)
            self.apply()
            applied = True
        now = self.clock()
        if now < self._next or self._fetcher is not None:
            return applied
        self._next = now + self.interval_s
        if not self.background:
            self.refresh()
            return True
        self._answers = {}
        self._fetcher = threading.Thread(
            target=self._fetch, args=(self._answers,), name="job-membership", daemon=True
        )
        self._fetcher.start()
        return applied

    def refresh(self) -> None:
        """Ask every source now, in this thread, and apply."""
        self._fetch(self._last)
        self.apply()

    def _fetch(self, into: dict[str, list[Job]]) -> None:
        for src in self.sources:
            try:
                into[src.scheduler] = src.fetch()
            except Exception as e:  # a scheduler outage must not stop detection
                self.failures += 1
                log.warning(
                    "job membership from %s failed (%s): keeping the last", src.scheduler, e
                )

    def apply(self) -> None:
        live_scheds = set(self._last)
        jobs: list[Job] = []
        for js in self._last.values():
            jobs += js
        for j in self.static:
            # static jobs only for nodes whose scheduler no live source answers for
            rest = tuple(n for n in j.nodes if self.topology.scheduler_of(n) not in live_scheds)
            if rest and j.name not in {x.name for x in jobs}:
                jobs.append(Job(j.name, j.tenant, j.priority, rest))
        self.topology.set_jobs(jobs)
        log.debug("job membership: %d jobs on %d nodes", len(jobs), len(self.topology.node_jobs))


def build_live_jobs(
    topology: Topology,
    cfg: MembershipConfig,
    kube_api: Callable[[], Any] | None = None,
    static: list[Job] | None = None,
) -> LiveJobs | None:
    """LiveJobs for the configured sources, or None when membership is static."""
    cfg.validate()
    if not cfg.enabled:
        return None
    sources: list[JobSource] = []
    if cfg.slurm:
        sources.append(SlurmJobs(cfg.squeue, cfg.timeout_s))
    if cfg.kubernetes:
        if kube_api is None:
            raise ConfigError("membership.kubernetes needs executors.kubernetes (the client)")
        sources.append(KubernetesPods(kube_api(), cfg))
    return LiveJobs(topology, sources, cfg.interval_s, static=static, background=True)
