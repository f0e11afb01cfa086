"""gov on a three-node Citus cluster: the schema distributes, a decision runs whole on the
worker that holds its user, and the queues drain exactly once across shards."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gov import Governor, Message, PolicyError
from gov import policy as policy_mod
from gov.hold.release import Releaser
from gov.testing import Clock, PushService
from gov.users import set_user_cap
from tests.acceptance.test_cli import test_seed_verification_from_the_shell  # noqa: F401  (run here too)
from tests.acceptance.test_serve import server, test_seed_verification_over_http  # noqa: F401
from tests.citus.conftest import worker_of
from tests.integration.test_decide import RACERS, ROUNDS, race_once
from tests.integration.test_delivery import _deliveries, _fill_outbox, _runner, states

REFERENCE = {"gov.tiers", "gov.tier_consumes", "gov.caps", "gov.settings", "gov.segment_caps", "gov.compiled_rules",
             "gov.policy_versions", "gov.timing_curves",
             "gov_alembic_version"}  # the schema revision: readable on every node
DISTRIBUTED = {
    "gov.users", "gov.user_caps", "gov.user_topic_optouts", "gov.messages", "gov.sends", "gov.push_suppressions",
    "gov.deferred", "gov.subscriptions", "gov.message_content", "gov.outbox", "gov.delivery_attempts",
    "gov.push_events", "gov.release_minutes",
}


def _workers(conn: psycopg.Connection[Any]) -> list[int]:
    return [int(p) for (p,) in conn.execute("SELECT nodeport FROM pg_dist_node WHERE groupid <> 0 ORDER BY 1")]


def _users_on(conn: psycopg.Connection[Any], port: int, prefix: str, n: int) -> list[str]:
    """``n`` user ids whose shard lives on the worker at ``port``."""
    users: list[str] = []
    i = 0
    while len(users) < n:
        i += 1
        if worker_of(conn, f"{prefix}{i}") == port:
            users.append(f"{prefix}{i}")
    return users


def test_the_schema_is_distributed_by_user(conn: psycopg.Connection[Any]) -> None:
    kinds = dict(conn.execute("SELECT table_name::text, citus_table_type FROM citus_tables").fetchall())
    assert {t for t, k in kinds.items() if k == "reference"} == REFERENCE  # a copy on every node
    assert {t for t, k in kinds.items() if k == "distributed"} == DISTRIBUTED
    assert len(kinds) == len(REFERENCE) + len(DISTRIBUTED)  # no "local" table left on the coordinator alone
    # one colocation group: a user's rows of every table are in one shard group, on one worker
    groups = conn.execute(
        "SELECT count(DISTINCT colocationid) FROM pg_dist_partition WHERE partmethod = 'h'"
    ).fetchone()
    assert groups == (1,)
    delegated = dict(conn.execute(
        "SELECT p.proname, o.distribution_argument_index FROM pg_dist_object o JOIN pg_proc p ON p.oid = o.objid"
        " WHERE o.classid = 'pg_proc'::regclass AND o.distribution_argument_index IS NOT NULL"
    ).fetchall())
    assert delegated == {"decide_v1": 0, "send_v1": 0, "claim_outbox_v3": 0, "release_due_v2": 0,
                         "decide_many_v2": 0, "send_many_v2": 0, "send_many_best_v1": 0, "send_batch_v1": 0}


def test_a_decision_is_pushed_down_whole_to_its_users_worker(conn: psycopg.Connection[Any]) -> None:
    """EXPLAIN on the coordinator: one task, the whole call, on the worker that holds the user."""
    for port in _workers(conn):
        (user,) = _users_on(conn, port, "explain-", 1)
        plan = "\n".join(r for (r,) in conn.execute(
            "EXPLAIN (VERBOSE) SELECT allowed FROM gov.decide_v1(%s::text, 'm1', 'P2', NULL, NULL, NULL)",
            (user,),
        ))
        assert "Task Count: 1" in plan, plan
        assert f"port={port}" in plan, plan
        assert "FROM gov.decide_v1(" in plan.split("Query:", 1)[1], plan  # the call itself, not its statements


def test_single_shard_counters_see_every_decision_as_one_shard(db_url: str) -> None:
    """Citus's own statistics: decisions of users on both workers run as single-shard queries."""
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute("SET citus.enable_stat_counters = on")
        c.execute("SELECT citus_stat_counters_reset(0)")
        g = Governor(c)
        for i in range(40):
            g.decide(Message(user_id=f"counted-{i}", id="m1", tier="P2"))
        ((single, multi),) = c.execute(
            "SELECT query_execution_single_shard, query_execution_multi_shard FROM citus_stat_counters"
            " WHERE name = current_database()"
        ).fetchall()
    # one execution per decision: the call itself went to the worker (run from the
    # coordinator, each of the decision's own statements would count as one)
    assert multi == 0 and 40 <= single <= 41, (single, multi)


