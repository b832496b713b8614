"""Benchmark: what `rocewatch check roce` costs as the fabric grows.

For each size, the simulator's fabric (8 NICs a node, rail-optimised leaves, 8 spines) writes its
RoCE configuration (nic_config.jsonl, switch_config.jsonl: SONiC CONFIG_DB events); the benchmark
times parsing both files into the per-end model and running every check over every cable. The
topology is built in memory (its YAML parse is the topology loader's cost, not this feature's).

Prints one JSON object (--json) with, per size: nodes, NICs, cable ends, the two files' sizes,
load_s (parse), checks_s (all checks), findings (0: the simulated fabric is correct), and the
load average when it ran.

  python benchmarks/roce_config.py --json [--nodes 64,512]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent
]

from rocewatch.core.topology import Topology  # noqa: E402
from rocewatch.roce.checks import run_checks  # noqa: E402
from rocewatch.roce.report import load_dir  # noqa: E402
from rocewatch.sim import SimConfig  # noqa: E402
from rocewatch.sim.fabric import Fabric  # noqa: E402
from rocewatch.sim.roce_config import write_roce_config  # noqa: E402


def measure(nodes: int) -> dict[str, object]:
    cfg = SimConfig(nodes=nodes)
    fab = Fabric(cfg)
    topo = Topology.from_dict(fab.topology_dict())
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        write_roce_config(d, cfg, fabric=fab)
        sizes = {p.name: p.stat().st_size for p in d.glob("*_config.jsonl")}
        t = time.perf_counter()
        _, fc = load_dir(d, topo)
        load_s = time.perf_counter() - t
        t = time.perf_counter()
        findings = run_checks(topo, fc)
        checks_s = time.perf_counter() - t
    return {
        "nodes": nodes,
        "nics": fab.n_nics,
        "ends": len(fc.ends),
        "bytes": sizes,
        "load_s": round(load_s, 3),
        "checks_s": round(checks_s, 3),
        "findings": len(findings),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="64,512", help="fabric sizes (nodes), comma-separated")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = {
        "benchmark": "roce_config",
        "sizes": [measure(int(n)) for n in args.nodes.split(",")],
        "loadavg": os.getloadavg()[0],
    }
    print(json.dumps(res, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
