"""The Kafka wire format (proto/rocewatch/v1/telemetry.proto): encode and decode sample batches.

>>> import polars as pl
>>> from rocewatch.core.model import conform
>>> df = conform(pl.DataFrame({"ts": [1], "device": ["leaf-0"], "port": ["Ethernet1"],
...     "qual": ["3"], "metric": ["pfc_rx_pause_us"], "value": [5.0], "raw": [5]}))
>>> decode(encode(df)).equals(df)
True
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import polars as pl
from google.protobuf.message import DecodeError

from rocewatch.core.errors import BadInput
from rocewatch.core.keys import KEYS, mix
from rocewatch.core.model import SAMPLE_SCHEMA, SERIES_KEY, empty_samples
from rocewatch.wire.telemetry_pb2 import TelemetryBatch

SCHEMA_VERSION = 1
_STR_COLS = ("device", "port", "qual", "metric")


def encode(df: pl.DataFrame, source: str = "", seq: int = 0) -> bytes:
    """One sample frame (SAMPLE_SCHEMA) -> one TelemetryBatch message."""
    msg = TelemetryBatch(
        schema_version=SCHEMA_VERSION,
        source=source,
        seq=seq,
        rows=df.height,
        produced_ns=time.time_ns(),
    )
    # sorted: the same strings give the same dictionary, which a reader looks up once
    strings = pl.concat([df[c].unique() for c in _STR_COLS]).unique().sort()
    enum = pl.Enum(strings)
    msg.dict.extend(strings.to_list())
    idx = {c: df[c].cast(enum).to_physical().cast(pl.UInt32).to_numpy() for c in _STR_COLS}
    msg.ts_ns = df["ts"].to_numpy().astype("<i8", copy=False).tobytes()
    msg.device_idx = idx["device"].astype("<u4", copy=False).tobytes()
    msg.port_idx = idx["port"].astype("<u4", copy=False).tobytes()
    msg.qual_idx = idx["qual"].astype("<u4", copy=False).tobytes()
    msg.metric_idx = idx["metric"].astype("<u4", copy=False).tobytes()
    msg.value = df["value"].to_numpy().astype("<f8", copy=False).tobytes()
    raw = df["raw"]
    msg.raw = raw.fill_null(0).to_numpy().astype("<u8", copy=False).tobytes()
    msg.raw_valid = raw.is_not_null().cast(pl.UInt8).to_numpy().tobytes()
    return bytes(msg.SerializeToString())


def encode_rows(
    df: pl.DataFrame, groups: list[np.ndarray], source: str = "", seq0: int = 0
) -> Iterator[bytes]:
    """Several row subsets of one frame -> one TelemetryBatch each (``seq`` from ``seq0 + 1``),
    made one at a time as the caller takes them (a bounded sender holds only what it sends).

    The strings are coded once for the whole frame and each message gets only the ones its rows
    use, so a frame of many devices costs a few array operations per message instead of a
    dozen frame operations (what ``encode`` costs called once per device).
    """
    if not groups:
        return
    # sorted, so each message's dictionary (its codes' strings, in code order) is too: the same
    # strings give the same dictionary, which a reader looks up once (``coded_frames``)
    strings = pl.concat([df[c] for c in _STR_COLS]).unique().sort()
    table = np.array(strings.to_list(), dtype=object)
    enum = pl.Enum(strings)
    # views of the frame's own buffers where Polars allows (no copy per frame)
    codes = [df[c].cast(enum).to_physical().cast(pl.UInt32).to_numpy() for c in _STR_COLS]
    ts = df["ts"].to_numpy().astype("<i8", copy=False)
    value = df["value"].to_numpy().astype("<f8", copy=False)
    raw_s = df["raw"]
    raw = raw_s.fill_null(0).to_numpy().astype("<u8", copy=False)
    valid = raw_s.is_not_null().cast(pl.UInt8).to_numpy()
    for i, rows in enumerate(groups):
        uniq, inv = np.unique(np.concatenate([c[rows] for c in codes]), return_inverse=True)
        local = inv.astype("<u4").reshape(len(_STR_COLS), len(rows))
        msg = TelemetryBatch(
            schema_version=SCHEMA_VERSION,
            source=source,
            seq=seq0 + i + 1,
            rows=len(rows),
            produced_ns=time.time_ns(),
        )
        msg.dict.extend(table[uniq].tolist())
        msg.ts_ns = ts[rows].tobytes()
        msg.device_idx = local[0].tobytes()
        msg.port_idx = local[1].tobytes()
        msg.qual_idx = local[2].tobytes()
        msg.metric_idx = local[3].tobytes()
        msg.value = value[rows].tobytes()
        msg.raw = raw[rows].tobytes()
        msg.raw_valid = valid[rows].tobytes()
        yield bytes(msg.SerializeToString())


class Decoded:
    """A decoded message's columns, before they join a frame (see ``frames``)."""

    __slots__ = ("cols", "dict", "produced_ns", "rows", "seq", "source")

    def __init__(self, msg: TelemetryBatch) -> None:
        n = msg.rows
        self.rows = n
        self.source = msg.source
        self.seq = msg.seq
        self.produced_ns = msg.produced_ns
        self.dict = list(msg.dict)

        def col(b: bytes, dtype: str, width: int, name: str) -> np.ndarray:
            if len(b) != n * width:
                raise BadInput(f"column {name} holds {len(b)} bytes, expected {n * width}")
            return np.frombuffer(b, dtype=dtype)

        self.cols = {
            "ts": col(msg.ts_ns, "<i8", 8, "ts_ns"),
            "device": col(msg.device_idx, "<u4", 4, "device_idx"),
            "port": col(msg.port_idx, "<u4", 4, "port_idx"),
            "qual": col(msg.qual_idx, "<u4", 4, "qual_idx"),
            "metric": col(msg.metric_idx, "<u4", 4, "metric_idx"),
            "value": col(msg.value, "<f8", 8, "value"),
            "raw": col(msg.raw, "<u8", 8, "raw"),
            "raw_valid": col(msg.raw_valid, "u1", 1, "raw_valid"),
        }
        nd = len(self.dict)
        for c in _STR_COLS:
            if n and int(self.cols[c].max()) >= nd:
                raise BadInput(f"column {c} indexes past the string table ({nd} entries)")


