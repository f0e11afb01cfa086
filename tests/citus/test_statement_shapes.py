"""A decision on a worker runs no statement through Citus; its Citus path only the user's shard's.

Citus plans every statement that names one of its tables in its own planner. For a
fast-path statement on the user's shard (one table, the user id as key) the shard query is
planned once and cached (with gov's Citus build, tests/citus/test_plan_cache.py); for a
statement on a reference table, with a sublink, or an INSERT … SELECT, it is deparsed,
parsed and planned again on every call. So the decision reads the policy (reference
tables) through gov.policy_tier, policy_caps, policy_rules and policy_spend, which
gov.distribute_v1 binds to the tables' local copies, plain tables to PostgreSQL; runs a
probe only when its condition can hold; and inserts send rows one VALUES at a time.

Citus's own counter of single-shard executions, read on the worker that holds the user,
counts the statements that still pass through Citus. On that worker gov.decide_core runs
the copy of the decision over the user's own shard tables by name
(gov.bind_shard_decisions): none. Citus's path (gov.decide_core_citus: the coordinator in an
app's transaction, a role that does not own the tables) makes the plain decision's ten, all
fast-path statements on the user's shard (below). Before this shape the same decision
made fourteen, four of them policy reads planned per call.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg

from gov import Governor, Message
from tests.citus.test_any_node import at_port
from tests.citus.test_cluster import _users_on, _workers

# A fresh user's allowed P2 (the default policy: P2's own windows and P1's budget):
# gov.users insert and row lock (gov.cluster_user_lock), the repeat check on gov.messages,
# the user's segment and zone, their own caps, one gov.sends count per budget (2), one
# gov.sends insert per budget (2), the gov.messages insert.
PLAIN_ALLOWED = 10
# with a topic: the user's opt-out probe on gov.user_topic_optouts, one more
WITH_TOPIC = PLAIN_ALLOWED + 1


def _executions(worker: psycopg.Connection[Any]) -> tuple[int, int]:
    row = worker.execute(
        "SELECT query_execution_single_shard, query_execution_multi_shard FROM citus_stat_counters"
        " WHERE name = current_database()").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _per_decision(db_url: str, port: int, users: list[str], topic: str | None, *, citus_path: bool = False) -> float:
    """Citus's single-shard executions per decision, on the worker ``port`` that holds ``users``:
    through gov.decide_v1 (the dispatcher), or Citus's path called as it is."""
    with psycopg.connect(at_port(db_url, port), autocommit=True) as worker:
        worker.execute("SET citus.enable_stat_counters = on")
        g = Governor(worker)

        def decide(user: str, message: str) -> bool:
            if not citus_path:
                return g.decide(Message(user_id=user, id=message, tier="P2", topic=topic)).allowed
            row = worker.execute("SELECT allowed FROM gov.decide_core_citus(%s, %s, 'P2', %s, NULL, NULL, false)",
                                 (user, message, topic)).fetchone()
            return bool(row and row[0])

        decide(users[0], "warm")  # the session's first plans
        before = _executions(worker)
        for u in users[1:]:
            assert decide(u, "m1")
        after = _executions(worker)
    assert after[1] == before[1], "a decision ran a statement over several shards"
    return (after[0] - before[0]) / (len(users) - 1)


def test_the_policy_reads_are_bound_to_the_local_copies(conn: psycopg.Connection[Any]) -> None:
    rows = conn.execute(
        "SELECT p.proname, l.lanname, p.prosrc FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang"
        " WHERE p.pronamespace = 'gov'::regnamespace AND p.proname LIKE 'policy\\_%' ORDER BY 1").fetchall()
    assert [r[0] for r in rows] == ["policy_caps", "policy_rules", "policy_spend", "policy_tier"]
    for name, language, source in rows:
        assert language == "sql", name
        (table,) = [w for w in source.split() if w.startswith("gov.")]
        # a shard's table: no Citus table of that name, but a relation PostgreSQL reads as it is
        (citus,) = conn.execute("SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = to_regclass(%s)",
                                (table,)).fetchone() or (None,)
        assert citus == 0 and conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() != (None,), (name, table)


def test_a_decision_on_the_users_worker_runs_no_statement_through_citus(db_url: str,
                                                                       conn: psycopg.Connection[Any]) -> None:
    for port, topic in zip(_workers(conn), (None, "news"), strict=True):
        users = _users_on(conn, port, f"bound-{topic}-", 21)
        assert _per_decision(db_url, port, users, topic) == 0, topic


