"""The `rocewatch` command."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from rocewatch.errors import ConfigError, RocewatchError

log = logging.getLogger("rocewatch")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rocewatch",
        description="Streaming telemetry and anomaly detection for RoCE v2 fabrics.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log debug detail")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser(
        "demo",
        help="simulate a fabric with faults and run the whole pipeline "
        "in one process (no Kafka), printing alerts and drains",
    )
    d.add_argument("--nodes", type=int, default=64)
    d.add_argument("--duration", type=float, default=40.0, help="telemetry seconds")
    d.add_argument("--seed", type=int, default=7)
    d.add_argument("--db", default="rocewatch-demo.db", help="SQLite file to write")
    d.add_argument("--out", type=Path, help="also write alerts.jsonl and actions.jsonl here")

    s = sub.add_parser("simulate", help="write a scenario directory from the fabric simulator")
    s.add_argument("out_dir", type=Path)
    s.add_argument("--nodes", type=int, default=16)
    s.add_argument("--duration", type=float, default=30.0, help="telemetry seconds")
    s.add_argument("--seed", type=int, default=1)
    s.add_argument(
        "--scenario",
        default="default",
        choices=["default", "demo", "healthy", "moe", "dark_storm", "uplink_flaky"],
    )

    r = sub.add_parser("replay", help="replay a scenario directory through the detectors")
    r.add_argument("scenario_dir", type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--config", type=Path)
    r.add_argument("--model", type=Path, help="isolation-forest model to use (else learned)")

    pub = sub.add_parser("publish", help="publish a scenario's telemetry to the Kafka topic")
    pub.add_argument("scenario_dir", type=Path)
    pub.add_argument("--config", type=Path, required=True)
    pub.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="pace at this many times telemetry speed (0: as fast as possible)",
    )

    det = sub.add_parser("detect", help="the detector service: consume telemetry from Kafka")
    det.add_argument("--config", type=Path, required=True)
    det.add_argument(
        "--max-idle",
        type=float,
        default=0.0,
        help="exit after this many seconds without input (0: run forever)",
    )

    ev = sub.add_parser(
        "evaluate",
        help="score the detectors on labelled simulated scenarios "
        "(precision, recall, time to detect, wrong-node drains)",
    )
    ev.add_argument("--out", type=Path, default=Path("evaluation"), help="where to write results")
    ev.add_argument("--json", action="store_true", help="print the results as JSON")
    ev.add_argument("--quick", action="store_true", help="a small suite (tests, CI)")
    ev.add_argument("--config", type=Path, help="rocewatch config (detector thresholds, policy)")

    col = sub.add_parser(
        "collect",
        help="subscribe to switches over gNMI and write telemetry to Kafka (or a file)",
    )
    col.add_argument("--config", type=Path, help="rocewatch config (gnmi: and kafka: sections)")
    col.add_argument("--topology", type=Path, help="topology (targets, cabling check)")
    col.add_argument("--target", action="append", default=[], help="NAME=HOST:PORT (repeatable)")
    col.add_argument("--out", type=Path, help="append gnmic event JSON lines here, not Kafka")
    col.add_argument("--duration", type=float, default=0.0, help="seconds (0: until stopped)")
    col.add_argument(
        "--shard-group",
        help="collect only this instance's share of the targets (Kafka consumer group NAME)",
    )
    col.add_argument(
        "--gnmic-topic",
        help="instead of subscribing: read gnmic's Kafka output (format: event) from this topic",
    )
    col.add_argument(
        "--max-idle", type=float, default=0.0, help="--gnmic-topic: exit after this idle time"
    )

    t = sub.add_parser("topology", help="topology file tools")
    tsub = t.add_subparsers(dest="topology_command", required=True)
    tc = tsub.add_parser("check", help="validate a topology file")
    tc.add_argument("file", type=Path)
    td = tsub.add_parser("discover", help="write a topology file from LLDP neighbours over gNMI")
    td.add_argument("--config", type=Path)
    td.add_argument("--topology", type=Path, help="current topology: targets, names, roles")
    td.add_argument("--target", action="append", default=[], help="NAME=HOST:PORT (repeatable)")
    td.add_argument("--out", type=Path, required=True)
    td.add_argument("--timeout", type=float, default=30.0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("kafka").setLevel(logging.WARNING)
    try:
        return _dispatch(args)
    except ConfigError as e:
        lines = str(e).splitlines() or ["invalid input"]
        print(f"rocewatch: error: {lines[0]}", file=sys.stderr)
        for line in lines[1:]:
            print(f"  {line}", file=sys.stderr)
        return 2
    except RocewatchError as e:
        print(f"rocewatch: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    from rocewatch.config import load_config

    if args.command == "demo":
        from rocewatch.demo import run_demo

        return run_demo(args.nodes, args.duration, args.seed, Path(args.db), args.out)
    if args.command == "simulate":
        from rocewatch.sim import scenarios as sc
        from rocewatch.sim import write_scenario

        if args.scenario == "demo":
            sim_cfg = sc.demo_scenario(nodes=args.nodes, seed=args.seed)
        else:
            sim_cfg = sc.SCENARIOS[args.scenario](
                nodes=args.nodes, duration_s=args.duration, seed=args.seed
            )
        from rocewatch.progress import Progress

        bar = Progress("simulate", 1, enabled=sys.stderr.isatty())
        write_scenario(sim_cfg, args.out_dir, progress=lambda d, t: bar.update(d / max(t, 1)))
        bar.close()
        print(f"wrote {args.out_dir}")
        return 0
    if args.command == "replay":
        from rocewatch.replay import replay

        cfg = load_config(args.config)
        store = None
        if cfg.storage_url:
            from storage.store import Store

            store = Store(cfg.storage_url)
            store.create_schema()
        res = replay(
            args.scenario_dir,
            args.out,
            cfg,
            show_progress=sys.stderr.isatty(),
            store=store,
            model=args.model,
        )
        firing = sum(1 for a in res.alerts if a["status"] == "firing")
        print(
            f"replayed {res.samples} samples in {res.seconds:.1f} s: {len(res.alerts)} alerts "
            f"({firing} still firing), {len(res.actions)} actions -> {args.out}"
        )
        skipped = {k: v for k, v in res.stats.items() if not k.endswith("_by")}
        if skipped:
            print(
                "counted and skipped: " + ", ".join(f"{k}={v}" for k, v in sorted(skipped.items()))
            )
        return 0
    if args.command == "publish":
        from rocewatch.kafka_io import publish_scenario

        cfg = load_config(args.config)
        n = publish_scenario(args.scenario_dir, cfg, rate=args.rate)
        print(f"published {n} samples to {cfg.kafka.topics.telemetry}")
        return 0
    if args.command == "detect":
        from rocewatch.kafka_io import DetectService

        cfg = load_config(args.config)
        DetectService(cfg).run(max_idle_s=args.max_idle)
        return 0
    if args.command == "evaluate":
        from rocewatch.evaluate import run_evaluate

        return run_evaluate(args.out, args.json, args.quick, args.config, args.verbose)
    if args.command == "collect" or (
        args.command == "topology" and args.topology_command == "discover"
    ):
        from collector.gnmi.service import run_collect, run_discover
        from rocewatch.topology import Topology

        cfg = load_config(args.config)
        topo_file = args.topology or (Path(cfg.topology) if cfg.topology else None)
        topo = Topology.load(topo_file) if topo_file else None
        if args.command == "collect" and args.gnmic_topic:
            from collector.gnmi.kafka_events import GnmicKafkaBridge

            if topo is None:
                raise ConfigError("--gnmic-topic needs a topology (to name gnmic's sources)")
            bridge = GnmicKafkaBridge(cfg, topo, args.gnmic_topic)
            bridge.run(max_idle_s=args.max_idle)
            print(f"bridged {bridge.messages} gnmic messages to {cfg.kafka.topics.telemetry}")
            return 0
        if args.command == "collect":
            return run_collect(
                cfg, topo, args.target, args.out, args.duration, shard_group=args.shard_group
            )
        return run_discover(cfg, topo, args.target, args.out, args.timeout)
    if args.command == "topology":
        from rocewatch.topology import Topology

        t = Topology.load(args.file)
        print(
            f"{args.file}: ok: {len(t.switches)} switches, {len(t.links)} links, "
            f"{len(t.nodes)} nodes, {len(t.nics)} NICs, {len(t.jobs)} jobs"
        )
        return 0
    raise ConfigError(f"unknown command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
