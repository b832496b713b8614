"""Benchmark: detector throughput per core and state per series, in-process (no Kafka).

A 1,024-GPU fabric (128 nodes x 8 NICs, 16 leaves, 4 spines) sampled every 100 ms is simulated
ahead of time; then the whole detection pipeline (rates, windows, every registered detector,
alert lifecycle, drain policy) runs over it tick by tick, as the live service does.

  samples_per_s_per_core  samples / CPU seconds of the process spent in the pipeline
  bytes_per_series        serialized detector state (rate state, window history, detectors,
                          lifecycle, policy) divided by the number of series
Other keys break both down. Prints one JSON object with --json.

``--rollups 10`` also runs the metric rollups (10 s and 60 s levels) that the live detect
service computes in the same loop for storage, and counts their state: the figures a deployment
with storage sees.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# this file's own name would shadow the detectors package
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent
]


def state_bytes(data: object) -> int:
    """The size of a part of a pipeline's checkpoint (its state, as data)."""
    from rocewatch.core import checkpoint
    from rocewatch.pipeline import Pipeline

    return len(checkpoint.dumps(data, "pipeline", Pipeline.state_types()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--scenario", default="default", help="simulator scenario (faults included)")
    ap.add_argument(
        "--rollups",
        type=int,
        default=0,
        metavar="SECONDS",
        help="also compute metric rollups at this resolution, as the live service does (10)",
    )
    args = ap.parse_args()

    from rocewatch.config import Config
    from rocewatch.pipeline import Pipeline
    from rocewatch.sim import Simulator
    from rocewatch.sim.scenarios import SCENARIOS

    cfg = SCENARIOS[args.scenario](nodes=args.nodes, duration_s=args.seconds, seed=3)
    sim = Simulator(cfg)
    print(
        f"[detectors-bench] simulating {args.nodes * 8} GPUs for {args.seconds:.0f} s",
        file=sys.stderr,
    )
    frames = list(sim.ticks())
    total = sum(f.height for f in frames)
    pipe = Pipeline(sim.topology, Config(), rollup_s=args.rollups or None, retain=False)
    if os.environ.get("ROCEWATCH_BENCH_DEFAULT_GC") != "1":  # to measure what tune_gc gives
        from rocewatch.runtime.memory import tune_gc

        tune_gc()  # as the CLI's detect, replay, evaluate and demo commands do
    lateness = pipe.engine.lateness_ns()
    print(f"[detectors-bench] {total:,} samples; running the pipeline", file=sys.stderr)
    c0, w0 = time.process_time(), time.perf_counter()
    alerts = 0
    for f in frames:
        pipe.ingest(f)
        out = pipe.advance(int(f["ts"].max()) - lateness)  # type: ignore[arg-type]
        alerts += sum(1 for a in out.alerts if a.status == "firing")
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    # state as a checkpoint holds it, mid-stream (before the final flush)
    series = pipe.engine.rates.state.height + sum(
        1 for _ in frames[-1].filter(frames[-1]["raw"].is_null()).iter_rows()
    )
    st = pipe.state()
    parts = {
        "rate_state": state_bytes(st["engine"]["rates"]),
        "window_history": state_bytes(st["engine"]["history"]),
        "detectors": state_bytes(st["detectors"]),
        "lifecycle": state_bytes(st["lifecycle"]),
        "policy": state_bytes(st["policy"]),
    }
    if args.rollups:
        parts["rollups"] = state_bytes(st["rollups"])
    pending = state_bytes(st["engine"]["pending"])
    detector_state = sum(parts.values())
    pipe.finish()
    result = {
        "samples_per_s_per_core": round(total / cpu),
        "bytes_per_series": round(detector_state / series, 1),
        "samples": total,
        "series": series,
        "gpus": args.nodes * 8,
        "sample_interval_s": cfg.interval_s,
        "telemetry_s": args.seconds,
        "cpu_s": round(cpu, 2),
        "wall_s": round(wall, 2),
        "samples_per_s_wall": round(total / wall),
        "state_bytes_by_part": parts,
        "pending_samples_bytes": pending,
        "detectors": [d.name for d in pipe.detectors],
        "alerts_fired": alerts,
        "rollup_s": args.rollups or None,
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "cores": os.cpu_count(),
        "note": "CPU counts every thread of the process (Polars uses both cores)",
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