def parse(data: bytes) -> Decoded:
    """Bytes from Kafka -> columns; raises BadInput for anything that is not a valid batch."""
    msg = TelemetryBatch()
    try:
        msg.ParseFromString(data)
    except (DecodeError, ValueError) as e:
        raise BadInput(f"not a TelemetryBatch: {e}") from e
    if msg.schema_version == 0 or msg.schema_version > SCHEMA_VERSION:
        raise BadInput(f"unsupported schema_version {msg.schema_version}")
    return Decoded(msg)


def frames(batches: list[Decoded]) -> pl.DataFrame:
    """Many decoded messages -> one sample frame, strings gathered from one joined table."""
    if not batches:
        return empty_samples()
    table = pl.Series("s", [s for b in batches for s in b.dict], dtype=pl.String)
    idx = _key_indices(batches, [len(b.dict) for b in batches])
    return _frame(batches, [table.gather(idx[c]).alias(c) for c in SERIES_KEY])


def coded_frames(batches: list[Decoded]) -> pl.DataFrame:
    """Like ``frames``, but the key as codes into the process's key table (``rocewatch.core.keys``)
    with each row's series id (``sid``): no string is gathered per sample, and each message's
    dictionary is looked up once (a collector sends the same one again and again)."""
    if not batches:
        return empty_coded()
    coded = [KEYS.codes(b.dict) for b in batches]
    if any(t is None for t in coded):
        # the key table is full and some message names new strings: those messages are read
        # as strings, and the frames meet as strings (``KeyTable.concat``)
        fit = [b for b, t in zip(batches, coded, strict=True) if t is not None]
        rest = [b for b, t in zip(batches, coded, strict=True) if t is None]
        parts = ([coded_frames(fit)] if fit else []) + [frames(rest)]
        return KEYS.concat(parts)
    tables = [t for t in coded if t is not None]
    table = np.concatenate(tables)
    key = {c: table[i] for c, i in _key_indices(batches, [len(t) for t in tables]).items()}
    sid = mix([KEYS.hashes[key[c]] for c in SERIES_KEY])
    cols = [pl.Series(c, key[c], dtype=pl.UInt32) for c in SERIES_KEY]
    return _frame(batches, cols, [pl.Series("sid", sid, dtype=pl.UInt64)])


def _key_indices(batches: list[Decoded], sizes: list[int]) -> dict[str, np.ndarray]:
    """Each key column's indices into the messages' dictionaries laid end to end."""
    offsets = np.cumsum([0, *sizes[:-1]], dtype=np.uint32)
    return {
        c: np.concatenate([b.cols[c] + off for b, off in zip(batches, offsets, strict=True)])
        for c in _STR_COLS
    }


def _frame(
    batches: list[Decoded], key: list[pl.Series], tail: list[pl.Series] | None = None
) -> pl.DataFrame:
    """The sample frame of ``batches`` with the given key columns (SERIES_KEY order), then
    ``tail``."""

    def cat(name: str) -> np.ndarray:
        return np.concatenate([b.cols[name] for b in batches])

    raw = pl.Series("raw", cat("raw"), dtype=pl.UInt64)
    valid = cat("raw_valid").astype(bool)
    if not valid.all():  # gauges: no raw counter
        raw = pl.select(pl.when(pl.Series(valid)).then(raw).otherwise(None)).to_series()
    return pl.DataFrame(
        [
            pl.Series("ts", cat("ts"), dtype=pl.Int64),
            *key,
            pl.Series("value", cat("value"), dtype=pl.Float64),
            raw.alias("raw"),
            *(tail or []),
        ]
    )


def empty_coded() -> pl.DataFrame:
    return pl.DataFrame(
        schema={
            **{c: (pl.UInt32() if c in SERIES_KEY else t) for c, t in SAMPLE_SCHEMA.items()},
            "sid": pl.UInt64(),
        }
    )


def decode(data: bytes) -> pl.DataFrame:
    return frames([parse(data)])
