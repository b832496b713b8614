"""Schema version 5: incidents, their timelines and their graphs (storage/incidents.py).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)
Json = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    # a database from before migrations is created from the current models, then stamped
    # 0001 (storage/migrate.py): these tables may be there already
    have = set(sa.inspect(op.get_bind()).get_table_names())
    if "incidents" not in have:
        op.create_table(
            "incidents",
            sa.Column("id", Id, primary_key=True, autoincrement=True),
            sa.Column("key", sa.String(256), nullable=False),
            sa.Column("kind", sa.String(32), nullable=False),
            sa.Column("title", sa.String(512), nullable=False),
            sa.Column("severity", sa.String(16), nullable=False),
            sa.Column("status", sa.String(16), nullable=False),
            sa.Column("started_at", TS, nullable=False),
            sa.Column("ended_at", TS, nullable=True),
            sa.Column("updated_at", TS, nullable=False),
            sa.Column("labels", Json, nullable=False),
            sa.Column("links", Json, nullable=False),
        )
        op.create_index("ix_incidents_key_started", "incidents", ["key", "started_at"])
        op.create_index("ix_incidents_status", "incidents", ["status"])
        op.create_index("ix_incidents_started_at", "incidents", ["started_at"])
    if "incident_events" not in have:
        op.create_table(
            "incident_events",
            sa.Column("id", Id, primary_key=True, autoincrement=True),
            sa.Column("incident_id", sa.BigInteger(), nullable=False),
            sa.Column("time", TS, nullable=False),
            sa.Column("kind", sa.String(16), nullable=False),
            sa.Column("ref", sa.String(128), nullable=False),
            sa.Column("summary", sa.Text(), nullable=False),
            sa.Column("detail", Json, nullable=False),
            sa.UniqueConstraint("incident_id", "kind", "ref", "time", name="uq_incident_events"),
        )
        op.create_index("ix_incident_events_incident_id", "incident_events", ["incident_id"])
        op.create_index("ix_incident_events_ref", "incident_events", ["ref", "time"])
    if "incident_nodes" not in have:
        op.create_table(
            "incident_nodes",
            sa.Column("id", Id, primary_key=True, autoincrement=True),
            sa.Column("incident_id", sa.BigInteger(), nullable=False),
            sa.Column("node_id", sa.String(256), nullable=False),
            sa.Column("kind", sa.String(16), nullable=False),
            sa.Column("title", sa.String(256), nullable=False),
            sa.Column("subtitle", sa.Text(), nullable=False),
            sa.Column("share", sa.Float(), nullable=True),
            sa.Column("first_paused", TS, nullable=True),
            sa.Column("detail", Json, nullable=False),
            sa.UniqueConstraint("incident_id", "node_id", name="uq_incident_nodes"),
        )
        op.create_index("ix_incident_nodes_incident_id", "incident_nodes", ["incident_id"])
        op.create_index("ix_incident_nodes_node_id", "incident_nodes", ["node_id"])
    if "incident_edges" not in have:
        op.create_table(
            "incident_edges",
            sa.Column("id", Id, primary_key=True, autoincrement=True),
            sa.Column("incident_id", sa.BigInteger(), nullable=False),
            sa.Column("edge_id", sa.String(512), nullable=False),
            sa.Column("source", sa.String(256), nullable=False),
            sa.Column("target", sa.String(256), nullable=False),
            sa.Column("kind", sa.String(16), nullable=False),
            sa.Column("share", sa.Float(), nullable=True),
            sa.UniqueConstraint("incident_id", "edge_id", name="uq_incident_edges"),
        )
        op.create_index("ix_incident_edges_incident_id", "incident_edges", ["incident_id"])


def downgrade() -> None:
    for t in ("incident_edges", "incident_nodes", "incident_events", "incidents"):
        op.drop_table(t)
