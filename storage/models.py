"""SQLAlchemy tables for alerts, actions, metric rollups and the schema version.

Times are timezone-aware UTC datetimes (``UtcDateTime``): ``timestamptz`` on PostgreSQL, ISO
text on SQLite (which has no time zone type, so the zone is stripped on write and put back on
read). Microseconds are kept; the nanoseconds beyond them are not.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

SCHEMA_VERSION = 8  # = the number of the newest migration (storage/migrations/versions)

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_US = dt.timedelta(microseconds=1)

# Entity labels copied into their own indexed columns so Grafana can filter without JSON paths.
ENTITY_LABELS = ("switch", "port", "node", "nic", "queue", "priority", "role")


def ns_to_datetime(ns: int) -> dt.datetime:
    """Epoch nanoseconds -> aware UTC datetime (truncated to microseconds)."""
    return EPOCH + dt.timedelta(microseconds=ns // 1000)


def datetime_to_ns(t: dt.datetime) -> int:
    """Aware (or naive, taken as UTC) datetime -> epoch nanoseconds."""
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return ((t - EPOCH) // _US) * 1000


class UtcDateTime(TypeDecorator[dt.datetime]):
    """A datetime that is always stored as UTC and always read back timezone-aware."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: rocewatch stores only timezone-aware UTC times")
        value = value.astimezone(dt.UTC)
        if dialect.name == "sqlite":
            # SQLite's DATETIME text has no zone; keep one fixed format so strings sort as times.
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)  # type: ignore[no-any-return]
        return value.astimezone(dt.UTC)  # type: ignore[no-any-return]


JsonType = JSON().with_variant(JSONB(), "postgresql")
Id = BigInteger().with_variant(Integer(), "sqlite")  # SQLite autoincrements INTEGER PRIMARY KEY


class Base(DeclarativeBase):
    pass


class AlertRow(Base):
    """One alert event: a (fingerprint, starts_at) pair, updated in place when it resolves."""

    __tablename__ = "alerts"
    __table_args__ = (
        UniqueConstraint("fingerprint", "starts_at", name="uq_alerts_event"),
        Index("ix_alerts_status_starts", "status", "starts_at"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    fingerprint: Mapped[str] = mapped_column(String(64))
    alertname: Mapped[str] = mapped_column(String(64), index=True)
    severity: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    starts_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, index=True)
    ends_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    labels: Mapped[dict[str, str]] = mapped_column(JsonType)
    annotations: Mapped[dict[str, str]] = mapped_column(JsonType)
    switch: Mapped[str | None] = mapped_column(String(128), index=True)
    port: Mapped[str | None] = mapped_column(String(128), index=True)
    node: Mapped[str | None] = mapped_column(String(128), index=True)
    nic: Mapped[str | None] = mapped_column(String(64), index=True)
    queue: Mapped[str | None] = mapped_column(String(32), index=True)
    priority: Mapped[str | None] = mapped_column(String(16), index=True)
    role: Mapped[str | None] = mapped_column(String(16), index=True)
    # the fingerprint of the alert whose inhibit rule suppresses this one (its annotation
    # ``inhibited_by``); NULL for an alert that is notified (also once it outlived its source)
    inhibited_by: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)


class TenantInterferenceRow(Base):
    """One congestion alert that named an aggressor of another tenant: who suffered, who
    caused it, and the PFC pause time the victim's NICs suffered while it fired
    (rocewatch/alerting/interference.py). Keyed as the alert event it comes from."""

    __tablename__ = "tenant_interference"
    __table_args__ = (
        UniqueConstraint("fingerprint", "starts_at", name="uq_tenant_interference_event"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    fingerprint: Mapped[str] = mapped_column(String(64))
    starts_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, index=True)
    ends_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    alertname: Mapped[str] = mapped_column(String(64))
    switch: Mapped[str | None] = mapped_column(String(128), nullable=True)
    port: Mapped[str | None] = mapped_column(String(128), nullable=True)
    victim_tenant: Mapped[str] = mapped_column(String(128), index=True)
    victim_job: Mapped[str] = mapped_column(String(256))
    aggressor_tenant: Mapped[str] = mapped_column(String(128), index=True)
    aggressor_job: Mapped[str] = mapped_column(String(256))
    pause_s: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)


