"""Sample rows -> TelemetryBatch messages (proto/rocewatch/v1/telemetry.proto), without Polars,
NumPy or the protobuf runtime: what the agent puts on the telemetry topic.

The message is a handful of scalar fields and little-endian column arrays, so it is written
directly in protobuf's wire format (fields in number order, proto3 defaults left out, as the
protobuf runtime writes them). ``rocewatch.wire.encode`` writes the same bytes from a sample
frame (tests/test_agent.py holds the two to that) and ``rocewatch.wire.parse`` reads both.
"""

from __future__ import annotations

import struct
import time

from collector.nic.samples import Columns

SCHEMA_VERSION = 1  # rocewatch.wire.SCHEMA_VERSION: the layout this writes


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1  # int64 as protobuf writes a negative one: ten bytes of two's complement
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field_varint(num: int, n: int) -> bytes:
    return _varint(num << 3) + _varint(n) if n else b""


def _field_bytes(num: int, data: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(data)) + data if data else b""


def encode(
    cols: Columns,
    start: int = 0,
    stop: int | None = None,
    source: str = "",
    seq: int = 0,
    produced_ns: int | None = None,
) -> bytes:
    """Rows ``start:stop`` of ``cols`` -> one TelemetryBatch message."""
    stop = len(cols) if stop is None else min(stop, len(cols))
    n = max(0, stop - start)
    device, port = cols.device[start:stop], cols.port[start:stop]
    qual, metric = cols.qual[start:stop], cols.metric[start:stop]
    # sorted: the same strings give the same dictionary, which a reader looks up once
    strings = sorted({*device, *port, *qual, *metric})
    code = {s: i for i, s in enumerate(strings)}
    raw = cols.raw[start:stop]
    parts = [
        _field_varint(1, SCHEMA_VERSION),
        _field_bytes(2, source.encode()),
        _field_varint(3, seq),
        _field_varint(4, n),
        # a repeated string is written even when empty ("" is the usual qualifier)
        *(_varint(5 << 3 | 2) + _varint(len(b)) + b for b in (s.encode() for s in strings)),
        _field_bytes(6, struct.pack(f"<{n}q", *cols.ts[start:stop])),
        _field_bytes(7, struct.pack(f"<{n}I", *(code[s] for s in device))),
        _field_bytes(8, struct.pack(f"<{n}I", *(code[s] for s in port))),
        _field_bytes(9, struct.pack(f"<{n}I", *(code[s] for s in qual))),
        _field_bytes(10, struct.pack(f"<{n}I", *(code[s] for s in metric))),
        _field_bytes(11, struct.pack(f"<{n}d", *cols.value[start:stop])),
        _field_bytes(12, struct.pack(f"<{n}Q", *(0 if r is None else r for r in raw))),
        _field_bytes(13, bytes(0 if r is None else 1 for r in raw)),
        _field_varint(14, time.time_ns() if produced_ns is None else produced_ns),
    ]
    return b"".join(parts)
