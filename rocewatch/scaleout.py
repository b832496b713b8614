"""The detector service (`rocewatch detect`) over Kafka consumer groups: two stages in every
instance. One instance is a group of one; more split the work.

Stage 1, *aggregate* (group ``<group_id>-agg`` on the telemetry topic): one window engine per
assigned telemetry partition (rates, pending samples, steps), closed by that partition's own
watermark (its newest sample time less the allowed lateness). A partition's steps therefore
depend only on its own records, whichever instance runs it. Closed steps go to the steps topic
(a partition per fabric domain, key = telemetry partition): a small JSON header and the
aggregated rows as compressed Arrow IPC. After the step messages are flushed, the partition's
engine and next offset are written to the compacted state topic (state partition = telemetry
partition), and only then are the offsets committed. A partition (re)assigned to an instance
resumes from its latest state; steps it emits again after a crash are the same and stage 2
drops them.

Stage 2, *detect* (group ``<group_id>-detect`` on the steps topic, one partition per fabric
domain, so exactly one instance is active per domain and another takes over when it dies; see
:class:`DomainRoutes` for what a domain's steps hold): assembles every step from all telemetry
partitions (merged in partition order, so the result does not depend on who sent what when),
evaluates a step once every live partition has closed past it, runs the detectors, alert
lifecycle and policy, and publishes alerts and actions. Its state (the pipeline, per-partition
progress, partial steps, the steps-topic offset, the output topics' end offsets) is checkpointed
to the last partition of the state topic; after a takeover, events already published after that
checkpoint are read back and not sent again.
With ``kafka.fence_detect`` those writes are Kafka transactions (:class:`DetectWriter`), so an
instance that stalled past its session and lost the stage can write nothing more, and a fence
before each drain or resume keeps it off the scheduler too (:class:`FencedExecutor`).

A partition is left out of the stage-2 watermark while its owner reports it idle (caught up, no
records for ``idle_flush_s``, and no stalled input in this instance for ``partition_idle_s``:
after a broker outage, read to the end is not the end until publishers have had time to resend)
and the broker holds no record past the owner's read offset in the report (a report read back
after a takeover, or one a busy owner has not yet replaced, stops counting the moment a record
arrives), or when nobody has reported it for ``stall_s`` (no owner: longer than a failover takes,
so a failover does not drop a partition's steps).
"""

from __future__ import annotations

import contextlib
import heapq
import io
import json
import logging
import os
import signal
import struct
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import polars as pl
from kafka import ConsumerRebalanceListener, KafkaConsumer
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic
from kafka.errors import (
    InvalidPartitionsError,
    InvalidProducerEpochError,
    KafkaError,
    KafkaTimeoutError,
    ProducerFencedError,
    TopicAlreadyExistsError,
)
from kafka.structs import OffsetAndMetadata, TopicPartition

from actions.api import OperatorApi
from actions.membership import LiveJobs, build_live_jobs
from actions.operator import MemoryCommands, apply_pending, pending_approvals
from actions.routing import RoutingExecutor
from detectors.clock_guard import ClockGuard
from detectors.isolation_forest import (
    FeatureFeed,
    IsolationForestConfig,
    IsolationForestDetector,
)
from detectors.pfc_storm import PfcStormDetector
from detectors.rates import series_ids
from detectors.registry import metrics_read
from detectors.windows import AGG_SCHEMA, SeriesTable, Step, WindowEngine
from rocewatch import checkpoint, wire
from rocewatch.checkpoint import CheckpointError
from rocewatch.config import Config, KafkaConfig
from rocewatch.delivery import Published, output_partitions, send_events
from rocewatch.errors import (
    BadInput,
    ConfigError,
    Fenced,
    RetryableError,
    RocewatchError,
)
from rocewatch.intake import (
    SendTimes,
    admit_record,
    parse_record,
    partition_guard,
    send_dead_letter,
)
from rocewatch.kafka_io import (
    GROUP_METADATA_MAX_AGE_MS,
    WatchedProducer,
    ensure_topics,
    make_producer,
    wait_for_partitions,
)
from rocewatch.kafka_poll import poll_group
from rocewatch.keys import KEYS, KeyTable, is_coded, mix
from rocewatch.model import SERIES_KEY, Alert
from rocewatch.pipeline import (
    COARSE_ROLLUP_S,
    ROLLUP_S,
    ROLLUP_SCHEMA,
    Output,
    Pipeline,
    Rollups,
)
from rocewatch.runtime import reclaim
from rocewatch.stats import Stats
from rocewatch.topology import Topology

log = logging.getLogger(__name__)

STATE_VERSION = 1
# steps messages: the series key as codes into value tables in the header (RWS2), or, in
# messages written before, as strings in the rows (RWS1, still read)
MAGIC = b"RWS2"
MAGIC_V1 = b"RWS1"
ROLLUPS_MAGIC = b"RWR1"
MAX_MESSAGE_BYTES = 64 << 20  # steps and state topics; the producer's request limit matches
ROWS_PER_STEPS_MESSAGE = 200_000
HEARTBEAT_S = 1.0  # an owned partition reports at least this often
# a detect stage that heard from no partition this long is the one not hearing (a broker away):
# nobody's silence then says that a partition has no owner
DEAF_S = 5 * HEARTBEAT_S
END_EVERY_S = 0.2  # how stale the telemetry end offsets behind an idle report may be
MAX_SKEW_S = 2.0  # how far one owned partition may run ahead of the slowest
POLL_MS = 100  # each stage's longest wait for records (a poll returns as soon as some come)
STANDBY_POLL_MS = 250  # the detect stage's while another instance runs it
DETECT_JOIN_S = 120.0  # how long a stopping instance waits for the detect stage's last step
TAKEOVER_RETRY_S = 2.0  # how soon a takeover that met an unreachable broker is tried again
# the longest a transaction's commit, abort or offsets may wait for the broker; kafka-python
# waits for them without a bound, and its sender can stay stuck on a connection to a broker
# that restarted (seen in CI: the detect stage blocked in a commit for good)
TXN_WAIT_S = 30.0
STEP_SCHEMA: dict[str, pl.DataType] = {"step": pl.Int64(), **AGG_SCHEMA}


def forest_window_s(cfg: Config) -> float | None:
    """The isolation forest's feature window when it is enabled (stage 1 then computes its
    window values), else None."""
    forest = cfg.detectors.get("isolation_forest") or IsolationForestConfig()
    return None if forest.enabled is False else float(forest.feature_window_s)


RECORD_OVERHEAD = 4096  # what a record batch adds to its value (key, headers, framing)


def record_limit(k: KafkaConfig, topic: str) -> int:
    """The largest value the broker takes on ``topic`` (its ``max.message.bytes``, less the
    batch framing), at most MAX_MESSAGE_BYTES. A record above it would be refused, and a
    refused record is fatal to an idempotent producer: everything it holds is dropped, the
    steps with it. So larger states are not sent (``state_too_large``), and larger steps and
    rollups go out in more messages."""
    return record_limits(k, [topic])[topic]


def record_limits(k: KafkaConfig, topics: list[str]) -> dict[str, int]:
    """``record_limit`` of each topic, from one admin connection."""
    out = dict.fromkeys(topics, MAX_MESSAGE_BYTES)
    try:
        admin = KafkaAdminClient(**k.client_kwargs(), request_timeout_ms=30000)
    except KafkaError as e:
        log.warning("record limits of %s unknown (%s); taking %d", topics, e, MAX_MESSAGE_BYTES)
        return out
    try:
        want = [ConfigResource(ConfigResourceType.TOPIC, t, ["max.message.bytes"]) for t in topics]
        try:
            # every value: kafka-python's default filter ("modified") leaves out a topic on
            # the broker's default limit (1 MiB), which must not be taken for 64 MiB
            res = admin.describe_configs(want, config_filter="all")
        except TypeError:  # an older kafka-python, without the argument
            res = admin.describe_configs(want)
        for t in topics:
            try:
                value = res["topic"][t]["max.message.bytes"]["value"]
                out[t] = max(0, min(MAX_MESSAGE_BYTES, int(value) - RECORD_OVERHEAD))
            except (KeyError, TypeError, ValueError) as e:
                log.warning("record limit of %s unknown (%s); taking %d", t, e, MAX_MESSAGE_BYTES)
        return out
    except KafkaError as e:
        log.warning("record limits of %s unknown (%s); taking %d", topics, e, MAX_MESSAGE_BYTES)
        return out
    finally:
        admin.close()


def ensure_scaleout_topics(k: KafkaConfig, domains: int = 1) -> int:
    """Create the telemetry, output, steps and state topics; return the telemetry partitions.
    The steps topic has a partition per fabric domain (one more domain in the topology: one
    more partition, added here)."""
    ensure_topics(k)
    try:
        admin = KafkaAdminClient(**k.client_kwargs(), request_timeout_ms=30000)
    except KafkaError as e:
        raise RetryableError(f"cannot reach Kafka at {k.bootstrap_servers}: {e}") from e
    try:
        existing: set[str] = set()

        def count(topic: str) -> int:
            if topic not in existing:
                return 0
            desc = admin.describe_topics([topic])
            return len(desc[0].get("partitions") or []) if desc else 0

        deadline = time.monotonic() + 30
        n = 0
        while n <= 0:  # a topic just created may take a moment to show its partitions
            existing = set(admin.list_topics())
            n = count(k.topics.telemetry)
            if n <= 0 and time.monotonic() > deadline:
                raise RetryableError(f"telemetry topic {k.topics.telemetry} has no partitions")
            if n <= 0:
                time.sleep(0.2)
        have_state = count(k.topics.state)
        big = {"max.message.bytes": str(MAX_MESSAGE_BYTES)}
        want = [rollups_topic(k)] if k.topics.rollups not in existing else []
        have_steps = count(k.topics.steps)
        if k.topics.steps not in existing:
            want.append(
                NewTopic(
                    k.topics.steps, domains, 1, topic_configs={**big, "retention.ms": "86400000"}
                )
            )
        elif have_steps < domains:
            log.warning(
                "steps topic %s has %d partitions: adding up to %d, one per fabric domain",
                k.topics.steps,
                have_steps,
                domains,
            )
            # (another instance starting with the same topology may have grown it first)
            with contextlib.suppress(InvalidPartitionsError):
                admin.create_partitions({k.topics.steps: domains})
        if have_state == 0:
            want.append(
                NewTopic(
                    k.topics.state,
                    n + 1,
                    1,
                    topic_configs={**big, "cleanup.policy": "compact", "segment.ms": "600000"},
                )
            )
        elif have_state < n + 1:
            raise ConfigError(
                f"kafka.topics.state {k.topics.state} has {have_state} partitions; scale-out "
                f"needs the telemetry partitions + 1 = {n + 1}"
            )
        if want:
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(want)
        return n
    finally:
        admin.close()


def rollups_topic(k: KafkaConfig) -> NewTopic:
    """The metric rollups stage 1 computes when storage is configured (``rocewatch sink``
    stores them): keyed by telemetry partition, a day's retention, records up to 64 MB."""
    return NewTopic(
        k.topics.rollups,
        k.partitions,
        1,
        topic_configs={"max.message.bytes": str(MAX_MESSAGE_BYTES), "retention.ms": "86400000"},
    )


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


