"""A throwaway PostgreSQL database on the test server (ROCEWATCH_TEST_PG_URL)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import psycopg
from sqlalchemy.engine import make_url


@contextlib.contextmanager
def fresh_database(server_url: str, prefix: str = "rw_t") -> Iterator[str]:
    """Create an empty database, yield its SQLAlchemy URL, drop it afterwards."""
    base = make_url(server_url)
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    dsn = base.set(drivername="postgresql", database="postgres").render_as_string(
        hide_password=False
    )
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
