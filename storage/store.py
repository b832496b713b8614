"""Writes alerts, actions and metric rollups to SQL: SQLite embedded, PostgreSQL in production.

Every write is one transaction, committed before the call returns, and idempotent: the same
alert event, action or rollup bucket written twice leaves one row (an upsert keyed by the
tables' unique constraints), so a writer may retry a batch after any failure.

>>> s = Store("sqlite://")
>>> s.create_schema()
>>> s.write_alerts([Alert({"alertname": "FlakyLink", "severity": "warning"}, {}, 10**18)])
1
>>> [a.status for a in s.alerts()]
['firing']
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import polars as pl
from sqlalchemy import Engine, Table, create_engine, delete, event, inspect, or_, select, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url

from rocewatch.core import rollups
from rocewatch.core.errors import ConfigError, PermanentError, RetryableError
from rocewatch.core.model import Action, Alert
from rocewatch.core.roce import ConfigChange
from storage import incidents
from storage.models import (
    ENTITY_LABELS,
    SCHEMA_VERSION,
    ActionRow,
    AlertRow,
    Base,
    ConfigChangeRow,
    MetaRow,
    NcclRankRow,
    OperatorCommandRow,
    RollupRow,
    TenantInterferenceRow,
    datetime_to_ns,
    ns_to_datetime,
)

log = logging.getLogger(__name__)

PENDING = "pending-approval"  # the outcome of a drain that waits for approval (actions.policy)
ROLLUP_KEY_DB = ["bucket_start", "resolution_s", "device", "port", "qual", "metric"]

ALERTS: Table = AlertRow.__table__  # type: ignore[assignment]
ACTIONS: Table = ActionRow.__table__  # type: ignore[assignment]
ROLLUPS: Table = RollupRow.__table__  # type: ignore[assignment]
META: Table = MetaRow.__table__  # type: ignore[assignment]
COMMANDS: Table = OperatorCommandRow.__table__  # type: ignore[assignment]
INTERFERENCE: Table = TenantInterferenceRow.__table__  # type: ignore[assignment]
CHANGES: Table = ConfigChangeRow.__table__  # type: ignore[assignment]
RANKS: Table = NcclRankRow.__table__  # type: ignore[assignment]

_ALERT_UPDATED = [
    "alertname",
    "severity",
    "status",
    "ends_at",
    "labels",
    "annotations",
    *ENTITY_LABELS,
    "inhibited_by",
    "updated_at",
]


def redact(url: str | URL) -> str:
    """The URL with any password replaced by ``***``: the only form of it that is ever logged."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except sa_exc.ArgumentError:
        return "<unparseable database URL>"


