"""The ``citus`` tier: gov on a three-node Citus cluster.

The cluster is the one $GOV_TEST_CITUS_URL names (a coordinator's database, disposable:
every test empties gov's tables in it), or one the harness starts from the installed
extension (gov.testing.citus) and stops after the run. Without either the tier is
skipped, saying why. Run it with ``python -m pytest -m citus`` (the default run leaves
it out: it starts three servers).

Here ``db_url`` is the coordinator's database, emptied and given the default policy
again, so tests written for one server (and their fixtures) run on the cluster as they are.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from gov import migrate
from gov import policy as policy_mod
from gov.testing.citus import citus_cluster, citus_missing

HERE = os.path.dirname(__file__)

PER_USER_TABLES = (
    "gov.push_events, gov.delivery_attempts, gov.outbox, gov.message_content, gov.subscriptions, "
    "gov.deferred, gov.push_suppressions, gov.sends, gov.messages, gov.user_topic_optouts, gov.user_caps, "
    "gov.users"
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if str(item.fspath).startswith(HERE):
            item.add_marker(pytest.mark.citus)


@pytest.fixture(scope="session")
def citus_server() -> Iterator[str]:
    configured = os.environ.get("GOV_TEST_CITUS_URL")
    if configured:
        yield configured
        return
    reason = citus_missing()
    if reason:
        pytest.skip(f"no Citus cluster: {reason}; or give one in GOV_TEST_CITUS_URL")
    with citus_cluster() as url:
        yield url


@pytest.fixture(scope="session")
def citus_db(citus_server: str) -> str:
    """The coordinator's database, migrated and distributed by `gov db upgrade`'s own path."""
    migrate.upgrade(citus_server)
    return citus_server


@pytest.fixture
def db_url(citus_db: str) -> Iterator[str]:
    with psycopg.connect(citus_db, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {PER_USER_TABLES}")
        with conn.transaction():
            policy_mod.apply(conn, policy_mod.default_policy(), policy_mod.default_policy_text())
    yield citus_db


def worker_of(conn: psycopg.Connection[Any], user_id: str) -> int:
    """The port of the worker that holds ``user_id``'s shard."""
    row = conn.execute(
        "SELECT nodeport FROM citus_shards WHERE table_name = 'gov.users'::regclass"
        " AND shardid = get_shard_id_for_distribution_column('gov.users', %s::text)",
        (user_id,),
    ).fetchone()
    assert row is not None
    return int(row[0])
