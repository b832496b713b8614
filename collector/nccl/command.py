"""The flags of ``rocewatch nccl-collect`` (collector/registry.py ``nccl``): argparse only, so
the command line is built without importing the collector."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(nc: argparse.ArgumentParser) -> None:
    nc.add_argument("dir", type=Path, help="the job's NCCL_INSPECTOR_DUMP_DIR")
    nc.add_argument("--job", required=True, help="the job's name (the topology's, if listed)")
    nc.add_argument("--debug-dir", type=Path, help="NCCL_DEBUG=INFO logs (else DIR/debug)")
    nc.add_argument(
        "--comma-dir", type=Path, help="google/CoMMA OTLP/JSON exports, *.jsonl (else DIR/comma)"
    )
    nc.add_argument(
        "--prom-dir", type=Path, help="Inspector's Prometheus textfiles, *.prom (else DIR)"
    )
    nc.add_argument("--ras-file", type=Path, help="a file ncclras -f json output is written to")
    nc.add_argument("--topology", type=Path, help="topology file (else the config's)")
    nc.add_argument("--config", type=Path, help="rocewatch config (Kafka settings)")
    nc.add_argument(
        "--out", type=Path, help="write samples as JSON lines here (- for stdout), not Kafka"
    )
    nc.add_argument(
        "--key",
        choices=["job", "host"],
        default="job",
        help="Kafka message key: nccl/<job>/<communicator> (default) or the host (docs/nccl.md)",
    )
    nc.add_argument("--interval", type=float, default=1.0, help="seconds between reads")
    nc.add_argument("--duration", type=float, default=0.0, help="seconds to run (0: forever)")
