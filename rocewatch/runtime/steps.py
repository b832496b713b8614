"""Steps between the stages: the steps and rollups messages' codec, and the routing of a step's
rows to the fabric domains that need them."""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import polars as pl

from detectors.rates import series_ids
from detectors.windows import AGG_SCHEMA, SeriesTable, Step
from rocewatch.core.errors import BadInput
from rocewatch.core.keys import KeyTable, mix
from rocewatch.core.model import SERIES_KEY
from rocewatch.core.rollups import ROLLUP_SCHEMA
from rocewatch.core.topology import Topology

# steps messages: the series key as codes into value tables in the header (RWS2), or, in
# messages written before, as strings in the rows (RWS1, still read)
MAGIC = b"RWS2"
MAGIC_V1 = b"RWS1"
ROLLUPS_MAGIC = b"RWR1"
ROWS_PER_STEPS_MESSAGE = 200_000
STEP_SCHEMA: dict[str, pl.DataType] = {"step": pl.Int64(), **AGG_SCHEMA}


def _frame_from_ipc(data: bytes) -> pl.DataFrame:
    return pl.read_ipc(io.BytesIO(data))


def _ipc(df: pl.DataFrame) -> bytes:
    """A frame as zstd-compressed Arrow IPC (``_frame_from_ipc`` reads it back)."""
    buf = io.BytesIO()
    df.write_ipc(buf, compression="zstd")
    return buf.getvalue()


def encode_rollups(df: pl.DataFrame) -> bytes:
    return ROLLUPS_MAGIC + _ipc(df)


def decode_rollups(data: bytes) -> pl.DataFrame:
    if data[:4] != ROLLUPS_MAGIC:
        raise BadInput("not a rollups message")
    try:
        df = _frame_from_ipc(data[4:])
    except (OSError, pl.exceptions.PolarsError) as e:
        raise BadInput(f"bad rollups message: {e}") from e
    missing = [c for c in ROLLUP_SCHEMA if c not in df.columns]
    if missing:
        raise BadInput(f"rollups message lacks columns {missing}")
    return df


# --- wire format of the steps topic -----------------------------------------------------------


@dataclass
class CodedRows:
    """Steps rows with the series key as codes: STEP_SCHEMA's columns in its order, but each
    key column (SERIES_KEY) UInt32, an index into that column's table in ``values``.

    One row per series and step is about one row per sample, so the key strings would be most
    of the steps topic's bytes and of its encoding and decoding CPU; the owner's series table
    holds the codes already, and its value tables are small (devices, ports, metrics)."""

    frame: pl.DataFrame
    values: list[list[str | None]]

    @property
    def height(self) -> int:
        return self.frame.height

    def decoded(self) -> pl.DataFrame:
        """The rows with their key strings (STEP_SCHEMA); BadInput for a code past its table."""
        cols = []
        for c, vals in zip(SERIES_KEY, self.values, strict=True):
            codes = self.frame.get_column(c)
            top = codes.max()  # (None: every code null, as a column of null keys gives)
            if top is not None and int(top) >= len(vals):  # type: ignore[arg-type]
                raise BadInput(f"steps rows: {c} code past its table of {len(vals)}")
            cols.append(pl.Series(c, vals, dtype=pl.String).gather(codes))
        return self.frame.with_columns(cols)

    def in_table(self, keys: KeyTable) -> pl.DataFrame:
        """The rows with their key as codes into ``keys`` (the process's key table) and each
        row's series id (``sid``): the form the detect stage assembles steps from without
        gathering a string (``coded_step``). Rows with a null key string come back decoded
        (strings: the general path). BadInput for a code past its table."""
        cols = []
        hashes = []
        for c, vals in zip(SERIES_KEY, self.values, strict=True):
            codes = self.frame.get_column(c)
            if codes.null_count() or None in vals:
                return self.decoded()
            idx = codes.to_numpy()
            if len(idx) and int(idx.max()) >= len(vals):
                raise BadInput(f"steps rows: {c} code past its table of {len(vals)}")
            table = keys.codes(vals)  # type: ignore[arg-type]
            if table is None:  # the key table is full: strings, the general path
                return self.decoded()
            mine = table[idx]
            cols.append(pl.Series(c, mine, dtype=pl.UInt32))
            hashes.append(keys.hashes[mine])
        return _with_series(self.frame, [*cols, pl.Series("sid", mix(hashes), dtype=pl.UInt64)])

    def slice_steps(self) -> list[tuple[int, CodedRows]]:
        """(step index, its rows) for each step, in order."""
        return [
            (int(idx), CodedRows(frame, self.values))  # type: ignore[call-overload]
            for (idx,), frame in self.frame.partition_by(
                "step", as_dict=True, maintain_order=True
            ).items()
        ]


