"""NCCL Inspector output of the simulated jobs, consistent with the simulated fabric.

Each job of the fabric runs one communicator over all its GPUs (a rank per GPU, GPU ``i`` of a
node sending through its rail NIC ``mlx5_i``) and an AllReduce every ``period_s``. Every
process writes what NCCL Inspector writes with ``NCCL_INSPECTOR_DUMP_VERBOSE=1`` and a dump
interval of ``dump_s`` (format v4.3: a ``dump_stats`` marker, then its ``coll_perf`` lines
with per-channel kernel times) to ``nccl/<job>/<host>-pid<pid>.log``, and its
``NCCL_DEBUG=INFO`` lines (NET/IB devices, channel connections, Init COMPLETE) to
``nccl/<job>/debug/<host>.log`` (CONTRACTS.md section 5), and CoMMA's per-edge latency to
``nccl/<job>/comma/<host>.jsonl`` (rocewatch/sim/comma.py).

The faults show as NCCL sees them: a NIC whose PCIe link trained down makes its rank start
``PCIE_LATE_US`` late and the job's collectives slower (the ring runs at the slowest link's
pace); a Straggler NIC makes its rank ``STRAGGLER_LATE_US`` late; a ``SlowGpu`` makes its rank
``lag_us`` late with a clean fabric; a PFC storm from a NIC of the job slows all its
collectives (``STORM_SLOW``) without making one rank late. Every rank gets a few
microseconds of launch jitter.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import orjson

from rocewatch.sim.comma import write_comma
from rocewatch.sim.faults import PcieDowngrade, PfcStorm, SlowGpu, Straggler

if TYPE_CHECKING:
    from rocewatch.sim.simulator import Simulator

PCIE_LATE_US = 200.0
STRAGGLER_LATE_US = 150.0
EXEC_US = 40_000.0
BUSBW_GBS = 180.0
MSG_BYTES = 1 << 31
CHANNELS = 2
STORM_SLOW = 3.0  # a paused job's collectives take this many times longer


def comm_id(job: str) -> str:
    return "0x" + hashlib.sha256(job.encode()).hexdigest()[:14]


def write_nccl(out: Path, sim: Simulator, period_s: float = 0.5, dump_s: float = 1.0) -> None:
    """Write ``out/nccl/<job>/`` for every job of ``sim`` (module docstring)."""
    fab, cfg = sim.fabric, sim.cfg
    rng = np.random.default_rng([cfg.seed, 36])
    start_us = cfg.start_ns // 1000
    n_coll = int(cfg.duration_s / period_s)
    for job in fab.jobs:
        nodes = [n for n in job.nodes if n in fab.node_index]
        if not nodes:
            continue
        comm = comm_id(job.name)
        n_ranks = len(nodes) * fab.n_rails
        t_coll = start_us + (np.arange(n_coll) * period_s + period_s / 2) * 1e6
        late = np.zeros((n_ranks, n_coll))
        slow = np.ones(n_coll)  # the job's collective time factor
        for f in sim.faults:
            if isinstance(f, PfcStorm) and f.origin == "nic" and f.node in nodes:
                # the job's NICs are paused: every collective of the job crawls
                t0 = start_us + f.onset_s * 1e6
                t1 = start_us + f.end_s(cfg.duration_s) * 1e6
                on = (t_coll >= t0) & (t_coll < t1)
                slow[on] = np.maximum(slow[on], STORM_SLOW)
                continue
            if not isinstance(f, PcieDowngrade | Straggler | SlowGpu) or f.node not in nodes:
                continue
            r = nodes.index(str(f.node)) * fab.n_rails + fab.rail_nics.index(str(f.nic))
            t0 = start_us + f.onset_s * 1e6
            t1 = start_us + f.end_s(cfg.duration_s) * 1e6
            on = (t_coll >= t0) & (t_coll < t1)
            if isinstance(f, PcieDowngrade):
                late[r, on] += PCIE_LATE_US
                slow[on] = np.maximum(slow[on], 32.0 * 16 / (f.speed_gts * f.width))
            elif isinstance(f, Straggler):
                late[r, on] += STRAGGLER_LATE_US
                slow[on] = np.maximum(slow[on], 1.0 / max(0.05, 1.0 - f.slow))
            else:
                late[r, on] += f.lag_us
        jitter = rng.uniform(0.0, 6.0, size=(n_ranks, n_coll, CHANNELS))
        kstart = t_coll[None, :, None] + late[:, :, None] + jitter
        exec_us = EXEC_US * slow + late.max(axis=0)
        d = out / "nccl" / job.name
        (d / "debug").mkdir(parents=True, exist_ok=True)
        for ni, node in enumerate(nodes):
            dbg: list[str] = []
            for g in range(fab.n_rails):
                r = ni * fab.n_rails + g
                pid = 20_000 + fab.node_index[node] * 100 + g
                dbg += _debug_lines(node, pid, g, r, n_ranks, len(nodes), fab.rail_nics, comm)
                lines = _inspector_lines(
                    node, pid, comm, job.name, r, n_ranks, len(nodes), t_coll, kstart[r],
                    exec_us, dump_s, start_us, rng,
                )  # fmt: skip
                (d / f"{node}-pid{pid}.log").write_bytes(lines)
            (d / "debug" / f"{node}.log").write_text("\n".join(dbg) + "\n")
        # CoMMA's per-edge latency (rocewatch/sim/comma.py), on its own random stream
        write_comma(
            d, [nd for nd in nodes for _ in fab.rail_nics], list(fab.rail_nics) * len(nodes),
            fab.n_rails, comm, list(sim.faults), cfg.start_ns, cfg.duration_s, dump_s,
            np.random.default_rng([cfg.seed, 37, fab.node_index[nodes[0]]]),
        )  # fmt: skip


def _inspector_lines(
    host: str,
    pid: int,
    comm: str,
    name: str,
    rank: int,
    n_ranks: int,
    nnodes: int,
    t_coll: np.ndarray,
    kstart: np.ndarray,
    exec_us: np.ndarray,
    dump_s: float,
    start_us: int,
    rng: np.random.Generator,
) -> bytes:
    header = {"id": comm, "comm_name": name, "rank": rank, "n_ranks": n_ranks, "nnodes": nnodes}
    done = kstart.max(axis=1) + exec_us
    out: list[bytes] = []
    dump = start_us + dump_s * 1e6
    i, n = 0, len(t_coll)
    while i < n:
        j = i
        while j < n and done[j] <= dump:
            j += 1
        if j > i:
            marker = {
                "header": header,
                "metadata": {
                    "inspector_output_format_version": "v4.3",
                    "git_rev": "",
                    "rec_mechanism": "nccl_profiler_interface",
                    "dump_timestamp_us": int(dump),
                    "hostname": host,
                    "pid": pid,
                },
                "dump_stats": {
                    "coll_records": j - i,
                    "coll_dropped_total": 0,
                    "coll_dropped_since_last_dump": 0,
                    "p2p_records": 0,
                    "p2p_dropped_total": 0,
                    "p2p_dropped_since_last_dump": 0,
                },
            }
            out.append(orjson.dumps(marker))
            for k in range(i, j):
                out.append(
                    orjson.dumps({"coll_perf": _coll(k + 1, kstart[k], float(exec_us[k]), rng)})
                )
            i = j
        dump += dump_s * 1e6
    return b"\n".join(out) + b"\n" if out else b""


def _coll(sn: int, ks: np.ndarray, exec_us: float, rng: np.random.Generator) -> dict[str, object]:
    starts = [int(x) for x in ks]
    stop = [s + int(exec_us) for s in starts]
    busbw = BUSBW_GBS * EXEC_US / exec_us * float(rng.uniform(0.99, 1.01))
    return {
        "coll": "AllReduce",
        "coll_algo": "RING",
        "coll_proto": "SIMPLE",
        "coll_sn": sn,
        "coll_msg_size_bytes": MSG_BYTES,
        "coll_exec_time_us": int(exec_us),
        "coll_timing_source": "kernel_gpu",
        "coll_algobw_gbs": round(busbw / 1.875, 6),
        "coll_busbw_gbs": round(busbw, 6),
        "event_trace_sn": {
            "coll_start_sn": 1,
            "coll_stop_sn": 2,
            "kernel_events": [
                {"channel_id": c, "kernel_start_sn": 3 + c, "kernel_stop_sn": 40 + c}
                | {"kernel_record_sn": 39 + c}
                for c in range(len(starts))
            ],
        },
        "event_trace_ts": {
            "coll_start_ts": min(starts) - 120,
            "coll_stop_ts": min(starts) - 115,
            "kernel_events": [
                {"channel_id": c, "kernel_start_ts": s, "kernel_stop_ts": e, "kernel_record_ts": e}
                for c, (s, e) in enumerate(zip(starts, stop, strict=True))
            ],
        },
    }


def _debug_lines(
    host: str,
    pid: int,
    gpu: int,
    rank: int,
    n_ranks: int,
    nnodes: int,
    nics: list[str],
    comm: str,
) -> list[str]:
    p = f"{host}:{pid}:{pid + 57} [{gpu}] NCCL INFO "
    devs = " ".join(f"[{i}]{nic}:1/RoCE" for i, nic in enumerate(nics))
    peer = (rank + len(nics)) % n_ranks
    back = (rank - len(nics)) % n_ranks
    return [
        p + "NCCL version 2.23.4+cuda12.6",
        p + f"NET/IB : Using {devs} [RO]; OOB ens1f0np0:10.0.0.{nnodes}<0>",
        p + "Using network IB",
        p + f"comm 0x55d0c8a{gpu:03x} rank {rank} nRanks {n_ranks} nNodes {nnodes} "
        f"localRanks {len(nics)} localRank {gpu} MNNVL 0",
        *(
            p + f"Channel {c:02d}/0 : {rank}[{gpu}] -> {peer}[{gpu}] [send] via NET/IB/{gpu}"
            for c in range(CHANNELS)
        ),
        *(
            p + f"Channel {c:02d}/0 : {back}[{gpu}] -> {rank}[{gpu}] [receive] via NET/IB/{gpu}"
            for c in range(CHANNELS)
        ),
        p + f"comm 0x55d0c8a{gpu:03x} rank {rank} nranks {n_ranks} cudaDev {gpu} nvmlDev {gpu} "
        f"busId {0x1B000 + gpu * 0x10000:x} commId {comm} - Init COMPLETE",
    ]
