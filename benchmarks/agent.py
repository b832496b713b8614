"""Benchmark: CPU the node agent spends per NIC sample.

A node with 8 mlx5 NICs is laid out as a sysfs tree by the simulator (hw_counters, port counters,
PCIe, link speed: the files the agent reads on a real node); each NIC's netdev is a real netdev
of this machine that answers the ethtool statistics ioctl, so that part is the kernel's real
cost. The agent samples and serialises snapshots (JSON lines) ``--samples`` times.

Prints one JSON object (--json) with:
  cpu_s_per_nic_sample            process CPU seconds per NIC snapshot, ethtool by ioctl
  cpu_s_per_nic_sample_command    the same with ethtool forked (`ethtool -S`), children included
  and the conditions: NICs, counters per snapshot, the netdev used for ethtool and its counters.

  python benchmarks/agent.py --json [--samples 300]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent
]


def log(msg: str) -> None:
    print(f"[agent-bench] {msg}", file=sys.stderr, flush=True)


def ethtool_netdev() -> tuple[str | None, int]:
    """A netdev of this machine whose driver has ethtool statistics (most counters first)."""
    from collector.nic.ethtool import EthtoolError, EthtoolReader

    best: tuple[str | None, int] = (None, 0)
    for p in sorted(Path("/sys/class/net").iterdir()):
        try:
            r = EthtoolReader(p.name)
        except EthtoolError:
            continue
        n = len(r.names)
        r.close()
        if n > best[1]:
            best = (p.name, n)
    return best


def node_tree(root: Path, netdev: str | None) -> int:
    """Lay out gpu-001's 8 NICs from a short simulation; returns NICs laid out."""
    import orjson

    from rocewatch.sim import SimConfig, write_scenario
    from rocewatch.sim.sysfs import write_node_sysfs

    scen = root / "scenario"
    write_scenario(SimConfig(nodes=4, duration_s=0.3, seed=2), scen)
    snaps: dict[str, dict] = {}
    for line in (scen / "nic.jsonl").read_bytes().splitlines():
        s = orjson.loads(line)
        if s["node"] == "gpu-001":
            snaps[s["nic"]] = s
    nics = [snaps[k] for k in sorted(snaps)]
    if netdev is not None:
        for s in nics:
            s["netdev"] = netdev  # the ioctl needs a real device
    write_node_sysfs(root / "sys", nics)
    return len(nics)


def run(root: Path, mode: str, samples: int) -> tuple[float, int, int]:
    from collector.nic.agent import AgentConfig, NicAgent

    cfg = AgentConfig(node="gpu-001", sysfs_root=str(root / "sys"), ethtool=mode, mlxlink="off")
    agent = NicAgent(cfg)
    try:
        lines = agent.sample_lines()  # warm: descriptors opened, names read
        counters = sum(line.count(b":") for line in lines) // len(lines)
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        c0 = time.process_time()
        for _ in range(samples):
            agent.sample_lines()
        cpu = time.process_time() - c0
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu += (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        if agent.stats.counts:
            log(f"{mode}: {dict(agent.stats.counts)}")
        return cpu / (samples * len(agent.nics)), len(agent.nics), counters
    finally:
        agent.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--samples", type=int, default=300)
    args = ap.parse_args()
    netdev, n_eth = ethtool_netdev()
    log(f"ethtool netdev: {netdev} ({n_eth} counters)")
    with tempfile.TemporaryDirectory(prefix="rw-agent-bench-") as tmp:
        root = Path(tmp)
        node_tree(root, netdev)
        ioctl, nics, counters = run(root, "ioctl" if netdev else "off", args.samples)
        command = None
        if netdev and shutil.which("ethtool"):
            command, _, _ = run(root, "command", max(10, args.samples // 10))
    out = {
        "cpu_s_per_nic_sample": round(ioctl, 7),
        "cpu_s_per_nic_sample_command": round(command, 6) if command is not None else None,
        "nics": nics,
        "samples": args.samples,
        "counters_per_snapshot": counters,
        "ethtool_netdev": netdev,
        "ethtool_counters": n_eth,
    }
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
