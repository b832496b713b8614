"""Benchmark: what the RoCE configuration in the stream (rocewatch/roce/watch.py) costs the
pipeline, per minute of telemetry.

The simulator's fabric (8 NICs a node) sends its configuration as agents and gnmic would: the
switches' CONFIG_DB at the start and every NIC's first snapshot at its own time over the first
minute (agents starting one by one: a new end at almost every 0.1 s step); then a steady
minute (every NIC's snapshot again, nothing changed); then PFC moved to priority 4 on every port
of one leaf. Times the watch's ``advance`` at every 0.1 s step (CPU seconds).

  python benchmarks/roce_watch.py --json [--nodes 64,256]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent
]

from rocewatch.roce.watch import ConfigWatch  # noqa: E402
from rocewatch.sim import SimConfig, Simulator  # noqa: E402
from rocewatch.sim.roce_config import ConfigFault, config_records  # noqa: E402

S = 1_000_000_000
STEP = S // 10


def measure(nodes: int) -> dict[str, object]:
    cfg = SimConfig(nodes=nodes, seed=1)
    sim = Simulator(cfg)
    nics, events, _ = config_records(cfg, sim.fabric)
    t0 = cfg.start_ns
    w = ConfigWatch(sim.topology)
    for i, n in enumerate(nics):
        w.add_nic(n | {"timestamp": t0 + i * 60 * S // len(nics)})
    for e in events:
        w.add_switch(e)

    def run(first: int, last: int) -> float:
        c = time.process_time()
        for k in range(first, last):
            w.advance(t0 + k * STEP)
        return round(time.process_time() - c, 3)

    first = run(1, 601)
    for i, n in enumerate(nics):
        w.add_nic(n | {"timestamp": t0 + 60 * S + i * 60 * S // len(nics)})
    steady = run(601, 1201)
    leaf = sim.fabric.leaves[0]
    _, wrong, _ = config_records(
        cfg, sim.fabric, [ConfigFault("pfc_wrong_priority", leaf)], ts=t0 + 121 * S
    )
    for e in wrong:
        if e["tags"]["source"].startswith(f"{leaf}:"):
            w.add_switch(e)
    c = time.process_time()
    changes = w.advance(t0 + 122 * S)
    change_s = round(time.process_time() - c, 3)
    return {
        "nodes": nodes,
        "nics": len(nics),
        "ends": len(w.ends),
        "first_minute_cpu_s": first,
        "steady_minute_cpu_s": steady,
        "leaf_change_cpu_s": change_s,
        "leaf_change_events": len(changes),
        "findings_after_change": len(w.findings),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="64,256")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = {
        "benchmark": "roce_watch",
        "date": time.strftime("%Y-%m-%d"),
        "loadavg": os.getloadavg()[0],
        "sizes": [measure(int(n)) for n in args.nodes.split(",")],
    }
    print(json.dumps(out, indent=2) if args.json else out)


if __name__ == "__main__":
    main()
