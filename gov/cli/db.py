"""`gov db`: schema migrations, the embedded server, the analysts' role."""

from __future__ import annotations

import sys
from typing import Any

import click

from gov.cli.common import dsn, url_option
from gov.errors import GovError


@click.group("db")
def db() -> None:
    """Schema migrations and the embedded server."""


@db.command("upgrade")
@url_option
def db_upgrade(database_url: str | None) -> None:
    """Migrate the database to the newest schema (and apply the default policy if none).

    On a Citus coordinator, also distribute the schema by user (docs/scale-out.md).
    """
    from gov import migrate
    from gov.db import resolve_url, translate_errors

    with translate_errors():
        distributed = migrate.upgrade(resolve_url(database_url))
    for line in distributed:
        click.echo(f"gov: {line}", err=True)
    click.echo(f"gov: schema at {migrate.head()}", err=True)


@db.command("check")
@url_option
def db_check(database_url: str | None) -> None:
    """Exit non-zero while migrations are pending."""
    from gov import migrate
    from gov.db import resolve_url, translate_errors

    with translate_errors():
        todo = migrate.pending(resolve_url(database_url))
    if todo:
        click.echo(f"gov: {len(todo)} migration(s) pending: {', '.join(todo)}; run `gov db upgrade`", err=True)
        sys.exit(1)
    click.echo(f"gov: schema at {migrate.head()}, nothing pending", err=True)


@db.command("stop")
def db_stop() -> None:
    """Stop the embedded PostgreSQL under $GOV_DATA_DIR, if it runs."""
    from gov.db import stop_embedded

    click.echo("gov: embedded server stopped" if stop_embedded() else "gov: no embedded server running", err=True)



def grant_analyst_role(conn: Any, role: str) -> bool:
    """Give ``role`` read-only access for analysts; create it (NOLOGIN) if missing.

    Returns True when the role was created. Grants USAGE on schema gov and SELECT on the
    analysts' tables and views, and on gov.subscriptions only the columns id, user_id,
    created_at, retired_at, retired_reason (the endpoint is a capability URL, p256dh and
    auth are keys). Grants nothing else and revokes nothing; run it again after an
    upgrade that adds views. Runs in ``conn``'s transaction.
    """
    from psycopg import sql

    from gov.db import translate_errors
    from gov.queries import q

    if not isinstance(role, str) or not role or len(role) > 63 or "\x00" in role:
        raise GovError(f"invalid role name {role!r} (1 to 63 characters)")
    ident = sql.Identifier(role)
    with translate_errors(), conn.transaction():
        row = conn.execute(q("role_exists"), {"role": role}).fetchone()
        created = not (row and row[0])
        if created:
            conn.execute(sql.SQL(q("create_analyst_role")).format(role=ident))
        for name in ("grant_analyst_schema", "grant_analyst_select", "grant_analyst_subscription_columns"):
            conn.execute(sql.SQL(q(name)).format(role=ident))
    return created


@db.command("grant-analyst")
@click.argument("role")
@url_option
def grant_analyst(role: str, database_url: str | None) -> None:
    """Give ROLE read-only access to the analysts' tables and views (created NOLOGIN if missing).

    Log in as a member of it: GRANT ROLE TO alice; never as ROLE itself unless you give it LOGIN.
    """
    import psycopg

    from gov.db import translate_errors

    with translate_errors(), psycopg.connect(dsn(database_url)) as conn:
        created = grant_analyst_role(conn, role)
    click.echo(f"gov: role {role} {'created (NOLOGIN) and ' if created else ''}granted read-only analyst access",
               err=True)