class Store:
    """The SQL store behind Grafana and the audit trail.

    ``url`` is an SQLAlchemy URL: ``sqlite:///path.db`` (``sqlite://`` for memory) or
    ``postgresql://user:pw@host/db`` (psycopg 3 is used). Call ``create_schema()`` once before
    writing. Database failures raise ``RetryableError`` (connection, lock, timeout: retry the
    same batch) or ``PermanentError`` (the database refused the statement).
    """

    def __init__(
        self,
        url: str = "sqlite:///rocewatch.db",
        *,
        batch_size: int = 5000,
        busy_timeout_s: float = 10.0,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        try:
            u = make_url(url)
        except sa_exc.ArgumentError as e:
            raise ConfigError(f"storage: cannot parse database URL {redact(url)}") from e
        if u.drivername == "postgresql":
            u = u.set(drivername="postgresql+psycopg")  # psycopg 3, not the default psycopg2
        self.backend = u.get_backend_name()
        if self.backend not in ("sqlite", "postgresql"):
            raise ConfigError(
                f"storage: unsupported database {self.backend!r} in {redact(u)}: "
                "use sqlite or postgresql"
            )
        if batch_size < 1:
            raise ConfigError("storage: batch_size must be at least 1")
        self.url = redact(u)
        # the fabric's topology, when the writer has it: incident graphs then draw who paused
        # whom over its cables (storage/incidents.py); without it only what the alerts say
        self.topology: Any = None
        self.batch_size = batch_size
        self._clock = clock
        kwargs: dict[str, Any] = {}
        if self.backend == "sqlite":
            kwargs["connect_args"] = {"timeout": busy_timeout_s}
        else:
            kwargs["pool_pre_ping"] = True
        try:
            self.engine: Engine = create_engine(u, **kwargs)
        except (sa_exc.ArgumentError, ImportError) as e:
            raise ConfigError(f"storage: cannot use {self.url}: {e}") from e
        if self.backend == "sqlite":
            timeout_ms = int(busy_timeout_s * 1000)
            event.listen(self.engine, "connect", _sqlite_pragmas(timeout_ms))
        log.info("storage: using %s", self.url)

    # --- schema --------------------------------------------------------------------------------
    def create_schema(self, timescaledb: bool = True) -> None:
        """Create or upgrade the schema (Alembic migrations) and record its version; refuse a
        database from a newer rocewatch. ``timescaledb``: make metric_rollups a hypertable when
        the server offers the extension (untested: see storage/timescale.py)."""
        from storage import migrate, timescale

        with self._errors("create schema"), self.engine.begin() as conn:
            if "meta" in inspect(conn).get_table_names():
                found = conn.execute(
                    select(META.c.value).where(META.c.key == "schema_version")
                ).scalar_one_or_none()
                if found is not None and int(found) > SCHEMA_VERSION:
                    raise ConfigError(
                        f"storage: {self.url} has schema version {found}, this rocewatch uses "
                        f"{SCHEMA_VERSION}"
                    )
            migrate.upgrade(conn, self.url)
            ins = self._insert(META).values(key="schema_version", value=str(SCHEMA_VERSION))
            conn.execute(
                ins.on_conflict_do_update(
                    index_elements=["key"], set_={"value": ins.excluded.value}
                )
            )
            if timescaledb and self.backend == "postgresql":
                timescale.make_hypertables(conn)

    def drop_schema(self) -> None:
        """Drop every rocewatch table and the migration record (tests, a full reset)."""
        with self._errors("drop schema"), self.engine.begin() as conn:
            Base.metadata.drop_all(conn)
            conn.execute(text("DROP TABLE IF EXISTS alembic_version"))

    def schema_version(self) -> int | None:
        with self._errors("read schema version"), self.engine.connect() as conn:
            v = conn.execute(
                select(META.c.value).where(META.c.key == "schema_version")
            ).scalar_one_or_none()
        return None if v is None else int(v)

    # --- writes --------------------------------------------------------------------------------
    def write_alerts(self, alerts: Sequence[Alert]) -> int:
        """Upsert alert events keyed by (fingerprint, startsAt); return the rows written.

        A later write of the same event replaces status, endsAt, labels and annotations, except
        that a resolved event is final: a late re-send of its firing state does not reopen it.
        """
        now = ns_to_datetime(self._clock())
        rows: dict[tuple[str, dt.datetime], dict[str, Any]] = {}
        for a in alerts:
            row = _alert_row(a, now)
            key = (row["fingerprint"], row["starts_at"])
            prev = rows.get(key)
            if prev is not None and prev["ends_at"] is not None and row["ends_at"] is None:
                continue
            rows[key] = row
        if not rows:
            return 0
        ins = self._insert(ALERTS)
        stmt = ins.on_conflict_do_update(
            index_elements=["fingerprint", "starts_at"],
            set_={c: ins.excluded[c] for c in _ALERT_UPDATED},
            where=or_(ins.excluded.ends_at.is_not(None), ALERTS.c.ends_at.is_(None)),
        )
        with self._errors("write alerts"), self.engine.begin() as conn:
            values = list(rows.values())
            for i in range(0, len(values), self.batch_size):
                conn.execute(stmt, values[i : i + self.batch_size])
            # each event filed under its incident in the same commit (what it was stored as:
            # a late firing re-send of a resolved event is filed as resolved)
            stored = [a for a in alerts if (a.fingerprint, ns_to_datetime(a.starts_at)) in rows]
            incidents.record_alerts(self, conn, _final(stored), now)
        return len(rows)

    def write_interference(self, alerts: Sequence[Alert]) -> int:
        """Upsert one ``tenant_interference`` row per alert event that names an aggressor
        tenant (rocewatch/alerting/interference.py: its annotations), keyed as the event;
        alerts inhibited by another are left out (their cause is paged and counted there).
        A resolved event is final, as in ``write_alerts``. Returns the rows written."""
        now = ns_to_datetime(self._clock())
        rows: dict[tuple[str, dt.datetime], dict[str, Any]] = {}
        for a in _final(alerts):
            ann = a.annotations
            if not ann.get("aggressor_tenant") or ann.get("inhibited_by"):
                continue
            try:
                pause = float(ann.get("victim_pause_s") or 0.0)
            except ValueError:
                pause = 0.0
            row = {
                "fingerprint": a.fingerprint,
                "starts_at": ns_to_datetime(a.starts_at),
                "ends_at": ns_to_datetime(a.ends_at) if a.ends_at else None,
                "alertname": a.labels.get("alertname", ""),
                "switch": a.labels.get("switch"),
                "port": a.labels.get("port"),
                "victim_tenant": ann.get("victim_tenant", ""),
                "victim_job": ann.get("victim_job", ""),
                "aggressor_tenant": ann["aggressor_tenant"],
                "aggressor_job": ann.get("aggressor_job", ""),
                "pause_s": pause,
                "updated_at": now,
            }
            rows[(a.fingerprint, ns_to_datetime(a.starts_at))] = row
        if not rows:
            return 0
        ins = self._insert(INTERFERENCE)
        stmt = ins.on_conflict_do_update(
            index_elements=["fingerprint", "starts_at"],
            set_={c: ins.excluded[c] for c in ("ends_at", "pause_s", "updated_at")},
            where=or_(ins.excluded.ends_at.is_not(None), INTERFERENCE.c.ends_at.is_(None)),
        )
        with self._errors("write tenant interference"), self.engine.begin() as conn:
            values = list(rows.values())
            for i in range(0, len(values), self.batch_size):
                conn.execute(stmt, values[i : i + self.batch_size])
        return len(rows)

    def tenant_pause(self) -> dict[tuple[str, str], float]:
        """(victim tenant, aggressor tenant) -> the pause time stored, in seconds."""
        q = select(
            INTERFERENCE.c.victim_tenant, INTERFERENCE.c.aggressor_tenant, INTERFERENCE.c.pause_s
        )
        out: dict[tuple[str, str], float] = {}
        with self._errors("read tenant interference"), self.engine.connect() as conn:
            for v, g, p in conn.execute(q):
                out[(v, g)] = out.get((v, g), 0.0) + float(p)
        return out

    def write_actions(self, actions: Sequence[Action]) -> int:
        """Insert actions, ignoring any already stored (same time, action, node, fingerprint),
        except that a drain waiting for approval takes the outcome of its approval.

        An approved (or rejected) drain is decided again at the telemetry time the operator's
        command is carried out; while telemetry time stands still (the stream ended, a quiet
        fabric) that is the waiting drain's own time, so both share one row, and the outcome
        that row shows must be the drain's, not "pending-approval". Any other outcome stays as
        first stored (a replayed decision does not rewrite history)."""
        rows: dict[tuple[Any, ...], dict[str, Any]] = {}
        for a in actions:
            row = {
                "time": ns_to_datetime(a.time),
                "action": a.action,
                "node": a.node,
                "scheduler": a.scheduler,
                "reason": a.reason,
                "alert_fingerprint": a.alert_fingerprint,
                "executed": a.executed,
                "outcome": a.outcome,
            }
            key = (row["time"], a.action, a.node, a.alert_fingerprint)
            if rows.setdefault(key, row)["outcome"] == PENDING and a.outcome != PENDING:
                rows[key] = row
        if not rows:
            return 0
        ins = self._insert(ACTIONS)
        stmt = ins.on_conflict_do_update(
            index_elements=["time", "action", "node", "alert_fingerprint"],
            set_={
                "executed": ins.excluded.executed,
                "outcome": ins.excluded.outcome,
                "reason": ins.excluded.reason,
            },
            where=(ACTIONS.c.outcome == PENDING) & (ins.excluded.outcome != PENDING),
        )
        with self._errors("write actions"), self.engine.begin() as conn:
            values = list(rows.values())
            for i in range(0, len(values), self.batch_size):
                conn.execute(stmt, values[i : i + self.batch_size])
            incidents.record_actions(self, conn, actions)
        return len(rows)

    def write_config_changes(self, changes: Sequence[ConfigChange]) -> int:
        """Insert RoCE configuration changes, ignoring any already stored (same time, device,
        port and field: a replayed stream stores each once). Returns the rows given."""
        rows: dict[tuple[Any, ...], dict[str, Any]] = {}
        for c in changes:
            row = {
                "time": ns_to_datetime(c.ts),
                "kind": c.kind,
                "device": c.device,
                "port": c.port,
                "field": c.field,
                "old_value": c.old,
                "new_value": c.new,
                "source": c.source,
            }
            rows[(row["time"], c.device, c.port, c.field)] = row
        if not rows:
            return 0
        stmt = self._insert(CHANGES).on_conflict_do_nothing(
            index_elements=["time", "device", "port", "field"]
        )
        with self._errors("write config changes"), self.engine.begin() as conn:
            values = list(rows.values())
            for i in range(0, len(values), self.batch_size):
                conn.execute(stmt, values[i : i + self.batch_size])
        return len(rows)

    def write_ranks(self, ranks: Sequence[Mapping[str, Any]]) -> int:
        """Upsert NCCL ranks (``job``, ``comm``, ``rank``, ``host``, ``gpu``, ``nic``,
        ``seen_ns``: telemetry time): a rank seen again moves its ``last_seen`` on and takes its
        newest place; its ``first_seen`` stays."""
        rows: dict[tuple[str, str, int], dict[str, Any]] = {}
        for r in ranks:
            t = ns_to_datetime(int(r["seen_ns"]))
            key = (str(r["job"]), str(r["comm"]), int(r["rank"]))
            old = rows.get(key)
            rows[key] = {
                "job": key[0],
                "comm": key[1],
                "rank": key[2],
                "host": str(r["host"]),
                "gpu": int(r["gpu"]),
                "nic": str(r["nic"]),
                "first_seen": min(t, old["first_seen"]) if old else t,
                "last_seen": max(t, old["last_seen"]) if old else t,
            }
        if not rows:
            return 0
        ins = self._insert(RANKS)
        stmt = ins.on_conflict_do_update(
            index_elements=["job", "comm", "rank"],
            set_={
                "host": ins.excluded.host,
                "gpu": ins.excluded.gpu,
                "nic": ins.excluded.nic,
                "last_seen": ins.excluded.last_seen,
            },
            where=RANKS.c.last_seen <= ins.excluded.last_seen,
        )
        with self._errors("write ranks"), self.engine.begin() as conn:
            values = list(rows.values())
            for i in range(0, len(values), self.batch_size):
                conn.execute(stmt, values[i : i + self.batch_size])
        return len(rows)

    def config_changes(self, device: str | None = None) -> list[ConfigChange]:
        """Stored configuration changes, oldest first (of one device, if given)."""
        q = select(CHANGES).order_by(CHANGES.c.time, CHANGES.c.id)
        if device is not None:
            q = q.where(CHANGES.c.device == device)
        with self._errors("read config changes"), self.engine.connect() as conn:
            rows = conn.execute(q).mappings().all()
        return [
            ConfigChange(
                datetime_to_ns(r["time"]),
                r["kind"],
                r["device"],
                r["port"],
                r["field"],
                r["old_value"],
                r["new_value"],
                r["source"],
            )
            for r in rows
        ]

    def ranks(self) -> list[dict[str, Any]]:
        """Every stored NCCL rank (for tests and exports)."""
        with self._errors("read ranks"), self.engine.connect() as conn:
            rows = conn.execute(
                select(RANKS).order_by(RANKS.c.job, RANKS.c.comm, RANKS.c.rank)
            ).mappings()
            return [
                {k: v for k, v in r.items() if k != "id"}
                | {
                    "first_seen": datetime_to_ns(r["first_seen"]),
                    "last_seen": datetime_to_ns(r["last_seen"]),
                }
                for r in rows
            ]

    def write_rollups(self, df: pl.DataFrame) -> int:
        """Upsert metric rollups (columns ``ROLLUP_COLUMNS``); a rewritten bucket is replaced."""
        missing = [c for c in rollups.ROLLUP_COLUMNS if c not in df.columns]
        if missing:
            raise ValueError(f"rollups frame lacks columns {missing}")
        if df.height == 0:
            return 0
        df = (
            df.select(
                pl.from_epoch(pl.col("bucket_start_ns").cast(pl.Int64), time_unit="ns")
                .dt.replace_time_zone("UTC")
                .alias("bucket_start"),
                pl.col("bucket_start_ns").cast(pl.Int64),
                pl.col("resolution_s").cast(pl.Int64),
                *[pl.col(c).cast(pl.String).fill_null("") for c in ("device", "port", "qual")],
                pl.col("metric").cast(pl.String),
                *[pl.col(c).cast(pl.Float64).fill_nan(None) for c in rollups.ROLLUP_VALUES[:4]],
                pl.col("count").cast(pl.Int64).fill_null(0),
            )
            .unique(subset=rollups.ROLLUP_KEY, keep="last", maintain_order=True)
            .drop("bucket_start_ns")
        )
        ins = self._insert(ROLLUPS)
        stmt = ins.on_conflict_do_update(
            index_elements=["bucket_start", "resolution_s", "device", "port", "qual", "metric"],
            set_={c: ins.excluded[c] for c in rollups.ROLLUP_VALUES},
        )
        if self.backend == "postgresql":
            self._copy_rollups(df)
            return df.height
        # SQLite: the driver's executemany on plain tuples; the time as SQLAlchemy's SQLite
        # DateTime text, so these rows and ORM-written ones share one key format.
        cols = [c.name for c in ROLLUPS.columns if c.name in df.columns]  # the compiled order
        sql = str(stmt.compile(dialect=self.engine.dialect, column_keys=cols))
        rows = (
            df.select(cols)
            .with_columns(pl.col("bucket_start").dt.strftime("%Y-%m-%d %H:%M:%S%.6f"))
            .rows()
        )
        with self._errors("write rollups"), self.engine.begin() as conn:
            raw = conn.connection.driver_connection
            assert raw is not None
            for off in range(0, len(rows), self.batch_size):
                raw.executemany(sql, rows[off : off + self.batch_size])
        return df.height

    def _copy_rollups(self, df: pl.DataFrame) -> None:
        """PostgreSQL: COPY the batch into a temporary table, then one INSERT .. ON CONFLICT
        (several times the rows per second of a parameterised executemany)."""
        import psycopg

        cols = list(df.columns)
        collist = ", ".join(f'"{c}"' for c in cols)
        updates = ", ".join(f'"{c}" = EXCLUDED."{c}"' for c in rollups.ROLLUP_VALUES)
        key = ", ".join(f'"{c}"' for c in ROLLUP_KEY_DB)
        csv = df.with_columns(
            pl.col("bucket_start").dt.strftime("%Y-%m-%d %H:%M:%S%.6f+00")
        ).write_csv(include_header=False, null_value="")
        try:
            with self._errors("write rollups"), self.engine.begin() as conn:
                raw = conn.connection.driver_connection
                assert raw is not None
                with raw.cursor() as cur:
                    cur.execute(
                        "CREATE TEMP TABLE IF NOT EXISTS rw_rollups_in ("
                        "bucket_start timestamptz, resolution_s integer, device text, port text, "
                        "qual text, metric text, mean float8, max float8, min float8, "
                        "last float8, count bigint) ON COMMIT DELETE ROWS"
                    )
                    with cur.copy(
                        f"COPY rw_rollups_in ({collist}) FROM STDIN WITH (FORMAT csv)"
                    ) as cp:
                        cp.write(csv.encode())
                    cur.execute(
                        f"INSERT INTO metric_rollups ({collist}) "
                        f"SELECT {collist} FROM rw_rollups_in "
                        f"ON CONFLICT ({key}) DO UPDATE SET {updates}"
                    )
        except psycopg.OperationalError as e:
            raise RetryableError(f"storage: write rollups on {self.url} failed: {e}") from e
        except psycopg.Error as e:
            raise PermanentError(f"storage: write rollups on {self.url} failed: {e}") from e

    def prune(self, older_than_ns: int) -> dict[str, int]:
        """Delete resolved alerts that ended, actions taken and rollup buckets that started
        before ``older_than_ns``; firing alerts are kept however old. Returns rows deleted."""
        cutoff = ns_to_datetime(older_than_ns)
        out: dict[str, int] = {}
        with self._errors("prune"), self.engine.begin() as conn:
            out["alerts"] = conn.execute(
                delete(ALERTS).where(ALERTS.c.ends_at.is_not(None), ALERTS.c.ends_at < cutoff)
            ).rowcount
            out["actions"] = conn.execute(delete(ACTIONS).where(ACTIONS.c.time < cutoff)).rowcount
            out["tenant_interference"] = conn.execute(
                delete(INTERFERENCE).where(
                    INTERFERENCE.c.ends_at.is_not(None), INTERFERENCE.c.ends_at < cutoff
                )
            ).rowcount
            out["metric_rollups"] = conn.execute(
                delete(ROLLUPS).where(ROLLUPS.c.bucket_start < cutoff)
            ).rowcount
            out["config_changes"] = conn.execute(
                delete(CHANGES).where(CHANGES.c.time < cutoff)
            ).rowcount
            out["incidents"] = incidents.prune(conn, cutoff)
        log.info("storage: pruned %s before %s", out, cutoff.isoformat())
        return out

    def apply_retention(self, days: float) -> dict[str, int]:
        """Retention by age: prune everything older than ``days`` before now (the store's
        clock), including delivered or refused notifications in the outbox."""
        if days <= 0:
            raise ConfigError("storage: retention_days must be positive")
        cutoff_ns = self._clock() - int(days * 86400 * 1e9)
        out = self.prune(cutoff_ns)
        from storage.outbox import Outbox

        out["notify_outbox"] = Outbox(self, clock=lambda: self._clock() / 1e9).prune(
            cutoff_ns / 1e9
        )
        return out

    # --- reads ---------------------------------------------------------------------------------
    def alerts(self, status: str | None = None, alertname: str | None = None) -> list[Alert]:
        """Stored alert events, oldest first; ``status`` is ``firing`` or ``resolved``."""
        q = select(ALERTS).order_by(ALERTS.c.starts_at, ALERTS.c.id)
        if status is not None:
            q = q.where(ALERTS.c.status == status)
        if alertname is not None:
            q = q.where(ALERTS.c.alertname == alertname)
        with self._errors("read alerts"), self.engine.connect() as conn:
            rows = conn.execute(q).mappings().all()
        return [
            Alert(
                labels=dict(r["labels"]),
                annotations=dict(r["annotations"]),
                starts_at=datetime_to_ns(r["starts_at"]),
                ends_at=datetime_to_ns(r["ends_at"]) if r["ends_at"] is not None else 0,
                fingerprint=r["fingerprint"],
            )
            for r in rows
        ]

    def actions(self) -> list[Action]:
        """Stored actions in decision order."""
        q = select(ACTIONS).order_by(ACTIONS.c.time, ACTIONS.c.id)
        with self._errors("read actions"), self.engine.connect() as conn:
            rows = conn.execute(q).mappings().all()
        return [
            Action(
                time=datetime_to_ns(r["time"]),
                action=r["action"],
                node=r["node"],
                scheduler=r["scheduler"],
                reason=r["reason"],
                alert_fingerprint=r["alert_fingerprint"],
                executed=bool(r["executed"]),
                outcome=r["outcome"],
            )
            for r in rows
        ]

    # --- operator commands (rocewatch approve / undrain, the HTTP API) --------------------------
    def add_command(self, command: str, node: str, requested_by: str) -> int:
        """Queue a command for the detect service; return its id."""
        now = self._clock()
        row: dict[str, Any] = {
            "requested_at": ns_to_datetime(now),
            "command": command,
            "node": node,
            "requested_by": requested_by,
            "status": "pending",
            "result": "",
        }
        with self._errors("add command"), self.engine.begin() as conn:
            res = conn.execute(COMMANDS.insert().values(**row).returning(COMMANDS.c.id))
            cid = int(res.scalar_one())
            incidents.record_command(self, conn, {**row, "id": cid, "requested_at": now})
            return cid

    def commands(self, status: str | None = None, ids: Sequence[int] = ()) -> list[dict[str, Any]]:
        """Commands oldest first, optionally only those with ``status`` or these ``ids``."""
        q = select(COMMANDS).order_by(COMMANDS.c.id)
        if status is not None:
            q = q.where(COMMANDS.c.status == status)
        if ids:
            q = q.where(COMMANDS.c.id.in_(list(ids)))
        with self._errors("read commands"), self.engine.connect() as conn:
            rows = conn.execute(q).mappings().all()
        return [
            {
                "id": r["id"],
                "requested_at": datetime_to_ns(r["requested_at"]),
                "command": r["command"],
                "node": r["node"],
                "requested_by": r["requested_by"],
                "status": r["status"],
                "result": r["result"],
            }
            for r in rows
        ]

    def finish_command(self, command_id: int, status: str, result: str) -> None:
        with self._errors("finish command"), self.engine.begin() as conn:
            conn.execute(
                COMMANDS.update()
                .where(COMMANDS.c.id == command_id)
                .values(status=status, result=result, done_at=ns_to_datetime(self._clock()))
            )
            r = conn.execute(select(COMMANDS).where(COMMANDS.c.id == command_id)).mappings()
            for c in r.all():
                row = {k: c[k] for k in ("id", "command", "node", "requested_by", "status")}
                row.update(result=c["result"], requested_at=datetime_to_ns(c["requested_at"]))
                incidents.record_command(self, conn, row)

    # --- incidents (storage/incidents.py) ------------------------------------------------------
    def incidents(self, limit: int = 200) -> list[dict[str, Any]]:
        """Open incidents first, then the most recent ones."""
        with self._errors("read incidents"), self.engine.connect() as conn:
            return incidents.list_incidents(conn, limit)

    def incident(self, incident_id: int) -> dict[str, Any] | None:
        """One incident with its graph (``nodes``, ``edges``) and ``timeline``; None if none."""
        with self._errors("read incident"), self.engine.connect() as conn:
            return incidents.read_incident(conn, incident_id)

    def incident_of_alert(self, fingerprint: str, starts_at: int | None = None) -> int | None:
        """The incident an alert event was filed under (its latest event without a time)."""
        with self._errors("read incident"), self.engine.connect() as conn:
            if starts_at is not None:
                return incidents.find_for_alert(conn, fingerprint, ns_to_datetime(starts_at))
            return incidents.latest_with_alert(conn, fingerprint)

    def rollups(self) -> pl.DataFrame:
        """All stored rollups as a frame with ``ROLLUP_COLUMNS`` (for tests and exports)."""
        q = select(ROLLUPS).order_by(ROLLUPS.c.bucket_start, ROLLUPS.c.id)
        with self._errors("read rollups"), self.engine.connect() as conn:
            rows = conn.execute(q).mappings().all()
        data: dict[str, list[Any]] = {c: [] for c in rollups.ROLLUP_COLUMNS}
        for r in rows:
            data["bucket_start_ns"].append(datetime_to_ns(r["bucket_start"]))
            for c in rollups.ROLLUP_COLUMNS[1:]:
                data[c].append(r[c])
        schema = {
            "bucket_start_ns": pl.Int64,
            "resolution_s": pl.Int64,
            "device": pl.String,
            "port": pl.String,
            "qual": pl.String,
            "metric": pl.String,
            "mean": pl.Float64,
            "max": pl.Float64,
            "min": pl.Float64,
            "last": pl.Float64,
            "count": pl.Int64,
        }
        return pl.DataFrame(data, schema=schema)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals -----------------------------------------------------------------------------
    def _insert(self, table: Table) -> Any:
        # Both dialects' Insert have on_conflict_do_update/do_nothing with the same arguments.
        if self.backend == "postgresql":
            return postgresql.insert(table)
        return sqlite.insert(table)

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Turn driver errors into the project's: retry on connection trouble, else give up."""
        try:
            yield
        except sa_exc.DBAPIError as e:
            msg = _first_line(e.orig) if e.orig is not None else type(e).__name__
            text = f"storage: {what} on {self.url} failed: {msg}"
            permanent = any(s in msg for s in ("no such table", "no such column"))
            if e.connection_invalidated or (
                isinstance(e, sa_exc.OperationalError | sa_exc.InterfaceError) and not permanent
            ):
                raise RetryableError(text) from e
            raise PermanentError(text) from e
        except sa_exc.TimeoutError as e:  # connection pool exhausted
            raise RetryableError(f"storage: {what} on {self.url} failed: {e}") from e


def _alert_row(a: Alert, now: dt.datetime) -> dict[str, Any]:
    row: dict[str, Any] = {
        "fingerprint": a.fingerprint,
        "alertname": a.labels.get("alertname", ""),
        "severity": a.labels.get("severity", ""),
        "status": a.status,
        "starts_at": ns_to_datetime(a.starts_at),
        "ends_at": ns_to_datetime(a.ends_at) if a.ends_at else None,
        "labels": dict(a.labels),
        "annotations": dict(a.annotations),
        "updated_at": now,
    }
    for k in ENTITY_LABELS:
        row[k] = a.labels.get(k)
    row["inhibited_by"] = a.annotations.get("inhibited_by") or None
    return row


def _final(alerts: Sequence[Alert]) -> list[Alert]:
    """One alert per event, its last state in the batch (resolved wins over firing)."""
    out: dict[tuple[str, int], Alert] = {}
    for a in alerts:
        k = (a.fingerprint, a.starts_at)
        if k not in out or not out[k].ends_at:
            out[k] = a
    return list(out.values())


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


def _sqlite_pragmas(timeout_ms: int) -> Callable[[Any, Any], None]:
    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {int(timeout_ms)}")
            cur.execute("PRAGMA journal_mode = WAL")  # answers 'memory' for in-memory databases
            # FULL: a commit is on disk when write_* returns, even across a power loss.
            cur.execute("PRAGMA synchronous = FULL")
        finally:
            cur.close()

    return on_connect
