"""Schema version 4: alerts.inhibited_by, the alert whose inhibit rule suppresses an alert.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A database from before migrations existed is created from the current models and then
    # stamped 0001 (storage/migrate.py): its alerts table may have the column already.
    conn = op.get_bind()
    have = {c["name"] for c in sa.inspect(conn).get_columns("alerts")}
    if "inhibited_by" not in have:
        op.add_column("alerts", sa.Column("inhibited_by", sa.String(64), nullable=True))
    indexes = {i["name"] for i in sa.inspect(conn).get_indexes("alerts")}
    if "ix_alerts_inhibited_by" not in indexes:
        op.create_index("ix_alerts_inhibited_by", "alerts", ["inhibited_by"])


def downgrade() -> None:
    op.drop_index("ix_alerts_inhibited_by", table_name="alerts")
    with op.batch_alter_table("alerts") as batch:  # SQLite cannot drop a column in place
        batch.drop_column("inhibited_by")
