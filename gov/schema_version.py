"""Is the database at the schema this code expects? One query, without Alembic.

The runner, the releaser and the API call :func:`require_head` at start: a database
on an older (or newer) schema is refused with one line naming both revisions, instead
of failing later with "function does not exist". The code's head is read from the
revision files themselves (``revision = …`` / ``down_revision = …``), so a command
that only checks does not import Alembic; :func:`gov.migrate.head` agrees (tested).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

VERSION_TABLE = "gov_alembic_version"  # in the public schema (alembic/env.py)

_REVISION = re.compile(r'^(down_revision|revision)\s*(?::[^=]*)?=\s*["\']?([^"\'\s]+)["\']?', re.MULTILINE)


def alembic_dir() -> Path:
    """The migrations: packaged as gov/_alembic in a wheel, ./alembic in a checkout."""
    packaged = Path(__file__).parent / "_alembic"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "alembic"


@lru_cache(maxsize=1)
def code_head() -> str:
    """The newest revision this code ships (the one no other revision builds on)."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in (alembic_dir() / "versions").glob("*.py"):
        fields = dict(_REVISION.findall(path.read_text(encoding="utf-8")))
        if "revision" in fields:
            revisions.add(fields["revision"])
            if fields.get("down_revision") not in (None, "None"):
                parents.add(fields["down_revision"])
    heads = sorted(revisions - parents)
    if len(heads) != 1:
        raise RuntimeError(f"migrations have {len(heads)} heads: {heads}")
    return heads[0]


def database_revision(url: str) -> str | None:
    """The revision the database is at (None: gov was never installed there)."""
    import psycopg

    from gov.db import translate_errors

    with translate_errors(), psycopg.connect(url, autocommit=True) as conn:
        return revision_of(conn)


def revision_of(conn: psycopg.Connection[Any]) -> str | None:
    """The revision of the database ``conn`` is connected to (None: gov is not installed).
    The connection must be in autocommit mode or able to roll back: a missing table is an
    error PostgreSQL ends the transaction for."""
    import psycopg
    from psycopg import sql

    query = sql.SQL("SELECT version_num FROM public.{}").format(sql.Identifier(VERSION_TABLE))
    try:
        row = conn.execute(query).fetchone()
    except psycopg.errors.UndefinedTable:
        return None
    return row[0] if row else None


def require_head(url: str) -> None:
    """Raise :class:`gov.SchemaMismatch` unless the database is at :func:`code_head`."""
    check_head(database_revision(url))


def check_head(have: str | None) -> None:
    """Raise :class:`gov.SchemaMismatch` unless ``have`` (a database's revision) is :func:`code_head`."""
    from gov.errors import SchemaMismatch

    want = code_head()
    if have != want:
        raise SchemaMismatch(
            f"database schema is at revision {have or '(none: gov is not installed)'}, this gov needs {want}: "
            "run `gov db upgrade` (or run the gov version that matches the database)"
        )
