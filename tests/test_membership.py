"""Live job membership (actions.membership): from a real slurmctld + slurmd, and how it reaches
the policy's job caps and the detectors' peers. Membership from real Pods on a real API server:
tests/test_kubernetes.py."""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any

import pytest

from actions.membership import (
    LiveJobs,
    MembershipConfig,
    SlurmJobs,
    expand_hostlist,
    parse_squeue,
)
from detectors.base import node_labels
from rocewatch.config import config_from_dict
from rocewatch.core.topology import Job, Topology


def topo(names: list[str], scheduler: str = "slurm", jobs: list[Any] | None = None) -> Topology:
    return Topology.from_dict(
        {
            "switches": [{"name": "leaf-0"}],
            "nodes": [
                {"name": n, "scheduler": scheduler, "nics": [{"nic": "mlx5_0"}]} for n in names
            ],
            "jobs": jobs or [],
        }
    )


def test_hostlists_and_squeue_output() -> None:
    assert expand_hostlist("rwnode[1-3]") == ["rwnode1", "rwnode2", "rwnode3"]
    assert expand_hostlist("gpu-[008-010],cpu1") == ["gpu-008", "gpu-009", "gpu-010", "cpu1"]
    assert expand_hostlist("r[1-2]n[1,3]") == ["r1n1", "r1n3", "r2n1", "r2n3"]
    jobs = parse_squeue(
        "17|alice|(null)|gpu-[01-02]|llm|pretrain\n18|bob|vision|gpu-03|resnet\nbroken line\n"
    )
    assert jobs == [
        Job("llm|pretrain-17", "alice", None, ("gpu-01", "gpu-02")),  # no account: the user
        Job("resnet-18", "vision", None, ("gpu-03",)),
    ]


class Flaky:
    scheduler = "slurm"

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers

    def fetch(self) -> list[Job]:
        a = self.answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return list(a)


def test_live_jobs_refresh_fallback_and_last_good_answer() -> None:
    t = topo(["gpu-01", "gpu-02", "gpu-03"], jobs=[{"name": "static-a", "nodes": ["gpu-01"]}])
    now = [0.0]
    src = Flaky(
        [
            [Job("live-1", "t1", None, ("gpu-02", "gpu-03", "gpu-99"))],
            RuntimeError("slurmctld unreachable"),
            [],
        ]
    )
    live = LiveJobs(t, [src], interval_s=30, clock=lambda: now[0])
    assert live.maybe_refresh()
    # live membership replaces the static jobs of Slurm nodes; unknown nodes are dropped
    assert t.node_jobs == {"gpu-02": ["live-1"], "gpu-03": ["live-1"]}
    assert t.jobs["live-1"].nodes == ("gpu-02", "gpu-03")
    now[0] = 10
    assert not live.maybe_refresh()  # not due
    now[0] = 31
    assert live.maybe_refresh()
    assert t.node_jobs == {"gpu-02": ["live-1"], "gpu-03": ["live-1"]}  # failure: kept
    assert live.failures == 1
    now[0] = 62
    live.maybe_refresh()
    assert t.node_jobs == {}  # the job ended

    # Without a live source for their scheduler, nodes keep the topology file's jobs.
    k = topo(["k-01", "k-02"], scheduler="kubernetes", jobs=[{"name": "s", "nodes": ["k-01"]}])
    LiveJobs(k, [Flaky([[Job("x-1", None, None, ("k-02",))]])]).refresh()
    assert k.node_jobs == {"k-02": ["x-1"], "k-01": ["s"]}


SLURMD_NODE = os.environ.get("ROCEWATCH_TEST_SLURMD_NODE", "")


def submit_job(name: str) -> str:
    """A two-minute batch job on the test slurmd, account tenant-a; its job id."""
    sub = subprocess.run(
        [
            "sbatch", "--parsable", "-w", SLURMD_NODE, "-J", name,
            "--account=tenant-a", "--output=/dev/null", "--chdir=/tmp", "--wrap", "sleep 120",
        ],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return sub.stdout.strip().split(";")[0]


def test_membership_from_a_real_slurm_job(slurmd_node: str) -> None:
    """Submit a real batch job to the real slurmctld; its slurmd runs it; squeue names it."""
    jobid = submit_job("rw-membership")
    try:
        t = topo(["rwnode1", "rwnode2", "rwnode3", "rwnode4"])
        live = LiveJobs(t, [SlurmJobs()], interval_s=0.1)
        name = f"rw-membership-{jobid}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            live.refresh()
            if name in t.jobs:
                break
            time.sleep(0.5)
        assert t.jobs[name] == Job(name, "tenant-a", None, (slurmd_node,))
        assert t.node_jobs[slurmd_node] == [name]
        # detectors label and group by it
        assert node_labels(t, slurmd_node)["job"] == name
        assert node_labels(t, slurmd_node)["tenant"] == "tenant-a"
    finally:
        subprocess.run(["scancel", jobid], check=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        live.refresh()
        if name not in t.jobs:
            break
        time.sleep(0.5)
    assert name not in t.jobs


def test_membership_config() -> None:
    cfg = config_from_dict({"membership": {"slurm": True, "interval_s": 5, "job_labels": ["a"]}})
    assert cfg.membership == MembershipConfig(slurm=True, interval_s=5, job_labels=("a",))
    from rocewatch.core.errors import ConfigError

    with pytest.raises(ConfigError):
        config_from_dict({"membership": {"interval_s": 0}})


def test_straggler_peer_groups_follow_live_membership() -> None:
    import polars as pl

    from detectors.straggler import StragglerDetector

    t = topo(["gpu-01", "gpu-02", "gpu-03"], jobs=[{"name": "a", "nodes": ["gpu-01", "gpu-02"]}])
    det = StragglerDetector(t)
    det.slots.rows(pl.DataFrame({"device": ["gpu-01", "gpu-02", "gpu-03"], "port": ["mlx5_0"] * 3}))
    det._grow()
    assert [det.group_names[g] if g >= 0 else None for g in det.group] == ["job:a", "job:a", None]
    LiveJobs(t, [Flaky([[Job("b-9", None, None, ("gpu-02", "gpu-03"))]])]).refresh()
    det._grow()
    assert [det.group_names[g] if g >= 0 else None for g in det.group] == [
        None,
        "job:b-9",
        "job:b-9",
    ]


def test_a_slow_scheduler_does_not_stall_the_caller() -> None:
    """In the detect loop membership is fetched in the background: while squeue hangs, each
    maybe_refresh returns at once and the static jobs stay; the answer is applied by the first
    call after it arrives."""
    import threading
    import time

    t = topo(["gpu-01", "gpu-02"], jobs=[{"name": "static-a", "nodes": ["gpu-01"]}])
    release = threading.Event()

    class Hanging:
        scheduler = "slurm"

        def fetch(self) -> list[Job]:
            release.wait(30)
            return [Job("live-7", "t1", None, ("gpu-01", "gpu-02"))]

    live = LiveJobs(t, [Hanging()], interval_s=30, background=True)
    t0 = time.monotonic()
    for _ in range(20):
        assert not live.maybe_refresh()
    assert time.monotonic() - t0 < 1.0  # never waited for the scheduler
    assert t.node_jobs == {"gpu-01": ["static-a"]}  # the fallback meanwhile
    release.set()
    deadline = time.monotonic() + 10
    while not live.maybe_refresh():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert t.node_jobs == {"gpu-01": ["live-7"], "gpu-02": ["live-7"]}
    assert not live.maybe_refresh()  # applied once; the next fetch is due in 30 s
