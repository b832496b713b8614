"""The node agent's command line: ``rocewatch agent`` and, in the lean ``rocewatch-agent``
distribution (agent/pyproject.toml), the ``rocewatch-agent`` command; both take the same
arguments, defined once here.

Only what sampling and sending need is imported: the config's ``kafka``, ``agent`` and
``metrics_port`` sections, the sysfs/ethtool/mlxlink readers, the spool and, when it sends, the
Kafka sink. No detector, no Polars, no action module.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from rocewatch.core.errors import run_command

log = logging.getLogger("rocewatch.agent")

HELP = (
    "the node agent: sample NIC counters (ethtool, RDMA hw_counters, PCIe) and send "
    "snapshots to Kafka, spooled to disk while the broker is away"
)


def add_arguments(ag: argparse.ArgumentParser) -> None:
    ag.add_argument("--config", type=Path, help="rocewatch config (its agent: and kafka:)")
    ag.add_argument("--node", help="node name (default: agent.node, else the host name)")
    ag.add_argument("--interval", type=float, help="seconds between samples (>= 0.1)")
    ag.add_argument("--sysfs-root", help="where sysfs is mounted (default /sys)")
    ag.add_argument("--netdev", action="append", default=[], help="also sample this netdev")
    ag.add_argument("--spool-dir", help="where unsent snapshots wait")
    ag.add_argument(
        "--out", type=Path, help="append snapshots to this file instead of Kafka (- for stdout)"
    )
    ag.add_argument(
        "--once",
        action="store_true",
        help="take one snapshot of every NIC, write them as JSON lines (stdout, or --out), exit",
    )
    ag.add_argument(
        "--config-out",
        type=Path,
        help="also append each NIC's RoCE configuration (nic_config.jsonl lines: dcb, ethtool -a, "
        "ecn and GID sysfs) to this file (- for stdout): at start, every --config-interval, "
        "and at once when sysfs shows a change (without it, an agent sending to Kafka sends "
        "them on the configuration topic, kafka.topics.config)",
    )
    ag.add_argument(
        "--no-config",
        action="store_true",
        help="do not read nor send the NICs' RoCE configuration to Kafka",
    )
    ag.add_argument(
        "--config-interval", type=float, default=60.0, help="seconds between configuration reads"
    )
    ag.add_argument("--duration", type=float, default=0.0, help="seconds to run (0: forever)")
    ag.add_argument("--metrics-port", type=int, help="serve /metrics here (else the config's)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rocewatch-agent", description=HELP)
    p.add_argument("-v", "--verbose", action="store_true", help="log debug detail")
    add_arguments(p)
    return p


def run(args: argparse.Namespace) -> int:
    """Run the agent as ``args`` (from :func:`add_arguments`) say; the exit status."""
    import dataclasses
    import signal
    import threading

    from collector.nic.agent import NicAgent
    from collector.output import STDOUT, LinesOutput, Output, joined
    from rocewatch.config import load_agent_config

    cfg = load_agent_config(args.config)
    over: dict[str, object] = {}
    if args.node:
        over["node"] = args.node
    if args.interval is not None:
        over["interval_s"] = args.interval
    if args.sysfs_root:
        over["sysfs_root"] = args.sysfs_root
    if args.netdev:
        over["netdevs"] = tuple(args.netdev)
    if args.spool_dir:
        over["spool_dir"] = args.spool_dir
    acfg = dataclasses.replace(cfg.agent, **over)  # type: ignore[arg-type]
    agent = NicAgent(acfg)
    config_out: Output[list[bytes]] | None = None
    if args.config_out is not None:
        config_out = LinesOutput(args.config_out, joined)
        agent.watch_config(config_out, interval_s=max(1.0, args.config_interval))
    try:
        if args.once:
            once = LinesOutput(args.out or STDOUT, joined)
            once(agent.sample_lines())
            once.close()
            agent._config_tick()
            return 0
        sink: Output[list[bytes]]
        if args.out is not None:
            sink = LinesOutput(args.out, joined)
        else:
            from collector.nic.kafka_output import KafkaSnapshotOutput

            sink = KafkaSnapshotOutput(
                cfg.kafka, agent.node, acfg.kafka_format, acfg.kafka_topic or None
            )
            if config_out is None and not args.no_config:
                from collector.nic.kafka_output import KafkaConfigOutput

                config_out = KafkaConfigOutput(cfg.kafka, agent.node)
                agent.watch_config(config_out, interval_s=max(1.0, args.config_interval))
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        log.info("agent %s: %d NICs every %.3g s", agent.node, len(agent.nics), acfg.interval_s)
        metrics = None
        port = args.metrics_port or cfg.metrics_port
        if port:
            from rocewatch.core.metrics import ReadingsEndpoint

            metrics = ReadingsEndpoint(port, agent.readings)
            log.info("serving /metrics on port %d", metrics.port)
        try:
            agent.run(sink, stop, duration_s=args.duration)
        finally:
            sink.close()
            if metrics is not None:
                metrics.close()
        counts = dict(agent.stats.counts)
        counts["samples"] = agent.samples
        print(" ".join(f"{k}={v}" for k, v in sorted(counts.items())))
        return 0
    finally:
        agent.close()
        if config_out is not None:
            config_out.close()


def main(argv: list[str] | None = None) -> int:
    """``rocewatch-agent``: the exit status (2 for a configuration error, 1 for another)."""
    args = build_parser().parse_args(argv)
    return run_command("rocewatch-agent", args.verbose, lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
