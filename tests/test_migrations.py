"""Alembic migrations on SQLite and a real PostgreSQL: fresh databases, old databases, refusal."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import column, inspect, table, text

from rocewatch.core.errors import ConfigError
from rocewatch.core.model import Alert
from storage import SCHEMA_VERSION, Store, migrate
from storage.models import Base, ns_to_datetime
from storage.store import ALERTS, _alert_row
from tests.pg_fresh import fresh_database

T0 = 1_795_946_400_000_000_000


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgresql", marks=pytest.mark.postgres),
    ]
)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'm.db'}"
        return
    with fresh_database(request.getfixturevalue("postgres_url"), "rw_migr") as u:
        yield u


def storm() -> Alert:
    return Alert({"alertname": "PFCStorm", "severity": "critical", "node": "gpu-1"}, {"s": "x"}, T0)


def test_fresh_database_is_migrated_to_head_and_matches_the_models(url: str) -> None:
    with Store(url) as s:
        s.create_schema()
        s.create_schema()  # idempotent
        assert s.schema_version() == SCHEMA_VERSION
        with s.engine.connect() as conn:
            assert migrate.current(conn) == migrate.head()
            diff = compare_metadata(
                MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata
            )
        assert diff == [], diff


def test_upgrade_from_revision_0001_keeps_data(url: str) -> None:
    with Store(url) as s, s.engine.begin() as conn:
        command.upgrade(migrate.alembic_config(conn), "0001")
    with Store(url) as s:
        with s.engine.begin() as conn:
            assert "notify_outbox" not in inspect(conn).get_table_names()
            conn.execute(text("INSERT INTO meta (key, value) VALUES ('schema_version', '1')"))
            # the alert as revision 0001 stored it: without the columns added since
            row = _alert_row(storm(), ns_to_datetime(T0))
            row.pop("inhibited_by")
            old = table("alerts", *(column(k, ALERTS.c[k].type) for k in row))
            conn.execute(old.insert().values(row))
        s.create_schema()
        assert [a.to_json() for a in s.alerts()] == [storm().to_json()]
        assert s.schema_version() == SCHEMA_VERSION
        with s.engine.connect() as conn:
            assert "notify_outbox" in inspect(conn).get_table_names()
            assert migrate.current(conn) == migrate.head()


def test_database_from_before_migrations_is_stamped_and_upgraded(url: str) -> None:
    """Schema version 1 was made by create_all, with no alembic_version table."""
    with Store(url) as s:
        later = {"notify_outbox", "operator_commands"}  # revisions 0002 and 0003
        v1 = [t for name, t in Base.metadata.tables.items() if name not in later]
        with s.engine.begin() as conn:
            Base.metadata.create_all(conn, tables=v1)
            conn.execute(text("INSERT INTO meta (key, value) VALUES ('schema_version', '1')"))
        s.write_alerts([storm()])
        s.create_schema()
        assert len(s.alerts()) == 1
        with s.engine.connect() as conn:
            assert migrate.current(conn) == migrate.head()
            assert {"notify_outbox", "operator_commands"} <= set(inspect(conn).get_table_names())


def test_unknown_revision_is_refused(url: str) -> None:
    with Store(url) as s:
        s.create_schema()
        with s.engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
        with pytest.raises(ConfigError, match="9999"):
            s.create_schema()
