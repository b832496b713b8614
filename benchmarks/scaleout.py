"""Benchmark: scale-out detect (``rocewatch detect --scale-out``), one instance vs two.

A simulated fabric (default 128 nodes x 8 NICs = 1,024 GPUs, every 100 ms) is published in
real time to a 4-partition telemetry topic, once for one detector instance and once for two,
``--rounds`` times over, alternated (the live figures pool the rounds: a shared machine's speed
drifts between runs, and one pair of runs can show 15 % either way; ``efficiency_by_round``
shows each); then both again with the recording published as fast as the producer goes
(``burst_*`` keys).
Every instance is its own process; its CPU (user + sys, from /proc and wait4) is counted from
the moment the fabric starts talking until it exits. Prints one JSON object (--json) with:

  one_instance_cpu_s_per_msample    detector CPU seconds per million samples, one instance
  two_instances_cpu_s_per_msample   the same, both instances together
  efficiency                        the first divided by the second (1.0: splitting is free)
  latency_p99_s                     publish -> evaluated by the detectors, two instances, over
                                    the live stream (see below)
  latency_p99_one_instance_s        the same, one instance
  latency_p99_incl_drain_s          two instances, every record, the stream's last ones included
  latency_p99_steady_s              two instances, the live records after the stream's first
                                    second (``..._one_instance_s``: one): a fabric's first steps
                                    meet tens of thousands of new series and take 0.2 to 0.4 s
                                    longer, 2 to 3 % of a 20 s run, enough to move its p99
  live_cores_*                      CPU seconds per telemetry second of the instances, the
                                    publisher (this process) and the broker: above ~1.8 cores
                                    together, 2 cores fall behind and latency grows with the run
  detect_stage_cpu_s_per_msample_*  the detect stage's thread alone (live runs): one instance,
                                    and each of two instances, busiest first. With
                                    ``--pod-domains`` the fabric is split into its two pods
                                    (domains, each with half the spines), so the detect stage
                                    runs as two, one per instance

The recording ends; a fabric does not. A step closes when a sample newer than its end plus the
allowed lateness arrives, so the records of the final lateness + one step + one tick (0.7 s) can
only be closed by the idle flush, ``idle_flush_s`` after the stream stops: that is the drain, not
the pipeline's latency, and at 20 s it is 3 % of the records, enough to own the p99. The live
figures leave those records out; ``latency_p99_incl_drain_s`` keeps them.

Starts its own Kafka broker unless --bootstrap. Two cores shared with the broker and the
publisher cannot show a wall-clock speed-up; the CPU figures are what scaling costs.

  python benchmarks/scaleout.py --json [--nodes 128] [--seconds 20] [--rounds 2] [--pod-domains]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# benchmarks/detectors.py would shadow the detectors package: run from the repository root
sys.path[:] = [str(ROOT), str(ROOT / "scripts")] + [
    p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent
]
PARTITIONS = 4
CLK_TCK = os.sysconf("SC_CLK_TCK")
THREADS = os.environ.get("ROCEWATCH_BENCH_POLARS_THREADS", "1")
FIRST_S = 1.0  # the stream's first second: a fabric's first steps (see the docstring)


def log(msg: str) -> None:
    print(f"[scaleout-bench] {msg}", file=sys.stderr, flush=True)


def _pipeline_bench() -> Any:
    """benchmarks/pipeline.py (its simulate-and-produce helpers), loaded by path."""
    spec = importlib.util.spec_from_file_location(
        "rw_pipeline_bench", ROOT / "benchmarks" / "pipeline.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process (its own, not its children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def held_partitions(log_text: str) -> list[int]:
    """The telemetry partitions an instance's log says it aggregates now."""
    tail = log_text.rsplit("aggregating telemetry partitions", 1)
    if len(tail) < 2:
        return []
    listed = tail[1].split("\n")[0].strip().strip("[]")
    return [int(x) for x in listed.split(",") if x.strip()]


def detect_stages_ready(texts: list[str], domains: list[str]) -> bool:
    """One instance runs the detect stage (one domain), or the instances' latest assignments
    split the domains' stages between them, every instance holding some. (That the groups
    have settled, so the stage stays where it is, is ``groups_settled``'s.)"""
    if len(domains) <= 1:
        return any(t.rfind("detect stage active") > t.rfind("detect stage handed") for t in texts)
    held = []
    for t in texts:
        found = re.findall(r"detect stages held here: (.*)", t)
        held.append(re.findall(r"'([^']*)'", found[-1]) if found else [])
    return all(held) and sorted(d for h in held for d in h) == sorted(domains)


