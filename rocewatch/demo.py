"""`rocewatch demo`: a simulated fabric with one fault of each kind, end to end in one process."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import orjson

from detectors.registry import ALERTNAMES
from rocewatch.config import Config
from rocewatch.core.model import PFC_STORM
from rocewatch.core.progress import Progress
from rocewatch.pipeline import Output, Pipeline
from rocewatch.replay import write_jsonl
from rocewatch.runtime.outputs import OutputWriter


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def _feed_config(pipeline: Pipeline, sim: Any) -> str:
    """The fabric's RoCE configuration into the pipeline, as the agents and gnmic would send it
    (five minutes before the telemetry), plus the demo's configuration change: PFC moved to
    priority 4 on the leaf port facing the storm's origin two minutes before the storm. Returns
    the change in words ("" without a NIC storm)."""
    from rocewatch.sim.faults import PfcStorm
    from rocewatch.sim.roce_config import WRONG_PRIORITY, config_records, port_pfc_change

    t0 = int(sim.cfg.start_ns)
    nics, events, _ = config_records(sim.cfg, sim.fabric, ts=t0 - 300 * 1_000_000_000)
    said = ""
    storm = next((f for f in sim.faults if isinstance(f, PfcStorm) and f.node and f.nic), None)
    nic = sim.topology.nics.get((storm.node, storm.nic)) if storm is not None else None
    if storm is not None and nic is not None and nic.switch_port is not None:
        at = t0 + int((storm.onset_s - 120) * 1e9)
        sp = nic.switch_port
        events.append(port_pfc_change(sp.switch, sp.port, at, WRONG_PRIORITY))
        said = f"pfc_enable {WRONG_PRIORITY} on {sp} at {(at - t0) / 1e9:+.0f} s"
    pipeline.ingest_config("nic", nics)
    pipeline.ingest_config("switch", events)
    return said


def run_demo(nodes: int, duration: float, seed: int, db: Path, out: Path | None) -> int:
    from rocewatch.sim import Simulator
    from rocewatch.sim.scenarios import demo_scenario
    from storage.store import Store

    cfg = demo_scenario(nodes=nodes, seed=seed)
    if duration and duration != cfg.duration_s:
        import dataclasses

        cfg = dataclasses.replace(cfg, duration_s=duration)
    sim = Simulator(cfg)
    pipeline = Pipeline(sim.topology, Config(), rollup_s=10)
    change = _feed_config(pipeline, sim)
    if db.exists():
        db.unlink()
    store = Store(f"sqlite:///{db}")
    store.create_schema()
    lateness = pipeline.engine.lateness_ns()
    total = int(cfg.duration_s / cfg.interval_s)
    bar = Progress("demo", total, enabled=True)
    t0 = time.perf_counter()
    n_alerts = 0

    writer = OutputWriter(store)

    def sink(o: Output) -> None:
        nonlocal n_alerts
        writer.write(
            o.alerts, o.inhibited, o.actions, o.rollups, o.ranks, config_changes=o.config_changes
        )
        n_alerts += sum(1 for a in o.alerts if a.status == "firing")

    print(
        f"simulating {nodes} nodes x {cfg.nics_per_node} NICs for {cfg.duration_s:.0f} s of "
        f"telemetry, faults: {', '.join(type(f).__name__ for f in cfg.faults)}",
        file=sys.stderr,
    )
    newest = 0
    for i, frame in enumerate(sim.ticks()):
        pipeline.ingest(frame)
        if frame.height:
            newest = max(newest, int(frame["ts"].max()))  # type: ignore[arg-type]
        if i % 5 == 4:  # hand over half a second at a time, as a Kafka poll would
            sink(pipeline.advance(newest - lateness))
        bar.update(i + 1, f"{pipeline.samples_in / 1e6:.1f} M samples, {n_alerts} alerts")
    sink(pipeline.finish())
    bar.close()
    alerts = pipeline.all_alerts()
    writer.store_final(alerts)
    store.close()
    elapsed = time.perf_counter() - t0
    start = cfg.start_ns

    def rel(ns: int) -> str:
        return f"{(ns - start) / 1e9:+.2f}s" if ns else "-"

    rows = []
    victims = [a for a in alerts if a.labels.get("role") == "victim"]
    for a in alerts:
        lab = a.labels
        if lab.get("role") == "victim":
            continue
        entity = "/".join(
            x
            for x in (lab.get("node") or lab.get("switch"), lab.get("nic") or lab.get("port"))
            if x
        )
        rows.append(
            [
                a.name,
                lab.get("severity", ""),
                lab.get("role", ""),
                entity or lab.get("scope", ""),
                rel(a.starts_at),
                rel(a.ends_at),
                a.status,
            ]
        )
    if victims:
        first = min(v.starts_at for v in victims)
        nics = sum(1 for v in victims if "nic" in v.labels)
        rows.append(
            [
                PFC_STORM,
                "warning",
                "victim",
                f"{len(victims) - nics} switch ports + {nics} NICs (grouped)",
                rel(first),
                "",
                f"{sum(1 for v in victims if v.status == 'firing')} firing",
            ]
        )
    print()
    print(
        f"ALERTS ({len(alerts)}, victims of a storm grouped under one line; "
        "telemetry time relative to the start)"
    )
    print(_table(rows, ["alertname", "severity", "role", "entity", "starts", "ends", "status"]))
    truth_rows = []
    for f in sim.truth().get("faults", []):
        names = {f["alertname"], *f.get("also", [])}
        matches = f.get("match") or [f["labels"]]
        hits = [
            a
            for a in alerts
            if a.name in names
            and a.labels.get("role") != "victim"
            and any(all(a.labels.get(k) == v for k, v in m.items()) for m in matches)
        ]
        found = (
            f"yes, in {(min(h.starts_at for h in hits) - f['onset_ns']) / 1e9:.2f} s"
            if hits
            else ("no" if f["alertname"] in ALERTNAMES.values() else "no detector yet")
        )
        entity = "/".join(str(v) for v in f["labels"].values())
        truth_rows.append([f["kind"], entity, rel(f["onset_ns"]), found])
    print()
    print("INJECTED FAULTS (the simulator's ground truth) and whether rocewatch found them")
    print(_table(truth_rows, ["fault", "entity", "onset", "detected"]))
    act_rows = [
        [rel(x.time), x.action, x.node, x.scheduler, x.outcome, x.reason] for x in pipeline.actions
    ]
    print()
    print(f"DRAIN DECISIONS ({len(act_rows)}; dry-run: nothing was executed)")
    print(_table(act_rows, ["time", "action", "node", "scheduler", "outcome", "reason"]))
    print()
    print(
        f"{pipeline.samples_in:,} samples in {elapsed:.1f} s "
        f"({pipeline.samples_in / elapsed:,.0f} samples/s); SQLite: {db}"
    )
    if change:
        print()
        print(f"CONFIGURATION CHANGE (the demo's own, in the stream): {change}")
        for a in alerts:
            if "config_changes" in a.annotations and a.labels.get("role") == "origin":
                print(
                    f"  on {a.name} {a.labels.get('node')}/{a.labels.get('nic')}: "
                    f"{a.annotations['config_changes']}"
                )
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_jsonl(out / "alerts.jsonl", [a.to_json() for a in alerts])
        write_jsonl(out / "actions.jsonl", [a.to_json() for a in pipeline.actions])
        (out / "truth.json").write_bytes(orjson.dumps(sim.truth(), option=orjson.OPT_INDENT_2))
    return 0
