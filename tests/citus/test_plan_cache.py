"""A decision on a worker reuses its statements' cached plans instead of planning them per call.

Inside the decision function every fast-path statement on a distributed table has its
shard query planned once and kept in Citus's local plan cache. Citus 13.2.1 and 13.2.2
refuse that cache for exactly these plans (citus#8783): each call plans every such
statement again and appends the plan to a list that never shrinks, so the backend's
memory grows with every decision. gov builds Citus with the upstream fix
(bin/build-citus, bin/citus-patches/); on a stock 13.2.2 this test is skipped, saying so.

The measure is the backend's own memory (pg_backend_memory_contexts), read in the session
that made the decisions: a re-planned statement leaves its plan behind, a cached one does
not, so growth per decision names the per-call planning without timing anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from gov import Governor, Message
from gov.testing.citus import LIB
from tests.citus.test_any_node import at_port
from tests.citus.test_cluster import _workers, worker_of

WARM = 200  # past Citus's own first executions (custom plans, then the cache is filled)
MEASURED = 1500
# a decision that planned its ~7 fast-path statements per call leaves tens of kB each call
# (about 50 MB over MEASURED); cached plans leave the backend flat but for catalog caches
MAX_GROWTH_BYTES = 2 * 1024 * 1024


def _patched() -> bool:
    marker = LIB / "citus.gov-patches"
    return marker.exists() and "local-plan-cache-8824.patch" in marker.read_text()


def _backend_bytes(c: psycopg.Connection[Any]) -> int:
    (total,) = c.execute("SELECT sum(total_bytes)::bigint FROM pg_backend_memory_contexts").fetchone() or (0,)
    return int(total)


def _same_shard_users(conn: psycopg.Connection[Any], port: int, n: int) -> list[str]:
    """``n`` users of one shard on the worker at ``port``: one cached plan per statement serves them all."""
    (shard,) = conn.execute(
        "SELECT get_shard_id_for_distribution_column('gov.users', 'pc-anchor'::text)").fetchone() or (0,)
    users: list[str] = []
    i = 0
    while len(users) < n:
        i += 1
        (s,) = conn.execute("SELECT get_shard_id_for_distribution_column('gov.users', %s::text)",
                            (f"pc{i}",)).fetchone() or (0,)
        if s == shard:
            users.append(f"pc{i}")
    assert worker_of(conn, users[0]) == port or port == 0
    return users


@pytest.mark.skipif(not _patched(), reason="stock Citus 13.2.2 re-plans cached statements per call "
                    "(citus#8783); build it with gov's fix: bin/build-citus")
def test_decisions_at_the_users_worker_do_not_grow_the_backend(db_url: str, conn: psycopg.Connection[Any]) -> None:
    anchor_port = worker_of(conn, "pc-anchor")
    assert anchor_port in _workers(conn)
    users = _same_shard_users(conn, anchor_port, 40)
    with psycopg.connect(at_port(db_url, anchor_port), autocommit=True) as worker:
        g = Governor(worker)
        n = 0

        def decide(count: int) -> None:
            nonlocal n
            for _ in range(count):
                # P3 (one window of a weekly cap of 1 in the default policy) keeps most calls blocked, and
                # a blocked decision runs the same statements up to the count: both paths are exercised
                g.decide(Message(user_id=users[n % len(users)], id=f"m{n}", tier="P2" if n % 2 else "P3"))
                n += 1

        decide(WARM)
        before = _backend_bytes(worker)
        decide(MEASURED)
        after = _backend_bytes(worker)
    assert after - before <= MAX_GROWTH_BYTES, (
        f"the worker backend grew by {(after - before) / 1024:.0f} kB over {MEASURED} decisions: "
        "its statements are planned again on every call")


def test_the_patch_file_is_where_the_build_reads_it() -> None:
    """bin/build-citus applies every file of bin/citus-patches; the test above names this one."""
    patch = Path(__file__).resolve().parents[2] / "bin" / "citus-patches" / "local-plan-cache-8824.patch"
    text = patch.read_text()
    assert "+++ b/src/backend/distributed/planner/local_plan_cache.c" in text
    assert "taskList) > 1" in text