def kube_api(cfg: Config) -> Any:
    """A CoreV1Api factory when Kubernetes is configured (built only when first needed)."""
    kcfg = cfg.executors.kubernetes
    if kcfg is None:
        return None

    def make() -> Any:
        from kubernetes import client

        from actions.kubernetes import api_client

        return client.CoreV1Api(api_client(kcfg))

    return make


def tell_domain(pipe: Pipeline, domain: str | None) -> None:
    """PFCStorm learns the fabric domain its pipeline runs for (a restored one too, whatever
    its record says): a switch of another domain, heard there only on the cable ends facing the
    domain, is where the pause enters, named at once as replay traces it (``unheard``)."""
    for det in pipe.detectors:
        if isinstance(det, PfcStormDetector):
            det.domain = domain


# --- the state topic -----------------------------------------------------------------------------


# serialises the frames of a checkpoint off the stage's thread (one at a time, in order)
_SERIALISER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rocewatch-state")
AGG_STATE_KIND = "aggregate-state"  # a stage-1 partition's state record (rocewatch.checkpoint)
DETECT_STATE_KIND = "detect-state"  # a detect stage's


def _as_checkpoint(obj: Any) -> tuple[Any, str]:
    """A stage's state as the data its record holds, and the record's kind."""
    if isinstance(obj, AggState):
        return {f.name: getattr(obj, f.name) for f in fields(obj)}, AGG_STATE_KIND
    if isinstance(obj, DetectState):
        return obj.state(), DETECT_STATE_KIND
    return obj, "state"


class StateSnapshot:
    """A stage's state as a state record (docs/formats/checkpoint.md), taken in two parts.

    At once, in the stage's thread: a consistent copy of the state (``checkpoint.Snapshot``:
    its Polars frames copied, its arrays copied out, the rest encoded as JSON values). Then,
    on a worker thread (``start``), the part that costs: the frames as zstd Arrow IPC (Polars
    releases the GIL) and the record's checksum. At 1,024 GPUs the copy takes tens of ms and
    the serialisation 0.1 to 0.2 s, which no longer holds up the stream."""

    def __init__(self, obj: Any, copy: bool = True) -> None:
        data, kind = _as_checkpoint(obj)
        self.snap = checkpoint.Snapshot(data, kind, copy_frames=copy)
        self.future: Future[bytes] | None = None

    def start(self) -> StateSnapshot:
        self.future = _SERIALISER.submit(self.snap.record)
        return self

    def done(self) -> bool:
        return self.future is None or self.future.done()

    def record(self) -> bytes:
        """The state record (waits for the worker when started)."""
        return self.future.result() if self.future is not None else self.snap.record()


def _dumps(obj: Any) -> bytes:
    """A state record at once: nothing changes the frames meanwhile, so they are not copied."""
    return StateSnapshot(obj, copy=False).record()


def load_agg_state(raw: bytes) -> AggState:
    """A stage-1 state record read back; ``CheckpointError`` unless it is one of this build's
    format and ``STATE_VERSION`` (nothing in it is executed)."""
    d = checkpoint.loads(raw, AGG_STATE_KIND)
    try:
        st = AggState(**d)
    except TypeError as e:
        raise CheckpointError(f"not a partition's state: {e}") from e
    if st.version != STATE_VERSION:
        raise CheckpointError(f"partition state version {st.version!r}, reads {STATE_VERSION}")
    if not (
        isinstance(st.engine, WindowEngine)
        and isinstance(st.partition, int)
        and isinstance(st.offset, int)
        and isinstance(st.hi, int)
        and (st.rollups is None or all(isinstance(r, Rollups) for r in st.rollups))
        and (st.forest is None or isinstance(st.forest, FeatureFeed))
    ):
        raise CheckpointError("a partition's state of the wrong shape")
    return st


def load_detect_state(raw: bytes) -> DetectState:
    """A detect stage's state record read back, as ``load_agg_state``."""
    return DetectState.restore(checkpoint.loads(raw, DETECT_STATE_KIND))


class StateStore:
    """Latest state per state-topic partition (one key per partition, so the last record wins).

    Read committed: the detect stage writes its state in transactions (``DetectWriter``), so a
    partition's last offset may be a transaction marker, and a fenced instance's aborted state
    must never be restored.

    Both stages of an instance read through it, each from its own thread: a KafkaConsumer is
    not safe to share between threads, so every read holds ``lock``."""

    def __init__(self, k: KafkaConfig, producer: Any, max_bytes: int | None = None) -> None:
        self.topic = k.topics.state
        self.producer = producer
        self.lock = threading.RLock()
        self.reader = KafkaConsumer(
            **k.client_kwargs(),
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
            fetch_max_bytes=MAX_MESSAGE_BYTES,
        )
        self.written_end: dict[int, int] = {}  # end offset after our own last write
        # a state above it is not sent
        self.max_bytes = record_limit(k, self.topic) if max_bytes is None else max_bytes

    def end(self, partition: int) -> int:
        tp = TopicPartition(self.topic, partition)
        return int(self.end_offsets([tp])[tp])

    def end_offsets(self, tps: list[TopicPartition], timeout_ms: int | None = None) -> Any:
        """Any topic's end offsets (read committed), as ``KafkaConsumer.end_offsets``."""
        with self.lock:
            return self.reader.end_offsets(tps, timeout_ms=timeout_ms)

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        with self.lock:
            return self.reader.partitions_for_topic(topic)  # type: ignore[no-any-return]

    def load(self, partition: int, key: str | None = None, timeout_s: float = 60.0) -> bytes | None:
        """The value of the partition's last committed record (with ``key``, if given)."""
        rec = self.load_record(partition, key, timeout_s)
        return None if rec is None else rec[0]

    def load_record(
        self, partition: int, key: str | None = None, timeout_s: float = 60.0
    ) -> tuple[bytes, int] | None:
        """``load``, with the record's offset (for a log line about it)."""
        with self.lock:
            return self._load(partition, key, timeout_s)

    def _load(self, partition: int, key: str | None, timeout_s: float) -> tuple[bytes, int] | None:
        tp = TopicPartition(self.topic, partition)
        end = self.end(partition)
        want = None if key is None else key.encode()
        back = 8  # the last record is usually within the last few offsets (markers, fences)
        deadline = time.monotonic() + timeout_s
        while end > 0:
            start = max(0, end - back)
            self.reader.assign([tp])
            self.reader.seek(tp, start)
            found: Any = None
            while self.reader.position(tp) < end:
                if time.monotonic() > deadline:
                    raise RetryableError(f"state {self.topic}/{partition} not readable to {end}")
                for m in self.reader.poll(timeout_ms=500).get(tp, []):
                    if m.offset < end and (want is None or m.key == want):
                        found = m
            if found is not None:
                return (bytes(found.value), int(found.offset)) if found.value else None
            if start == 0:
                break
            back *= 8
        return None

    def save(self, partition: int, key: str, value: bytes) -> Any:
        return self.producer.send(self.topic, key=key.encode(), value=value, partition=partition)

    def confirm(self, partition: int, future: Any) -> None:
        self.written_end[partition] = int(future.get(timeout=60).offset) + 1

    def close(self) -> None:
        with self.lock:
            self.reader.close()


