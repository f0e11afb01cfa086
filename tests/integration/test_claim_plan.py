"""A runner's claim is planned once per session on one server, not again on every call.

The claim (gov.claim_outbox_v3 → gov.claim_local) runs a five-table statement whose plan
cost 2.5 ms to make and 0.8 ms to run; planned on 3,156 of its 3,786 calls, it was the
largest planning cost of the default ``gov simulate`` (docs/performance.md, stop 41).

The measure is PostgreSQL's own: with ``debug_print_plan`` every plan the server makes is
sent to the client as a log message, so the plans of the claim's statement (the one with
the CTE ``due``) are counted without timing anything.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from gov import Governor, Message
from gov.testing import PushService

T0 = datetime(2026, 6, 10, 9, 0, tzinfo=UTC)
CALLS = 30
CLAIM = "SELECT outbox_id FROM gov.claim_outbox_v3(NULL, %s, %s, 30000, %s, %s)"


def _claim_plans(c: psycopg.Connection[Any], calls: list[tuple[Any, ...]]) -> int:
    """How many times the claim's statement was planned over ``calls`` (parameters of CLAIM)."""
    details: list[str] = []
    c.add_notice_handler(lambda d: details.append(d.message_detail or ""))
    c.execute("SET debug_print_plan = on")
    c.execute("SET client_min_messages = log")
    for params in calls:
        c.execute(CLAIM, params).fetchall()
    c.execute("RESET client_min_messages")
    c.execute("RESET debug_print_plan")
    return sum(":ctename due" in d for d in details)


def test_a_runner_plans_its_claim_once_per_session_not_per_call(db_url: str, push: PushService) -> None:
    with Governor(db_url, allow_loopback_http=True, pool_size=1) as governor:
        for i in range(CALLS):
            governor.subscribe(f"u{i:02d}", push.subscribe().info)
            governor.send(Message(user_id=f"u{i:02d}", id="m", tier="P0", title="t"), at=T0, deliver=False)
        (ids,) = governor.source.execute("SELECT array_agg(id ORDER BY id) FROM gov.outbox", {})[0]
    assert len(ids) == CALLS
    with psycopg.connect(db_url, autocommit=True) as c:
        # a runner handed rows (gov.send's own attempt, the simulator's runners): one row a call,
        # as the rows come, each call's values different
        given = _claim_plans(c, [("w", 10, T0 + timedelta(seconds=i), [i_d]) for i, i_d in enumerate(ids)])
        claimed = c.execute("SELECT count(*) FROM gov.outbox WHERE state = 'sending'").fetchone()
    assert claimed == (CALLS,)  # the claims did claim
    with psycopg.connect(db_url, autocommit=True) as c:
        # a runner draining whatever is due (gov dispatch), at a moment nothing is due yet
        anything = _claim_plans(c, [("w", 1 + i, T0 - timedelta(seconds=i + 1), None) for i in range(CALLS)])
    # one plan per session and form: the first generic one (another only after an ANALYZE)
    assert given <= 2 and anything <= 2, (given, anything)


def test_a_claim_of_given_rows_finds_them_by_id_not_across_every_user(db_url: str) -> None:
    """The claim of given rows names them by id alone; the key is (user_id, id). It must find
    them through an index on id (gov.outbox_todo_by_id, migration 0049), not by reading the
    key index across every user (PostgreSQL 18: 215 index pages for ten rows among 2,000
    users, 3.7 ms) nor every row still to do (PostgreSQL 15 with a backlog)."""
    with psycopg.connect(db_url, autocommit=True) as c:
        # 2,000 users with 16,000 finished rows and a backlog of 4,000 rows to do
        c.execute("""
            INSERT INTO gov.subscriptions (user_id, endpoint, p256dh, auth)
            SELECT 'u' || g, 'https://push.example/' || g, 'k', 'a' FROM generate_series(1, 2000) g""")
        c.execute("""
            INSERT INTO gov.outbox (user_id, message_id, subscription_id, state, next_attempt_at, created_at,
                                    finished_at)
            SELECT s.user_id, 'm' || k, s.id, CASE WHEN k < 2 THEN 'pending' ELSE 'delivered' END,
                   %(t)s, %(t)s, CASE WHEN k < 2 THEN NULL ELSE %(t)s END
              FROM gov.subscriptions s, generate_series(0, 9) k""", {"t": T0})
        c.execute("ANALYZE gov.outbox")
        (ids,) = c.execute("SELECT array_agg(id) FROM (SELECT id FROM gov.outbox WHERE state = 'pending'"
                           " ORDER BY id DESC LIMIT 10) r").fetchone()
        (by_id,) = c.execute("SELECT 'gov.outbox_todo_by_id'::regclass::oid").fetchone()
        details: list[str] = []
        c.add_notice_handler(lambda d: details.append(d.message_detail or ""))
        c.execute("SET debug_print_plan = on")
        c.execute("SET client_min_messages = log")
        claimed = c.execute(CLAIM, ("w", 10, T0 + timedelta(minutes=1), ids)).fetchall()
        c.execute("RESET client_min_messages")
        c.execute("RESET debug_print_plan")
    assert sorted(r[0] for r in claimed) == sorted(ids)
    (plan,) = [d for d in details if ":ctename due" in d]
    assert f":indexid {by_id} " in plan
