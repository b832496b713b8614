"""The join: each rank of a job -> its host, GPU and NIC.

Sources, best first: the job's ``NCCL_DEBUG=INFO`` output (``DebugLog``: the process's CUDA
device and the NIC its channels use), Inspector records (host and pid of each communicator
rank), and the topology (a rail-optimised node's GPU ``i`` sends through its ``i``-th NIC).
Without debug lines the GPU is taken as the rank's local index (``rank % ranks per node``)
and the place is marked ``guessed``.

The map is kept per job. A rank that shows up with another pid than before means the job
restarted: the job's whole map is dropped and rebuilt from the new processes
(``restarts`` counts it), so a rank never keeps the NIC of its previous incarnation.

The map travels with the telemetry as ``nccl_rank_gpu`` samples (device the host, port
``rank<r>``, qual ``<comm>/<nic>``, value the CUDA device), so detectors downstream read it
from the window engine like any other reading (``samples``).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from collector.nccl.debug import DebugLog
from collector.nccl.inspector import RankInfo
from rocewatch.core.model import SAMPLE_SCHEMA, empty_samples
from rocewatch.core.topology import Topology


@dataclass(frozen=True)
class Place:
    job: str
    comm: str
    rank: int
    host: str
    pid: int | None
    gpu: int | None
    nic: str | None
    guessed: bool = False


class RankJoin:
    def __init__(self, topology: Topology | None = None) -> None:
        self.topology = topology
        self.jobs: dict[str, dict[tuple[str, int], Place]] = {}
        self.restarts = 0

    def update(self, job: str, ranks: dict[tuple[str, int], RankInfo], debug: DebugLog) -> None:
        """Lay the ranks Inspector reported (and the job's debug lines) over the map."""
        cur = self.jobs.setdefault(job, {})
        for key, info in ranks.items():
            old = cur.get(key)
            if old is not None and info.pid is not None and old.pid not in (None, info.pid):
                self.restarts += 1
                cur = self.jobs[job] = {}  # a new incarnation: nothing of the old one holds
                break
        for key, info in ranks.items():
            cur[key] = self._place(job, info, debug)

    def _place(self, job: str, info: RankInfo, debug: DebugLog) -> Place:
        proc = debug.processes.get((info.host, info.pid)) if info.pid is not None else None
        if proc is None:  # the debug log's hostname may be the short or long form
            for (h, pid), p in debug.processes.items():
                if pid == info.pid and h.split(".", 1)[0] == info.host.split(".", 1)[0]:
                    proc = p
                    break
        gpu: int | None = None
        nic: str | None = None
        guessed = False
        if proc is not None:
            gpu, nic = proc.cuda_dev, proc.nic()
        if gpu is None:
            per_node = self._ranks_per_node(info)
            gpu = info.rank % per_node if per_node else None
            guessed = True
        if nic is None and gpu is not None and self.topology is not None:
            node = self.topology.nodes.get(info.host)
            if node is not None and gpu < len(node.nics):
                nic = node.nics[gpu].nic
                guessed = True
        return Place(job, info.comm, info.rank, info.host, info.pid, gpu, nic, guessed)

    def _ranks_per_node(self, info: RankInfo) -> int | None:
        if self.topology is not None:
            node = self.topology.nodes.get(info.host)
            if node is not None and node.nics:
                return len(node.nics)
        return None

    def place(self, job: str, comm: str, rank: int) -> Place | None:
        return self.jobs.get(job, {}).get((comm, rank))

    def samples(self, ts: int) -> pl.DataFrame:
        """The map as ``nccl_rank_gpu`` samples at ``ts`` (see the module docstring)."""
        rows = [p for places in self.jobs.values() for p in places.values() if p.gpu is not None]
        if not rows:
            return empty_samples()
        return pl.DataFrame(
            {
                "ts": [ts] * len(rows),
                "device": [p.host for p in rows],
                "port": [f"rank{p.rank}" for p in rows],
                "qual": [f"{p.comm}/{p.nic or ''}" for p in rows],
                "metric": ["nccl_rank_gpu"] * len(rows),
                "value": [float(p.gpu) for p in rows],  # type: ignore[arg-type]
                "raw": [None] * len(rows),
            },
            schema=SAMPLE_SCHEMA,
        )
