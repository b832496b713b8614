"""The runners of the collector commands the registry names (collector/registry.py ``run``):
each wires its collector to the configuration, the topology and an output (Kafka, or JSON lines
with ``--out``), and serves its counts."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rocewatch.core.errors import ConfigError
from rocewatch.core.metrics import Reading

log = logging.getLogger("rocewatch")


def readings_endpoint(port: int | None, read: Callable[[], Iterable[Reading]]) -> Any:
    """A /metrics endpoint on ``port`` serving ``read()``; None without a port."""
    if not port:
        return None
    from rocewatch.core.metrics import ReadingsEndpoint

    ep = ReadingsEndpoint(port, read)
    log.info("serving /metrics on port %d", ep.port)
    return ep


def int_listen(args: argparse.Namespace) -> int:
    import signal
    import threading

    import polars as pl

    from collector.inband.live import IntCollector, sample_lines
    from collector.inband.udp import UdpListener, UdpListenerConfig
    from collector.output import LinesOutput, Output
    from rocewatch.config import load_config
    from rocewatch.core.topology import Topology

    cfg = load_config(args.config)
    topo_path = args.topology or (Path(cfg.topology) if cfg.topology else None)
    if topo_path is None:
        raise ConfigError("int-listen needs --topology or 'topology' in the config")
    topology = Topology.load(topo_path)
    listener = UdpListener(UdpListenerConfig(host=args.host, port=args.port))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    close: list[object] = []
    sink: Output[pl.DataFrame]
    if args.out is not None:
        sink = LinesOutput(args.out, sample_lines)
    else:
        from rocewatch.bus.publish import TelemetryPublisher
        from rocewatch.bus.topics import ensure_topics

        ensure_topics(cfg.kafka)
        sink = pub = TelemetryPublisher(cfg.kafka, source=f"int-listen:{args.port}")
    close.append(sink)
    coll = IntCollector(topology, listener, sink, interval_ns=int(args.interval_ms * 1e6))
    readings = coll.readings
    if args.out is None:
        readings = lambda: [*coll.readings(), *pub.readings()]  # noqa: E731
    metrics = readings_endpoint(args.metrics_port or cfg.metrics_port, readings)
    if metrics is not None:
        close.append(metrics)
    log.info("listening for INT reports on %s:%d", args.host, listener.port)
    try:
        coll.run(args.duration, stop)
    except KeyboardInterrupt:
        coll.flush()
    finally:
        listener.close()
        for c in close:
            c.close()  # type: ignore[attr-defined]
    print(" ".join(f"{k}={v}" for k, v in sorted(coll.counts().items())))
    return 0


def nccl_collect(args: argparse.Namespace) -> int:
    import signal
    import threading

    import polars as pl

    from collector.inband.live import sample_lines
    from collector.nccl.service import NcclCollector
    from collector.output import LinesOutput, Output
    from rocewatch.config import load_config
    from rocewatch.core.topology import Topology

    cfg = load_config(args.config)
    topo_path = args.topology or (Path(cfg.topology) if cfg.topology else None)
    topology = Topology.load(topo_path) if topo_path is not None else None
    sink: Output[pl.DataFrame]
    if args.out is not None:
        sink = LinesOutput(args.out, sample_lines)
    else:
        from rocewatch.bus.publish import TelemetryPublisher
        from rocewatch.bus.topics import ensure_topics

        ensure_topics(cfg.kafka)
        from rocewatch.bus.publish import nccl_key

        key = nccl_key(args.job) if args.key == "job" else None
        sink = TelemetryPublisher(cfg.kafka, source=f"nccl-collect:{args.job}", key=key)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    coll = NcclCollector(
        args.dir,
        args.job,
        topology,
        sink,
        args.debug_dir,
        comma_dir=args.comma_dir,
        prom_dir=args.prom_dir,
        ras_file=args.ras_file,
    )
    try:
        coll.run(args.interval, stop, args.duration)
    except KeyboardInterrupt:
        coll.poll(final=True)
    finally:
        coll.close()
        sink.close()
    counts = {"samples": coll.sent, **coll.stats.counts}
    print(" ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    return 0
