"""Benchmark: CPU the node agent spends per NIC sample, and what one `rocewatch agent --once`
costs (wall time and peak memory of the whole process: start-up, imports, one snapshot per NIC).

A node with 8 mlx5 NICs is laid out as a sysfs tree by the simulator (hw_counters, port counters,
PCIe, link speed: the files the agent reads on a real node); each NIC's netdev is a real netdev
of this machine that answers the ethtool statistics ioctl, so that part is the kernel's real
cost. The agent samples and serialises snapshots (JSON lines) ``--samples`` times.

Prints one JSON object (--json) with:
  cpu_s_per_nic_sample            process CPU seconds per NIC snapshot, ethtool by ioctl
  cpu_s_per_nic_sample_command    the same with ethtool forked (`ethtool -S`), children included
  once_s                          median wall seconds of `rocewatch agent --once` over --once-runs
                                  (each a new process writing one snapshot per NIC to --out)
  once_max_rss_mb                 the largest peak RSS of those processes (MB)
  and the conditions: NICs, counters per snapshot, the netdev used for ethtool and its counters,
  the command timed and the load average when it ran.

  python benchmarks/agent.py --json [--samples 300] [--once-runs 7]
      [--agent-command "/opt/rocewatch-agent/bin/rocewatch-agent"]   # the lean install's
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
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


def once(root: Path, command: list[str], runs: int, nics: int) -> tuple[float, float]:
    """`<command> --once` on gpu-001's tree ``runs`` times: (median wall s, max peak RSS MB).

    Timed by GNU time (`/usr/bin/time -f "%e %M"`): a child forked from this process would
    report this process's RSS as its own peak (Linux keeps the high-water mark across exec).
    """
    gnu_time = shutil.which("time", path="/usr/bin:/bin")
    if gnu_time is None:
        raise SystemExit("needs GNU time (/usr/bin/time: Debian's package 'time')")
    walls: list[float] = []
    rss_kb = 0
    out, measured = root / "once.jsonl", root / "time.txt"
    argv = [*command, "--once", "--node", "gpu-001", "--sysfs-root", str(root / "sys")]
    for _ in range(runs):
        out.unlink(missing_ok=True)
        res = subprocess.run(
            [gnu_time, "-f", "%e %M", "-o", str(measured), *argv, "--out", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=120,
        )
        lines = out.read_bytes().splitlines() if out.exists() else []
        if res.returncode != 0 or len(lines) != nics:
            raise SystemExit(f"{shlex.join(argv)}: exit {res.returncode}, {len(lines)} snapshots")
        wall, kb = measured.read_text().split()[-2:]
        walls.append(float(wall))
        rss_kb = max(rss_kb, int(kb))
    return statistics.median(walls), rss_kb / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--once-runs", type=int, default=7)
    ap.add_argument(
        "--agent-command",
        default=f"{sys.executable} -m rocewatch.cli agent",
        help="the agent command to time with --once (default: this checkout's `rocewatch agent`)",
    )
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
        once_cmd = shlex.split(args.agent_command)
        once_s, once_rss = once(root, once_cmd, args.once_runs, nics)
    out = {
        "cpu_s_per_nic_sample": round(ioctl, 7),
        "cpu_s_per_nic_sample_command": round(command, 6) if command is not None else None,
        "once_s": round(once_s, 3),
        "once_max_rss_mb": round(once_rss, 1),
        "once_command": shlex.join(once_cmd).replace(sys.executable, "python"),
        "load_average_1m": round(os.getloadavg()[0], 1),
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
