"""Shared fixtures: a real PostgreSQL per run, a fresh database per test, a VAPID key
and a strict local push service that checks it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gov import Governor
from gov.delivery.vapid import VapidSigner, generate_keypair
from gov.testing import PushService
from gov.testing.postgres import TemplateDatabases, server_url

pytest_plugins = ["gov.testing.pytest_plugin"]

SUBJECT = "mailto:push-ops@example.com"


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` (pyproject's addopts): the citus tier on a cluster given in
    $GOV_TEST_CITUS_URL runs in one process, since every test there empties the same
    database; the harness's own clusters are one per process. Else xdist's default."""
    marks = config.option.markexpr or ""
    if os.environ.get("GOV_TEST_CITUS_URL") and "citus" in marks.replace("not citus", ""):
        return 0
    return None


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


@pytest.fixture
def key_path(tmp_path: Path) -> Path:
    """A fresh VAPID private key file (mode 0600)."""
    path = tmp_path / "vapid.pem"
    generate_keypair(path)
    return path


@pytest.fixture
def signer(key_path: Path) -> VapidSigner:
    return VapidSigner.from_env({"GOV_VAPID_PRIVATE_KEY": str(key_path), "GOV_VAPID_SUBJECT": SUBJECT})


@pytest.fixture
def push(signer: VapidSigner) -> Iterator[PushService]:
    """A push service that verifies this test's VAPID key and decrypts every payload."""
    with PushService(expected_public_key=signer.public_key, hang_s=2.0) as service:
        yield service