class ActionRow(Base):
    """One drain/resume decision (docs/formats.md section 7), the policy's audit trail."""

    __tablename__ = "actions"
    __table_args__ = (
        UniqueConstraint("time", "action", "node", "alert_fingerprint", name="uq_actions_event"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    time: Mapped[dt.datetime] = mapped_column(UtcDateTime, index=True)
    action: Mapped[str] = mapped_column(String(16))
    node: Mapped[str] = mapped_column(String(128), index=True)
    scheduler: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text)
    alert_fingerprint: Mapped[str] = mapped_column(String(64))
    executed: Mapped[bool] = mapped_column(Boolean)
    outcome: Mapped[str] = mapped_column(Text)


class RollupRow(Base):
    """Per-bucket aggregates of one metric series, for dashboards over long ranges."""

    __tablename__ = "metric_rollups"
    __table_args__ = (
        UniqueConstraint(
            "bucket_start",
            "resolution_s",
            "device",
            "port",
            "qual",
            "metric",
            name="uq_rollups_series_bucket",
        ),
        Index("ix_rollups_series", "device", "port", "metric", "bucket_start"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    bucket_start: Mapped[dt.datetime] = mapped_column(UtcDateTime, index=True)
    resolution_s: Mapped[int] = mapped_column(Integer)
    device: Mapped[str] = mapped_column(String(128))
    port: Mapped[str] = mapped_column(String(128))
    # (NCCL series: ``<comm>/<collective>/<size>``, longer than a priority or queue)
    qual: Mapped[str] = mapped_column(String(256))
    metric: Mapped[str] = mapped_column(String(96))
    mean: Mapped[float | None] = mapped_column(Float)
    max: Mapped[float | None] = mapped_column(Float)
    min: Mapped[float | None] = mapped_column(Float)
    last: Mapped[float | None] = mapped_column(Float)
    count: Mapped[int] = mapped_column(BigInteger)


class ConfigChangeRow(Base):
    """One RoCE configuration setting of one cable end that changed between two snapshots
    (rocewatch/roce/watch.py): Grafana's table and annotations of configuration changes."""

    __tablename__ = "config_changes"
    __table_args__ = (
        UniqueConstraint("time", "device", "port", "field", name="uq_config_changes_event"),
        Index("ix_config_changes_device_time", "device", "time"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    time: Mapped[dt.datetime] = mapped_column(UtcDateTime, index=True)
    kind: Mapped[str] = mapped_column(String(16))  # nic | switch
    device: Mapped[str] = mapped_column(String(128))
    port: Mapped[str] = mapped_column(String(128))
    field: Mapped[str] = mapped_column(String(64))
    old_value: Mapped[str] = mapped_column(Text)
    new_value: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(String(32))


class OperatorCommandRow(Base):
    """An operator's request (approve, reject, undrain) for the detect service to carry out."""

    __tablename__ = "operator_commands"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    requested_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, index=True)
    command: Mapped[str] = mapped_column(String(16))
    node: Mapped[str] = mapped_column(String(128), index=True)
    requested_by: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16), index=True)  # pending | done | refused
    result: Mapped[str] = mapped_column(Text)
    done_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)


class MetaRow(Base):
    """Key/value facts about the database itself (``schema_version``)."""

    __tablename__ = "meta"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


alerts_table = AlertRow.__table__
actions_table = ActionRow.__table__
rollups_table = RollupRow.__table__
meta_table = MetaRow.__table__
commands_table = OperatorCommandRow.__table__


class OutboxRow(Base):
    """One alert event waiting for (or done with) delivery to one notification sink.

    The row is written in the same commit as the alert itself, before any delivery is tried, so
    neither a restart nor a receiver outage loses it. ``delivered_at`` set means sent (the
    receiver answered 2xx); ``dead_at`` set means the receiver refused it for good (4xx): kept
    for the audit trail, never retried. ``next_attempt_at`` is when it may be (re)tried.
    """

    __tablename__ = "notify_outbox"
    __table_args__ = (
        UniqueConstraint("sink", "fingerprint", "starts_at", "status", name="uq_outbox_event"),
        Index("ix_outbox_due", "sink", "delivered_at", "dead_at", "next_attempt_at"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    sink: Mapped[str] = mapped_column(String(64))
    fingerprint: Mapped[str] = mapped_column(String(64))
    starts_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    status: Mapped[str] = mapped_column(String(16))
    alert: Mapped[dict[str, Any]] = mapped_column(JsonType)  # the Alertmanager alert object
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    next_attempt_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    delivered_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    dead_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    # Alertmanager forgets a firing alert not re-sent within its resolve_timeout: such sinks
    # re-send firing events until their resolution is delivered (NULL: no refresh due).
    refresh_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)


outbox_table = OutboxRow.__table__


class IncidentRow(Base):
    """One fault as an operator meets it (storage/incidents.py): what one page shows."""

    __tablename__ = "incidents"
    __table_args__ = (Index("ix_incidents_key_started", "key", "started_at"),)

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(256))
    kind: Mapped[str] = mapped_column(String(32))  # storm | flaky_link | straggler | fabric ...
    title: Mapped[str] = mapped_column(String(512))
    severity: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), index=True)  # open | resolved
    started_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, index=True)
    ended_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    labels: Mapped[dict[str, str]] = mapped_column(JsonType)  # its main alert's labels
    links: Mapped[list[dict[str, Any]]] = mapped_column(JsonType)  # related incidents


