"""The flags of ``rocewatch int-listen`` (collector/registry.py ``inband``): argparse only, so
the command line is built without importing the collector."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(il: argparse.ArgumentParser) -> None:
    il.add_argument("--topology", type=Path, help="topology file (else the config's)")
    il.add_argument("--config", type=Path, help="rocewatch config (Kafka settings)")
    il.add_argument("--host", default="0.0.0.0")
    il.add_argument("--port", type=int, default=32766)
    il.add_argument(
        "--out", type=Path, help="write samples as JSON lines here (- for stdout), not Kafka"
    )
    il.add_argument("--duration", type=float, default=0.0, help="seconds to run (0: forever)")
    il.add_argument("--interval-ms", type=float, default=100.0, help="aggregation interval")
    il.add_argument("--metrics-port", type=int, help="serve /metrics here (else the config's)")
