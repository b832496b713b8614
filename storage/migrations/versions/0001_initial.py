"""Schema version 1: alerts, actions, metric rollups, meta.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Json = sa.JSON().with_variant(JSONB(), "postgresql")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("alertname", sa.String(64), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("starts_at", TS, nullable=False),
        sa.Column("ends_at", TS, nullable=True),
        sa.Column("labels", Json, nullable=False),
        sa.Column("annotations", Json, nullable=False),
        sa.Column("switch", sa.String(128), nullable=True),
        sa.Column("port", sa.String(128), nullable=True),
        sa.Column("node", sa.String(128), nullable=True),
        sa.Column("nic", sa.String(64), nullable=True),
        sa.Column("queue", sa.String(32), nullable=True),
        sa.Column("priority", sa.String(16), nullable=True),
        sa.Column("role", sa.String(16), nullable=True),
        sa.Column("updated_at", TS, nullable=False),
        sa.UniqueConstraint("fingerprint", "starts_at", name="uq_alerts_event"),
    )
    op.create_index("ix_alerts_status_starts", "alerts", ["status", "starts_at"])
    for col in (
        "alertname",
        "starts_at",
        "switch",
        "port",
        "node",
        "nic",
        "queue",
        "priority",
        "role",
    ):
        op.create_index(f"ix_alerts_{col}", "alerts", [col])

    op.create_table(
        "actions",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("time", TS, nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("node", sa.String(128), nullable=False),
        sa.Column("scheduler", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("alert_fingerprint", sa.String(64), nullable=False),
        sa.Column("executed", sa.Boolean(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.UniqueConstraint("time", "action", "node", "alert_fingerprint", name="uq_actions_event"),
    )
    op.create_index("ix_actions_time", "actions", ["time"])
    op.create_index("ix_actions_node", "actions", ["node"])

    op.create_table(
        "metric_rollups",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("bucket_start", TS, nullable=False),
        sa.Column("resolution_s", sa.Integer(), nullable=False),
        sa.Column("device", sa.String(128), nullable=False),
        sa.Column("port", sa.String(128), nullable=False),
        sa.Column("qual", sa.String(32), nullable=False),
        sa.Column("metric", sa.String(96), nullable=False),
        sa.Column("mean", sa.Float(), nullable=True),
        sa.Column("max", sa.Float(), nullable=True),
        sa.Column("min", sa.Float(), nullable=True),
        sa.Column("last", sa.Float(), nullable=True),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.UniqueConstraint(
            "bucket_start",
            "resolution_s",
            "device",
            "port",
            "qual",
            "metric",
            name="uq_rollups_series_bucket",
        ),
    )
    op.create_index(
        "ix_rollups_series", "metric_rollups", ["device", "port", "metric", "bucket_start"]
    )
    op.create_index("ix_metric_rollups_bucket_start", "metric_rollups", ["bucket_start"])

    op.create_table(
        "meta",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    for t in ("meta", "metric_rollups", "actions", "alerts"):
        op.drop_table(t)
