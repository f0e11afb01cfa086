"""The released names migration 0025 brought back answer as their successors do (invariant 16).

Each wrapper is called as a script written for its release would call it, beside the
current function, and must give the same rows, in the released shape, under today's
rules (invariant 12: only the lease holder records).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

T0 = datetime(2026, 6, 10, 9, 0, tzinfo=UTC)  # a Wednesday morning, outside quiet hours


def columns(conn: psycopg.Connection[Any], query: str, *params: Any) -> tuple[list[str], list[tuple[Any, ...]]]:
    cur = conn.execute(query, params)
    return [c.name for c in cur.description or []], cur.fetchall()


def subscribe(conn: psycopg.Connection[Any], user: str, n: int) -> int:
    row = conn.execute("SELECT gov.subscribe_v1(%s, %s, 'k', 'a')", (user, f"https://push.example/{user}/{n}"))
    return int(row.fetchone()[0])  # type: ignore[index]


def test_subscribe_v1_is_subscribe_v2(conn: psycopg.Connection[Any]) -> None:
    first = subscribe(conn, "u1", 1)
    assert subscribe(conn, "u1", 1) == first  # the same endpoint again: the same live row
    # an endpoint another user subscribes is retired for the first (subscribe_v2's rule)
    (moved,) = conn.execute("SELECT gov.subscribe_v1('u2', 'https://push.example/u1/1', 'k', 'a')").fetchone()
    assert moved != first
    assert conn.execute("SELECT user_id FROM gov.subscriptions WHERE retired_at IS NULL").fetchall() == [("u2",)]


def test_decide_many_v1_and_send_many_v1_decide_in_user_order(conn: psycopg.Connection[Any]) -> None:
    names, rows = columns(conn, "SELECT * FROM gov.decide_many_v1(ARRAY['b', 'a', 'a', 'c'], 'm1', 'P2')")
    assert names == ["user_id", "allowed", "action", "reason", "used", "cap", "retry_after_ms", "repeated"]
    assert [(r[0], r[1], r[7]) for r in rows] == [("a", True, False), ("b", True, False), ("c", True, False)]
    again = conn.execute("SELECT user_id, repeated FROM gov.decide_many_v1(ARRAY['a'], 'm1', 'P2')").fetchall()
    assert again == [("a", True)]
    for user in ("a", "b"):
        subscribe(conn, user, 1)
    names, rows = columns(
        conn, "SELECT * FROM gov.send_many_v1(ARRAY['b', 'a'], 'm2', 'P2', NULL, NULL, %s, NULL, NULL)",
        Jsonb({"title": "t"}),
    )
    assert names == ["user_id", "allowed", "action", "reason", "repeated", "outbox_ids"]
    assert [(r[0], r[1], len(r[5])) for r in rows] == [("a", True, 1), ("b", True, 1)]
    # the third P2 in a day is over the 2/24 h cap, as for send_many_v2
    third = conn.execute("SELECT user_id, allowed, reason FROM gov.send_many_v1(ARRAY['a'], 'm3', 'P2', NULL, "
                         "NULL, '{\"title\": \"t\"}', NULL, NULL)").fetchall()
    assert third == [("a", False, "cap_86400000ms")]


def queue(conn: psycopg.Connection[Any], users: list[str]) -> None:
    for user in users:
        subscribe(conn, user, 1)
        conn.execute("SELECT * FROM gov.send_v1(%s, 'm', 'P1', NULL, NULL, '{\"title\": \"t\"}', NULL, NULL)", (user,))


def test_v1_runner_claims_and_records_by_its_name(conn: psycopg.Connection[Any]) -> None:
    queue(conn, ["r1", "r2"])
    names, rows = columns(conn, "SELECT * FROM gov.claim_outbox_v1('w1', 10, 60000)")
    assert "claim_token" not in names and names[0] == "outbox_id" and len(rows) == 2
    first, second = sorted(r[0] for r in rows)
    record = "SELECT gov.record_attempt_v1(%s, %s, 'https://push.example', 'accepted', 201, NULL, NULL)"
    assert conn.execute(record, (first, "w2")).fetchone() == ("stale",)  # not w2's claim: nothing recorded
    assert conn.execute(record, (first, "w1")).fetchone() == ("delivered",)
    assert conn.execute(record, (first, "w1")).fetchone() == ("stale",)  # recorded once
    batch = Jsonb([{"outbox_id": second, "origin": "https://push.example", "outcome": "accepted", "status": 201}])
    assert conn.execute("SELECT * FROM gov.record_attempts_v1('w1', %s)", (batch,)).fetchall() == [
        (second, "delivered")
    ]
    assert conn.execute("SELECT count(*) FROM gov.delivery_attempts").fetchone() == (2,)


def test_v2_runner_records_under_its_claim_token(conn: psycopg.Connection[Any]) -> None:
    queue(conn, ["r1", "r2"])
    names, rows = columns(conn, "SELECT * FROM gov.claim_outbox_v2('w1', 10, 60000)")
    assert names[:2] == ["outbox_id", "claim_token"] and len(rows) == 2
    (one, token_one), (two, token_two) = sorted((r[0], r[1]) for r in rows)
    record = ("SELECT gov.record_attempt_v2(%s, %s, 'w1', 'https://push.example', 'accepted', 201, NULL, NULL)")
    assert conn.execute(record, (one, token_one + 1)).fetchone() == ("stale",)  # another claim's token
    assert conn.execute(record, (one, token_one)).fetchone() == ("delivered",)
    batch = Jsonb([{"outbox_id": two, "claim_token": token_two, "origin": "https://push.example",
                    "outcome": "throttled", "status": 429, "retry_after_ms": 60000}])
    assert conn.execute("SELECT * FROM gov.record_attempts_v2('w1', %s)", (batch,)).fetchall() == [(two, "pending")]


def test_release_due_v1_releases_what_release_due_v2_would(conn: psycopg.Connection[Any]) -> None:
    # P1 is 6 a day, then deferred (up to 6 h): a seventh 20 h later waits for the first slot
    conn.execute("UPDATE gov.settings SET jitter_ms = 0")
    send = "SELECT action FROM gov.send_v1('h', %s, 'P1', NULL, NULL, '{\"title\": \"t\"}', NULL, NULL, %s)"
    for i in range(6):
        assert conn.execute(send, (f"m{i}", T0)).fetchone() == (None,)
    assert conn.execute(send, ("held", T0 + timedelta(hours=20))).fetchone() == ("defer",)
    due = T0 + timedelta(hours=24, minutes=1)
    names, rows = columns(conn, "SELECT * FROM gov.release_due_v1(10, %s)", due)
    assert names == ["user_id", "message_id", "state", "outcome", "outbox_ids"]
    assert [(r[0], r[1], r[2]) for r in rows] == [("h", "held", "released")]
    assert conn.execute("SELECT * FROM gov.release_due_v1(10, %s)", (due,)).fetchall() == []
