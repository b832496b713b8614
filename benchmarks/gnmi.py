"""Benchmark: CPU per gNMI update of rocewatch's collector (and gnmic's, when installed).

A gNMI target process serves SWITCHES x PORTS (default 64 x 64, 17 values per port in three
notifications) from pre-encoded responses, so its own cost stays small and out of the figures.
Each collector runs in its own process, subscribes to every switch at once, decodes everything
into its output and exits; its CPU is its own user + system time from just before it subscribes
until the last update is decoded (rocewatch: into columnar SAMPLE_SCHEMA batches; gnmic: event
format to a file). Prints one JSON object (--json):

  rocewatch_cpu_us_per_update, gnmic_cpu_us_per_update, ratio (gnmic / rocewatch)

gnmic is looked for in ~/.cache/rocewatch/go/bin (scripts/go_tools.sh tries to install it);
where it is missing its figure and the ratio are null and ``gnmic_missing`` says why.

  python benchmarks/gnmi.py --json [--switches 64] [--ports 64] [--ticks 10]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent
]
GO_BIN = Path(os.environ.get("ROCEWATCH_GO_DIR", Path.home() / ".cache/rocewatch/go")) / "bin"


def log(msg: str) -> None:
    print(f"[gnmi-bench] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_target(port: int, switches: int, ports: int, ticks: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rocewatch.sim.gnmi_target",
            f"--address=127.0.0.1:{port}",
            f"--synthetic={switches}x{ports}",
            f"--ticks={ticks}",
            "--pace=0",
            "--eof",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("serving"):
        proc.kill()
        raise SystemExit(f"gNMI target did not start: {line!r}")
    return proc


def collector_child(addr: str, switches: int, expected: int) -> None:
    """The rocewatch collector process: subscribe to every switch, decode, report own CPU."""
    import polars as pl

    from collector.gnmi import Collector, GnmiConfig, SubscriptionConfig, TargetConfig

    rows = [0]

    def sink(df: pl.DataFrame) -> None:
        rows[0] += df.height

    cfg = GnmiConfig(
        subscription=SubscriptionConfig(paths=("/",), sample_interval_s=1.0),
        backoff_initial_s=30,
        backoff_max_s=30,
    )
    targets = [TargetConfig(f"sw-{i:03d}", addr, target=f"sw-{i:03d}") for i in range(switches)]
    col = Collector(cfg, sink, targets)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    w0 = time.perf_counter()
    col.start()
    health = col.health()
    while sum(h.updates for h in health.values()) < expected:
        if time.perf_counter() - w0 > 600:
            break
        time.sleep(0.01)
    col.stop()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    updates = sum(h.updates for h in health.values())
    print(
        json.dumps(
            {
                "cpu_s": cpu,
                "wall_s": time.perf_counter() - w0,
                "updates": updates,
                "samples": rows[0],
                "errors": [h.last_error for h in health.values() if h.last_error][:3],
            }
        ),
        flush=True,
    )


def run_rocewatch(addr: str, switches: int, expected: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, __file__, "--child", addr, str(switches), str(expected)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=900,
    )
    if out.returncode != 0:
        raise SystemExit(f"rocewatch collector failed: {out.stderr[-2000:]}")
    res: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return res


def run_gnmic(gnmic: Path, addr: str, switches: int, expected: int, tmp: Path) -> dict[str, float]:
    """gnmic subscribes to every switch (one target entry each), event format to a file."""
    cfg = tmp / "gnmic.yaml"
    out_file = tmp / "gnmic-events.jsonl"
    lines = ["insecure: true", "encoding: proto", "targets:"]
    for i in range(switches):
        # gnmic names targets by address; distinct names, same address, prefix target per entry
        lines += [f"  sw-{i:03d}:", f"    address: {addr}", f"    name: sw-{i:03d}"]
    lines += [
        "subscriptions:",
        "  fabric:",
        '    paths: ["/"]',
        "    mode: stream",
        "    stream-mode: sample",
        "    sample-interval: 1s",
        "    target: '{{ .Name }}'",
        "outputs:",
        "  file:",
        "    type: file",
        f"    filename: {out_file}",
        "    format: event",
    ]
    cfg.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen(
        [str(gnmic), "--config", str(cfg), "subscribe"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    t0 = time.perf_counter()
    seen = 0
    while time.perf_counter() - t0 < 600 and proc.poll() is None:
        time.sleep(0.5)
        if out_file.exists():
            with out_file.open("rb") as fh:
                seen = sum(len(json.loads(x).get("values", {})) for x in fh if x.strip())
            if seen >= expected:
                break
    with open(f"/proc/{proc.pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / tick
    proc.terminate()
    proc.wait(10)
    return {"cpu_s": cpu, "wall_s": time.perf_counter() - t0, "updates": seen}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        collector_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--switches", type=int, default=64)
    ap.add_argument("--ports", type=int, default=64)
    ap.add_argument("--ticks", type=int, default=10, help="sampling rounds each switch sends")
    args = ap.parse_args()
    ticks = max(2, args.ticks // 2 * 2)
    per_tick = args.switches * args.ports * 17
    expected = per_tick * ticks
    result: dict[str, object] = {
        "switches": args.switches,
        "ports_per_switch": args.ports,
        "updates_per_round": per_tick,
        "rounds": ticks,
        "cpus": os.cpu_count(),
    }
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        port = free_port()
        addr = f"127.0.0.1:{port}"
        log(f"target: {args.switches} switches x {args.ports} ports, {expected} updates per run")
        target = start_target(port, args.switches, args.ports, ticks)
        try:
            log("rocewatch collector ...")
            rw = run_rocewatch(addr, args.switches, expected)
            rw_us = rw["cpu_s"] * 1e6 / max(1, rw["updates"])
            result.update(
                rocewatch_cpu_us_per_update=round(rw_us, 3),
                rocewatch_updates=rw["updates"],
                rocewatch_cpu_s=round(rw["cpu_s"], 3),
                rocewatch_wall_s=round(rw["wall_s"], 3),
            )
            gnmic = GO_BIN / "gnmic"
            if not gnmic.exists():
                gnmic = Path(shutil.which("gnmic") or GO_BIN / "gnmic")
            if gnmic.exists():
                log("gnmic ...")
                gm = run_gnmic(gnmic, addr, args.switches, expected, tmp)
                g_us = gm["cpu_s"] * 1e6 / max(1, gm["updates"])
                result.update(
                    gnmic_cpu_us_per_update=round(g_us, 3),
                    gnmic_updates=gm["updates"],
                    gnmic_cpu_s=round(gm["cpu_s"], 3),
                    ratio=round(g_us / rw_us, 3),
                )
            else:
                result.update(
                    gnmic_cpu_us_per_update=None,
                    ratio=None,
                    gnmic_missing=(
                        "gnmic is not installed: the Go module proxy reachable here refuses "
                        "github.com/openconfig/gnmic (every version, 403); see scripts/go_tools.sh"
                    ),
                )
        finally:
            target.terminate()
            target.wait(10)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
