"""Schema version 7: config_changes, the RoCE configuration changes seen in the stream.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    # a database from before migrations is created from the current models, then stamped
    # 0001 (storage/migrate.py): the table may be there already
    if "config_changes" in set(sa.inspect(op.get_bind()).get_table_names()):
        return
    op.create_table(
        "config_changes",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("time", TS, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("device", sa.String(128), nullable=False),
        sa.Column("port", sa.String(128), nullable=False),
        sa.Column("field", sa.String(64), nullable=False),
        sa.Column("old_value", sa.Text(), nullable=False),
        sa.Column("new_value", sa.Text(), nullable=False),
        sa.Column("source", sa.String(32), nullable=False),
        sa.UniqueConstraint("time", "device", "port", "field", name="uq_config_changes_event"),
    )
    op.create_index("ix_config_changes_time", "config_changes", ["time"])
    op.create_index("ix_config_changes_device_time", "config_changes", ["device", "time"])


def downgrade() -> None:
    op.drop_table("config_changes")