class DetectWriter:
    """How the detect stage writes to Kafka: alerts, actions, its state and, with
    ``kafka.fence_detect``, a fence before each drain or resume.

    Fenced (the default), every write is part of a Kafka transaction of the producer with
    transactional id ``<group_id>-detect``, the same in every instance. An instance that takes
    the stage calls ``start``: the broker bumps the id's epoch, aborts whatever the previous
    holder left open, and from then on rejects the previous holder's writes
    (``Fenced``). Events are committed as soon as they are sent (readers read committed,
    so an event is visible at its commit). A checkpoint commits the state record with the
    steps-topic offset, atomically. Before a drain or resume the stage commits a small fence
    record to the state partition: a stalled instance that lost the stage learns it before it
    touches the scheduler, not after.

    Unfenced, writes go through the instance's shared producer.
    """

    def __init__(
        self,
        k: KafkaConfig,
        shared: Any,
        state_partition: int,
        batch_size: int = 1 << 20,
        suffix: str = "",
    ) -> None:
        self.k = k
        self.shared = shared
        self.batch_size = batch_size  # the shared producer's: sized to the topics' limits
        self.state_partition = state_partition
        self.fenced = k.fence_detect
        # (``suffix``: a fabric domain's own, "@<domain>", when the stage is split by domain)
        self.transactional_id = f"{k.group_id}-detect{suffix}"
        self.fence_key = f"fence{suffix}".encode()
        self.producer: Any = None if self.fenced else shared
        self.open = False
        self.commits = 0

    def start(self) -> None:
        """Take the stage's transactional id (fencing its previous holder). Before reading the
        stage's state: what that holder left open is aborted first, so it is not read."""
        if not self.fenced:
            return
        self.close()
        self.producer = make_producer(
            self.k,
            max_request_size=MAX_MESSAGE_BYTES,
            batch_size=self.batch_size,
            linger_ms=0,  # a transaction is committed right after its last send
            max_in_flight_requests_per_connection=5,
            enable_idempotence=True,
            transactional_id=self.transactional_id,
        )
        try:
            self.producer.init_transactions()
        except KafkaError as e:
            raise RetryableError(f"cannot take the detect stage's transactional id: {e}") from e

    def send(self, topic: str, **kw: Any) -> Any:
        if self.producer is None:
            raise Fenced("the detect stage's writer is closed")
        if self.fenced and not self.open:
            self._call(self.producer.begin_transaction)
            self.open = True
        return self._call(self.producer.send, topic, **kw)

    def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata] | None = None) -> None:
        """Make what was sent since the last commit visible (with ``offsets``, the detect
        group's consumer offsets, in the same transaction)."""
        if not self.fenced:
            self.shared.flush(timeout=60)  # ProducerFailed after a lost event
            return
        if not self.open:
            return
        if offsets:
            group = self.k.group_id + "-detect"
            self._call(self._bounded, "send_offsets_to_transaction", offsets, group)
        self._call(self._bounded, "commit_transaction")
        self.open = False
        self.commits += 1

    def _bounded(self, name: str, *args: Any) -> None:
        """The producer's transactional call ``name``, waited for at most ``TXN_WAIT_S``
        (``KafkaTimeoutError`` then: the stage gives this producer up and takes the stage
        again with a new one, whose ``init_transactions`` aborts what this one left open).
        The call is made as kafka-python's own method makes it, bar the unbounded wait."""
        manager = getattr(self.producer, "_transaction_manager", None)
        sender = getattr(self.producer, "_sender", None)
        begin = _TXN_BEGIN[name]
        if manager is None or sender is None or not hasattr(manager, begin):
            getattr(self.producer, name)(*args)  # another kafka-python: its own wait
            return
        result = getattr(manager, begin)(*args)
        sender.wakeup()
        if not result.wait(timeout_ms=TXN_WAIT_S * 1000):
            raise KafkaTimeoutError(f"{name} not done within {TXN_WAIT_S:.0f} s")

    def warm(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        """Commit ``offsets`` (where the stage resumes) in a transaction of their own. The
        first transaction that carries consumer offsets looks up the detect group's
        coordinator and connects to it, about 0.2 s here: done at takeover, that wait is
        not inside the first checkpoint, where it held up every step behind it."""
        if not self.fenced or self.open:
            return
        self._call(self.producer.begin_transaction)
        self.open = True
        self.commit(offsets)

    def abort(self) -> None:
        """Give up the open transaction (after a failure that leaves the producer usable);
        ``TransactionFailed`` if that fails too."""
        if self.fenced and self.open:
            self.open = False
            self._call(self._bounded, "abort_transaction")

    def fence(self) -> None:
        """Prove this instance still holds the stage (raises ``Fenced`` if not)."""
        if not self.fenced:
            return
        value = orjson.dumps({"pid": os.getpid(), "host": os.uname().nodename, "ts": time.time()})
        self.send(
            self.k.topics.state, key=self.fence_key, value=value, partition=self.state_partition
        )
        self.commit()

    def _call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except KafkaError as e:
            # fenced shows as itself, or (a send after an earlier request of the transaction
            # failed) as a KafkaError that carries it, or (any call once the sender met the
            # fence first, as an instance waking from a stall does) only as the message of
            # the transaction manager's error state, whose last error is the fence
            manager = getattr(self.producer, "_transaction_manager", None)
            last = getattr(manager, "last_error", None)
            if any(isinstance(x, _FENCED) for x in (e, e.__cause__, last, *e.args)):
                raise Fenced(f"another instance took the detect stage over ({e!r})") from e
            if self.fenced:
                raise TransactionFailed(f"detect stage transaction failed: {e!r}") from e
            raise

    def close(self) -> None:
        """Give the transactional producer up (what is still open is aborted by the broker,
        or by the next holder's ``start``)."""
        if self.fenced and self.producer is not None:
            with contextlib.suppress(Exception):
                self.producer.close(timeout=5)
            self.producer = None
        self.open = False


_FENCED = (ProducerFencedError, InvalidProducerEpochError)
# a transactional call of kafka-python's producer: the transaction manager's method it begins with
_TXN_BEGIN = {
    "commit_transaction": "begin_commit",
    "abort_transaction": "begin_abort",
    "send_offsets_to_transaction": "send_offsets_to_transaction",
}


class TransactionFailed(RocewatchError):
    """A transaction of the detect stage failed for a reason other than a fence: what it held
    is aborted, so the stage starts again from its last checkpoint."""


class FencedExecutor:
    """An executor that proves the detect stage is still this instance's before each drain
    and resume (``DetectWriter.fence``): a stalled instance that lost the stage raises
    ``Fenced`` instead of acting on the scheduler."""

    def __init__(self, inner: Any, fence: Any) -> None:
        self.inner = inner
        self.fence_fn = fence

    def _fence(self) -> None:
        if self.fence_fn is not None:
            self.fence_fn()

    def drain(self, node: str, scheduler: str, reason: str) -> str:
        self._fence()
        return str(self.inner.drain(node, scheduler, reason))

    def resume(self, node: str, scheduler: str) -> str:
        self._fence()
        return str(self.inner.resume(node, scheduler))


# --- stage 1: aggregate ------------------------------------------------------------------------


@dataclass
class AggState:
    version: int
    partition: int
    engine: WindowEngine
    offset: int  # next telemetry offset to read
    hi: int  # newest sample time seen
    rollups: list[Rollups] | None = None  # open buckets (with storage configured)
    forest: FeatureFeed | None = None  # the isolation forest's open window


@dataclass
class _Part:
    engine: WindowEngine
    offset: int | None
    hi: int = -1
    seen: float = field(default_factory=time.monotonic)
    idle: bool = False  # an idle report was sent since the last record
    reported: float = 0.0  # when the last steps message for it went out
    end_checked: float = 0.0  # when the broker was last asked for its end offset
    dirty: bool = True
    sent: SendTimes = field(default_factory=SendTimes)  # records waiting for their step
    rollups: list[Rollups] = field(default_factory=list)  # empty: no storage, none computed
    guard: ClockGuard | None = None  # bad clocks: made at the first record
    # the last step's table positions and their canonical order (steps_coded)
    order: list[np.ndarray] = field(default_factory=list)
    forest: FeatureFeed | None = None  # with the isolation forest on: its window values
    # its state record was refused: read from the group's committed offset, not the beginning
    from_committed: bool = False


def with_forest(
    chunks: list[tuple[CodedRows | None, int | None]], forest: pl.DataFrame | None
) -> list[tuple[CodedRows | None, int | None, pl.DataFrame | None]]:
    """The messages of one close with its forest window values spread over them: each
    window goes with the first message that closes past its end (it is done by then), the
    rest (an idle partition's open window) with the last."""
    out: list[tuple[CodedRows | None, int | None, pl.DataFrame | None]] = []
    rest = forest
    for i, (rows, to) in enumerate(chunks):
        mine = rest
        if i < len(chunks) - 1 and rest is not None and to is not None:
            done = pl.col("end") <= to
            mine, rest = rest.filter(done), rest.filter(~done)
            mine = mine if mine.height else None
        elif i < len(chunks) - 1:
            mine = None
        out.append((rows, to, mine))
    return out


class Aggregator:
    """Stage 1: per telemetry partition, samples -> closed steps on the steps topic."""

    def __init__(
        self,
        cfg: Config,
        n_parts: int,
        producer: Any,
        store: StateStore,
        limits: dict[str, int],
        routes: DomainRoutes | None = None,
    ) -> None:
        self.cfg = cfg
        self.k = cfg.kafka
        self.n_parts = n_parts
        self.producer = producer
        self.store = store
        self.routes = routes  # None: one domain, every row to steps partition 0
        # the isolation forest's window values are made here (one row per entity and window),
        # so the steps carry only what the other detectors read (rollups cover the rest)
        self.forest_s = forest_window_s(cfg)
        self.detect_metrics = metrics_read(cfg.detectors, fed=self.forest_s is not None)
        self.stats = Stats()
        self.parts: dict[int, _Part] = {}
        self.retired: dict[int, _Part] = {}
        # checkpoints whose frames are being serialised: partition -> (its part, snapshot)
        self.saving: dict[int, tuple[_Part, int, StateSnapshot]] = {}
        self.closing = False
        self.group_changed = time.monotonic()  # the last (re)assignment, for --max-idle
        # when a silent partition last turned out not to be read to its end (a broker outage,
        # a stalled fetch): no partition is reported idle within partition_idle_s of that
        self.disrupted_at = -float("inf")
        self.samples = 0
        # the largest steps and rollups records their topics take (``record_limits``): a topic
        # an operator created with a smaller max.message.bytes gets more, smaller messages
        self.steps_limit = limits[self.k.topics.steps]
        self.rollups_limit = limits[self.k.topics.rollups]
        self.consumer = KafkaConsumer(
            **self.k.client_kwargs(),
            group_id=self.k.group_id + "-agg",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=5000,
            fetch_max_bytes=64 << 20,
            max_partition_fetch_bytes=16 << 20,
            session_timeout_ms=self.k.session_timeout_ms,
            heartbeat_interval_ms=max(1000, self.k.session_timeout_ms // 4),
            metadata_max_age_ms=GROUP_METADATA_MAX_AGE_MS,
        )

    def _new_engine(self) -> WindowEngine:
        return WindowEngine(self.cfg.window, self.stats)

    def _new_rollups(self) -> list[Rollups]:
        """Rollup levels as replay keeps them, when storage is set: each partition's series are
        its own, so a partition's rollups are whole."""
        if not self.cfg.storage_url:
            return []
        return [Rollups(ROLLUP_S), Rollups(COARSE_ROLLUP_S)]

    # --- assignment ------------------------------------------------------------------------------
    def assigned(self, tps: list[TopicPartition]) -> None:
        self.group_changed = time.monotonic()
        for tp in tps:
            p = tp.partition
            part = self.retired.pop(p, None)
            if part is None or self.store.written_end.get(p) != self.store.end(p):
                part = self._restore(p)
            part.seen = time.monotonic()
            part.idle = False
            self.parts[p] = part
            if part.offset is not None:
                self.consumer.seek(tp, part.offset)
            elif not part.from_committed:
                self.consumer.seek_to_beginning(tp)
            # (else the consumer starts at the group's committed offset: it may not be asked
            # for it here, inside the rebalance)
        log.info("aggregating telemetry partitions %s", sorted(self.parts))

    def _restore(self, p: int) -> _Part:
        rec = self.store.load_record(p)
        if rec is not None:
            raw, at = rec
            try:
                st = load_agg_state(raw)
                if st.partition != p:
                    raise CheckpointError(f"the state of partition {st.partition}")
            except CheckpointError as e:  # damaged, foreign or forged: nothing of it is run
                self.stats.inc("checkpoint_rejected")
                log.error(
                    "state record %s/%d@%d rejected (%s); partition %d starts afresh from "
                    "its committed offset",
                    self.store.topic,
                    p,
                    at,
                    e,
                    p,
                )
                return _Part(
                    self._new_engine(),
                    None,
                    rollups=self._new_rollups(),
                    forest=self._new_forest(),
                    from_committed=True,
                )
            else:
                st.engine.stats = self.stats
                st.engine.rates.stats = self.stats
                log.info("partition %d resumes at offset %d", p, st.offset)
                rollups = st.rollups
                if rollups is None or bool(rollups) != bool(self.cfg.storage_url):
                    rollups = self._new_rollups()
                forest = st.forest
                if (forest is None) != (self.forest_s is None):
                    forest = self._new_forest()
                return _Part(
                    st.engine, st.offset, st.hi, dirty=False, rollups=rollups, forest=forest
                )
        return _Part(
            self._new_engine(), None, rollups=self._new_rollups(), forest=self._new_forest()
        )

    def _new_forest(self) -> FeatureFeed | None:
        return None if self.forest_s is None else FeatureFeed(self.forest_s)

    def revoked(self, tps: list[TopicPartition]) -> None:
        if self.closing:
            return
        gone = [tp.partition for tp in tps if tp.partition in self.parts]
        if gone:
            self.checkpoint(gone, commit=False)
        for p in gone:
            self.retired[p] = self.parts.pop(p)

    def lost(self, tps: list[TopicPartition]) -> None:
        """Evicted from the group (a stall past the session timeout): the partitions may have
        moved on under another instance, so their state here is stale. It is dropped unsaved
        (saving it would overwrite the new owner's newer state) and not kept for a return."""
        if self.closing:
            return
        gone = [tp.partition for tp in tps if tp.partition in self.parts]
        for p in gone:
            self.parts.pop(p)
            self.retired.pop(p, None)
        if gone:
            self.stats.inc("partitions_lost", len(gone))
            log.warning("evicted from the aggregate group: partitions %s dropped unsaved", gone)

    # --- the loop --------------------------------------------------------------------------------
    def poll_once(self, timeout_ms: int) -> int:
        recs = poll_group(self.consumer, timeout_ms, pauses=True)  # _balance pauses partitions
        now = time.monotonic()
        n = 0
        for tp, msgs in recs.items():
            part = self.parts.get(tp.partition)
            if part is None or not msgs:
                continue
            batches: list[wire.Decoded] = []
            for m in msgs:
                try:
                    d, hi, sent = parse_record(m)
                except BadInput as e:
                    self._dead_letter(m, e)
                    continue
                if part.guard is None:
                    part.guard = partition_guard(self.cfg, self.stats, f"partition {tp.partition}")
                hi = admit_record(part.guard, d)
                if d.rows:
                    batches.append(d)
                    part.hi = max(part.hi, hi)
                    part.sent.add(hi, sent)
            part.offset = msgs[-1].offset + 1
            part.seen = now
            part.idle = False
            part.dirty = True
            if batches:
                df = wire.coded_frames(batches)
                n += df.height
                part.engine.add(df)
            if part.hi >= 0:
                wm = part.hi - part.engine.lateness_ns()
                self._publish(tp.partition, part, part.engine.close_until(wm), idle=False)
        self.samples += n
        self._balance()
        for p, part in self.parts.items():
            if now - part.reported >= HEARTBEAT_S:  # stage 2 tells a quiet owner from none
                self._publish(p, part, [], idle=part.idle, heartbeat=True)
            if (
                part.idle
                or now - part.seen < self.k.idle_flush_s
                or not self._caught_up(p, part)
                or now - self.disrupted_at < self.k.partition_idle_s
            ):
                continue
            self._publish(p, part, part.engine.finish(), idle=True)
            part.idle = True
            part.dirty = True
        return n

    def all_idle(self) -> bool:
        """True when every partition this instance owns has been reported idle."""
        return all(part.idle for part in self.parts.values())

    def _balance(self) -> None:
        """Pause partitions far ahead of the slowest one this instance owns: stage 2 waits for
        the slowest anyway, and what runs ahead only fills its buffer."""
        his = [part.hi for part in self.parts.values() if part.hi >= 0 and not part.idle]
        if not his:
            paused = self.consumer.paused()
            if paused:
                self.consumer.resume(*paused)
            return
        limit = min(his) + int(MAX_SKEW_S * 1e9)
        pause: list[TopicPartition] = []
        resume: list[TopicPartition] = []
        for p, part in self.parts.items():
            tp = TopicPartition(self.k.topics.telemetry, p)
            (pause if part.hi > limit else resume).append(tp)
        if pause:
            self.consumer.pause(*pause)
        if resume:
            self.consumer.resume(*resume)

    def _caught_up(self, p: int, part: _Part) -> bool:
        """True when the partition has been read to its end, as the broker says now.

        The fetcher's highwater is only as fresh as the partition's last fetch response: a
        partition whose fetches stalled (a resumed partition kafka-python forgot, a broker
        that restarted) looks read to its end while records wait. Calling it idle then would
        close its steps early and make those records late, so the end offset is asked for,
        at most once a second per partition (only silent partitions get here)."""
        tp = TopicPartition(self.k.topics.telemetry, p)
        hw = self.consumer.highwater(tp)
        if hw is None or tp in self.consumer.paused():
            return False
        if part.offset is None:
            return True
        now = time.monotonic()
        if part.offset < hw:  # silent with records to read: a stalled fetch
            self.disrupted_at = now
            return False
        if now - part.end_checked < 1.0:
            return False
        part.end_checked = now
        try:
            end = self.consumer.end_offsets([tp], timeout_ms=2000).get(tp)
        except KafkaError as e:
            log.info("end offset of partition %d unknown (%s); not idle yet", p, e)
            self.disrupted_at = now
            return False
        if end is not None and part.offset < end:
            self.disrupted_at = now
            return False
        return end is not None

    def _publish(
        self, p: int, part: _Part, steps: list[Step], idle: bool, heartbeat: bool = False
    ) -> None:
        to = part.engine.closed_ns
        if not steps and not idle and not heartbeat:
            return
        part.reported = time.monotonic()
        if part.rollups and (steps or (idle and not heartbeat)):
            self._rollups(p, part, steps, idle and not heartbeat)
        step_ns = part.engine.step_ns
        closed_from = steps[0].start if steps else to
        forest = None
        if part.forest is not None:
            for s in steps:
                part.forest.add(s)
            forest = part.forest.take(to, idle and not heartbeat)
        rows = steps_coded(steps, step_ns, part.engine.series, part.order, self.detect_metrics)
        sent = part.sent.closed(to) if to is not None else []
        offset = part.offset
        if offset is None:  # nothing read: the partition's end as the fetcher last saw it
            hw = self.consumer.highwater(TopicPartition(self.k.topics.telemetry, p))
            offset = -1 if hw is None else int(hw)
        if self.routes is None or self.routes.n == 1:
            self._send_steps(p, 0, rows, forest, closed_from, to, idle, sent, offset, step_ns)
            return
        # every domain hears of every close (its watermark waits for every partition), with
        # its own rows
        for k, (mine, trees) in enumerate(
            zip(self.routes.split(rows), self.routes.split_forest(forest), strict=True)
        ):
            self._send_steps(p, k, mine, trees, closed_from, to, idle, sent, offset, step_ns)

    def _send_steps(
        self,
        p: int,
        shard: int,
        rows: CodedRows | None,
        forest: pl.DataFrame | None,
        closed_from: int | None,
        to: int | None,
        idle: bool,
        sent: list[int],
        offset: int,
        step_ns: int,
    ) -> None:
        """One close of partition ``p`` to steps partition ``shard``."""
        # very large closes go out in several messages, each ending on a whole step
        chunks: list[tuple[CodedRows | None, int | None]] = [(rows, to)]
        if rows is not None and rows.height > ROWS_PER_STEPS_MESSAGE:
            chunks = []
            for idx, one in rows.slice_steps():
                end = (idx + 1) * step_ns
                prev = chunks[-1][0] if chunks else None
                if prev is not None and prev.height + one.height <= ROWS_PER_STEPS_MESSAGE:
                    chunks[-1] = (CodedRows(pl.concat([prev.frame, one.frame]), rows.values), end)
                else:
                    chunks.append((one, end))
            chunks[-1] = (chunks[-1][0], to)
        todo = deque(with_forest(chunks, forest))
        while todo:
            chunk, chunk_to, chunk_forest = todo.popleft()
            last = not todo
            msg = StepsMessage(
                p,
                closed_from,
                chunk_to,
                idle and last,
                sent if last else [],
                chunk,
                offset,
                chunk_forest,
            )
            value = encode_steps(msg)
            if len(value) > self.steps_limit:
                # a topic created with a smaller max.message.bytes than rocewatch gives it:
                # halves of the close, each ending on a whole step, until each one fits
                halves = self._halves(p, chunk, chunk_to, len(value), step_ns)
                todo.extendleft(reversed(with_forest(halves, chunk_forest)))
                continue
            self.producer.send(
                self.k.topics.steps, key=str(p).encode(), value=value, partition=shard
            )
            closed_from = chunk_to

    def _halves(
        self, p: int, chunk: CodedRows | None, to: int | None, size: int, step_ns: int
    ) -> list[tuple[CodedRows | None, int | None]]:
        """A steps message too large for the steps topic, as two, split on a step boundary;
        one step alone that does not fit is an error the operator must fix (the topic's
        limit), since a refused record would stop the instance anyway."""
        steps = chunk.slice_steps() if chunk is not None else []
        if len(steps) < 2:
            raise ConfigError(
                f"kafka.topics.steps {self.k.topics.steps} takes records up to "
                f"{self.steps_limit + RECORD_OVERHEAD} bytes (max.message.bytes), but one step "
                f"of telemetry partition {p} needs {size + RECORD_OVERHEAD}: raise the topic's "
                f"max.message.bytes (rocewatch creates it with {MAX_MESSAGE_BYTES})"
            )
        assert chunk is not None
        half = len(steps) // 2

        def rows(part: list[tuple[int, CodedRows]]) -> CodedRows:
            return CodedRows(pl.concat([r.frame for _, r in part]), chunk.values)

        self.stats.inc("steps_messages_split", detail=f"partition {p}")
        return [(rows(steps[:half]), (steps[half - 1][0] + 1) * step_ns), (rows(steps[half:]), to)]

    def _rollups(self, p: int, part: _Part, steps: list[Step], idle: bool) -> None:
        """Fold closed steps into the rollup levels; send each bucket that completes and, when
        the partition goes idle (once, not with every heartbeat), the open buckets so far: the
        complete ones replace them in storage."""
        out: list[pl.DataFrame] = []
        for step in steps:
            partial = (
                Rollups._partial(step.frame, part.engine.series.ids(step))
                if step.frame.height
                else None
            )
            for level in part.rollups:
                done = level.add(step, partial)
                if done is not None:
                    out.append(done)
        if idle:
            out += [df for level in part.rollups if (df := level.peek()) is not None]
        todo = deque(df for df in out if df.height)
        while todo:
            df = todo.popleft()
            value = encode_rollups(df)
            if len(value) > self.rollups_limit and df.height > 1:
                # storage upserts rollups by bucket and series: any split of the rows will do
                half = df.height // 2
                todo.extendleft([df.slice(half), df.slice(0, half)])
                self.stats.inc("rollups_messages_split", detail=f"partition {p}")
                continue
            # keyed by partition: its buckets stay in order on one rollups partition
            self.producer.send(self.k.topics.rollups, key=str(p).encode(), value=value)

    def _dead_letter(self, m: Any, err: Exception) -> None:
        send_dead_letter(self.producer, self.k.topics.dead_letter, m, err, self.stats)

    def checkpoint(self, only: list[int] | None = None, commit: bool = True) -> None:
        """Steps flushed, then each partition's state written, then its offset committed. At
        once: for a handover and the final checkpoint (``begin_checkpoint`` is the stream's).

        Inside a rebalance callback (``commit=False``) the consumer cannot block: the state
        record carries the offset, and the next commit catches the group's offsets up.
        """
        todo = [p for p in (only if only is not None else list(self.parts)) if p in self.parts]
        for p in todo:
            if self.saving.pop(p, None) is not None:  # superseded by this one
                self.parts[p].dirty = True
        todo = [p for p in todo if self.parts[p].dirty and self.parts[p].offset is not None]
        if not todo:
            return
        self.producer.flush(timeout=60)  # ProducerFailed after a lost steps message
        saves = []
        for p in todo:
            part = self.parts[p]
            assert part.offset is not None
            saves.append((p, part.offset, _dumps(self._state(p, part))))
            part.dirty = False
        self._save(saves, commit)

    def begin_checkpoint(self, p: int) -> None:
        """The stream's periodic checkpoint of partition ``p``, in two halves so the stream
        does not wait for the serialisation: its state is copied now, its frames serialised on
        a worker thread, and ``finish_checkpoint`` writes it once they are. The steps it
        closed are sent before it is written (the flush there)."""
        part = self.parts.get(p)
        if part is None or p in self.saving or not part.dirty or part.offset is None:
            return
        self.saving[p] = (part, part.offset, StateSnapshot(self._state(p, part)).start())
        part.dirty = False  # the records read from now on make it dirty again

    def finish_checkpoint(self) -> None:
        """Write the states ``begin_checkpoint`` copied, once serialised."""
        ready = [p for p, (_, _, snap) in self.saving.items() if snap.done()]
        if not ready:
            return
        self.producer.flush(timeout=60)  # the steps each state closed: ProducerFailed if lost
        saves = []
        for p in ready:
            part, offset, snap = self.saving.pop(p)
            if self.parts.get(p) is part:  # still held here
                saves.append((p, offset, snap.record()))
        self._save(saves, True)

    @staticmethod
    def _state(p: int, part: _Part) -> AggState:
        assert part.offset is not None
        return AggState(
            STATE_VERSION, p, part.engine, part.offset, part.hi, part.rollups, part.forest
        )

    def _save(self, saves: list[tuple[int, int, bytes]], commit: bool) -> None:
        """Write partitions' states (partition, telemetry offset, record), then commit the
        offsets (after the broker took the states: the state topic holds them)."""
        futures = []
        for p, offset, blob in saves:
            if len(blob) > self.store.max_bytes:  # the stream goes on; a restart re-reads more
                self.stats.inc("state_too_large", detail=f"agg-{p}")
                log.error("state of partition %d is %d bytes: not checkpointed", p, len(blob))
                self.parts[p].dirty = True
                continue
            futures.append((p, offset, self.store.save(p, f"agg-{p}", blob)))
        if not futures:
            return
        self.producer.flush(timeout=60)
        for p, _, fut in futures:
            self.store.confirm(p, fut)
        if not commit:
            return
        offsets = {
            TopicPartition(self.k.topics.telemetry, p): OffsetAndMetadata(offset, "", -1)
            for p, offset, _ in futures
        }
        try:
            self.consumer.commit(offsets)
        except KafkaError as e:  # the state record holds the offset; the commit is for lag
            log.warning("offset commit failed (%s); the state topic keeps the offsets", e)


# --- stage 2: detect ---------------------------------------------------------------------------


@dataclass
class DetectState:
    version: int
    pipeline: Pipeline
    part_closed: dict[int, int]  # newest closed time reported per telemetry partition
    part_idle: dict[int, bool]
    buffer: dict[int, dict[int, pl.DataFrame]]  # step index -> telemetry partition -> rows
    closed_ns: int | None  # every step ending at or before this has been evaluated
    offset: int  # next steps-topic offset
    out_ends: dict[tuple[str, int], int]  # end offsets of the output topics at checkpoint time

    def state(self) -> dict[str, Any]:
        """What its state record holds (``restore`` takes it back)."""
        # the partial steps travel as one frame: many small frames cost more in headers
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        # (coded keys, which mean something only in this process, as their strings)
        parts = [
            KEYS.decode(f).with_columns(pl.lit(p, dtype=pl.Int32).alias("part"))
            for _, slot in sorted(self.buffer.items())
            for p, f in sorted(slot.items())
        ]
        d["buffer"] = pl.concat(parts, how="vertical") if parts else None
        return d

    @classmethod
    def restore(cls, d: Any) -> DetectState:
        """The state ``state()`` gave; ``CheckpointError`` if it is not one of this version."""
        if not isinstance(d, dict) or d.get("version") != STATE_VERSION:
            v = d.get("version") if isinstance(d, dict) else None
            raise CheckpointError(f"detect state version {v!r}, reads {STATE_VERSION}")
        flat = d.get("buffer")
        buffer: dict[int, dict[int, pl.DataFrame]] = {}
        try:
            if flat is not None and flat.height:
                for (idx, p), f in flat.partition_by(
                    ["step", "part"], as_dict=True, maintain_order=True
                ).items():
                    buffer.setdefault(int(idx), {})[int(p)] = f.drop("part")  # type: ignore[call-overload]
            st = cls(**{**d, "buffer": buffer})
        except (AttributeError, TypeError, ValueError, pl.exceptions.PolarsError) as e:
            raise CheckpointError(f"not a detect stage's state: {e}") from e
        if not (
            isinstance(st.pipeline, Pipeline)
            and isinstance(st.offset, int)
            and all(isinstance(x, dict) for x in (st.part_closed, st.part_idle, st.out_ends))
        ):
            raise CheckpointError("a detect stage's state of the wrong shape")
        return st


class Detector:
    """Stage 2 for one fabric domain (steps partition ``shard``): assemble its steps from
    every telemetry partition and run the detectors on them. ``DetectStage`` holds the
    consumer this reads through and one of these per domain."""

    def __init__(
        self,
        cfg: Config,
        topology: Topology,
        n_parts: int,
        producer: Any,
        store: StateStore,
        batch_size: int,
        consumer: Any,
        routes: DomainRoutes,
        shard: int = 0,
        db: Any = None,
    ) -> None:
        self.cfg = cfg
        self.k = cfg.kafka
        self.topology = topology
        self.n_parts = n_parts
        self.store = store
        self.consumer = consumer
        self.routes = routes
        self.shard = shard
        self.tp = TopicPartition(self.k.topics.steps, shard)
        # one domain keeps the names a single detect stage always had; with several, each
        # domain's state, transactional id and pipeline are its own
        self.domain: str | None = routes.names[shard] if routes.n > 1 else None
        self.name = "detect stage" if self.domain is None else f"detect stage {self.domain!r}"
        suffix = "" if self.domain is None else f"@{self.domain}"
        self.state_key = "detect" + suffix
        self.writer = DetectWriter(self.k, producer, n_parts, batch_size, suffix)
        self.stats = Stats()  # the detect pipeline's (a restored stage brings its own)
        # what happened to this instance's hold on the stage (lost, fenced, taken back): its
        # own, kept across restores
        self.holds = Stats()
        self.active = False
        self.closing = False
        self.group_changed = time.monotonic()  # the last (re)assignment, for --max-idle
        self.state: DetectState | None = None
        self.seen: dict[int, float] = {}
        self.idle_offset: dict[int, int] = {}  # the owner's read offset in its idle report
        self.all_quiet = False  # every telemetry partition idle and read to its end
        self.ends: dict[int, int] = {}  # telemetry end offsets, asked at most every END_EVERY_S
        self.ends_at = -float("inf")
        self.moved_at = -float("inf")  # when a steps message last moved a partition's close
        self.started = time.monotonic()
        self.heard = self.started  # when a steps message (any partition's) last came
        self.stall_s = max(20.0, 3 * self.k.session_timeout_ms / 1000.0)
        self.published = Published()
        # (CreateTime ns, seconds to evaluation) of telemetry records, for the benchmark
        self.latencies: deque[tuple[int, float]] = deque(maxlen=100_000)
        self.lat_pending: list[tuple[int, list[int]]] = []  # a heap on closed time
        # live job membership (squeue, pods) while this instance runs the detect stage; the
        # topology file's jobs are the fallback
        self.static_jobs = list(topology.jobs.values())
        self.live_jobs: LiveJobs | None = None
        # operators' commands (`rocewatch approve`, `undrain`) arrive in the storage database;
        # the instance running the node's domain's detect stage carries them out
        self.db = db
        self.alert_db: Any = None  # the storage database, for the inhibited alerts
        self.steps_evaluated = 0
        self.alerts_sent = 0
        self.actions_sent = 0
        # the drains waiting for approval, as the policy left them after its last step (for
        # the operator API's thread; None while this instance does not run the stage)
        self.pending_snapshot: list[str] | None = None
        # after a fence: when to take the stage back if the group still gives it to this
        # instance (nobody else holds it: the fence came from a transaction timeout, say)
        self.retake_at: float | None = None
        # a checkpoint whose frames are being serialised: (state, steps offset, snapshot)
        self.saving: tuple[DetectState, int, StateSnapshot] | None = None

    @property
    def step_ns(self) -> int:
        return round(self.cfg.window.step_s * 1e9)

    # --- assignment ------------------------------------------------------------------------------
    def assigned(self, tps: list[TopicPartition]) -> None:
        self.group_changed = time.monotonic()
        self.retake_at = None
        if not tps:
            return
        try:
            self._take_over(tps)
        except (RetryableError, TransactionFailed, KafkaError) as e:
            # called in the group's rebalance (kafka-python turns a listener's error into an
            # error of the poll, which would stop the instance) or in a retake; a broker
            # restarting or a coordinator not yet loaded is worth waiting out: the group still
            # gives this instance the stage, so it tries again while it does
            self.holds.inc("detect_takeover_failed")
            self._drop(f"{self.name} not taken over ({e}); trying again")
            self.retake_at = time.monotonic() + TAKEOVER_RETRY_S

    def _take_over(self, tps: list[TopicPartition]) -> None:
        self.writer.start()  # fences the previous holder and aborts what it left open
        st = self._restore()
        executor = FencedExecutor(RoutingExecutor(self.cfg.executors), self.writer.fence)
        if st is None:
            pipe = Pipeline(
                self.topology,
                self.cfg,
                executor=executor,
                stats=self.stats,
                rollup_s=None,  # the scale-out path stores no metrics: no rollups to compute
                retain=False,
                domain=self.domain,
            )
            # (a refused state too: the steps before its offset make the pipeline's state
            # again, and what was published after its output offsets is not suppressed)
            st = DetectState(STATE_VERSION, pipe, {}, {}, {}, None, 0, {})
            self.consumer.seek_to_beginning(tps[0])
        else:
            st.pipeline.policy.executor = executor
            self.stats = st.pipeline.stats
            self.consumer.seek(tps[0], st.offset)
            self._load_suppressions(st)
        self._feed_forest(st.pipeline)
        tell_domain(st.pipeline, self.domain)
        resume = {tps[0]: OffsetAndMetadata(st.offset, "", -1)}
        with contextlib.suppress(KafkaError, RocewatchError):  # the first write meets it again
            self.writer.warm(resume)
        self.state = st
        self.pending_snapshot = st.pipeline.policy.pending()
        self.live_jobs = build_live_jobs(
            st.pipeline.topology, self.cfg.membership, kube_api(self.cfg), static=self.static_jobs
        )
        self.active = True
        self.started = self.heard = time.monotonic()
        self.seen = {p: self.started for p in st.part_closed}
        log.info("%s active (steps offset %d)", self.name, st.offset)

    def _feed_forest(self, pipe: Pipeline) -> None:
        """The isolation forest takes its window values from stage 1 (``FeatureFeed``): the
        steps do not carry its own metrics. A forest restored from a state written before it
        was fed (it accumulated the steps itself) starts over: it learns its baseline again."""
        for i, det in enumerate(pipe.detectors):
            if (
                not isinstance(det, IsolationForestDetector)
                or getattr(det, "fed", None) is not None
            ):
                continue
            if any(k.acc.n_entities for k in det.kinds.values()):
                log.warning(
                    "the isolation forest now takes stage 1's window values: it starts over"
                )
                det = pipe.detectors[i] = IsolationForestDetector(det.topology, det.config)
            det.feed_from_stage1()

    def _restore(self) -> DetectState | None:
        rec = self.store.load_record(self.n_parts, key=self.state_key)
        if rec is None:
            return None
        raw, at = rec
        try:
            return load_detect_state(raw)
        except CheckpointError as e:  # damaged, foreign or forged: nothing of it is run
            self.holds.inc("checkpoint_rejected")
            log.error(
                "state record %s/%d@%d rejected (%s); the %s starts afresh from the first step",
                self.store.topic,
                self.n_parts,
                at,
                e,
                self.name,
            )
            return None

    def revoked(self, tps: list[TopicPartition]) -> None:
        if self.active and tps and not self.closing:
            self.checkpoint(commit=False)
            self._drop(f"{self.name} handed over")

    def lost(self, tps: list[TopicPartition]) -> None:
        """Evicted from the group (a stall past the session timeout): another instance may
        hold the stage already, so nothing is written; it resumes from the last checkpoint."""
        if self.active and tps and not self.closing:
            self.holds.inc("detect_stage_lost")
            self._drop(f"{self.name} lost (evicted from the group); its unsaved state is dropped")

    def _drop(self, why: str) -> None:
        self.active = False
        self.state = None
        self.saving = None
        self.pending_snapshot = None
        self.live_jobs = None
        self.writer.close()
        log.info(why)

    def _fenced(self, e: Fenced) -> None:
        self.holds.inc("detect_stage_fenced")
        log.warning("%s: this instance's unsaved detect state is dropped", e)
        self._drop(f"{self.name} handed over (fenced)")
        self._retake_later()

    def _retake_later(self) -> None:
        # a stalled instance learns from the group within a session timeout that the stage is
        # gone (and is assigned anew); if the group still gives it the stage after that, the
        # fence came from elsewhere and nobody runs the stage: it takes the stage back
        self.retake_at = time.monotonic() + self.k.session_timeout_ms / 1000.0 + 1.0

    def _maybe_retake(self) -> None:
        if self.retake_at is None or time.monotonic() < self.retake_at:
            return
        self.retake_at = None
        tps = [tp for tp in self.consumer.assignment() if tp == self.tp]
        if tps:
            self.holds.inc("detect_stage_retaken")
            log.warning(
                "fenced, but the group still gives this instance the detect stage: "
                "taking it back from its checkpoint"
            )
            self.assigned(tps)

    def _guarded(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, the stage dropped if fenced, or started again from its checkpoint
        if a transaction failed otherwise (what it held was aborted, so it is made again) or
        the broker could not be asked (end offsets during a broker restart, say)."""
        try:
            return fn(*args)
        except Fenced as e:
            self._fenced(e)
        except (TransactionFailed, KafkaError) as e:
            # what the transaction held is aborted, and whether this instance still holds the
            # stage is in doubt: a broker can answer a commit that another holder's epoch bump
            # fenced with UNKNOWN_SERVER_ERROR instead of PRODUCER_FENCED. Taking the stage
            # back at once would fence a rightful new holder, so the stage waits for the
            # group, as after a fence, and starts again from its checkpoint if still assigned.
            # (a broker that cannot be asked at all, restarting say, is waited out the same way)
            failed = isinstance(e, TransactionFailed)
            self.holds.inc("detect_transaction_failed" if failed else "detect_broker_unreachable")
            log.error("%s: the %s starts again from its checkpoint", e, self.name)
            self._drop(f"{self.name} stopped ({'transaction failed' if failed else 'broker'})")
            self._retake_later()
        return None

    def _output_tps(self) -> list[TopicPartition]:
        return output_partitions(self.cfg, self.store)

    def _load_suppressions(self, st: DetectState) -> None:
        """Read what was published after the checkpoint: it must not be published again."""
        self.published = Published()
        tps = self._output_tps()
        ends = self.store.end_offsets(tps)
        starts = {tp: st.out_ends.get((tp.topic, tp.partition), 0) for tp in tps}
        if not any(start < ends.get(tp, 0) for tp, start in starts.items()):
            return
        if self.published.read_back(self.cfg, starts, ends):
            raise RetryableError("could not read back the events published after the state")
        log.info(
            "after the takeover, %d already-published events will not be sent again",
            self.published.total(),
        )

    # --- the loop --------------------------------------------------------------------------------
    def handle(self, msgs: list[Any]) -> int:
        """This domain's records of one poll (none: time has passed), then every step the
        watermark now allows evaluated; how many moved a partition on."""
        return int(self._guarded(self._handle, msgs) or 0)

    def _handle(self, msgs: list[Any]) -> int:
        st = self.state
        if st is None or not self.active:
            self._maybe_retake()
            return 0
        if self.live_jobs is not None:  # answers are applied here, in the stage's thread
            self.live_jobs.maybe_refresh()
        n = 0
        now = time.monotonic()
        if msgs:
            for m in msgs:
                st.offset = m.offset + 1
                try:
                    msg = decode_steps(m.value or b"", KEYS)
                except BadInput as e:
                    self.stats.inc("bad_steps_message", detail=str(e)[:80])
                    continue
                if msg.idle:
                    self.idle_offset[msg.partition] = msg.offset
                n += self._take(st, msg, now)
        self._advance(st, now)
        return n

    def _take(self, st: DetectState, msg: StepsMessage, now: float) -> bool:
        """Apply one steps message; True when it moved the partition on (not a heartbeat)."""
        p = msg.partition
        if not 0 <= p < self.n_parts:
            self.stats.inc("bad_steps_message", detail=f"partition {p}")
            return False
        if now - self.heard >= DEAF_S:  # the first word after a deaf spell (``_target``)
            self.seen = {q: now for q in self.seen}
            self.started = now
        self.seen[p] = self.heard = now
        was_idle = st.part_idle.get(p)
        st.part_idle[p] = msg.idle
        prev = st.part_closed.get(p)
        if msg.sent and msg.closed_to is not None:
            heapq.heappush(self.lat_pending, (msg.closed_to, msg.sent))
        if msg.forest is not None:
            self._offer_forest(st, p, msg.forest)
        if msg.closed_to is None or (prev is not None and msg.closed_to <= prev):
            # nothing new: a heartbeat, a re-emission after a restart, an empty idle report
            return bool(msg.idle and not was_idle)
        st.part_closed[p] = msg.closed_to
        self.moved_at = time.monotonic()
        rows = msg.rows
        if rows is None or rows.height == 0:
            return True
        assert isinstance(rows, pl.DataFrame)  # decode_steps gives a frame (codes or strings)
        # the usual message is one step, none of it sent before or late: then nothing is
        # filtered or split (each costs a query per message, more than the rows' own work)
        step = pl.col("step")
        steps = rows.get_column("step")
        if steps.null_count():  # no owner sends these: a foreign or damaged message
            self.stats.inc("bad_steps_message", detail="rows without a step")
            rows = rows.filter(step.is_not_null())
            if not rows.height:
                return True
            steps = rows.get_column("step")
        first, last = int(steps.min()), int(steps.max())  # type: ignore[arg-type]
        if prev is not None and first < prev // self.step_ns:
            rows = rows.filter(step >= prev // self.step_ns)  # steps sent before a restart
        if st.closed_ns is not None and first < st.closed_ns // self.step_ns:
            late = rows.filter(step < st.closed_ns // self.step_ns)
            if late.height:
                self.stats.inc("late_step_rows", late.height, detail=f"partition {p}")
                rows = rows.filter(step >= st.closed_ns // self.step_ns)
        if first == last and rows.height:
            by_step = {(first,): rows}
        else:
            by_step = rows.partition_by("step", as_dict=True, maintain_order=True)
        for (idx,), frame in by_step.items():
            slot = st.buffer.setdefault(int(idx), {})  # type: ignore[call-overload]
            old = slot.get(p)
            slot[p] = frame if old is None else KEYS.concat([old, frame])
        return True

    def _offer_forest(self, st: DetectState, p: int, frame: pl.DataFrame) -> None:
        """A partition's isolation-forest window values to the forest (which drops a window
        sent again after a restart: ``IsolationForestDetector.offer``)."""
        for det in st.pipeline.detectors:
            if isinstance(det, IsolationForestDetector) and getattr(det, "fed", None) is not None:
                late = det.offer(p, frame)
                if late:
                    self.stats.inc("late_forest_rows", late, detail=f"partition {p}")

    def _target(self, st: DetectState, now: float) -> int | None:
        """How far every live partition has closed (None: wait for a partition to report)."""
        live: list[int] = []
        # silence means "no owner" only once this stage has read everything sent so far:
        # a detect stage behind on the steps topic has simply not read the reports yet
        hw = self.consumer.highwater(self.tp)
        behind = hw is None or st.offset < hw
        # nothing from any partition, though each owner reports every HEARTBEAT_S: the broker
        # (or this stage's link to it) is away, and a partition's silence counts from its return
        # (a broker restart longer than stall_s made every partition stalled, and the steps
        # of the ones behind late: late_step_rows in test_scale_out_broker_restart_...)
        if behind or now - self.heard >= DEAF_S:
            self.seen = {p: now for p in self.seen}
            self.started = now
        idle = [p for p in range(self.n_parts) if st.part_idle.get(p)]
        quiet = set(self._still_quiet(idle, now)) if idle else set()
        self.all_quiet = len(quiet) == self.n_parts
        for p in range(self.n_parts):
            if p in quiet:
                continue
            if now - self.seen.get(p, self.started) >= self.stall_s:
                if p in st.part_closed or p in self.seen:
                    self.stats.inc("stalled_partition", detail=str(p))
                continue  # nobody has owned it for longer than a failover takes
            if p not in st.part_closed:
                return None
            live.append(st.part_closed[p])
        if live:
            return min(live)
        return max(st.part_closed.values()) if st.part_closed else None

    def _still_quiet(self, idle: list[int], now: float) -> list[int]:
        """Of the partitions reported idle, those the broker holds nothing new for.

        An idle report is old news once records arrive: the owner says so with its next
        message, but that can come after other partitions have closed steps past the new
        records (an owner busy with the detect stage reads late). So the telemetry end offsets
        are asked for (at most every END_EVERY_S, one request): a partition with records past
        the offset of its idle report holds the watermark again. Unknown ends trust no report.

        They are asked again whenever a steps message has moved a partition's close since: a
        burst (a publisher catching up) can close another partition's step within moments of
        records reaching the idle one, and every record published before the samples that
        closed that step is in the broker by the time its steps message is read.
        """
        if now - self.ends_at >= END_EVERY_S or self.ends_at <= self.moved_at:
            tps = [TopicPartition(self.k.topics.telemetry, p) for p in range(self.n_parts)]
            asked = time.monotonic()
            try:
                got = self.store.end_offsets(tps, timeout_ms=2000)
            except KafkaError as e:
                log.info("telemetry end offsets unknown (%s): idle reports not trusted", e)
                return []
            self.ends = {tp.partition: int(off) for tp, off in got.items()}
            self.ends_at = asked
        return [
            p
            for p in idle
            if self.idle_offset.get(p, -1) >= 0 and self.ends.get(p, 1 << 62) <= self.idle_offset[p]
        ]

    def _advance(self, st: DetectState, now: float) -> None:
        self.all_quiet = False
        self._advance_steps(st, now)
        if self.all_quiet:
            # every partition read to its end and idle: telemetry time stands still, so alerts
            # held for a late inhibiting source are decided now (as replay's end decides them)
            out = st.pipeline.decide_held()
            if out.alerts or out.inhibited or out.actions:
                self._emit(out)

    def _advance_steps(self, st: DetectState, now: float) -> None:
        target = self._target(st, now)
        if target is None:
            return
        boundary = (target // self.step_ns) * self.step_ns
        if st.closed_ns is None:
            if not st.buffer:
                return
            st.closed_ns = min(st.buffer) * self.step_ns
        if boundary <= st.closed_ns:
            return
        lo, hi = st.closed_ns // self.step_ns, boundary // self.step_ns
        if hi - lo <= self.cfg.window.max_steps_per_close:
            indices: list[int] = list(range(lo, hi))
        else:  # a long silence: only the steps that hold data
            indices = sorted(i for i in st.buffer if lo <= i < hi)
        steps = []
        for idx in indices:
            slot = st.buffer.pop(idx, None)
            start, end = idx * self.step_ns, (idx + 1) * self.step_ns
            if not slot:
                steps.append(Step(start, end))
                continue
            # merged in partition order: the same step whoever aggregated what
            frame = KEYS.concat([slot[p] for p in sorted(slot)]).drop("step")
            if is_coded(frame):
                steps.append(coded_step(st.pipeline.engine.series, start, end, frame))
            else:  # rows restored from a checkpoint, or with a null key: strings
                steps.append(Step(start, end, frame=frame))
        st.closed_ns = boundary
        self._emit(st.pipeline.evaluate(steps))
        self.steps_evaluated += len(steps)
        t = time.time_ns()
        while self.lat_pending and self.lat_pending[0][0] <= boundary:
            for sent in heapq.heappop(self.lat_pending)[1]:
                self.latencies.append((sent, (t - sent) / 1e9))

    def apply_operator_commands(self) -> int:
        """Carry out the operators' pending commands (while this instance runs the detect
        stage), publish what they decided, and checkpoint at once: a takeover then finds the
        policy as the commands, already marked done, left it."""
        return int(self._guarded(self._apply_operator_commands) or 0)

    def _apply_operator_commands(self) -> int:
        st = self.state
        if st is None or not self.active or self.db is None:
            return 0
        try:
            n = apply_pending(st.pipeline.policy, [self.db], accept=self._owns_node)
            if n:
                self._emit(st.pipeline.operator_tick())
                self._checkpoint(True)
        except RetryableError as e:
            log.warning("operator commands: %s; trying again later", e)
            return 0
        return n

    def _owns_node(self, node: str) -> bool:
        """Commands about a node go to its domain's policy."""
        return self.domain is None or self.topology.domain_of(node) == self.domain

    def _emit(self, out: Output) -> None:
        if self.state is not None and out.actions:
            self.pending_snapshot = self.state.pipeline.policy.pending()
        n_alerts, n_actions = send_events(self.writer, self.cfg, out, self.published)
        if n_alerts or n_actions:
            self.writer.commit()  # visible now (read committed), not at the next checkpoint
        if out.inhibited and self.alert_db is not None:
            # inhibited alerts are stored, never published (docs/alerting.md): straight to the
            # database, an idempotent upsert, so a step evaluated again after a takeover is no
            # harm; with the published events' times (as JSON keeps them), as the sink stores
            try:
                self.alert_db.write_alerts([Alert.from_json(a.to_json()) for a in out.inhibited])
            except RetryableError as e:
                self.stats.inc("inhibited_not_stored", len(out.inhibited))
                log.warning("inhibited alerts not stored: %s", e)
        self.alerts_sent += n_alerts
        self.actions_sent += n_actions

    def checkpoint(self, commit: bool = True) -> None:
        """Alerts and actions flushed, then the state written, then the steps offset committed
        (fenced: the state and the offset in one transaction). At once: for a handover, a
        final checkpoint and the operators' commands (``begin_checkpoint`` is the stream's)."""
        self._guarded(self._checkpoint, commit)

    def _checkpoint(self, commit: bool) -> None:
        self.saving = None  # superseded by this one
        st = self.state
        if st is None or not self.active:
            return
        self._mark_outputs(st)
        self._write_state(_dumps(st), st.offset, commit)

    def begin_checkpoint(self) -> None:
        """The stream's periodic checkpoint, in two halves so the stream does not wait for the
        state's serialisation: the state is copied now (its outputs flushed first, as for
        ``checkpoint``), its frames serialised on a worker thread, and ``finish_checkpoint``
        writes it once they are. The steps evaluated meanwhile are after its offset: a
        restart from it evaluates them again, and what they published is suppressed, as for
        any step after a checkpoint."""
        self._guarded(self._begin_checkpoint)

    def _begin_checkpoint(self) -> None:
        st = self.state
        if st is None or not self.active or self.saving is not None:
            return
        self._mark_outputs(st)
        self.saving = (st, st.offset, StateSnapshot(st).start())

    def finish_checkpoint(self) -> None:
        """Write the state ``begin_checkpoint`` copied, once serialised."""
        if self.saving is not None and self.saving[2].done():
            self._guarded(self._finish_checkpoint)

    def _finish_checkpoint(self) -> None:
        assert self.saving is not None
        st, offset, snap = self.saving
        self.saving = None
        if st is not self.state or not self.active:  # handed over or taken again since
            return
        blob = snap.record()
        self.writer.commit()  # the events of the steps since: the state's transaction holds none
        self._write_state(blob, offset, True)

    def _mark_outputs(self, st: DetectState) -> None:
        """Flush what was published and note where the output topics end: a restart from
        this state suppresses what was published after it."""
        self.writer.commit()
        st.out_ends = {
            (tp.topic, tp.partition): int(off)
            for tp, off in self.store.end_offsets(self._output_tps()).items()
        }

    def _write_state(self, blob: bytes, offset: int, commit: bool) -> None:
        if len(blob) > self.store.max_bytes:  # the stream goes on; a restart re-reads more
            self.stats.inc("state_too_large", detail=self.state_key)
            log.error(
                "%s state is %d bytes, above %d: not checkpointed",
                self.name,
                len(blob),
                self.store.max_bytes,
            )
            return
        offsets = {self.tp: OffsetAndMetadata(offset, "", -1)}
        fut = self.writer.send(
            self.store.topic, key=self.state_key.encode(), value=blob, partition=self.n_parts
        )
        # the transaction holds only the state and the offset (the events went before it), so
        # a broker that refuses the state (a record too large for the topic, say) costs this
        # checkpoint and nothing else: it is aborted and counted, and the stream goes on
        try:
            if self.writer.fenced:
                self.writer.commit(offsets if commit else None)
                self.store.confirm(self.n_parts, fut)
                return
            self.writer.commit()
            self.store.confirm(self.n_parts, fut)
        except (TransactionFailed, KafkaError) as e:
            self.writer.abort()
            self.stats.inc("state_write_failed", detail=self.state_key)
            log.error("%s state not saved (%r); the stream goes on", self.name, e)
            return
        if not commit:
            return
        with contextlib.suppress(KafkaError):  # the state record holds the offset
            self.consumer.commit(offsets)


class DetectStage:
    """Stage 2 of an instance: one consumer in the detect group (``<group_id>-detect``) on the
    steps topic, and a ``Detector`` per steps partition, that is per fabric domain. The group
    spreads the partitions over the instances, so a fabric of several domains runs its
    detect stage on as many cores; each domain's stage fails over on its own."""

    def __init__(
        self,
        cfg: Config,
        topology: Topology,
        n_parts: int,
        producer: Any,
        store: StateStore,
        batch_size: int,
        routes: DomainRoutes,
    ) -> None:
        k = cfg.kafka
        self.routes = routes
        self.closing = False
        self.db: Any = None
        if cfg.storage_url:
            from storage.store import Store

            self.db = Store(cfg.storage_url)
            self.db.create_schema()
        # operators' commands: from the database (CLI, API of any instance) or, without one,
        # from this instance's API (which then reaches only the domains it evaluates)
        self.commands: Any = self.db if self.db is not None else MemoryCommands()
        self.consumer = KafkaConsumer(
            **k.client_kwargs(),
            group_id=k.group_id + "-detect",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=200,
            fetch_max_bytes=MAX_MESSAGE_BYTES,
            max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
            session_timeout_ms=k.session_timeout_ms,
            heartbeat_interval_ms=max(1000, k.session_timeout_ms // 4),
            metadata_max_age_ms=GROUP_METADATA_MAX_AGE_MS,
        )
        self.shards = [
            Detector(cfg, topology, n_parts, producer, store, batch_size, self.consumer, routes, i)
            for i in range(routes.n)
        ]
        for det in self.shards:
            det.db = self.commands
            det.alert_db = self.db

    # --- assignment ------------------------------------------------------------------------------
    def _mine(self, tps: list[TopicPartition]) -> list[tuple[Detector, list[TopicPartition]]]:
        # (a steps partition past the domains, from a topology that had more, is not read)
        return [(d, [tp for tp in tps if tp == d.tp]) for d in self.shards]

    def assigned(self, tps: list[TopicPartition]) -> None:
        for det, mine in self._mine(tps):
            det.assigned(mine)
        if self.routes.n > 1:
            held = sorted(d.name for d in self.shards if d.active)
            log.info("detect stages held here: %s", ", ".join(held) or "none")

    def revoked(self, tps: list[TopicPartition]) -> None:
        for det, mine in self._mine(tps):
            det.revoked(mine)

    def lost(self, tps: list[TopicPartition]) -> None:
        for det, mine in self._mine(tps):
            det.lost(mine)

    # --- the loop --------------------------------------------------------------------------------
    def poll_once(self, timeout_ms: int) -> int:
        """One poll of the steps topic; each domain takes its records (and evaluates what its
        watermark allows, records or not)."""
        recs = poll_group(self.consumer, timeout_ms)
        return sum(det.handle(recs.get(det.tp, [])) for det in self.shards)

    def apply_operator_commands(self) -> int:
        return sum(det.apply_operator_commands() for det in self.shards)

    def checkpoint(self, commit: bool = True) -> None:
        for det in self.shards:
            det.checkpoint(commit)

    def begin_checkpoint(self) -> None:
        for det in self.shards:
            det.begin_checkpoint()

    def finish_checkpoint(self) -> None:
        for det in self.shards:
            det.finish_checkpoint()

    # --- what the service reads ------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return any(d.active for d in self.shards)

    @property
    def group_changed(self) -> float:
        return max(d.group_changed for d in self.shards)

    @property
    def steps_evaluated(self) -> int:
        return sum(d.steps_evaluated for d in self.shards)

    def caught_up(self) -> bool:
        """Every detect stage held here has evaluated its steps to where the telemetry ends
        (every partition idle and read to its end): an idle stop loses none of them."""
        return all(d.all_quiet for d in self.shards if d.active)

    @property
    def alerts_sent(self) -> int:
        return sum(d.alerts_sent for d in self.shards)

    @property
    def actions_sent(self) -> int:
        return sum(d.actions_sent for d in self.shards)

    def latencies(self) -> list[tuple[int, float]]:
        return sorted(x for d in self.shards for x in d.latencies)

    def all_stats(self) -> list[Stats]:
        return [s for d in self.shards for s in (d.stats, d.holds)]

    def pending_snapshot(self) -> list[str] | None:
        """Drains waiting for approval in the domains this instance runs (None: it runs none)."""
        snaps = [d.pending_snapshot for d in self.shards if d.pending_snapshot is not None]
        if not snaps:
            return None
        return sorted({n for snap in snaps for n in snap})

    def close(self) -> None:
        self.closing = True
        for d in self.shards:
            d.closing = True

    def close_writers(self) -> None:
        for d in self.shards:
            d.writer.close()


# --- the service ------------------------------------------------------------------------------


class _AggListener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, agg: Aggregator) -> None:
        self.agg = agg

    def on_partitions_lost(self, lost: Any) -> None:
        self.agg.lost(list(lost))

    def on_partitions_revoked(self, revoked: Any) -> None:
        self.agg.revoked(list(revoked))

    def on_partitions_assigned(self, assigned: Any) -> None:
        self.agg.assigned(list(assigned))


class _DetectListener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, det: DetectStage) -> None:
        self.det = det

    def on_partitions_lost(self, lost: Any) -> None:
        self.det.lost(list(lost))

    def on_partitions_revoked(self, revoked: Any) -> None:
        self.det.revoked(list(revoked))

    def on_partitions_assigned(self, assigned: Any) -> None:
        self.det.assigned(list(assigned))


