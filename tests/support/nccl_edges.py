"""A small communicator's CoMMA edge latency and rank join, fed through a real window engine to
an NCCL detector, step by step (for the SlowEdge tests)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import polars as pl

from detectors.base import StepContext
from detectors.windows import WindowConfig, WindowEngine
from rocewatch.core.model import Finding, conform
from rocewatch.core.topology import Topology

S = 1_000_000_000
T0 = 1_795_946_400 * S
COMM = "0x7f8c496ae9f661"
SEND = "nccl_net_send_latency_ns"


def topology() -> Topology:
    """Four nodes with one NIC each; gpu-001/002 under leaf-0, gpu-003/004 under leaf-1; one
    spine joins the leaves."""
    return Topology.from_dict(
        {
            "switches": [
                {"name": "leaf-0", "role": "leaf"},
                {"name": "leaf-1", "role": "leaf"},
                {"name": "spine-0", "role": "spine"},
            ],
            "links": [
                {"a": "leaf-0/Ethernet1", "b": "spine-0/Ethernet1"},
                {"a": "leaf-1/Ethernet1", "b": "spine-0/Ethernet2"},
            ],
            "nodes": [
                {"name": f"gpu-00{i + 1}", "nics": [
                    {"nic": "mlx5_0", "switch_port": f"leaf-{i // 2}/Ethernet{33 + i % 2}"}
                ]}
                for i in range(4)
            ],
            "jobs": [{"name": "llm", "nodes": [f"gpu-00{i + 1}" for i in range(4)]}],
        }
    )  # fmt: skip


def samples(sec: int, slow: Mapping[tuple[int, int], float]) -> pl.DataFrame:
    """Second ``sec``'s exports: the join (rank i on gpu-00<i+1>/mlx5_0) and each ring edge's
    send latency (12 us, times ``slow[(src, dst)]``)."""
    ts = T0 + sec * S
    rows: list[tuple[int, str, str, str, str, float]] = []
    for r in range(4):
        rows.append((ts, f"gpu-00{r + 1}", f"rank{r}", f"{COMM}/mlx5_0", "nccl_rank_gpu", 0.0))
        d = (r + 1) % 4
        v = 12_000.0 * slow.get((r, d), 1.0) * (1 + 0.01 * ((sec + r) % 3))
        rows.append((ts, f"gpu-00{r + 1}", f"rank{r}->rank{d}", COMM, SEND, v))
    df = pl.DataFrame(
        rows, schema=["ts", "device", "port", "qual", "metric", "value"], orient="row"
    )
    return conform(df)


def run(
    det: object,
    topo: Topology,
    seconds: Iterable[int],
    slow: Callable[[int], Mapping[tuple[int, int], float]],
    firing: Callable[[], list[Mapping[str, str]]] = list,
    engine: WindowEngine | None = None,
) -> tuple[WindowEngine, list[list[Finding]]]:
    """Feed ``seconds`` of exports to ``det`` (step 1 s); its findings at each second."""
    eng = engine or WindowEngine(WindowConfig(step_s=1.0, lateness_s=0.0))
    out: list[list[Finding]] = []
    for sec in seconds:
        eng.add(samples(sec, slow(sec)))
        for step in eng.close_until(T0 + (sec + 1) * S):
            eng.enter(step)
            ctx = StepContext(eng, topo, step.start, step.end, firing=firing)
            out.append(det.evaluate(ctx))  # type: ignore[attr-defined]
    return eng, out
