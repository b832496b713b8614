"""Where a collector's telemetry goes: one protocol for every collector (gNMI, INT, the node
agent) and each of its three places (Kafka, a file, stdout).

An output is called with a batch (a sample frame from gNMI and INT, snapshot lines from the
agent) and closed once, last, when its collector stops: ``close`` writes out everything it was
given. Kafka outputs are ``rocewatch.bus.publish.TelemetryPublisher`` (sample frames, as
protobuf batches) and ``collector.nic.kafka_output.KafkaSnapshotOutput`` (snapshots); a file or
stdout is a ``LinesOutput`` with the collector's own line format (gnmic events, sample JSON,
NIC JSON: docs/formats.md), which ``rocewatch replay`` reads back.

Imports nothing heavy: the node agent uses it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Generic, Protocol, TypeVar

import orjson

from rocewatch.core.errors import ConfigError

B = TypeVar("B")
B_contra = TypeVar("B_contra", contravariant=True)

STDOUT = "-"  # the path that means stdout


class Output(Protocol[B_contra]):
    def __call__(self, batch: B_contra, /) -> None: ...

    def close(self) -> None: ...


class LinesOutput(Generic[B]):
    """Batches as lines, appended to a file or written to stdout (path ``-``), each batch
    flushed as it comes (a reader tailing the file, or a pipe, sees it at once)."""

    def __init__(self, path: Path | str, encode: Callable[[B], bytes]) -> None:
        self.path = str(path)
        self.encode = encode
        self.owned = self.path != STDOUT
        try:
            # closed by close(), when the collector stops
            self.fh: IO[bytes] = Path(path).open("ab") if self.owned else sys.stdout.buffer  # noqa: SIM115
        except OSError as e:
            raise ConfigError(f"--out {path}: {e.strerror}") from e

    def __call__(self, batch: B) -> None:
        data = self.encode(batch)
        if data:
            self.fh.write(data)
            self.fh.flush()

    def close(self) -> None:
        self.fh.flush()
        if self.owned:
            self.fh.close()


def joined(lines: list[bytes]) -> bytes:
    """Lines that already end in newlines (the agent's snapshots), as they are."""
    return b"".join(lines)


def json_lines(rows: list[dict[str, Any]]) -> bytes:
    """Dicts as JSON lines."""
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)