class ScaleOutService:
    """Both stages in one process: run as many instances as there are cores to spare."""

    def __init__(self, cfg: Config, topology: Topology | None = None) -> None:
        if topology is None:
            if not cfg.topology:
                raise ConfigError("detect needs 'topology' (a topology file) in its config")
            topology = Topology.load(cfg.topology)
        self.cfg = cfg
        k = cfg.kafka
        self.routes = DomainRoutes(topology)
        self.n_parts = ensure_scaleout_topics(k, self.routes.n)
        t = k.topics
        limits = record_limits(k, [t.steps, t.rollups, t.state])
        # a batch of several records must fit each topic's limit too (kafka-python splits a
        # refused batch, but its flush then fails); one larger record goes alone
        batch = max(16 << 10, min(1 << 20, *limits.values()))
        self.producer = WatchedProducer(
            make_producer(k, max_request_size=MAX_MESSAGE_BYTES, batch_size=batch)
        )
        self.store = StateStore(k, self.producer, limits[t.state])
        self.agg = Aggregator(cfg, self.n_parts, self.producer, self.store, limits, self.routes)
        self.det = DetectStage(
            cfg, topology, self.n_parts, self.producer, self.store, batch, self.routes
        )
        self.stop_event = threading.Event()
        self.detect_error: BaseException | None = None
        self.detect_input = -float("inf")  # when the detect stage last took records
        # CPU seconds of each stage's thread over the last run (the summary reports them)
        self.agg_cpu_s = 0.0
        self.detect_cpu_s = 0.0
        self.subscribed = False
        self.metrics: Any = None
        if cfg.metrics_port:
            from rocewatch.metrics import ServiceMetrics

            self.metrics = ServiceMetrics(cfg.metrics_port)
        self.summary_path = Path(cfg.state_dir) / f"scaleout-{os.getpid()}.json"
        # every instance serves the operator API: commands go to the database, where the
        # instance running the detect stage picks them up (as `rocewatch approve` does)
        self.api: OperatorApi | None = None
        if cfg.api.listen:
            self.api = OperatorApi(
                cfg.api, self.det.commands, self.det.db, pending=self.pending
            ).start()
        # storage and notifications of what the detect stage publishes (rocewatch.event_sink):
        # in a thread of this process unless a separate `rocewatch sink` is configured
        from rocewatch import event_sink  # (which imports this module's rollups codec)

        self.sink: Any = None
        self.sink_error: BaseException | None = None
        self.sink_started = False
        if event_sink.wanted(cfg):
            self.sink = event_sink.EventSink(cfg, metrics=self.metrics)

    def pending(self) -> list[str]:
        """Drains waiting for approval: live for the domains whose detect stage this
        instance runs, else from the actions stored in the database (the sink stores them)."""
        snap = self.det.pending_snapshot()
        if (snap is not None and all(d.active for d in self.det.shards)) or self.det.db is None:
            return snap or []
        held = {d.domain for d in self.det.shards if d.active}
        topo = self.det.shards[0].topology
        stored = [
            a.node
            for a in pending_approvals(self.det.db.actions())
            if snap is None or topo.domain_of(a.node) not in held
        ]
        return sorted(set(stored) | set(snap or []))

    def run(self, max_idle_s: float = 0.0) -> None:
        """The aggregate stage in this thread and the detect stage in its own
        (``_detect_loop``). Each blocks on its own consumer until records come: neither waits
        out the other's poll, and a quiet instance polls each consumer ten times a second, not
        twenty-five (a kafka-python poll costs about a millisecond of CPU, records or not)."""
        k = self.cfg.kafka
        if not self.subscribed:
            self.subscribe()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop_event.set())
        log.info("scale-out detect on %s as groups %s-agg/-detect", k.topics.telemetry, k.group_id)
        self.detect_error = None
        detect = threading.Thread(target=self._detect_loop, name="rocewatch-detect", daemon=True)
        sink: threading.Thread | None = None
        if self.sink is not None:
            self.sink_started = True
            sink = threading.Thread(target=self._sink_loop, name="rocewatch-sink", daemon=True)
            sink.start()
        last_input = time.monotonic()
        next_metrics = time.monotonic()
        next_save = next_metrics + k.commit_interval_s
        turn = 0
        cpu0 = time.thread_time()
        detect.start()
        try:
            while not self.stop_event.is_set():
                self.producer.check()
                n = self.agg.poll_once(POLL_MS)
                self.agg.finish_checkpoint()
                now = time.monotonic()
                if self.metrics is not None and now >= next_metrics:
                    next_metrics = now + 0.5
                    self.metrics.update_scaleout(self)
                if n or not self.agg.consumer.assignment():
                    last_input = now  # idle time counts from the group join, not before it
                # a rebalance is activity: a member joining or leaving restarts the idle clock
                last_input = max(
                    last_input, self.agg.group_changed, self.det.group_changed, self.detect_input
                )
                if now >= next_save:
                    # one partition's state at a time, spread over the interval: each is still
                    # saved once per interval, and the stream pauses for one piece at a time
                    # (the detect stage saves its own, in its thread)
                    pieces = sorted(self.agg.parts)
                    if pieces:
                        self.agg.begin_checkpoint(pieces[turn % len(pieces)])
                    turn += 1
                    next_save = now + k.commit_interval_s / max(1, len(pieces))
                # (and not before this instance's partitions are reported idle: their last
                # steps are closed then, which a recent stall can put off by partition_idle_s)
                quiet = now - last_input
                late = quiet >= max_idle_s + k.partition_idle_s + 5
                # the detect stage too: on a loaded machine it can be steps behind when stage 1
                # goes idle, busy with one poll's steps for longer than max_idle_s (stopped
                # then, the tail of the stream was never evaluated: alerts left firing)
                if (
                    max_idle_s
                    and quiet >= max_idle_s
                    and (self.agg.all_idle() or late)
                    and (self.det.caught_up() or late)
                ):
                    break
            self._stop_detect(detect)
            self.agg_cpu_s = time.thread_time() - cpu0
            self.checkpoint()
            if self.sink_error is not None:  # detection's state is saved: the restart goes on
                raise self.sink_error
            if self.metrics is not None:
                self.metrics.update_scaleout(self)
                self.metrics.update_detect_stage(self.det)
        finally:
            self.stop_event.set()
            detect.join(DETECT_JOIN_S)
            try:
                self.close()
            finally:
                if sink is not None:
                    self._stop_sink(sink)

    def _sink_loop(self) -> None:
        """The embedded sink's thread. An error stops the instance (``run`` raises it): a
        detector that goes on without storing or notifying would fail silently."""
        try:
            self.sink.run()
        except BaseException as e:
            self.sink_error = e
            self.stop_event.set()

    def _stop_sink(self, sink: threading.Thread) -> None:
        """After the final checkpoint: the sink stores what was published, then stops."""
        from rocewatch.event_sink import FINISH_S

        self.sink.finish()
        sink.join(FINISH_S + self.cfg.notify.drain_timeout_s + 10)
        if sink.is_alive():
            self.sink.stop_event.set()
            log.warning("the sink did not finish in time: the next start stores the rest")
            sink.join(10)

    def _detect_loop(self) -> None:
        """The detect stage's thread: steps in, alerts and actions out, the operators'
        commands carried out, its state saved once per commit interval. An error stops the
        instance (``run`` raises it); the final checkpoint is ``run``'s, once this has ended."""
        k = self.cfg.kafka
        next_commands = time.monotonic()
        next_save = next_commands + k.commit_interval_s
        cpu0 = time.thread_time()
        try:
            while not self.stop_event.is_set():
                if self.det.poll_once(POLL_MS if self.det.active else STANDBY_POLL_MS):
                    self.detect_input = time.monotonic()
                self.det.finish_checkpoint()
                now = time.monotonic()
                if now >= next_commands:
                    next_commands = now + 0.5
                    self.det.apply_operator_commands()
                    if self.metrics is not None:
                        self.metrics.update_detect_stage(self.det)
                if now >= next_save:
                    next_save = now + k.commit_interval_s
                    self.det.begin_checkpoint()
        except BaseException as e:  # handed to run(), which raises it
            self.detect_error = e
            self.stop_event.set()
        finally:
            self.detect_cpu_s = time.thread_time() - cpu0

    def _stop_detect(self, detect: threading.Thread) -> None:
        """End the detect stage's thread; its error, if it stopped the instance, is raised."""
        self.stop_event.set()
        detect.join(DETECT_JOIN_S)
        if self.detect_error is not None:
            raise self.detect_error
        if detect.is_alive():
            raise RocewatchError(f"the detect stage did not stop within {DETECT_JOIN_S:.0f} s")

    def subscribe(self) -> None:
        """Join both groups once the topics' partitions are known (else the first assignment
        would be empty until the next metadata refresh)."""
        k = self.cfg.kafka
        self.subscribed = True
        wait_for_partitions(self.agg.consumer, k.topics.telemetry)
        wait_for_partitions(self.det.consumer, k.topics.steps)
        self.agg.consumer.subscribe([k.topics.telemetry], listener=_AggListener(self.agg))
        self.det.consumer.subscribe([k.topics.steps], listener=_DetectListener(self.det))

    def checkpoint(self) -> None:
        self.agg.checkpoint()
        self.det.checkpoint()
        freed, ms = reclaim()  # see rocewatch.runtime: the soak's memory stays flat with it
        log.debug("reclaimed %d objects in %.0f ms", freed, ms)

    def summary(self) -> dict[str, Any]:
        lat = self.det.latencies()
        return {
            "pid": os.getpid(),
            "samples": self.agg.samples,
            "steps_evaluated": self.det.steps_evaluated,
            "alerts_sent": self.det.alerts_sent,
            "actions_sent": self.det.actions_sent,
            # CPU seconds of the aggregate stage's thread and the detect stage's (the Kafka
            # clients' own threads are in neither), and the fabric domains evaluated here
            "agg_cpu_s": round(self.agg_cpu_s, 3),
            "detect_cpu_s": round(self.detect_cpu_s, 3),
            "domains_held": sorted((d.domain or "") for d in self.det.shards if d.steps_evaluated),
            "latencies": lat,  # [CreateTime ns, seconds to evaluation], by CreateTime
            "stats": Stats.merged(self.agg.stats, *self.det.all_stats()).as_dict(),
        }

    def close(self) -> None:
        # the final checkpoint is done: leaving the groups must not write state again
        self.agg.closing = True
        self.det.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.api is not None:
            self.api.close()
        try:
            self.summary_path.parent.mkdir(parents=True, exist_ok=True)
            self.summary_path.write_text(json.dumps(self.summary()))
        finally:
            try:
                self.agg.consumer.close(autocommit=False)
                self.det.consumer.close(autocommit=False)
            finally:
                self.det.close_writers()
                self.producer.finish()
                self.store.close()
                if self.det.db is not None:
                    self.det.db.close()
                if self.sink is not None and not self.sink_started:  # else run() stops it
                    self.sink.close()
