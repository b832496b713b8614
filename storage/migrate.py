"""Schema migrations with Alembic (storage/migrations), run by ``Store.create_schema()``.

A database created before migrations existed (schema version 1, no ``alembic_version``) is
stamped as revision 0001 and upgraded from there. A database from a newer rocewatch (a schema
version or revision this one does not know) is refused with ConfigError, never touched.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import Connection, inspect, text

from rocewatch.core.errors import ConfigError

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _alembic_detail() -> Iterator[None]:
    """Alembic reports every plug-in and step at INFO: for a rocewatch user that is detail (the
    one line that matters is ours, "migrated ... from ... to ..."), so it shows only when this
    module logs at DEBUG (``rocewatch -v``)."""
    alembic_log = logging.getLogger("alembic")
    if log.isEnabledFor(logging.DEBUG) or alembic_log.level != logging.NOTSET:
        yield  # verbose, or someone chose alembic's level: leave it
        return
    alembic_log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        alembic_log.setLevel(logging.NOTSET)


# alembic logs its plug-ins at INFO while it is imported: imported here, as detail
with _alembic_detail():
    from alembic import command
    from alembic.config import Config as AlembicConfig
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from alembic.util.exc import CommandError


MIGRATIONS = Path(__file__).parent / "migrations"
ADVISORY_LOCK = 0x726F6365  # 'roce': one schema change at a time on a shared PostgreSQL


def alembic_config(conn: Connection) -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = conn
    return cfg


def head() -> str:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    h = ScriptDirectory.from_config(cfg).get_current_head()
    assert h is not None
    return h


def current(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()


def upgrade(conn: Connection, where: str) -> str:
    """Bring the schema on ``conn`` to the newest revision; return the revision before."""
    with _alembic_detail():
        return _upgrade(conn, where)


def _upgrade(conn: Connection, where: str) -> str:
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": ADVISORY_LOCK})
    tables = set(inspect(conn).get_table_names())
    cfg = alembic_config(conn)
    before = current(conn)
    if before is None and "alerts" in tables:
        log.info("storage: %s predates migrations: stamping it as revision 0001", where)
        command.stamp(cfg, "0001")
        before = "0001"
    known = {s.revision for s in ScriptDirectory.from_config(cfg).walk_revisions()}
    if before is not None and before not in known:
        raise ConfigError(
            f"storage: {where} is at schema revision {before}, which this rocewatch does not "
            "know (a newer version wrote it)"
        )
    try:
        command.upgrade(cfg, "head")
    except CommandError as e:
        raise ConfigError(f"storage: cannot migrate {where}: {e}") from e
    if before != head():
        log.info("storage: migrated %s from %s to %s", where, before or "empty", head())
    return before or ""
