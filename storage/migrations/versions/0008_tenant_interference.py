"""Schema version 8: tenant_interference, the pause time each tenant suffered from others
(rocewatch/alerting/interference.py).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    # a database from before migrations is created from the current models, then stamped
    # 0001 (storage/migrate.py): the table may be there already
    if "tenant_interference" in set(sa.inspect(op.get_bind()).get_table_names()):
        return
    op.create_table(
        "tenant_interference",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("starts_at", TS, nullable=False),
        sa.Column("ends_at", TS, nullable=True),
        sa.Column("alertname", sa.String(64), nullable=False),
        sa.Column("switch", sa.String(128), nullable=True),
        sa.Column("port", sa.String(128), nullable=True),
        sa.Column("victim_tenant", sa.String(128), nullable=False),
        sa.Column("victim_job", sa.String(256), nullable=False),
        sa.Column("aggressor_tenant", sa.String(128), nullable=False),
        sa.Column("aggressor_job", sa.String(256), nullable=False),
        sa.Column("pause_s", sa.Float(), nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.UniqueConstraint("fingerprint", "starts_at", name="uq_tenant_interference_event"),
    )
    op.create_index("ix_tenant_interference_starts_at", "tenant_interference", ["starts_at"])
    op.create_index(
        "ix_tenant_interference_victim_tenant", "tenant_interference", ["victim_tenant"]
    )
    op.create_index(
        "ix_tenant_interference_aggressor_tenant", "tenant_interference", ["aggressor_tenant"]
    )


def downgrade() -> None:
    op.drop_table("tenant_interference")
