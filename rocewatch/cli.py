"""The `rocewatch` command."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rocewatch.core.errors import ConfigError, run_command

if TYPE_CHECKING:
    pass

log = logging.getLogger("rocewatch")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line; with ``command``, only that command's collector flags are loaded."""
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
    s.add_argument("--int", action="store_true", help="also write int.pcap (INT reports)")
    s.add_argument(
        "--nccl", action="store_true", help="also write nccl/<job>/ (NCCL Inspector, NCCL_DEBUG)"
    )
    s.add_argument(
        "--sysfs", action="store_true", help="also lay out a fake sysfs tree per node (sysfs/)"
    )
    s.add_argument(
        "--config-fault",
        action="append",
        default=[],
        metavar="KIND[=TARGET]",
        help="a RoCE configuration fault in nic_config/switch_config.jsonl (repeatable): "
        "nic_pcp_trust, pfc_wrong_priority, uplink_mtu, spine_no_ecn, no_roce_v2_gid",
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

    det = sub.add_parser(
        "detect",
        help="the detector service: consume telemetry from Kafka (run several to split the work)",
    )
    det.add_argument("--config", type=Path, required=True)
    det.add_argument(
        "--max-idle",
        type=float,
        default=0.0,
        help="exit after this many seconds without input (0: run forever)",
    )
    det.add_argument(
        "--scale-out",
        action="store_true",
        help="accepted for old scripts, without effect: every instance joins the same groups",
    )

    nt = sub.add_parser(
        "notify",
        help="deliver queued alert notifications (webhooks, Alertmanager) from the outbox",
    )
    nt.add_argument("--config", type=Path, required=True)
    nt.add_argument(
        "--max-idle",
        type=float,
        default=0.0,
        help="exit after this many seconds with nothing to deliver (0: run forever)",
    )

    sk = sub.add_parser(
        "sink",
        help="store the alerts and actions topics and queue their notifications "
        "(detect does it itself unless sink.embedded: false)",
    )
    sk.add_argument("--config", type=Path, required=True)
    sk.add_argument(
        "--max-idle",
        type=float,
        default=0.0,
        help="exit after this many seconds with nothing read (0: run forever)",
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
    ev.add_argument(
        "--matrix",
        action="store_true",
        help="the matrix of cadences, fabrics and magnitudes (docs/evaluation.md)",
    )
    ev.add_argument("--cells", help="matrix: only the cells whose names contain one of these (a,b)")
    ev.add_argument(
        "--nccl",
        action="store_true",
        help="the NCCL cases: the jobs' own view of PCIe, slow-GPU and storm faults (docs/nccl.md)",
    )
    ev.add_argument("--jobs", type=int, help="matrix: cells run in this many processes (CPUs)")

    def store_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", type=Path, help="rocewatch config (its storage.url)")
        sp.add_argument("--db", help="database URL (instead of --config)")

    al = sub.add_parser("alerts", help="list stored alerts (inhibited ones marked)")
    store_args(al)
    al.add_argument("--status", choices=["firing", "resolved"])
    al.add_argument("--json", action="store_true", help="one JSON object per line")

    ac = sub.add_parser("actions", help="list stored drain and resume decisions")
    store_args(ac)
    ac.add_argument("--node")
    ac.add_argument("--json", action="store_true", help="one JSON object per line")

    ap = sub.add_parser("approve", help="approve a drain waiting for approval (no NODE: list them)")
    store_args(ap)
    ap.add_argument("node", nargs="?")
    ap.add_argument("--reject", action="store_true", help="reject the drain instead")
    ap.add_argument("--wait", type=float, default=10.0, help="seconds to wait for the service")

    ud = sub.add_parser("undrain", help="return a node rocewatch drained to service now")
    store_args(ud)
    ud.add_argument("node")
    ud.add_argument("--wait", type=float, default=10.0, help="seconds to wait for the service")
    isd = sub.add_parser(
        "int-send", help="send a scenario's int.pcap (or a pcap file) as UDP datagrams"
    )
    isd.add_argument("source", type=Path, help="scenario directory or pcap file")
    isd.add_argument("--to", default="127.0.0.1:32766", help="HOST:PORT of the INT collector")
    isd.add_argument("--rate", type=float, default=0.0, help="datagrams per second (0: no pacing)")

    # each collector's command (collector/registry.py): its flags are loaded for the command
    # being run (all of them when ``command`` is None), so a lean command (the agent) imports
    # no other collector
    from collector.registry import commands, resolve

    for name, entry in commands().items():
        cp = sub.add_parser(name, help=entry.help)
        if command is None or command == name:
            resolve(entry.arguments)(cp)

    col = sub.add_parser(
        "collect",
        help="subscribe to switches over gNMI and write telemetry to Kafka (or a file)",
    )
    col.add_argument("--config", type=Path, help="rocewatch config (gnmi: and kafka: sections)")
    col.add_argument("--topology", type=Path, help="topology (targets, cabling check)")
    col.add_argument("--target", action="append", default=[], help="NAME=HOST:PORT (repeatable)")
    col.add_argument(
        "--out", type=Path, help="append gnmic event JSON lines here (- for stdout), not Kafka"
    )
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

    ck = sub.add_parser("check", help="configuration checks")
    cksub = ck.add_subparsers(dest="check_command", required=True)
    ckr = cksub.add_parser(
        "roce",
        help="RoCE configuration of NICs and switches, both ends of every cable "
        "(like netq check roce); exits 1 on an error",
    )
    ckr.add_argument("dir", type=Path, help="topology.yaml, nic_config.jsonl, switch_config.jsonl")
    ckr.add_argument("--json", action="store_true")
    ckr.add_argument("--priority", type=int, help="RoCE's lossless priority (default: the jobs')")
    ckr.add_argument("--no-table", action="store_true", help="findings only")

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


def _command_of(argv: list[str]) -> str | None:
    """The command named in ``argv`` (its first word that is no option)."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    args = build_parser(_command_of(words)).parse_args(argv)
    return run_command("rocewatch", args.verbose, lambda: _dispatch(args))


def _dispatch(args: argparse.Namespace) -> int:
    from collector.registry import commands, resolve

    collector = commands().get(args.command)
    if collector is not None:
        # before anything else is imported: the agent runs on every GPU node and needs none of
        # the detectors, Polars or actions (each runner imports what it needs)
        return int(resolve(collector.run)(args))
    # operators' handles next: they need no detectors (a quick start)
    if args.command in ("alerts", "actions", "approve", "undrain"):
        from rocewatch import operator_cli as oc

        if args.command == "alerts":
            return oc.cmd_alerts(args.config, args.db, args.status, args.json)
        if args.command == "actions":
            return oc.cmd_actions(args.config, args.db, args.node, args.json)
        command = "reject" if args.command == "approve" and args.reject else args.command
        return oc.cmd_command(args.config, args.db, command, args.node, args.wait)
    if args.command == "check":
        from rocewatch.roce.report import cmd_check_roce

        return cmd_check_roce(args.dir, args.json, args.priority, not args.no_table)
    from rocewatch.config import load_config
    from rocewatch.runtime.memory import tune_gc

    if args.command == "demo":
        from rocewatch.demo import run_demo

        tune_gc()
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
        from rocewatch.core.progress import Progress

        bar = Progress("simulate", 1, enabled=sys.stderr.isatty())
        write_scenario(
            sim_cfg,
            args.out_dir,
            progress=lambda d, t: bar.update(d / max(t, 1)),
            int_pcap=args.int,
            nccl=args.nccl,
        )
        if args.config_fault:
            from rocewatch.sim.roce_config import parse_fault, write_roce_config

            write_roce_config(args.out_dir, sim_cfg, [parse_fault(f) for f in args.config_fault])
        if args.sysfs:
            from rocewatch.sim.sysfs import write_scenario_sysfs

            write_scenario_sysfs(args.out_dir)
        bar.close()
        print(f"wrote {args.out_dir}")
        return 0
    if args.command == "replay":
        from rocewatch.replay import replay

        cfg = load_config(args.config)
        tune_gc()
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
        from rocewatch.runtime.publish import publish_scenario

        cfg = load_config(args.config)
        n = publish_scenario(args.scenario_dir, cfg, rate=args.rate)
        print(f"published {n} samples to {cfg.kafka.topics.telemetry}")
        return 0
    if args.command == "detect":
        from rocewatch.runtime.service import DetectService

        cfg = load_config(args.config)
        tune_gc()
        DetectService(cfg).run(max_idle_s=args.max_idle)
        return 0
    if args.command == "notify":
        from rocewatch.runtime.notifier import run_notify

        cfg = load_config(args.config)
        return run_notify(cfg, max_idle_s=args.max_idle)
    if args.command == "sink":
        from rocewatch.event_sink import EventSink

        sink = EventSink(load_config(args.config))
        sink.run(max_idle_s=args.max_idle)
        log.info("sink: %s", sink.summary())
        return 0
    if args.command == "evaluate":
        from rocewatch.evaluate import run_evaluate

        tune_gc()
        if args.nccl:
            from rocewatch.evaluate.nccl import run_evaluate_nccl

            return run_evaluate_nccl(args.out, args.json, args.config)
        if args.matrix:
            from rocewatch.evaluate import run_evaluate_matrix

            return run_evaluate_matrix(args.out, args.json, args.config, args.jobs, args.cells)
        return run_evaluate(args.out, args.json, args.quick, args.config, args.verbose)
    if args.command == "int-send":
        return _int_send(args)
    if args.command == "collect" or (
        args.command == "topology" and args.topology_command == "discover"
    ):
        from rocewatch.core.topology import Topology
        from rocewatch.runtime.collect import run_collect, run_discover

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
        from rocewatch.core.topology import Topology

        t = Topology.load(args.file)
        print(
            f"{args.file}: ok: {len(t.switches)} switches, {len(t.links)} links, "
            f"{len(t.nodes)} nodes, {len(t.nics)} NICs, {len(t.jobs)} jobs"
        )
        return 0
    raise ConfigError(f"unknown command {args.command}")


def _int_send(args: argparse.Namespace) -> int:
    from collector.inband import iter_pcap_chunks
    from rocewatch.sim.inband import UdpSender

    path = args.source / "int.pcap" if args.source.is_dir() else args.source
    host, _, port = args.to.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--to {args.to!r}: expected HOST:PORT")
    try:
        chunks = iter_pcap_chunks(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: {e}") from e
    sender = UdpSender(host.strip("[]"), int(port), rate=args.rate)
    try:
        for c in chunks:
            sender.send(c.payloads())
    finally:
        sender.close()
    print(f"sent {sender.sent} datagrams to {args.to}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
