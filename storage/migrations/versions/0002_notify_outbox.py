"""Schema version 2: the notification outbox.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Json = sa.JSON().with_variant(JSONB(), "postgresql")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "notify_outbox",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("sink", sa.String(64), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("starts_at", TS, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("alert", Json, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("next_attempt_at", TS, nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("delivered_at", TS, nullable=True),
        sa.Column("dead_at", TS, nullable=True),
        sa.Column("refresh_at", TS, nullable=True),
        sa.UniqueConstraint("sink", "fingerprint", "starts_at", "status", name="uq_outbox_event"),
    )
    op.create_index(
        "ix_outbox_due", "notify_outbox", ["sink", "delivered_at", "dead_at", "next_attempt_at"]
    )


def downgrade() -> None:
    op.drop_table("notify_outbox")
