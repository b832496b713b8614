"""Soak: a 1,024-GPU fabric sampled every 100 ms, streamed live through the real broker for
minutes while ``rocewatch detect`` runs as its own process; memory of both sides over time.

The publisher (the collectors' side: the simulator feeding ``TelemetryPublisher`` with its
bounded send buffer) and the detector (``rocewatch detect``, a separate process) run against a
Kafka broker on loopback. Every second the harness reads both processes' RSS from /proc and
the detector's consumer lag and ingested samples from its /metrics endpoint. Prints one JSON
object (--json) with, per side, ``*_rss_start_mb`` / ``*_rss_end_mb`` (after warm-up / at the
end), ``*_rss_slope_mb_per_min`` (least-squares slope over the second half of the run),
``*_rss_growth_second_half_mb`` (that slope times the half's length), the same for the RSS
floor (``*_rss_floor_*``: the lowest RSS of each 10 s, which batches in flight move far less
than they move the RSS itself), the lag at the end and at
its peak, the samples published and consumed, and ``plot``: a PNG of RSS and lag over time.

  python benchmarks/soak.py --json [--seconds 600] [--nodes 128] [--plot FILE]
                             [--check]

``--seconds`` defaults to ``ROCEWATCH_SOAK_S`` or 600 (the issue's bound). ``--check`` judges
the run (``problems``: the stream ended cleanly, the send buffer held, the detector kept
consuming, and, from ``MEMORY_JUDGED_FROM_S`` on, memory stayed flat: each side's RSS floor
grew less than ``GROWTH_BOUND_MB`` over the judged half) and exits 1 when something failed.
tests/test_soak.py runs the same harness and the same judgement for a short time, where memory
cannot be judged yet. Starts its own Kafka broker unless --bootstrap.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# benchmarks/detectors.py would shadow the detectors package: run from the repository root
sys.path[:] = [str(ROOT), str(ROOT / "scripts")] + [
    p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent
]
PARTITIONS = 4
SAMPLE_EVERY_S = 1.0
WARMUP_SHARE = 0.5  # memory is judged over the second half of the run at least
FIT_SETTLE_S = 30.0  # ... and from this long after the isolation forest's first model
FLOOR_WINDOW = 10  # samples per window of the RSS floor (its lowest value in the window)
SEED = 11
# memory: the RSS floor of each process (its lowest value in each 10 s window; batches in flight
# swing the detector's RSS by a few hundred MB, a leak lifts the floor) is fitted by least
# squares over the judged half, and its slope times the half's length must stay below this:
# under 10 % of the detector's working set at 1,024 GPUs (500-1,000 MB) and of the order of a
# leak of one byte per thousand samples (about 25 MB a minute at 400-480k samples/s). The
# unbounded growth this found (the detector buffering what partitions delivered ahead of the
# slowest one) lifted the floor by 100-500 MB a minute.
GROWTH_BOUND_MB = 50.0
# runs shorter than this end before the isolation forest's first model has settled (its fit is
# a one-time step up of some 40 MB) and leave too few floor windows to fit a slope
MEMORY_JUDGED_FROM_S = 240.0
_METRIC = re.compile(r"^(rocewatch_[a-z_]+)(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)


def log(msg: str) -> None:
    print(f"[soak] {msg}", file=sys.stderr, flush=True)


def rss_mb(pid: int) -> float | None:
    """Resident set size of a live process in MiB (None once it has gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def scrape(port: int) -> dict[str, float]:
    """The detector's rocewatch_* metrics (labelled series summed)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for name, value in _METRIC.findall(text):
        out[name] = out.get(name, 0.0) + float(value)
    return out


def slope_per_min(ts: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over ts (seconds), per minute."""
    import numpy as np

    if len(ts) < 3:
        return float("nan")
    return float(np.polyfit(np.asarray(ts), np.asarray(ys), 1)[0]) * 60.0


# --- the publisher (its own process) ----------------------------------------------------------


def publish_live(conf: Path, nodes: int, seconds: float, summary: Path) -> int:
    """Simulate the fabric and publish it tick by tick at the live rate, through the bounded
    ``TelemetryPublisher``; write what happened to ``summary`` (JSON)."""
    from rocewatch.bus.publish import TelemetryPublisher
    from rocewatch.bus.topics import ensure_topics
    from rocewatch.config import load_config
    from rocewatch.sim import Simulator
    from rocewatch.sim.scenarios import default_scenario

    cfg = load_config(conf)
    sim_cfg = default_scenario(nodes=nodes, duration_s=seconds, seed=SEED)
    # telemetry time is wall time, as from a live fabric
    sim = Simulator(dataclasses.replace(sim_cfg, start_ns=time.time_ns()))
    ensure_topics(cfg.kafka)
    pub = TelemetryPublisher(cfg.kafka, source="soak")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    interval = sim_cfg.interval_s
    print("streaming", flush=True)
    t0 = time.monotonic()
    behind_max = 0.0
    late_ticks = 0
    ticks = 0
    for k, frame in enumerate(sim.ticks()):
        if stop.is_set():
            break
        ahead = t0 + k * interval - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        elif -ahead > interval:
            late_ticks += 1
            behind_max = max(behind_max, -ahead)
        pub.publish(frame)
        ticks += 1
    wall = time.monotonic() - t0
    pub.close()
    summary.write_text(
        json.dumps(
            {
                "ticks": ticks,
                "samples": pub.samples,
                "wall_s": wall,
                "dropped_samples": pub.dropped_samples,
                "dropped_messages": pub.dropped_messages,
                "failed_messages": pub.failed_messages,
                "max_pending_bytes": pub.max_pending_bytes,
                "buffer_bytes": cfg.kafka.publish_buffer_bytes,
                "late_ticks": late_ticks,
                "behind_max_s": behind_max,
            }
        )
    )
    return 0


# --- the harness ----------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_config(tmp: Path, bootstrap: str, topology_file: Path, prefix: str, port: int) -> Path:
    import yaml

    names = ("telemetry", "alerts", "actions", "dead_letter", "steps", "state", "rollups")
    key_file = tmp / "state.key"  # the state topic's MAC key
    key_file.write_text(secrets.token_hex(32))
    conf = tmp / "soak.yaml"
    conf.write_text(
        yaml.safe_dump(
            {
                "topology": str(topology_file),
                "state_dir": str(tmp / "state"),
                "metrics_port": port,
                "kafka": {
                    "bootstrap_servers": bootstrap,
                    "group_id": f"{prefix}.group",
                    "partitions": PARTITIONS,
                    "commit_interval_s": 5.0,
                    "idle_flush_s": 2.0,
                    "session_timeout_ms": 10000,
                    # the collectors' side holds at most this much unacknowledged telemetry
                    "publish_buffer_bytes": 16 << 20,
                    "publish_when_full": "block",
                    "topics": {n: f"{prefix}.{n}" for n in names},
                    "state_signing": {"key": {"id": "soak", "file": str(key_file)}},
                },
            }
        )
    )
    return conf


def _wait_log(path: Path, needle: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        if needle in text:
            return
        if proc.poll() is not None:
            raise RuntimeError(f"process exited early ({proc.returncode}):\n{text[-3000:]}")
        time.sleep(0.3)
    raise RuntimeError(f"no {needle!r} in {path} after {timeout:.0f} s")


def judged_from(t_end: float) -> float:
    """Where warm-up ends, in seconds since the fabric started talking: half the run, and not
    before the isolation forest has fitted its first model (it learns from the first
    ``baseline_s`` of telemetry; the model, the forest's compiled arrays and the CPU spike of
    the fit are a one-time step up), while that leaves a third of the run to judge."""
    from detectors.isolation_forest import IsolationForestConfig

    first_fit = IsolationForestConfig().baseline_s + FIT_SETTLE_S
    return max(t_end * WARMUP_SHARE, min(first_fit, t_end * 2 / 3))


def plot(samples: list[dict[str, float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] for s in samples]
    fig, (ax, lag_ax) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    ax.plot(t, [s["detector_rss_mb"] for s in samples], label="detector (rocewatch detect)")
    ax.plot(t, [s["publisher_rss_mb"] for s in samples], label="publisher (collector side)")
    ax.axvline(judged_from(t[-1]) if t else 0, color="grey", ls=":", lw=1, label="judged from here")
    ax.set_ylabel("RSS (MiB)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right")
    ax.set_title(title)
    lag_ax.plot(t, [s["lag_records"] for s in samples], color="tab:red")
    lag_ax.set_ylabel("consumer lag (records)")
    lag_ax.set_xlabel("seconds since the fabric started talking")
    lag_ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_soak(
    seconds: float,
    nodes: int,
    bootstrap: str,
    tmp: Path,
    plot_path: Path | None = None,
    drain_s: float = 60.0,
) -> dict[str, Any]:
    """Run publisher and detector for ``seconds``; the figures (see the module docstring).

    After the publisher ends, the detector gets up to ``drain_s`` to catch up (its /metrics
    count every published sample); then it is stopped with SIGTERM (a graceful stop:
    checkpoint, commit). It runs without --max-idle: on a loaded machine the publisher can take
    longer to start than any idle bound, and a detector that idled out before the stream began
    would be judged as one that died mid-stream.
    """
    import yaml

    from rocewatch.sim import Simulator
    from rocewatch.sim.scenarios import default_scenario

    tmp.mkdir(parents=True, exist_ok=True)
    prefix = f"soak.{os.getpid()}.{int(time.time())}"
    topology = Simulator(default_scenario(nodes=nodes, duration_s=seconds, seed=SEED)).topology
    topology_file = tmp / "topology.yaml"
    topology_file.write_text(yaml.safe_dump(topology.to_dict()))
    port = _free_port()
    conf = _write_config(tmp, bootstrap, topology_file, prefix, port)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    det_log = tmp / "detect.log"
    det_cmd = [sys.executable, "-m", "rocewatch.cli", "detect", "--config", str(conf)]
    pub_log = tmp / "publish.log"
    pub_summary = tmp / "publish.json"
    pub_cmd = [sys.executable, str(Path(__file__).resolve()), "--publish", str(conf)]
    pub_cmd += ["--nodes", str(nodes), "--seconds", str(seconds), "--summary", str(pub_summary)]

    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=[bootstrap])
    admin.create_topics([NewTopic(f"{prefix}.telemetry", PARTITIONS, 1)])
    admin.close()

    det = subprocess.Popen(det_cmd, env=env, stdout=det_log.open("wb"), stderr=subprocess.STDOUT)
    pub: subprocess.Popen[bytes] | None = None
    try:
        _wait_log(det_log, "aggregating telemetry partitions [", det, 120)
        log(f"detector ready (pid {det.pid}); publishing {seconds:.0f} s of {nodes * 8} GPUs")
        pub = subprocess.Popen(
            pub_cmd, env=env, stdout=pub_log.open("wb"), stderr=subprocess.STDOUT
        )
        _wait_log(pub_log, "streaming", pub, 120)
        t0 = time.monotonic()
        samples: list[dict[str, float]] = []
        pub_rc: int | None = None
        while True:
            now = time.monotonic() - t0
            r_det, r_pub = rss_mb(det.pid), rss_mb(pub.pid)
            m = scrape(port)
            if r_det is not None and r_pub is not None and pub.poll() is None:
                samples.append(
                    {
                        "t": round(now, 2),
                        "detector_rss_mb": round(r_det, 2),
                        "publisher_rss_mb": round(r_pub, 2),
                        "lag_records": m.get("rocewatch_consumer_lag_records_total", 0.0),
                        "metrics_ok": bool(m),
                        "consumed_samples": m.get("rocewatch_samples_ingested_total", 0.0),
                    }
                )
            pub_rc = pub.poll()
            if pub_rc is not None:
                break
            if det.poll() is not None:
                raise RuntimeError(f"the detector exited mid-stream:\n{_tail(det_log)}")
            if now > seconds + 120:
                raise RuntimeError("the publisher did not finish in time")
            time.sleep(max(0.0, SAMPLE_EVERY_S - (time.monotonic() - t0 - now)))
        if pub_rc != 0:
            raise RuntimeError(f"the publisher failed ({pub_rc}):\n{_tail(pub_log)}")
        end = scrape(port)
        log(f"publisher done; detector draining (up to {drain_s:.0f} s)")
        published = json.loads(pub_summary.read_text())["samples"]
        deadline = time.monotonic() + drain_s
        stopped_by = "drain timeout"
        while time.monotonic() < deadline and det.poll() is None:
            m = scrape(port)
            if m.get("rocewatch_samples_ingested_total", 0.0) >= published:
                stopped_by = "caught up"
                break
            time.sleep(0.5)
        if det.poll() is not None:
            raise RuntimeError(f"the detector exited while draining:\n{_tail(det_log)}")
        det.send_signal(signal.SIGTERM)
        det_rc: int | None = det.wait(120)
    finally:
        for p in (pub, det):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(30)
    if det_rc != 0:
        raise RuntimeError(f"the detector failed ({det_rc}):\n{_tail(det_log)}")
    pubs = json.loads(pub_summary.read_text())
    return _figures(samples, pubs, end, stopped_by, nodes, seconds, plot_path)


def _tail(path: Path, n: int = 3000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else "(no log)"


def _figures(
    samples: list[dict[str, float]],
    pubs: dict[str, Any],
    end: dict[str, float],
    stopped_by: str,
    nodes: int,
    seconds: float,
    plot_path: Path | None,
) -> dict[str, Any]:
    if len(samples) < 10:
        raise RuntimeError(f"only {len(samples)} memory samples")
    t_end = samples[-1]["t"]
    second = [s for s in samples if s["t"] >= judged_from(t_end)]
    out: dict[str, Any] = {}
    span_min = (second[-1]["t"] - second[0]["t"]) / 60.0
    for side in ("detector", "publisher"):
        key = f"{side}_rss_mb"
        slope = slope_per_min([s["t"] for s in second], [s[key] for s in second])
        # the floor: each window's lowest RSS. Batches in flight swing the RSS by a few hundred
        # MB; what a leak raises is the floor, which moves far less with them
        floor_t, floor = [], []
        for i in range(0, len(second) - FLOOR_WINDOW + 1, FLOOR_WINDOW):
            win = second[i : i + FLOOR_WINDOW]
            floor_t.append(sum(s["t"] for s in win) / len(win))
            floor.append(min(s[key] for s in win))
        floor_slope = slope_per_min(floor_t, floor)
        out[f"{side}_rss_floor_slope_mb_per_min"] = round(floor_slope, 3)
        out[f"{side}_rss_floor_growth_second_half_mb"] = round(floor_slope * span_min, 2)
        out[f"{side}_rss_start_mb"] = round(second[0][key], 1)
        out[f"{side}_rss_end_mb"] = round(samples[-1][key], 1)
        out[f"{side}_rss_max_mb"] = round(max(s[key] for s in samples), 1)
        out[f"{side}_rss_slope_mb_per_min"] = round(slope, 3)
        out[f"{side}_rss_growth_second_half_mb"] = round(slope * span_min, 2)
    consumed_half = [s["consumed_samples"] for s in second]
    out.update(
        {
            "samples": len(samples),
            "sample_every_s": SAMPLE_EVERY_S,
            "run_s": round(t_end, 1),
            "judged_from_s": round(second[0]["t"], 1),
            "lag_records_end": int(end.get("rocewatch_consumer_lag_records_total", 0)),
            "lag_records_max": int(max(s["lag_records"] for s in samples)),
            "published_samples": pubs["samples"],
            "consumed_samples_at_publish_end": int(end.get("rocewatch_samples_ingested_total", 0)),
            "consumed_samples_second_half": int(consumed_half[-1] - consumed_half[0]),
            "publish_rate_samples_per_s": round(pubs["samples"] / max(pubs["wall_s"], 1e-9)),
            "publisher_dropped_samples": pubs["dropped_samples"],
            "publisher_failed_messages": pubs["failed_messages"],
            "publisher_max_pending_mb": round(pubs["max_pending_bytes"] / 2**20, 2),
            "publisher_buffer_mb": round(pubs["buffer_bytes"] / 2**20, 2),
            "publisher_behind_max_s": round(pubs["behind_max_s"], 2),
            "detector_stopped_by": stopped_by,
            "nodes": nodes,
            "gpus": nodes * 8,
            "telemetry_s": seconds,
            "sample_interval_s": 0.1,
            "telemetry_partitions": PARTITIONS,
            "cores": os.cpu_count(),
            "load_average_1m": round(os.getloadavg()[0], 2),
        }
    )
    if plot_path is not None:
        title = f"soak: {nodes * 8} GPUs every 100 ms, {t_end:.0f} s"
        plot(samples, plot_path, title)
        out["plot"] = str(plot_path)
    out["series"] = samples
    return out


def problems(res: dict[str, Any]) -> list[str]:
    """What is wrong with a soak run's figures (``run_soak``'s result); empty when it passed."""
    out = []
    if not res["published_samples"] > 0:
        out.append("nothing was published")
    if res["publisher_failed_messages"] or res["publisher_dropped_samples"]:
        out.append(
            f"the publisher failed {res['publisher_failed_messages']} messages and dropped "
            f"{res['publisher_dropped_samples']} samples (publish_when_full: block)"
        )
    # one message may go over: a message larger than what is free waits for an empty buffer
    if res["publisher_max_pending_mb"] > res["publisher_buffer_mb"] + 1.0:
        out.append(
            f"the publisher held {res['publisher_max_pending_mb']} MB unacknowledged, "
            f"over its {res['publisher_buffer_mb']} MB buffer"
        )
    if not res["consumed_samples_second_half"] > 0:
        out.append("the detector consumed nothing in the second half")
    if not all(s["metrics_ok"] for s in res.get("series", [])):
        out.append("the detector's /metrics did not answer")
    if res["samples"] < 0.8 * res["run_s"] / res["sample_every_s"]:
        out.append(f"only {res['samples']} memory samples over {res['run_s']} s")
    if res["telemetry_s"] >= MEMORY_JUDGED_FROM_S:
        for side in ("detector", "publisher"):
            growth = res[f"{side}_rss_floor_growth_second_half_mb"]
            if not growth < GROWTH_BOUND_MB:
                out.append(
                    f"{side} RSS floor grew {growth:.1f} MB over the second half "
                    f"({res[f'{side}_rss_floor_slope_mb_per_min']:.2f} MB/min)"
                )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--seconds",
        type=float,
        default=float(os.environ.get("ROCEWATCH_SOAK_S", "600")),
        help="telemetry seconds streamed live (default $ROCEWATCH_SOAK_S or 600)",
    )
    ap.add_argument("--nodes", type=int, default=128, help="GPU nodes (8 NICs each)")
    ap.add_argument("--plot", type=Path, help="PNG to write (default: in the temp directory)")
    ap.add_argument("--bootstrap", help="use this broker instead of starting one")
    ap.add_argument("--series", action="store_true", help="include every sample in the JSON")
    ap.add_argument("--check", action="store_true", help="exit 1 when the run fails `problems`")
    ap.add_argument("--publish", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--summary", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.publish:
        return publish_live(args.publish, args.nodes, args.seconds, args.summary)

    import kafka_broker

    tmp = Path(tempfile.mkdtemp(prefix="rocewatch-soak-"))
    plot_path = args.plot or Path(tempfile.gettempdir()) / f"rocewatch-soak-{os.getpid()}.png"
    broker = None
    try:
        if args.bootstrap:
            bootstrap = args.bootstrap
        else:
            log("starting a Kafka broker")
            kafka_broker.fetch(quiet=True)
            broker = kafka_broker.start(tmp / "kafka", port=0)
            bootstrap = broker.bootstrap
        res = run_soak(args.seconds, args.nodes, bootstrap, tmp / "run", plot_path)
        found = problems(res)
        res["problems"] = found
        if not args.series:
            res.pop("series")
        log(f"plot: {plot_path}")
        print(json.dumps(res) if args.json else json.dumps(res, indent=2))
        for p in found:
            log(f"FAILED: {p}")
        return 1 if args.check and found else 0
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
