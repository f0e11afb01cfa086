"""Shared fixtures: a real PostgreSQL per run, a fresh database per test."""


from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from gov import Governor
from gov.testing.postgres import TemplateDatabases, server_url

pytest_plugins = ["gov.testing.pytest_plugin"]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    with server_url() as url:
        yield url


@pytest.fixture(scope="session")
def databases(pg_server: str) -> Iterator[TemplateDatabases]:
    dbs = TemplateDatabases(pg_server)
    yield dbs
    dbs.close()


@pytest.fixture
def db_url(databases: TemplateDatabases) -> Iterator[str]:
    """A committed database of its own, migrated, with the default policy."""
    url = databases.clone()
    yield url
    databases.drop(url)


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test's database, for setup and assertions."""
    with psycopg.connect(db_url, autocommit=True) as c:
        yield c


@pytest.fixture
def governor(db_url: str) -> Iterator[Governor]:
    with Governor(db_url) as g:
        yield g
