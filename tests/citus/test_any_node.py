"""No single router: a client may enter the cluster at any node (Citus keeps the metadata
on every worker), by a worker's URL or a multi-host URL, and its decisions are delegated to
the user's worker and stay exact."""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from gov import Governor, Message
from gov.schema_version import require_head
from tests.citus.test_cluster import _users_on, _workers

RACERS = 20
ROUNDS = 20


def at_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.username}@{parts.hostname}:{port}"))


def race(conns: list[psycopg.Connection[Any]], user: str) -> int:
    barrier = threading.Barrier(len(conns))
    allowed: list[bool] = []
    lock = threading.Lock()

    def racer(i: int, c: psycopg.Connection[Any]) -> None:
        barrier.wait()
        verdict = Governor(c).decide(Message(user_id=user, id=f"m{i}", tier="P2"))
        with lock:
            allowed.append(verdict.allowed)

    threads = [threading.Thread(target=racer, args=(i, c)) for i, c in enumerate(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(allowed) == len(conns)
    return allowed.count(True)


def test_decisions_sent_through_a_worker_are_delegated_and_exact(db_url: str, conn: psycopg.Connection[Any]) -> None:
    first, second = _workers(conn)
    entry = at_port(db_url, first)
    require_head(entry)  # the schema revision is readable on a worker (a reference table)

    def executions(c: psycopg.Connection[Any], users: list[str]) -> tuple[int, int]:
        c.execute("SELECT citus_stat_counters_reset(0)")
        g = Governor(c)
        for user in users:
            assert g.decide(Message(user_id=user, id="m1", tier="P2")).allowed
        ((single, multi),) = c.execute(
            "SELECT query_execution_single_shard, query_execution_multi_shard FROM citus_stat_counters"
            " WHERE name = current_database()").fetchall()
        return single, multi

    with psycopg.connect(entry, autocommit=True) as c:
        c.execute("SET citus.enable_stat_counters = on")
        # a user of the other worker: the call is delegated there whole, one execution
        single, multi = executions(c, _users_on(conn, second, "through-w1-", 10))
        assert multi == 0 and 10 <= single <= 11, (single, multi)
        # a user of this worker: Citus runs the call here ("not pushing down function to
        # the same node"), and the decision reads the local shards by name
        # (gov.bind_shard_decisions): no statement through Citus, none on another node
        single, multi = executions(c, _users_on(conn, first, "at-w1-", 10))
        assert (single, multi) == (0, 0), (single, multi)
    conns = [psycopg.connect(entry, autocommit=True) for _ in range(RACERS)]
    try:
        users = _users_on(conn, second, "wrace-", ROUNDS // 2) + _users_on(conn, first, "wrace-here-", ROUNDS // 2)
        assert [race(conns, user) for user in users] == [2] * ROUNDS
    finally:
        for c in conns:
            c.close()


def test_a_multi_host_url_spreads_connections_over_every_node_and_stays_exact(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    parts = urlsplit(db_url)
    ports = [parts.port, *_workers(conn)]
    hosts = ",".join(f"{parts.hostname}:{p}" for p in ports)
    multi = urlunsplit(parts._replace(netloc=f"{parts.username}@{hosts}", query="load_balance_hosts=random"))
    conns = [psycopg.connect(multi, autocommit=True) for _ in range(RACERS)]
    try:
        landed = {c.execute("SELECT inet_server_port()").fetchone()[0] for c in conns}  # type: ignore[index]
        assert len(landed) >= 2, landed  # libpq picks a node at random per connection
        assert [race(conns, f"multi-{i}") for i in range(ROUNDS)] == [2] * ROUNDS
    finally:
        for c in conns:
            c.close()
    with Governor(multi, pool_size=4) as governor:  # and gov's own pool takes such a URL as it is
        assert [governor.decide(Message(user_id="pooled", id=f"p{i}", tier="P2")).allowed for i in range(3)] == [
            True, True, False]


@pytest.mark.parametrize("revision", ["0023_plain_rules"])
def test_an_upgrade_of_a_distributed_cluster_keeps_working(citus_db: str, revision: str) -> None:
    """gov db upgrade on a cluster already distributed: down one revision and up again, the
    schema revision (a reference table now) updated through the coordinator."""
    from gov import migrate

    migrate.downgrade(citus_db, revision)
    assert migrate.current(citus_db) == revision
    migrate.upgrade(citus_db)
    assert migrate.current(citus_db) == migrate.head()


def test_a_shard_left_behind_on_another_node_is_never_read(db_url: str, conn: psycopg.Connection[Any]) -> None:
    """A moved shard's old table stays on its old node until Citus drops it: a claim there
    must refuse, not read it. Here such a table is made by hand on the worker that does not
    hold the shard; gov.shard_relation finds the name there and still refuses."""
    first, second = _workers(conn)
    key = _users_on(conn, first, "left-", 1)[0]
    (shard,) = conn.execute("SELECT shard_name('gov.outbox', get_shard_id_for_distribution_column("
                            "'gov.outbox', %s::text))", (key,)).fetchone()  # type: ignore[misc]
    with psycopg.connect(at_port(db_url, first), autocommit=True) as holder:
        assert holder.execute("SELECT gov.shard_relation('gov.outbox', %s)", (key,)).fetchone() == (shard,)
    with psycopg.connect(at_port(db_url, second), autocommit=True) as other:
        other.execute("SET citus.enable_ddl_propagation = off")
        other.execute(f"CREATE TABLE {shard} (LIKE gov.outbox)")  # the name only: no placement here
        try:
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="is not on this node"):
                other.execute("SELECT gov.shard_relation('gov.outbox', %s)", (key,))
        finally:
            other.execute(f"DROP TABLE {shard}")
