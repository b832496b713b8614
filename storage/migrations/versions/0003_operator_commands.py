"""Schema version 3: operators' commands (approve, reject, undrain) for the detect service.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "operator_commands",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("requested_at", TS, nullable=False),
        sa.Column("command", sa.String(16), nullable=False),
        sa.Column("node", sa.String(128), nullable=False),
        sa.Column("requested_by", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("result", sa.Text(), nullable=False),
        sa.Column("done_at", TS, nullable=True),
    )
    for col in ("requested_at", "node", "status"):
        op.create_index(f"ix_operator_commands_{col}", "operator_commands", [col])


def downgrade() -> None:
    op.drop_table("operator_commands")