def code_rows(rows: pl.DataFrame) -> CodedRows:
    """A frame of STEP_SCHEMA (key strings) -> CodedRows: the general path, for steps no
    series table made. Each column's table is its distinct strings in sorted order, so a
    string's code is its dense rank (a null key stays a null code, and decodes to null)."""
    values: list[list[str | None]] = []
    cols = []
    for c in SERIES_KEY:
        col = rows.get_column(c)
        values.append(col.drop_nulls().unique().sort().to_list())
        cols.append((col.rank("dense") - 1).cast(pl.UInt32).alias(c))
    return CodedRows(rows.with_columns(cols), values)


class DomainRoutes:
    """Where stage 1 sends each steps row: one steps partition per fabric domain
    (``Topology.domains``, in sorted order), each evaluated by its own detect stage.

    A row goes to its device's domain and, for a cable end whose other end is in another
    domain, to that domain too: the pause graph (PFCStorm's origin) and a cable's two ends
    (FlakyLink) are judged there with both sides, and each domain's pipeline speaks only for
    its own devices (``Pipeline(domain=...)``). A device the topology does not know goes to
    the domain '' if there is one, else to the first. The forest's window values are per
    entity: they go to the entity's domain only."""

    def __init__(self, topology: Topology) -> None:
        self.names: list[str] = list(topology.domains)
        self.index = {d: i for i, d in enumerate(self.names)}
        self.default = self.index[topology.domain_of("\0")]  # where unknown devices go
        self.owner = {dev: self.index[d] for dev, d in topology.domain.items()}
        halo: dict[tuple[str, str], tuple[int, ...]] = {}
        for key, doms in topology.cross_domain_ends().items():
            halo[key] = tuple(sorted(self.index[d] for d in doms))
        self.halo = halo
        self.halo_devices = {dev for dev, _ in halo}

    @property
    def n(self) -> int:
        return len(self.names)

    def of(self, device: str | None) -> int:
        """The steps partition of a device's domain."""
        return self.default if device is None else self.owner.get(device, self.default)

    def split(self, rows: CodedRows | None) -> list[CodedRows | None]:
        """The rows of each domain, in their order (a subset of the canonical order keeps it)."""
        if rows is None or rows.height == 0 or self.n == 1:
            return [rows] + [None] * (self.n - 1)
        devices, ports = rows.values[0], [*rows.values[1], None]
        # (a null code, from a null key string, is the code past the table: no device)
        owner = np.array([self.of(d) for d in [*devices, None]], dtype=np.int32)
        frame = rows.frame
        dev = frame.get_column("device").fill_null(len(devices)).to_numpy().astype(np.int64)
        mine = owner[dev]
        masks = [mine == k for k in range(self.n)]
        edge = np.array([d in self.halo_devices for d in [*devices, None]], dtype=bool)
        at = np.flatnonzero(edge[dev]) if edge.any() else np.empty(0, dtype=np.int64)
        if len(at):
            port = frame.get_column("port").fill_null(len(ports) - 1).to_numpy()[at]
            pairs = dev[at] * len(ports) + port.astype(np.int64)
            uniq, inv = np.unique(pairs, return_inverse=True)
            # each distinct (device, port) of those rows: the domains its other end is in
            extra = np.zeros((len(uniq), self.n), dtype=bool)
            for j, u in enumerate(uniq.tolist()):
                key = (devices[u // len(ports)], ports[u % len(ports)])
                extra[j, list(self.halo.get(key, ()))] = True  # type: ignore[arg-type]
            for k in range(self.n):
                masks[k][at[extra[inv, k]]] = True
        out: list[CodedRows | None] = []
        for m in masks:
            out.append(CodedRows(rows.frame.filter(pl.Series(m)), rows.values) if m.any() else None)
        return out

    def split_forest(self, frame: pl.DataFrame | None) -> list[pl.DataFrame | None]:
        if frame is None or self.n == 1:
            return [frame] + [None] * (self.n - 1)
        shard = np.array([self.of(d) for d in frame.get_column("device").to_list()])
        out: list[pl.DataFrame | None] = []
        for k in range(self.n):
            m = shard == k
            out.append(frame.filter(pl.Series(m)) if m.any() else None)
        return out


@dataclass
class StepsMessage:
    partition: int
    closed_from: int | None  # the partition's closed time before these steps
    closed_to: int | None  # every step of the partition ending at or before this is closed
    idle: bool  # the owner has caught up and the partition is quiet
    sent: list[int]  # CreateTime (ns) of the telemetry records these steps complete
    # STEP_SCHEMA in steps_rows' canonical order (decoded messages have strings)
    rows: pl.DataFrame | CodedRows | None
    # the owner's next telemetry offset when it sent this (-1: unknown): an idle partition is
    # idle only while the broker holds nothing past it
    offset: int = -1
    # the isolation forest's window values of the partition's entities for the windows these
    # steps complete (``FeatureFeed``; None: none)
    forest: pl.DataFrame | None = None


def _with_series(
    frame: pl.DataFrame, series: list[pl.Series], drop: str | None = None
) -> pl.DataFrame:
    """``frame.with_columns(*series)`` (a column of the same name replaced in place, others
    appended), less ``drop``, without a query plan: per steps message, Polars' planning of
    ``with_columns`` or ``drop`` costs more than the work on the message's rows."""
    new = {s.name: s for s in series}
    kept = [new.pop(c.name, c) for c in frame.get_columns() if c.name != drop]
    return pl.DataFrame([*kept, *new.values()])


def _elide(frame: pl.DataFrame) -> pl.DataFrame:
    """Leave out ``max`` and ``min`` where both equal ``last`` (a series' one sample in a step,
    the usual row): 40 % fewer bytes on the steps topic. ``same`` marks those rows."""
    last = pl.col("last")
    same = ((pl.col("max") == last) & (pl.col("min") == last)).fill_null(False).alias("same")
    return frame.with_columns(same).with_columns(
        pl.when("same").then(None).otherwise(pl.col(c)).alias(c) for c in ("max", "min")
    )


def _restore(frame: pl.DataFrame) -> pl.DataFrame:
    """``_elide`` undone, eagerly (0.06 ms for 8,000 rows against 0.19 as an expression; the
    detect stage reads a message from every telemetry partition ten times a second)."""
    if "same" not in frame.columns:
        raise BadInput("bad steps rows: no same column")
    same, last = frame.get_column("same"), frame.get_column("last")
    back = [last.zip_with(same, frame.get_column(c)).alias(c) for c in ("max", "min")]
    return _with_series(frame, back, drop="same")


def encode_steps(m: StepsMessage) -> bytes:
    """A small JSON header (with the key value tables), then the rows as an Arrow IPC stream."""
    head: dict[str, Any] = {
        "p": m.partition,
        "from": m.closed_from,
        "to": m.closed_to,
        "idle": m.idle,
        "sent": m.sent,
        "off": m.offset,
    }
    body = b""
    if m.rows is not None and m.rows.height:
        coded = m.rows if isinstance(m.rows, CodedRows) else code_rows(m.rows)
        head["keys"] = coded.values
        # a zstd IPC stream: for these numeric columns half the CPU of an IPC file, and 0.75 x
        # the bytes of LZ4 for 1.4 x its CPU; the broker, on the same cores, handles the bytes
        buf = io.BytesIO()
        _elide(coded.frame).write_ipc_stream(buf, compression="zstd")
        body = buf.getvalue()
    if m.forest is not None and m.forest.height:
        head["fb"] = len(body)  # the rows' bytes; the forest's window values follow them
        buf = io.BytesIO()
        m.forest.write_ipc_stream(buf, compression="zstd")
        body += buf.getvalue()
    head_b = orjson.dumps(head)
    return MAGIC + struct.pack("<I", len(head_b)) + head_b + body


def decode_steps(data: bytes, keys: KeyTable | None = None) -> StepsMessage:
    """A steps message; its rows with the key strings, or with ``keys`` given, the key as codes
    into that table and each row's ``sid`` (``CodedRows.in_table``)."""
    if len(data) < 8 or data[:4] not in (MAGIC, MAGIC_V1):
        raise BadInput("not a steps message")
    (n,) = struct.unpack("<I", data[4:8])
    try:
        h = orjson.loads(data[8 : 8 + n])
        rows = forest = None
        end = len(data)
        if "fb" in h:
            end = 8 + n + int(h["fb"])
            if not 8 + n <= end < len(data):
                raise BadInput("bad steps message: forest section")
            forest = pl.read_ipc_stream(io.BytesIO(data[end:]))
        if end > 8 + n and data[:4] == MAGIC_V1:
            rows = pl.read_ipc(io.BytesIO(data[8 + n : end]))
        elif end > 8 + n:
            tables = h["keys"]
            if not isinstance(tables, list) or len(tables) != len(SERIES_KEY):
                raise BadInput("bad steps message: key tables")
            frame = _restore(pl.read_ipc_stream(io.BytesIO(data[8 + n : end])))
            coded = CodedRows(frame, tables)
            rows = coded.decoded() if keys is None else coded.in_table(keys)
        return StepsMessage(
            int(h["p"]),
            h["from"],
            h["to"],
            bool(h["idle"]),
            [int(x) for x in h["sent"]],
            rows,
            int(h.get("off", -1)),
            forest,
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, OSError) as e:
        raise BadInput(f"bad steps message: {e}") from e
    except pl.exceptions.PolarsError as e:
        raise BadInput(f"bad steps rows: {e}") from e


def steps_rows(
    steps: list[Step],
    step_ns: int,
    series: SeriesTable | None = None,
    keep: frozenset[str] | None = None,
) -> pl.DataFrame | None:
    """Closed steps -> one frame with a step index, in a canonical row order: by step, metric
    name, then series id. The ids are the ones the engine's series table (``series``) holds
    when it made the steps, else hashed from the keys; the same either way, so steps re-emitted
    after a restore (whose table is rebuilt and sets its own order) come out the same. The
    engine's own order is usually that already: then nothing is gathered. With ``keep``, only
    the rows of those metrics."""
    parts: list[pl.DataFrame] = []
    idx: list[int] = []
    lens: list[int] = []
    for s in steps:
        for metric in sorted(s.by_metric):
            if keep is not None and metric not in keep:
                continue
            f = s.by_metric[metric]
            if not f.height:
                continue
            sid = series.metric_ids(s, metric) if series is not None else None
            if sid is None:
                sid = series_ids(f)
            if len(sid) > 1 and not bool(np.all(sid[1:] > sid[:-1])):
                f = f[pl.Series(np.argsort(sid, kind="stable"), dtype=pl.UInt32)]
            parts.append(f)
            idx.append(s.start // step_ns)
            lens.append(f.height)
    if not parts:
        return None
    rows = pl.concat(parts, how="vertical", rechunk=True).select(list(AGG_SCHEMA))
    step = pl.Series("step", np.repeat(np.array(idx, dtype=np.int64), lens))
    return rows.with_columns(step).select(list(STEP_SCHEMA))


def _metric_rank(series: SeriesTable) -> np.ndarray:
    """Each metric code's place when the table's metrics are sorted by name."""
    rank = np.empty(len(series.metrics), dtype=np.int64)
    rank[np.argsort(np.array(series.metrics, dtype=object))] = np.arange(len(series.metrics))
    return rank


def steps_coded(
    steps: list[Step],
    step_ns: int,
    series: SeriesTable,
    cache: list[np.ndarray] | None = None,
    keep: frozenset[str] | None = None,
) -> CodedRows | None:
    """``steps_rows`` with the key as the series table's codes (``SeriesTable.key_codes``):
    the key strings are not gathered, sorted or concatenated, and each step's rows are put in
    the canonical order with one gather (which also drops the metrics not in ``keep``). Steps
    this table did not make take the general path.

    ``cache`` (a list the caller keeps, empty at first) holds the last step's positions and
    order: a step with the same series in the same order (the usual one) sorts nothing."""
    numeric = [c for c in STEP_SCHEMA if c != "step" and c not in SERIES_KEY]
    rank = _metric_rank(series)
    kept = None if keep is None else np.array([m in keep for m in series.metrics], dtype=bool)
    parts: list[pl.DataFrame] = []
    codes: list[np.ndarray] = []
    idx: list[int] = []
    lens: list[int] = []
    for s in steps:
        pos = series.step_positions(s)
        if pos is None:
            rows = steps_rows(steps, step_ns, series, keep)
            return None if rows is None else code_rows(rows)
        sel = None
        if kept is not None:
            mask = kept[series.metric_code[pos]]
            if not mask.all():
                sel = np.flatnonzero(mask)
                pos = pos[sel]
        if not len(pos):
            continue
        if cache and np.array_equal(cache[0], pos):
            order = cache[1]
        else:
            order = np.lexsort((series.sids_at(pos), rank[series.metric_code[pos]]))
            if cache is not None:
                cache[:] = [pos, order]
        frame = pl.DataFrame([s.frame.get_column(c) for c in numeric])  # eager: no query plan
        if bool((order[1:] < order[:-1]).any()):
            pos = pos[order]
            sel = order if sel is None else sel[order]
        if sel is not None:
            frame = frame[pl.Series(sel, dtype=pl.UInt32)]
        parts.append(frame)
        codes.append(series.key_codes[pos])
        idx.append(s.start // step_ns)
        lens.append(frame.height)
    if not parts:
        return None
    key = np.concatenate(codes)
    rows = pl.concat(parts, how="vertical", rechunk=True)
    cols = {c: rows.get_column(c) for c in numeric}
    cols["step"] = pl.Series("step", np.repeat(np.array(idx, dtype=np.int64), lens))
    for j, c in enumerate(SERIES_KEY):
        cols[c] = pl.Series(c, key[:, j], dtype=pl.UInt32)
    frame = pl.DataFrame([cols[c] for c in STEP_SCHEMA])
    return CodedRows(frame, [list(v) for v in series.key_values])


_NUMERIC = [c for c in AGG_SCHEMA if c not in SERIES_KEY]


def coded_step(
    series: SeriesTable,
    start: int,
    end: int,
    rows: pl.DataFrame,
    cache: list[np.ndarray] | None = None,
) -> Step:
    """One step from rows whose key is coded (``CodedRows.in_table``), assembled in partition
    order (each partition's rows by metric name, then series id), for the detect stage.

    Each row's series position in ``series`` (the detect pipeline's own table) is found from its
    id, so the detectors' per-series slots and the sliding windows need no string hashing, and
    the key strings are gathered from the table by position (none while a step holds the same
    series as the last). Rows are grouped by metric name, keeping their order within a metric:
    ``by_metric`` is what splitting the string rows by metric gives.

    ``cache`` (a list the caller keeps, empty at first) holds the last step's positions and
    order: a step with the same series in the same order (the usual one) sorts nothing."""
    sid = rows.get_column("sid").to_numpy()
    pos = series.positions(sid, rows, np.arange(rows.height))
    names = series.metrics
    if cache and np.array_equal(cache[0], pos):
        order, pos_o, code_o, bounds = cache[1:]
    else:
        code = series.metric_code[pos]
        r = _metric_rank(series)[code]
        order = np.argsort(r, kind="stable")
        pos_o, r_o, code_o = pos[order], r[order], code[order]
        bounds = np.r_[np.flatnonzero(np.r_[True, r_o[1:] != r_o[:-1]]), len(r_o)]
        if cache is not None:
            cache[:] = [pos, order, pos_o, code_o, bounds]
    numeric = rows.select(_NUMERIC)
    if bool((order[1:] < order[:-1]).any()):
        numeric = numeric[pl.Series(order, dtype=pl.UInt32)]
    agg = pl.concat([series.keys_at(pos_o), numeric], how="horizontal")
    by_metric: dict[str, pl.DataFrame] = {}
    positions: dict[str, np.ndarray] = {}
    for j in range(len(bounds) - 1 if len(pos) else 0):
        a, b = int(bounds[j]), int(bounds[j + 1])
        name = names[int(code_o[a])]
        by_metric[name] = agg.slice(a, b - a)
        positions[name] = pos_o[a:b]
    return Step(start, end, frame=agg, by_metric=by_metric, positions=(series.epoch, positions))