class IncidentEventRow(Base):
    """One entry of an incident's timeline: an alert event, an inhibited symptom, an action,
    an operator command."""

    __tablename__ = "incident_events"
    __table_args__ = (
        UniqueConstraint("incident_id", "kind", "ref", "time", name="uq_incident_events"),
        Index("ix_incident_events_ref", "ref", "time"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    incident_id: Mapped[int] = mapped_column(BigInteger, index=True)
    time: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    kind: Mapped[str] = mapped_column(String(16))  # firing|resolved|inhibited|action|command
    ref: Mapped[str] = mapped_column(String(128))  # alert fingerprint, action key, command id
    summary: Mapped[str] = mapped_column(Text)
    detail: Mapped[dict[str, Any]] = mapped_column(JsonType)


class IncidentNodeRow(Base):
    """A node of an incident's graph (a NIC, a switch, a job, a host), as its alerts gave it."""

    __tablename__ = "incident_nodes"
    __table_args__ = (UniqueConstraint("incident_id", "node_id", name="uq_incident_nodes"),)

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    incident_id: Mapped[int] = mapped_column(BigInteger, index=True)
    node_id: Mapped[str] = mapped_column(String(256), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # origin|victim|relay|job|host|end|entity
    title: Mapped[str] = mapped_column(String(256))
    subtitle: Mapped[str] = mapped_column(Text)
    share: Mapped[float | None] = mapped_column(Float, nullable=True)  # pause share, 0..1
    first_paused: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    detail: Mapped[dict[str, Any]] = mapped_column(JsonType)


class IncidentEdgeRow(Base):
    """An edge of an incident's graph: who pauses whom, a NIC in a job, a cable."""

    __tablename__ = "incident_edges"
    __table_args__ = (UniqueConstraint("incident_id", "edge_id", name="uq_incident_edges"),)

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    incident_id: Mapped[int] = mapped_column(BigInteger, index=True)
    edge_id: Mapped[str] = mapped_column(String(512))
    source: Mapped[str] = mapped_column(String(256))
    target: Mapped[str] = mapped_column(String(256))
    kind: Mapped[str] = mapped_column(String(16))  # pauses | runs | cable | hosts
    share: Mapped[float | None] = mapped_column(Float, nullable=True)


class NcclRankRow(Base):
    """One rank of an NCCL job's communicator and where it runs (the rank join,
    rocewatch/alerting/job_paths.py): what maps a communicator's series to its job."""

    __tablename__ = "nccl_ranks"
    __table_args__ = (
        UniqueConstraint("job", "comm", "rank", name="uq_nccl_ranks"),
        Index("ix_nccl_ranks_comm", "comm"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    job: Mapped[str] = mapped_column(String(128))
    comm: Mapped[str] = mapped_column(String(64))
    rank: Mapped[int] = mapped_column(Integer)
    host: Mapped[str] = mapped_column(String(128))
    gpu: Mapped[int] = mapped_column(Integer)
    nic: Mapped[str] = mapped_column(String(64))
    first_seen: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    last_seen: Mapped[dt.datetime] = mapped_column(UtcDateTime)