def test_twenty_way_race_is_exact_for_users_on_each_worker(db_url: str, conn: psycopg.Connection[Any]) -> None:
    conns = [psycopg.connect(db_url, autocommit=True) for _ in range(RACERS)]
    try:
        for port in _workers(conn):
            for round_no, user in enumerate(_users_on(conn, port, f"race-{port}-", ROUNDS)):
                results = race_once(conns, user)
                assert len(results) == RACERS
                assert results.count(True) == 2, f"worker {port} round {round_no}: {results.count(True)} allowed"
                assert conn.execute("SELECT count(*) FROM gov.sends WHERE user_id = %s AND budget = 'P2'",
                                    (user,)).fetchone() == (2,)
                assert conn.execute("SELECT count(*) FROM gov.push_suppressions WHERE user_id = %s",
                                    (user,)).fetchone() == (RACERS - 2,)
    finally:
        for c in conns:
            c.close()


def test_a_race_of_delegated_decisions_and_decisions_in_the_apps_transaction_is_exact(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """Half the racers call gov on its own (Citus delegates the call to the user's worker),
    half inside a transaction of their own (the call then runs on the coordinator): the
    user's lock must be one lock wherever the decision runs."""
    delegated = [psycopg.connect(db_url, autocommit=True) for _ in range(RACERS // 2)]
    in_transaction = [psycopg.connect(db_url) for _ in range(RACERS // 2)]
    try:
        for port in _workers(conn):
            for round_no, user in enumerate(_users_on(conn, port, f"mixed-{port}-", ROUNDS // 2)):
                barrier = threading.Barrier(RACERS)
                results: list[bool] = []
                lock = threading.Lock()

                def racer(i: int, c: psycopg.Connection[Any], user: str = user, barrier: Any = barrier,
                          results: list[bool] = results, lock: threading.Lock = lock) -> None:
                    barrier.wait()
                    if c.autocommit:
                        verdict = Governor(c).decide(Message(user_id=user, id=f"m{i}", tier="P2"))
                    else:
                        with c.transaction():  # the app's own transaction: not delegated
                            verdict = Governor(c).decide(Message(user_id=user, id=f"m{i}", tier="P2"))
                    with lock:
                        results.append(verdict.allowed)

                threads = [threading.Thread(target=racer, args=(i, c))
                           for i, c in enumerate(delegated + in_transaction)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(timeout=60)
                assert len(results) == RACERS
                assert results.count(True) == 2, f"worker {port} round {round_no}: {results.count(True)} allowed"
                assert conn.execute("SELECT count(*) FROM gov.sends WHERE user_id = %s AND budget = 'P2'",
                                    (user,)).fetchone() == (2,)
    finally:
        for c in delegated + in_transaction:
            c.close()


def test_four_releasers_release_2000_held_messages_once(db_url: str, conn: psycopg.Connection[Any]) -> None:
    clock = Clock(datetime(2026, 6, 10, 9, 0, tzinfo=UTC))
    text = policy_mod.default_policy_text().replace('windows = [{ window = "24h", cap = 6 }]',
                                                    'windows = [{ window = "1h", cap = 1 }]')
    with conn.transaction():
        policy_mod.apply(conn, policy_mod.parse_policy(text), text)
    n = 2000
    conn.execute("INSERT INTO gov.sends (user_id, budget, sent_at, message_id)"
                 " SELECT 'u' || i, 'P1', %s, 'seed' FROM generate_series(1, %s) i", (clock.now, n))
    conn.execute("INSERT INTO gov.subscriptions (user_id, endpoint, p256dh, auth)"
                 " SELECT 'u' || i, 'https://push.example/' || i, 'k', 'a' FROM generate_series(1, %s) i", (n,))
    with Governor(db_url, clock=clock) as g:
        users = [f"u{i}" for i in range(1, n + 1)]
        held = g.send_many(Message(user_id="template", id="m", tier="P1", title="t"), users)
        assert Counter(r.decision.action for _, r in held) == {"defer": n}
    clock.now += timedelta(hours=2)
    barrier = threading.Barrier(4)
    results: list[dict[str, int]] = []

    def run() -> None:
        r = Releaser(db_url, batch=50, clock=clock)
        barrier.wait()
        results.append(dict(r.run_once().outcomes))
        r.source.close()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert sum(r.get("released", 0) for r in results) == n, results
    assert sum(1 for r in results if r.get("released")) >= 2, f"one releaser did everything: {results}"
    assert conn.execute("SELECT count(*), count(DISTINCT user_id) FROM gov.outbox").fetchone() == (n, n)
    assert conn.execute("SELECT state, count(*) FROM gov.deferred GROUP BY state").fetchall() == [("released", n)]


def test_four_runners_deliver_2000_rows_once(
    db_url: str, push: PushService, key_path: Path, conn: psycopg.Connection[Any]
) -> None:
    endpoints = _fill_outbox(db_url, push, 2000)
    runners = [_runner(db_url, key_path, "--once", "--processes", "1", "--workers", "4") for _ in range(4)]
    for r in runners:
        _out, err = r.communicate(timeout=600)
        assert r.returncode == 0, err
    delivered = _deliveries(push)
    assert set(delivered) == set(endpoints)
    assert max(delivered.values()) == 1, "a row was delivered twice"
    assert states(conn) == {"delivered": 2000}
    workers = conn.execute("SELECT count(DISTINCT worker) FROM gov.delivery_attempts").fetchone()
    assert workers is not None and workers[0] >= 2, "the runners did not share the work"


def test_a_campaign_is_decided_per_worker_like_single_decisions(db_url: str, conn: psycopg.Connection[Any]) -> None:
    users = [f"c{i}" for i in range(300)]
    conn.execute("INSERT INTO gov.sends (user_id, budget, sent_at, message_id)"
                 " SELECT 'c' || i, 'P2', now(), 'earlier-' || j FROM generate_series(0, 299, 3) i,"
                 " generate_series(1, 2) j")  # every third user has spent today's two P2
    with Governor(db_url) as g:
        verdicts = dict(g.decide_many(Message(user_id="template", id="promo", tier="P2"), users + users[:10]))
    assert len(verdicts) == 300
    assert {u for u, v in verdicts.items() if not v.allowed} == {f"c{i}" for i in range(0, 300, 3)}
    # a slice that is not one shard's users is refused, not decided on the wrong node
    ports = _workers(conn)
    mixed = [_users_on(conn, ports[0], "mix-", 1)[0], _users_on(conn, ports[1], "mix-", 1)[0]]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="another shard"):
        conn.execute("SELECT * FROM gov.decide_many_v2(%s, %s, 'x', 'P2')", (mixed[0], mixed))
    # (a claim without a shard key is refused too, but Citus 13.2 crashes on a NULL
    # distribution argument before the function can say so: docs/scale-out.md, Limits)


def test_a_users_own_cap_lowers_and_never_raises_on_the_cluster(db_url: str, conn: psycopg.Connection[Any]) -> None:
    """The user-cap trigger and the decision read the policy on the worker, inside the shard's
    own statement: a lower cap holds, a higher one is refused, on users of both workers."""
    for port in _workers(conn):
        (user,) = _users_on(conn, port, "capped-", 1)
        set_user_cap(conn, user, "P2", 86_400_000, 1)
        with pytest.raises(PolicyError, match="may only lower"):
            set_user_cap(conn, user, "P2", 86_400_000, 9)
        with Governor(db_url) as g:
            first, second = (g.decide(Message(user_id=user, id=f"m{i}", tier="P2")) for i in (1, 2))
        assert first.allowed and (second.allowed, second.reason) == (False, "cap_86400000ms")


def test_one_drain_sends_a_cluster_s_due_rows_together_and_each_once(
    db_url: str, push: PushService, signer: Any, conn: psycopg.Connection[Any]
) -> None:
    """An outside probe: endpoints that never answer, one user on each of eight shards.
    A batch held one shard's rows: the shards were sent one after another, each waiting
    out its timeout, and the drain outlasted the first backoffs and sent every row again
    (six requests an endpoint in one `--once`, 97 s, where one server sent one in 2.4 s).
    A batch now gathers the due rows of every shard, as one server's."""
    from gov.delivery.runner import Dispatcher

    users: dict[int, str] = {}
    for i in range(400):
        (shard,) = conn.execute("SELECT get_shard_id_for_distribution_column('gov.users', %s::text)",
                                (f"h{i}",)).fetchone()  # type: ignore[misc]
        users.setdefault(shard, f"h{i}")
        if len(users) == 8:
            break
    browsers = []
    with Governor(db_url, allow_loopback_http=True) as governor:
        for user in users.values():
            browser = push.subscribe(user)
            push.script(browser, ["hang"])
            governor.subscribe(user, browser.info)
            governor.send(Message(user_id=user, id="m", tier="P1", title="t"), deliver=False)
            browsers.append(browser)
    with Dispatcher(db_url, signer, workers=8, timeout_s=1.0, lease_s=30.0, allow_loopback_http=True) as runner:
        runner.run_once()
    # one attempt a row (the push service may not have read a request cut off by the timeout)
    assert conn.execute("SELECT array_agg(DISTINCT attempts) FROM gov.outbox").fetchone() == ([1],)
    per_row = conn.execute("SELECT count(*) FROM gov.delivery_attempts GROUP BY outbox_id").fetchall()
    assert per_row == [(1,)] * 8
    assert max(len(push.requests_for(b)) for b in browsers) <= 1
