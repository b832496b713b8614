"""Benchmark: CPU per gNMI update of rocewatch's collector against gnmic's, on the same target.

A gNMI target process serves SWITCHES x PORTS (default 64 x 64, 17 values per port in three
notifications) from pre-encoded responses, so its own cost stays small and out of the figures;
each stream sends ROUNDS sampling rounds and ends. Each collector runs in its own process and
subscribes to every switch at once:

* rocewatch: the collector decodes every update into columnar SAMPLE_SCHEMA batches; CPU is its
  own user + system time from just before it subscribes until the last update is decoded;
* gnmic (tests/support/gnmic.py finds it: ../shared/bin/gnmic, sha256 checked, else PATH): one
  subscription per switch naming it as the target, event format to a file; CPU is the whole
  process's user + system time (all threads, its start-up included) once every stream has ended
  and the file holds every update.

A run counts only when each collector saw every update: otherwise, or when gnmic is missing,
the benchmark exits non-zero with the reason instead of printing a ratio. ``--repeat N``
alternates the two N times (a loaded machine moves figures between runs) and reports medians.
Prints one JSON object (--json):

  rocewatch_cpu_us_per_update, gnmic_cpu_us_per_update, ratio (gnmic / rocewatch CPU per update:
  above 1, rocewatch spends less), *_runs (every run), load_avg (before and after)

``--split`` also runs the collector's gRPC side alone (responses kept as bytes: grpcio's own
cost), then with every response parsed into protobuf objects, and the whole collector after
``tune_gc``: ``split_grpc_receive_us_per_update``, ``split_protobuf_parse_us_per_update`` and
``split_decode_and_batch_us_per_update`` say where rocewatch's CPU goes.

  python benchmarks/gnmi.py --json [--switches 64] [--ports 64] [--ticks 10] [--repeat 3] [--split]
  python benchmarks/gnmi.py --profile [--switches 16]   # cProfile of rocewatch's decode thread
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent
]


class BenchError(Exception):
    """The run cannot give a figure (a collector did not finish, gnmic is missing)."""


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
        raise BenchError(f"gNMI target did not start: {line!r}")
    return proc


def collector_child(addr: str, switches: int, expected: int, variant: str) -> None:
    """The rocewatch collector process: subscribe to every switch, decode, report own CPU.

    ``variant``: ``collector`` (as ``rocewatch collect`` runs it), ``collector-gc`` (the same
    after ``rocewatch.runtime.tune_gc``, as the other long-running commands start),
    ``receive`` (the collector's gRPC streams, every response kept as bytes: grpcio's own
    cost), ``parse`` (the same, each response parsed into protobuf objects), ``profile:FILE``
    (the collector under cProfile, its decode thread's profile written to FILE)."""
    import polars as pl

    from collector.gnmi import Collector, GnmiConfig, SubscriptionConfig, TargetConfig

    if variant in ("receive", "parse"):
        receive_child(addr, switches, expected, variant)
        return
    rows = [0]

    def sink(df: pl.DataFrame) -> None:
        rows[0] += df.height

    cfg = GnmiConfig(
        subscription=SubscriptionConfig(paths=("/",), sample_interval_s=1.0),
        # the target ends each stream after its last round: never subscribe again meanwhile
        backoff_initial_s=600,
        backoff_max_s=600,
    )
    targets = [TargetConfig(f"sw-{i:03d}", addr, target=f"sw-{i:03d}") for i in range(switches)]
    col = Collector(cfg, sink, targets)
    if variant == "collector-gc":
        from rocewatch.runtime.memory import tune_gc

        tune_gc()
    prof = None
    if variant.startswith("profile:"):
        import cProfile
        import threading

        # the streams are decoded on the collector's event-loop thread: profile that thread
        prof = cProfile.Profile()
        real_start = threading.Thread.start

        def start(self: threading.Thread) -> None:
            if self.name == "gnmi-collector":
                run = self.run

                def profiled() -> None:
                    assert prof is not None
                    prof.runcall(run)

                self.run = profiled  # type: ignore[method-assign]
            real_start(self)

        threading.Thread.start = start  # type: ignore[method-assign]
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    w0 = time.perf_counter()
    col.start()
    health = col.health()
    deadline = w0 + 900
    while sum(h.updates for h in health.values()) < expected and time.perf_counter() < deadline:
        time.sleep(0.01)
    col.stop()  # flushes the last batch: its frame is part of the cost
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    wall = time.perf_counter() - w0
    if prof is not None:
        import pstats

        out = variant.split(":", 1)[1]
        prof.dump_stats(out)
        pstats.Stats(out, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(
        json.dumps(
            {
                "cpu_s": cpu,
                "wall_s": wall,
                "updates": sum(h.updates for h in health.values()),
                "samples": rows[0],
                "errors": [
                    h.last_error
                    for h in health.values()
                    if h.last_error and "ended the stream" not in h.last_error
                ][:3],
            }
        ),
        flush=True,
    )


def receive_child(addr: str, switches: int, expected: int, variant: str) -> None:
    """Only the gRPC side of the collector: its channels and Subscribe calls on one event loop,
    each response kept as bytes (``receive``) or parsed into protobuf objects (``parse``)."""
    import asyncio

    from pygnmi.spec.v080 import gnmi_pb2 as pb

    from collector.gnmi import SubscriptionConfig, TargetConfig
    from collector.gnmi.client import make_aio_channel, subscribe_request

    sub = SubscriptionConfig(paths=("/",), sample_interval_s=1.0)
    parse = pb.SubscribeResponse.FromString if variant == "parse" else (lambda b: b)
    updates = [0]

    async def one(name: str) -> None:
        channel = await make_aio_channel(TargetConfig(name, addr, target=name))
        done = asyncio.Event()

        async def requests() -> Any:
            yield subscribe_request(sub, name)
            await done.wait()

        call = channel.stream_stream(
            "/gnmi.gNMI/Subscribe",
            request_serializer=pb.SubscribeRequest.SerializeToString,
            response_deserializer=parse,
        )(requests())
        try:
            async for resp in call:
                if variant == "parse" and resp.WhichOneof("response") == "update":
                    updates[0] += len(resp.update.update)
                elif variant == "receive" and len(resp) > 2:  # not the sync response
                    updates[0] += 1  # responses, not updates (nothing parsed)
        finally:
            done.set()
            await channel.close()

    async def main() -> None:
        await asyncio.gather(*(one(f"sw-{i:03d}") for i in range(switches)))

    r0 = resource.getrusage(resource.RUSAGE_SELF)
    w0 = time.perf_counter()
    asyncio.run(main())
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    # without parsing, updates are not counted: every response came (17 updates in 3 per port)
    got = updates[0] if variant == "parse" else updates[0] * 17 // 3
    print(json.dumps({"cpu_s": cpu, "wall_s": time.perf_counter() - w0, "updates": got}))


def run_rocewatch(
    addr: str, switches: int, expected: int, variant: str = "collector"
) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, __file__, "--child", addr, str(switches), str(expected), variant],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=1200,
    )
    if variant.startswith("profile:"):
        print(out.stderr, file=sys.stderr)
    if out.returncode != 0:
        raise BenchError(f"rocewatch {variant} failed: {out.stderr[-2000:]}")
    res: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if res["updates"] != expected:
        raise BenchError(
            f"rocewatch {variant} did not finish: {res['updates']} of {expected} updates "
            f"({'; '.join(res.get('errors', [])) or 'no error reported'})"
        )
    return res


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) from /proc."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_gnmic(gnmic: Path, addr: str, switches: int, expected: int, tmp: Path) -> dict[str, Any]:
    """gnmic subscribes to every switch (a subscription per switch), event format to a file."""
    from tests.support.gnmic import Subscriber, count_values, event_lines, subscriber_config

    names = [f"sw-{i:03d}" for i in range(switches)]
    events = tmp / "gnmic-events.jsonl"
    events.unlink(missing_ok=True)
    work = tmp / "gnmic"
    work.mkdir(exist_ok=True)
    cfg = subscriber_config(names, addr, sample_interval_s=1.0, paths=("/",), events_file=events)
    cfg["log-file"] = str(work / "gnmic.log")
    (work / "gnmic.log").unlink(missing_ok=True)
    peer = Subscriber(gnmic, cfg, work)
    t0 = time.perf_counter()
    with peer:
        assert peer.proc is not None
        try:
            # the end of every stream (gnmic logs each), then the file output's last writes
            peer.wait(lambda: peer.ended() >= set(names), 900, "end of every stream")
            size = -1
            while events.exists() and events.stat().st_size != size:
                size = events.stat().st_size
                time.sleep(0.3)
        except AssertionError as e:
            raise BenchError(f"gnmic did not finish: {e}") from e
        cpu = proc_cpu_s(peer.proc.pid)
        wall = time.perf_counter() - t0
    seen = count_values(event_lines(events))
    if seen != expected:
        raise BenchError(f"gnmic did not deliver every update: {seen} of {expected} in {events}")
    return {"cpu_s": cpu, "wall_s": wall, "updates": seen}


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        collector_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        return 0
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--switches", type=int, default=64)
    ap.add_argument("--ports", type=int, default=64)
    ap.add_argument("--ticks", type=int, default=10, help="sampling rounds each switch sends")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each collector, alternated")
    ap.add_argument(
        "--split",
        action="store_true",
        help="also: grpcio alone, grpcio + protobuf parse, the collector after tune_gc",
    )
    ap.add_argument("--profile", action="store_true", help="cProfile rocewatch's decode thread")
    args = ap.parse_args()
    try:
        result = bench(args)
    except BenchError as e:
        print(f"gnmi-bench: FAILED: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")
    return 0


