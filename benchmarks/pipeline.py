"""Benchmark: simulate -> real Kafka -> detect, on this machine, broker included.

Prints one JSON object (--json) with:
  samples_per_s   detector throughput draining a pre-filled telemetry topic
  latency_p50_s   publish -> evaluated-by-detectors latency, fabric published in real time
  latency_p99_s
and the conditions they were measured under. Starts its own Kafka broker unless --bootstrap.

  python benchmarks/pipeline.py --json [--nodes 136] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# benchmarks/detectors.py would shadow the detectors package: run from the repository root
sys.path[:] = [str(ROOT), str(ROOT / "scripts")] + [
    p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent
]


def log(msg: str) -> None:
    print(f"[pipeline-bench] {msg}", file=sys.stderr, flush=True)


def generate(nodes: int, seconds: float, out: Path) -> tuple[int, int, float, object]:
    """Simulate, encode per device and tick, write length-prefixed messages grouped by tick."""
    from rocewatch import wire
    from rocewatch.sim import Simulator
    from rocewatch.sim.scenarios import healthy_scenario

    cfg = healthy_scenario(nodes=nodes, duration_s=seconds, seed=11)
    sim = Simulator(cfg)
    n_samples = 0
    n_msgs = 0
    t0 = time.process_time()
    with out.open("wb") as fh:
        for frame in sim.ticks():
            parts = frame.partition_by("device", as_dict=True, maintain_order=True)
            fh.write(struct.pack("<I", len(parts)))
            for (device,), part in parts.items():
                key = str(device).encode()
                val = wire.encode(part, "bench")
                fh.write(struct.pack("<HI", len(key), len(val)))
                fh.write(key)
                fh.write(val)
                n_msgs += 1
            n_samples += frame.height
    return n_samples, n_msgs, time.process_time() - t0, sim.topology


def produce(path: Path, bootstrap: str, topic: str, interval_s: float) -> None:
    """Send the recorded ticks; interval_s > 0 paces them like a live fabric."""
    from kafka import KafkaProducer

    p = KafkaProducer(
        bootstrap_servers=[bootstrap],
        acks="all",
        linger_ms=5,
        batch_size=1 << 20,
        max_request_size=8 << 20,
        compression_type="lz4",
    )
    t0 = time.monotonic()
    tick = 0
    with path.open("rb") as fh:
        while True:
            head = fh.read(4)
            if not head:
                break
            (n,) = struct.unpack("<I", head)
            if interval_s > 0:
                ahead = t0 + tick * interval_s - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
            for _ in range(n):
                klen, vlen = struct.unpack("<HI", fh.read(6))
                key = fh.read(klen)
                val = fh.read(vlen)
                # the record's CreateTime (set by send) is the publish time latency starts from
                p.send(topic, key=key, value=val)
            tick += 1
    p.flush()
    p.close()


def detect(
    bootstrap: str,
    topic: str,
    topology: object,
    state: Path,
    total: int,
    timeout_s: float,
    on_ready: object = None,
) -> dict[str, float]:
    """One `rocewatch detect` instance (both stages in this process) on ``topic``: its drain
    wall and CPU time, and the publish -> evaluated latencies of what it read."""
    import secrets
    import threading

    from rocewatch.config import (
        Config,
        KafkaConfig,
        StateKeyConfig,
        StateSigningConfig,
        TopicsConfig,
    )
    from rocewatch.runtime.service import DetectService

    # the state topic's MAC key (`rocewatch detect` does not start without one)
    key_file = state.parent / f"{state.name}.key"
    key_file.write_text(secrets.token_hex(32))
    names = ("alerts", "actions", "dead_letter", "steps", "state", "rollups")
    k = KafkaConfig(
        bootstrap_servers=bootstrap,
        group_id=f"bench-{topic}",
        topics=TopicsConfig(telemetry=topic, **{n: f"{topic}.{n}" for n in names}),
        state_signing=StateSigningConfig(key=StateKeyConfig(id="bench", file=str(key_file))),
    )
    svc = DetectService(Config(kafka=k, state_dir=str(state)), topology=topology)  # type: ignore[arg-type]
    svc.subscribe()
    # join both groups before the clock starts (and before the fabric starts talking); stage 1
    # is polled only until it has its partitions: a poll after that would aggregate records
    # outside the measured time (a whole poll of the pre-filled topic while the detect group
    # was still joining, which made the drain look up to twice as cheap as it is)
    c0 = time.process_time()  # from before the join: its first poll may already read records
    join_deadline = time.monotonic() + 60
    while time.monotonic() < join_deadline and not svc.agg.consumer.assignment():
        svc.agg.poll_once(100)
    while time.monotonic() < join_deadline and not svc.det.active:
        svc.det.poll_once(100)
    if callable(on_ready):
        on_ready()
    worker = threading.Thread(target=svc.run, daemon=True)
    first = time.monotonic()  # the clock starts once the detector is ready
    s0 = svc.agg.samples  # read by the join's polls, before the clock
    worker.start()
    deadline = time.monotonic() + timeout_s

    def evaluated() -> bool:
        """The detect stage has read every steps message stage 1 sent (the broker's end
        offsets: the consumer's highwater is only as fresh as its last fetch, which may predate
        the last closes) and evaluated every step all partitions have closed."""
        if svc.producer.unanswered:  # steps still on their way to the broker
            return False
        held = [(d, d.state) for d in svc.det.shards if d.active and d.state is not None]
        ends = svc.store.end_offsets([d.tp for d, _ in held])
        for d, st in held:
            closed = list(st.part_closed.values())
            if st.offset < ends[d.tp] or len(closed) < svc.n_parts:
                return False
            edge = min(closed) // d.step_ns * d.step_ns
            if st.closed_ns is None or st.closed_ns < edge:
                return False
        return bool(held)

    # drained: every sample aggregated, and every step closed by then evaluated (the last
    # lateness window waits for idleness: the old service's flush_idle, left out here)
    while time.monotonic() < deadline and worker.is_alive():
        if svc.agg.samples >= total and evaluated():
            break
        time.sleep(0.05)
    end = time.monotonic()
    cpu = time.process_time() - c0
    svc.stop_event.set()
    worker.join(120)
    lat = sorted(x for _, x in svc.det.latencies())
    return {
        "samples": svc.agg.samples,
        "clocked": svc.agg.samples - s0,  # the samples read after the clock started
        "wall_s": end - first,
        "cpu_s": cpu,
        "p50": lat[len(lat) // 2] if lat else float("nan"),
        "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--nodes", type=int, default=136, help="GPU nodes (8 NICs each)")
    ap.add_argument("--seconds", type=float, default=20.0, help="telemetry seconds")
    ap.add_argument("--bootstrap", help="use this broker instead of starting one")
    ap.add_argument(
        "--produce",
        nargs=4,
        metavar=("FILE", "BOOTSTRAP", "TOPIC", "INTERVAL"),
        help=argparse.SUPPRESS,
    )
    args = ap.parse_args()
    if args.produce:
        produce(Path(args.produce[0]), args.produce[1], args.produce[2], float(args.produce[3]))
        return 0

    import kafka_broker

    tmp = Path(tempfile.mkdtemp(prefix="rocewatch-bench-"))
    try:
        with kafka_broker.serving(tmp / "kafka", args.bootstrap) as bootstrap:
            log(f"simulating {args.nodes} nodes x 8 NICs for {args.seconds:.0f} s of telemetry")
            data = tmp / "ticks.bin"
            total, msgs, enc_cpu, topology = generate(args.nodes, args.seconds, data)
            rate_live = total / args.seconds
            log(
                f"{total:,} samples in {msgs:,} messages ({rate_live:,.0f} samples/s live); "
                f"encode {total / enc_cpu:,.0f} samples/s of CPU"
            )
            from kafka.admin import KafkaAdminClient, NewTopic

            admin = KafkaAdminClient(bootstrap_servers=[bootstrap])
            admin.create_topics([NewTopic("bench.fill", 4, 1), NewTopic("bench.live", 4, 1)])
            admin.close()
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            me = [sys.executable, __file__, "--produce"]

            log("throughput: filling the topic, then draining it with the detector")
            subprocess.run([*me, str(data), bootstrap, "bench.fill", "0"], check=True, env=env)
            thr = detect(bootstrap, "bench.fill", topology, tmp / "state-fill", total, 600)
            log(
                f"drained {thr['samples']:,} samples in {thr['wall_s']:.1f} s "
                f"({thr['clocked'] / thr['wall_s']:,.0f}/s, {thr['cpu_s']:.1f} s CPU)"
            )

            log("latency: publishing in real time while the detector runs")
            procs: list[subprocess.Popen[bytes]] = []

            def start_fabric() -> None:
                procs.append(
                    subprocess.Popen([*me, str(data), bootstrap, "bench.live", "0.1"], env=env)
                )

            live = detect(
                bootstrap,
                "bench.live",
                topology,
                tmp / "state-live",
                total,
                args.seconds * 3 + 60,
                on_ready=start_fabric,
            )
            for p in procs:
                p.wait(120)
            log(f"live: p50 {live['p50']:.3f} s, p99 {live['p99']:.3f} s")
            result = {
                "samples_per_s": round(thr["clocked"] / thr["wall_s"]),
                "latency_p50_s": round(live["p50"], 4),
                "latency_p99_s": round(live["p99"], 4),
                "detector_cpu_s_per_msample": round(thr["cpu_s"] / (thr["samples"] / 1e6), 3),
                "live_rate_samples_per_s": round(rate_live),
                "live_samples_processed": live["samples"],
                "nodes": args.nodes,
                "nics": args.nodes * 8,
                "telemetry_s": args.seconds,
                "sample_interval_s": 0.1,
                "allowed_lateness_s": 0.5,
                "window_step_s": 0.1,
                "cores": os.cpu_count(),
                "note": "latency includes the 0.5 s allowed lateness and the 0.1 s step: a sample "
                "is evaluated once the watermark passes its step",
            }
            print(json.dumps(result) if args.json else json.dumps(result, indent=2))
            return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
