"""TimescaleDB hypertables for the metric rollups, when the extension is available.

UNTESTED: no TimescaleDB package is reachable from the machines this project is tested on, so
this path has never run against a real TimescaleDB (the README says so). Plain PostgreSQL needs
none of it.
"""

from __future__ import annotations

import logging

from sqlalchemy import Connection, text

log = logging.getLogger(__name__)


def available(conn: Connection) -> bool:
    return bool(
        conn.execute(
            text("SELECT 1 FROM pg_available_extensions WHERE name = 'timescaledb'")
        ).scalar()
    )


def make_hypertables(conn: Connection) -> bool:
    """Turn metric_rollups into a hypertable on bucket_start (1-day chunks); True when done."""
    if conn.dialect.name != "postgresql" or not available(conn):
        return False
    conn.execute(text("CREATE EXTENSION IF NOT EXISTS timescaledb"))
    is_hyper = conn.execute(
        text(
            "SELECT 1 FROM timescaledb_information.hypertables "
            "WHERE hypertable_name = 'metric_rollups'"
        )
    ).scalar()
    if is_hyper:
        return True
    # A hypertable's unique indexes must include its time column: key rows by (id, bucket_start).
    conn.execute(text("ALTER TABLE metric_rollups DROP CONSTRAINT IF EXISTS metric_rollups_pkey"))
    conn.execute(text("ALTER TABLE metric_rollups ADD PRIMARY KEY (id, bucket_start)"))
    conn.execute(
        text(
            "SELECT create_hypertable('metric_rollups', 'bucket_start', "
            "chunk_time_interval => INTERVAL '1 day', migrate_data => true, "
            "if_not_exists => true)"
        )
    )
    log.info("storage: metric_rollups is a TimescaleDB hypertable")
    return True