def groups_settled(admin: Any, group: str, k: int) -> bool:
    """Both consumer groups (``<group>-agg``, ``<group>-detect``) are Stable with all ``k``
    instances as members, as the broker says: a member still joining would move partitions,
    or the detect stage, inside the measured stream."""
    from kafka.errors import KafkaError

    try:
        found = admin.describe_groups([f"{group}-agg", f"{group}-detect"])
    except KafkaError:  # the coordinator not yet known: not settled
        return False
    return all(g["group_state"] == "Stable" and len(g["members"]) == k for g in found.values())


def pct(xs: list[float], q: float) -> float:
    """The q-quantile of sorted values (nearest rank), NaN for none."""
    return xs[min(len(xs) - 1, int(len(xs) * q))] if xs else float("nan")


def run(
    k: int,
    bench: Any,
    bootstrap: str,
    data: Path,
    topology_file: Path,
    tmp: Path,
    total: int,
    seconds: float,
    interval_s: float = 0.1,
    broker_pid: int | None = None,
    round_: int = 0,
    domains: list[str] | None = None,
) -> dict[str, Any]:
    """Publish the recording to ``k`` fresh instances (in real time, or as fast as the producer
    goes with ``interval_s`` 0); their CPU and latencies. ``domains``: the fabric's domains."""
    domains = domains or [""]
    import yaml
    from kafka.admin import KafkaAdminClient, NewTopic

    from detectors.windows import WindowConfig

    prefix = f"bench.so{k}.{'live' if interval_s else 'burst'}.r{round_}.{os.getpid()}"
    topics = {
        n: f"{prefix}.{n}"
        for n in ("telemetry", "alerts", "actions", "dead_letter", "steps", "state")
    }
    admin = KafkaAdminClient(bootstrap_servers=[bootstrap])
    admin.create_topics([NewTopic(topics["telemetry"], PARTITIONS, 1)])
    admin.close()
    state = tmp / f"state-{prefix}"
    key_file = tmp / f"{prefix}.key"  # the state topic's MAC key, shared by the instances
    key_file.write_text(secrets.token_hex(32))
    conf = tmp / f"{prefix}.yaml"
    conf.write_text(
        yaml.safe_dump(
            {
                "topology": str(topology_file),
                "state_dir": str(state),
                "kafka": {
                    "bootstrap_servers": bootstrap,
                    "group_id": f"{prefix}.group",
                    "partitions": PARTITIONS,
                    "commit_interval_s": 5.0,
                    "idle_flush_s": 2.0,
                    "session_timeout_ms": 10000,
                    "scale_out": True,
                    "topics": topics,
                    "state_signing": {"key": {"id": "bench", "file": str(key_file)}},
                },
            }
        )
    )
    # one core per instance (the scaling model's unit): Polars' thread pool on a shared 2-core
    # machine only adds CPU spent waiting for the other core
    env = {**os.environ, "PYTHONPATH": str(ROOT), "POLARS_MAX_THREADS": THREADS}
    cmd = [sys.executable, "-m", "rocewatch.cli", "detect", "--config", str(conf)]
    cmd += ["--scale-out", "--max-idle", "6"]
    logs = [tmp / f"{prefix}-{i}.log" for i in range(k)]
    procs = []
    for i in range(k):
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=logs[i].open("wb"), stderr=subprocess.STDOUT)
        )
        time.sleep(1.0)
    # the clock starts once the instances' latest assignments split the telemetry partitions
    # between them (a member still rejoining the group shows its old, overlapping set) and one
    # runs the detect stage: a rebalance inside the measured stream would be timed as latency
    group_admin = KafkaAdminClient(bootstrap_servers=[bootstrap])
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            texts = [p.read_text(errors="replace") for p in logs]
            held = [held_partitions(t) for t in texts]
            if (
                all(held)
                and sorted(p for h in held for p in h) == list(range(PARTITIONS))
                and detect_stages_ready(texts, domains)
                and groups_settled(group_admin, f"{prefix}.group", k)
            ):
                break
            for p, lf in zip(procs, logs, strict=True):
                if p.poll() is not None:
                    raise RuntimeError(f"instance exited early:\n{lf.read_text()[-3000:]}")
            time.sleep(0.3)
        else:
            raise RuntimeError("instances did not take their partitions in time")
    finally:
        group_admin.close()
    cpu0 = [proc_cpu_s(p.pid) for p in procs]
    broker0 = proc_cpu_s(broker_pid) if broker_pid else 0.0
    pub0 = time.process_time()  # this process: the publisher and its Kafka client threads
    how = "in real time" if interval_s else "as fast as the producer goes"
    log(f"{k} instance(s) ready; publishing {seconds:.0f} s of telemetry {how}")
    pub = threading.Thread(
        target=bench.produce, args=(data, bootstrap, topics["telemetry"], interval_s), daemon=True
    )
    t0 = time.monotonic()
    pub.start()
    cpu = 0.0
    for p, c0 in zip(procs, cpu0, strict=True):
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            raise RuntimeError(f"an instance failed ({p.returncode})")
        cpu += ru.ru_utime + ru.ru_stime - c0
    wall = time.monotonic() - t0
    pub.join(60)
    pub_cpu = time.process_time() - pub0
    broker_cpu = proc_cpu_s(broker_pid) - broker0 if broker_pid else float("nan")
    summaries = [json.loads(f.read_text()) for f in state.glob("scaleout-*.json")]
    samples = sum(s["samples"] for s in summaries)
    if samples < total:
        raise RuntimeError(f"the instances aggregated {samples:,} of {total:,} samples")
    pairs = [(int(t), float(x)) for s in summaries for t, x in s["latencies"]]
    end = max((t for t, _ in pairs), default=0)
    w = WindowConfig()
    drain_ns = int((w.lateness_s + w.step_s + interval_s) * 1e9)
    live = sorted(x for t, x in pairs if t <= end - drain_ns)
    first = min((t for t, _ in pairs), default=0)
    steady = sorted(x for t, x in pairs if first + FIRST_S * 1e9 <= t <= end - drain_ns)
    p50, p99 = pct(live, 0.5), pct(live, 0.99)
    p99_all = pct(sorted(x for _, x in pairs), 0.99)
    log(
        f"{k} instance(s): {cpu:.1f} s CPU for {total:,} samples "
        f"({cpu / (total / 1e6):.2f} s per million), live latency p50 {p50:.3f} s "
        f"p99 {p99:.3f} s ({len(live):,} records; p99 {p99_all:.3f} s with the drain), "
        f"samples per instance {[s['samples'] for s in summaries]}"
    )
    return {
        "cpu_s": cpu,
        "per_msample": cpu / (total / 1e6),
        "p50": p50,
        "p99": p99,
        "p99_all": p99_all,
        "live": live,
        "steady": steady,
        "all": sorted(x for _, x in pairs),
        # CPU seconds per second of telemetry: what each party asks of the 2 cores
        "cores": {
            "instances": round(cpu / seconds, 2),
            "publisher": round(pub_cpu / seconds, 2),
            "broker": round(broker_cpu / seconds, 2),
        },
        "wall_s": wall,
        "per_instance_samples": [s["samples"] for s in summaries],
        # the detect stage's thread CPU per instance, busiest first, and the domains it ran
        "detect_cpu_s": sorted((s["detect_cpu_s"] for s in summaries), reverse=True),
        "domains_held": [s["domains_held"] for s in summaries],
        "alerts": sum(s["alerts_sent"] for s in summaries),
    }


