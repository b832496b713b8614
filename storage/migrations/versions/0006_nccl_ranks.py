"""Schema version 6: nccl_ranks (an NCCL job's ranks: what maps a communicator's series to its
job), and metric_rollups.qual widened to 256 characters (NCCL series' qual is
``<comm>/<collective>/<size>``).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("metric_rollups") as batch:  # (SQLite: a copy of the table)
        batch.alter_column(
            "qual", existing_type=sa.String(32), type_=sa.String(256), existing_nullable=False
        )
    # a database from before migrations is created from the current models, then stamped 0001
    if "nccl_ranks" not in set(sa.inspect(op.get_bind()).get_table_names()):
        op.create_table(
            "nccl_ranks",
            sa.Column("id", Id, primary_key=True, autoincrement=True),
            sa.Column("job", sa.String(128), nullable=False),
            sa.Column("comm", sa.String(64), nullable=False),
            sa.Column("rank", sa.Integer(), nullable=False),
            sa.Column("host", sa.String(128), nullable=False),
            sa.Column("gpu", sa.Integer(), nullable=False),
            sa.Column("nic", sa.String(64), nullable=False),
            sa.Column("first_seen", TS, nullable=False),
            sa.Column("last_seen", TS, nullable=False),
            sa.UniqueConstraint("job", "comm", "rank", name="uq_nccl_ranks"),
        )
        op.create_index("ix_nccl_ranks_comm", "nccl_ranks", ["comm"])


def downgrade() -> None:
    op.drop_index("ix_nccl_ranks_comm", table_name="nccl_ranks")
    op.drop_table("nccl_ranks")
    with op.batch_alter_table("metric_rollups") as batch:
        batch.alter_column(
            "qual", existing_type=sa.String(256), type_=sa.String(32), existing_nullable=False
        )
