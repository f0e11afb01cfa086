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