def bench(args: argparse.Namespace) -> dict[str, Any]:
    from tests.support.gnmic import find_gnmic

    ticks = max(2, args.ticks // 2 * 2)
    per_tick = args.switches * args.ports * 17
    expected = per_tick * ticks
    found = find_gnmic()
    if found.path is None and not args.profile:
        raise BenchError(f"gnmic is not available: {found.why}; no ratio without it")
    result: dict[str, Any] = {
        "switches": args.switches,
        "ports_per_switch": args.ports,
        "updates_per_round": per_tick,
        "rounds": ticks,
        "updates": expected,
        "cpus": os.cpu_count(),
        "gnmic": found.why,
        "load_avg_before": [round(x, 2) for x in os.getloadavg()],
    }
    runs: dict[str, list[dict[str, Any]]] = {}
    variants = ["collector", *(["receive", "parse", "collector-gc"] if args.split else [])]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        port = free_port()
        addr = f"127.0.0.1:{port}"
        log(f"target: {args.switches} switches x {args.ports} ports, {expected} updates per run")
        target = start_target(port, args.switches, args.ports, ticks)
        try:
            if args.profile:
                run_rocewatch(addr, args.switches, expected, f"profile:{tmp / 'rocewatch.prof'}")
                return result
            assert found.path is not None
            for i in range(args.repeat):
                for v in variants:
                    log(f"run {i + 1}/{args.repeat}: rocewatch {v} ...")
                    runs.setdefault(v, []).append(run_rocewatch(addr, args.switches, expected, v))
                log(f"run {i + 1}/{args.repeat}: gnmic ...")
                runs.setdefault("gnmic", []).append(
                    run_gnmic(found.path, addr, args.switches, expected, tmp)
                )
        finally:
            target.terminate()
            target.wait(10)
    us = {k: [r["cpu_s"] * 1e6 / r["updates"] for r in v] for k, v in runs.items()}
    rw, gm = us["collector"], us["gnmic"]
    result.update(
        rocewatch_cpu_us_per_update=round(median(rw), 3),
        rocewatch_cpu_us_per_update_runs=[round(x, 3) for x in rw],
        rocewatch_updates=runs["collector"][-1]["updates"],
        rocewatch_wall_s_runs=[round(r["wall_s"], 2) for r in runs["collector"]],
        gnmic_cpu_us_per_update=round(median(gm), 3),
        gnmic_cpu_us_per_update_runs=[round(x, 3) for x in gm],
        gnmic_updates=runs["gnmic"][-1]["updates"],
        gnmic_wall_s_runs=[round(r["wall_s"], 2) for r in runs["gnmic"]],
        ratio=round(median(gm) / median(rw), 3),
        ratio_runs=[round(g / r, 3) for g, r in zip(gm, rw, strict=True)],
    )
    if args.split:
        # where rocewatch's CPU goes: grpcio receiving, protobuf parsing, the decode into columns
        recv, parse, tuned = (median(us[k]) for k in ("receive", "parse", "collector-gc"))
        result.update(
            split_grpc_receive_us_per_update=round(recv, 3),
            split_protobuf_parse_us_per_update=round(parse - recv, 3),
            split_decode_and_batch_us_per_update=round(median(rw) - parse, 3),
            split_runs={k: [round(x, 3) for x in us[k]] for k in variants},
            rocewatch_tuned_gc_cpu_us_per_update=round(tuned, 3),
            ratio_tuned_gc=round(median(gm) / tuned, 3),
        )
    result["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    return result


if __name__ == "__main__":
    raise SystemExit(main())
