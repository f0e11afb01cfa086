"""Schema migrations: Alembic revisions that replay frozen SQL files from ``sql/``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from alembic import command, op
from gov.db import sqlalchemy_url
from gov.queries import sql_dir
from gov.schema_version import VERSION_TABLE, alembic_dir, require_head

__all__ = ["VERSION_TABLE", "alembic_dir", "current", "downgrade", "head", "pending", "require_head", "revisions",
           "upgrade"]

T = TypeVar("T")


def run_sql_file(relative: str) -> None:
    """Execute one frozen SQL file inside the running migration (called from revisions)."""
    sql = (sql_dir() / relative).read_text(encoding="utf-8")
    # Sent through psycopg without parameters, so '%' in PL/pgSQL RAISE is not a placeholder;
    # same connection, so same transaction as Alembic's version bookkeeping.
    raw = op.get_bind().connection.driver_connection
    assert raw is not None  # a live migration's connection always has its driver connection
    raw.execute(sql)


def _config(connection: Any) -> Config:
    cfg = Config()
    cfg.set_main_option("path_separator", "os")
    cfg.set_main_option("script_location", str(alembic_dir()))
    cfg.set_main_option("version_locations", str(alembic_dir() / "versions"))
    cfg.attributes["connection"] = connection
    return cfg


def _run(url: str, fn: Callable[..., T], *args: Any) -> T:
    engine = create_engine(sqlalchemy_url(url))
    try:
        with engine.begin() as conn:
            return fn(conn, *args)
    except DBAPIError as exc:
        # psycopg's own error, which gov.db.translate_errors turns into one line (a database
        # that does not exist, a refused connection), not SQLAlchemy's wrapper and traceback
        if isinstance(exc.orig, psycopg.Error):
            raise exc.orig from None
        raise
    finally:
        engine.dispose()


def _known(conn: Any) -> str | None:
    """The database's revision; SchemaMismatch when this code does not ship it (a newer gov's)."""
    have = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()
    if have is not None and have not in revisions():
        from gov.errors import SchemaMismatch

        raise SchemaMismatch(f"database schema is at revision {have}, which this gov (head {head()}) does not ship: "
                             "a newer gov migrated it; run that version")
    return have


def upgrade(url: str, revision: str = "head") -> list[str]:
    """Migrate to ``revision`` and, on a database with no policy yet, apply the default.

    At head on a Citus cluster, then distribute what is not distributed yet (in its own
    transaction: Citus copies each table's rows to the shards); returns what that did,
    one line per table or function (nothing on a single server).
    """

    def go(conn: Any) -> None:
        _known(conn)
        command.upgrade(_config(conn), revision)
        if revision == "head" and conn.execute(text("SELECT count(*) FROM gov.tiers")).scalar() == 0:
            from gov import policy

            raw = conn.connection.driver_connection
            policy.apply(raw, policy.default_policy(), policy.default_policy_text())

    _run(url, go)
    if revision != "head":
        return []
    return _run(url, lambda conn: [str(line) for (line,) in conn.execute(text("SELECT * FROM gov.distribute_v1()"))])


def downgrade(url: str, revision: str) -> None:
    _run(url, lambda conn: command.downgrade(_config(conn), revision))


def head() -> str:
    script = ScriptDirectory.from_config(_config(None))
    heads = script.get_heads()
    assert len(heads) == 1, f"migrations have {len(heads)} heads: {heads}"
    return heads[0]


def revisions() -> list[str]:
    """Every revision this code ships, oldest first: each one a release a database may be at."""
    script = ScriptDirectory.from_config(_config(None))
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def current(url: str) -> str | None:
    def go(conn: Any) -> str | None:
        ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return ctx.get_current_revision()

    return _run(url, go)


def pending(url: str) -> list[str]:
    """Revisions not yet applied, oldest first (empty when the database is at head)."""
    script = ScriptDirectory.from_config(_config(None))
    now = _run(url, _known)
    revs = [r.revision for r in script.iterate_revisions(head(), now)]
    return list(reversed(revs))