def test_every_shard_has_its_decision_over_its_own_tables(db_url: str, conn: psycopg.Connection[Any]) -> None:
    """One copy per shard of gov.users on every node, naming that shard's colocated tables and
    no Citus table (but in a %ROWTYPE, a type); the dispatcher names every copy."""
    shards = conn.execute("SELECT s.shardid, s.shardminvalue FROM pg_dist_shard s"
                          " WHERE s.logicalrelid = 'gov.users'::regclass ORDER BY 1").fetchall()
    tables = [t for (t,) in conn.execute("SELECT logicalrelid::regclass::text FROM pg_dist_partition"
                                         " WHERE logicalrelid::regclass::text LIKE 'gov.%'").fetchall()]
    assert "gov.messages" in tables and "gov.sends" in tables
    for port in _workers(conn):
        with psycopg.connect(at_port(db_url, port), autocommit=True) as worker:
            copies: dict[str, str] = dict(worker.execute(
                "SELECT proname, prosrc FROM pg_proc WHERE pronamespace = 'gov'::regnamespace"
                " AND proname ~ '^decide_core_[0-9]+$'").fetchall())
            assert sorted(copies) == sorted(f"decide_core_{shard}" for shard, _ in shards)
            (dispatcher,) = worker.execute("SELECT prosrc FROM pg_proc WHERE oid = 'gov.decide_core(text,text,text,"
                                           "text,text,timestamptz,boolean)'::regprocedure").fetchone() or ("",)
            for shard, minvalue in shards:
                source = copies[f"decide_core_{shard}"]
                assert f"gov.decide_core_{shard}(" in dispatcher
                (messages,) = worker.execute(
                    "SELECT shard_name('gov.messages', s.shardid) FROM pg_dist_shard s"
                    " WHERE s.logicalrelid = 'gov.messages'::regclass AND s.shardminvalue = %s",
                    (minvalue,)).fetchone() or ("",)
                assert f"{messages} " in source
                for table in tables:
                    assert not re.search(re.escape(table) + r"(?!_|%ROWTYPE)", source), (shard, table)


def test_a_plain_decision_runs_only_its_shards_statements_through_citus(db_url: str,
                                                                       conn: psycopg.Connection[Any]) -> None:
    port = _workers(conn)[0]
    users = _users_on(conn, port, "shape", 21)
    assert _per_decision(db_url, port, users, None, citus_path=True) == PLAIN_ALLOWED


def test_a_decision_with_a_topic_adds_only_its_opt_out_probe(db_url: str, conn: psycopg.Connection[Any]) -> None:
    port = _workers(conn)[-1]
    users = _users_on(conn, port, "topical", 21)
    assert _per_decision(db_url, port, users, "news", citus_path=True) == WITH_TOPIC


def test_a_role_that_does_not_own_the_tables_decides_through_citus_s_path(
        db_url: str, conn: psycopg.Connection[Any]) -> None:
    """Citus grants its metadata lock to the tables' owner only: an app role with the rights
    to read and write gov's tables (not their owner) decides through Citus's path, exactly."""
    role = "gov_shape_app"
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(f"DROP ROLE IF EXISTS {role}")
        admin.execute(f"CREATE ROLE {role} LOGIN")
        try:
            admin.execute(f"GRANT USAGE ON SCHEMA gov TO {role}")
            admin.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA gov TO {role}")
            admin.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA gov TO {role}")
            for port in _workers(conn):
                users = _users_on(conn, port, f"app-{port}-", 3)
                url = at_port(db_url, port).replace("postgres@", f"{role}@", 1)
                with psycopg.connect(url, autocommit=True) as app:
                    g = Governor(app)
                    for user in users:  # P2's 2 a day: the third is suppressed, wherever it is decided
                        assert [g.decide(Message(user_id=user, id=f"m{i}", tier="P2")).allowed
                                for i in range(3)] == [True, True, False], (port, user)
                    (single,) = app.execute(
                        "SELECT count(*) FROM gov.sends WHERE user_id = ANY(%s)", (users,)).fetchone() or (0,)
                    assert single == 2 * 2 * len(users)  # P2's and P1's budgets, two allowed each
        finally:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")