def with_pod_domains(doc: dict[str, Any]) -> None:
    """The simulated fabric's pods as domains: each leaf's (``leaf-r<rail>-p<pod>``) and so
    its nodes', and the spines dealt out over the pods in turn."""
    pods = sorted({sw["name"].rsplit("-p", 1)[1] for sw in doc["switches"] if sw["role"] == "leaf"})
    spines = 0
    for sw in doc["switches"]:
        if sw["role"] == "leaf":
            sw["domain"] = "pod-" + sw["name"].rsplit("-p", 1)[1]
        else:
            sw["domain"] = f"pod-{pods[spines % len(pods)]}"
            spines += 1


def pooled(runs: list[dict[str, Any]], total: int) -> dict[str, Any]:
    """Several runs of one setup as one: CPU summed over all their samples, latencies pooled."""
    live = sorted(x for r in runs for x in r["live"])
    steady = sorted(x for r in runs for x in r["steady"])
    every = sorted(x for r in runs for x in r["all"])
    cpu = sum(r["cpu_s"] for r in runs)
    return {
        "cpu_s": cpu,
        "per_msample": cpu / (len(runs) * total / 1e6),
        "p50": pct(live, 0.5),
        "p99": pct(live, 0.99),
        "p99_steady": pct(steady, 0.99),
        "p99_all": pct(every, 0.99),
        "cores": {
            k: round(sum(r["cores"][k] for r in runs) / len(runs), 2) for k in runs[0]["cores"]
        },
        "per_instance_samples": runs[-1]["per_instance_samples"],
        "detect_per_msample": [
            round(sum(cpu) / (len(runs) * total / 1e6), 3)
            for cpu in zip(*(r["detect_cpu_s"] for r in runs), strict=True)
        ],
        "domains_held": runs[-1]["domains_held"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--nodes", type=int, default=128, help="GPU nodes (8 NICs each)")
    ap.add_argument("--seconds", type=float, default=20.0, help="telemetry seconds")
    ap.add_argument("--bootstrap", help="use this broker instead of starting one")
    ap.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="live one-instance and two-instance runs, alternated: a shared machine's speed "
        "drifts by 10 %% and more between runs a minute apart, so the live figures pool them",
    )
    ap.add_argument(
        "--pod-domains",
        action="store_true",
        help="split the fabric into its pods (64 nodes each) as domains: the detect stage "
        "then runs per domain, on both instances",
    )
    args = ap.parse_args()

    import kafka_broker
    import yaml

    bench = _pipeline_bench()
    tmp = Path(tempfile.mkdtemp(prefix="rocewatch-scaleout-"))
    try:
        with kafka_broker.serving(tmp / "kafka", args.bootstrap) as bootstrap:
            log(f"simulating {args.nodes} nodes x 8 NICs for {args.seconds:.0f} s of telemetry")
            data = tmp / "ticks.bin"
            total, msgs, _, topology = bench.generate(args.nodes, args.seconds, data)
            topology_file = tmp / "topology.yaml"
            doc = topology.to_dict()
            if args.pod_domains:
                with_pod_domains(doc)
            topology_file.write_text(yaml.safe_dump(doc))
            log(f"{total:,} samples in {msgs:,} messages ({total / args.seconds:,.0f} samples/s)")
            broker_pid = None if args.bootstrap else kafka_broker.Broker.from_dir(tmp / "kafka").pid
            common = (bench, bootstrap, data, topology_file, tmp, total, args.seconds)
            domains = sorted({sw.get("domain") or "" for sw in doc["switches"]})
            ones: list[dict[str, Any]] = []
            twos: list[dict[str, Any]] = []
            for r in range(args.rounds):
                log(f"live round {r + 1} of {args.rounds}")
                ones.append(run(1, *common, broker_pid=broker_pid, round_=r, domains=domains))
                twos.append(run(2, *common, broker_pid=broker_pid, round_=r, domains=domains))
            one, two = pooled(ones, total), pooled(twos, total)
            # the same without pacing: both runs work through large batches, so the comparison
            # shows what splitting costs apart from how far behind one instance falls
            one_b = run(1, *common, 0.0, domains=domains)
            two_b = run(2, *common, 0.0, domains=domains)
            result = {
                "one_instance_cpu_s_per_msample": round(one["per_msample"], 3),
                "two_instances_cpu_s_per_msample": round(two["per_msample"], 3),
                "efficiency": round(one["per_msample"] / two["per_msample"], 3),
                "efficiency_by_round": [
                    round(a["per_msample"] / b["per_msample"], 3)
                    for a, b in zip(ones, twos, strict=True)
                ],
                "latency_p99_s": round(two["p99"], 3),
                "latency_p50_s": round(two["p50"], 3),
                "latency_p99_one_instance_s": round(one["p99"], 3),
                "latency_p99_incl_drain_s": round(two["p99_all"], 3),
                "latency_p99_steady_s": round(two["p99_steady"], 3),
                "latency_p99_steady_one_instance_s": round(one["p99_steady"], 3),
                "live_cores_two_instances": two["cores"],
                "live_cores_one_instance": one["cores"],
                "burst_one_instance_cpu_s_per_msample": round(one_b["per_msample"], 3),
                "burst_two_instances_cpu_s_per_msample": round(two_b["per_msample"], 3),
                "burst_efficiency": round(one_b["per_msample"] / two_b["per_msample"], 3),
                "one_instance_samples_per_cpu_s": round(1e6 / one["per_msample"]),
                "detect_stage_cpu_s_per_msample_one_instance": one["detect_per_msample"][0],
                "detect_stage_cpu_s_per_msample_two_instances": two["detect_per_msample"],
                "domains_held_two_instances": two["domains_held"],
                "pod_domains": args.pod_domains,
                "two_instances_samples_split": two["per_instance_samples"],
                "samples": total,
                "live_rate_samples_per_s": round(total / args.seconds),
                "nodes": args.nodes,
                "gpus": args.nodes * 8,
                "telemetry_partitions": PARTITIONS,
                "live_rounds": args.rounds,
                "telemetry_s": args.seconds,
                "sample_interval_s": 0.1,
                "cores": os.cpu_count(),
                "polars_threads_per_instance": int(THREADS),
                "load_average_1m": round(os.getloadavg()[0], 2),
                "note": "CPU counted per instance process from the first published record to its "
                "exit (includes Kafka decode, aggregation, steps encode/decode, state checkpoints "
                "and 6 s of idle polling); latency includes the 0.5 s allowed lateness; the live "
                "latencies leave out the records of the stream's last 0.7 s, which only the "
                "idle flush can close",
            }
            print(json.dumps(result) if args.json else json.dumps(result, indent=2))
            return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
