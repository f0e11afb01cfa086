"""Campaign decisions in bulk, pruning, and the conservation check."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from gov import Governor, Message
from gov.db import Source
from gov.ops.maintenance import conservation, prune

T0 = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
FAR = datetime(2100, 1, 1, tzinfo=UTC)


def suppression_shape(conn: psycopg.Connection[Any], prefix: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT substr(user_id, 2), message_id, tier, blocked_by, action, used, cap, retry_after_ms"
        " FROM gov.push_suppressions WHERE user_id LIKE %s ORDER BY 1, 2",
        (prefix + "%",),
    ).fetchall()


def test_decide_many_gives_the_one_by_one_verdicts(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    users = [f"{i:03d}" for i in range(60)]
    # a history: user i had i % 3 P2 sends today, i % 7 more this week, and i % 5 P1 sends today
    for prefix in ("a", "b"):
        for u in users:
            i = int(u)
            past = [T0 - timedelta(hours=k + 1) for k in range(i % 3)]
            past += [T0 - timedelta(days=k + 2) for k in range(i % 7)]
            for k, when in enumerate(sorted(past)):  # oldest first, as time passes
                governor.decide(Message(user_id=prefix + u, id=f"p2-{k}", tier="P2"), at=when)
            for k in range(i % 5):
                governor.decide(Message(user_id=prefix + u, id=f"p1-{k}", tier="P1"), at=T0 - timedelta(minutes=k + 1))
    template = Message(user_id="-", id="sale", tier="P2", campaign_id="spring")
    single = {u: governor.decide(Message(user_id="a" + u, id="sale", tier="P2", campaign_id="spring"), at=T0)
              for u in users}
    bulk = dict(governor.decide_many(template, ["b" + u for u in reversed(users)], at=T0, batch=7))
    assert {u: single[u] for u in users} == {u: bulk["b" + u] for u in users}
    reasons = {d.reason for d in single.values()}
    assert reasons == {None, "cap_86400000ms", "cap_604800000ms"}, reasons  # every path was exercised
    assert suppression_shape(conn, "a") == suppression_shape(conn, "b")


def test_campaign_and_single_sends_do_not_deadlock(db_url: str, conn: psycopg.Connection[Any]) -> None:
    """Batches lock users in one order; single sends lock one user: no cycle, exact caps."""
    users = [f"u{i:04d}" for i in range(400)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def campaign(name: str, order: list[str]) -> None:
        try:
            with Governor(db_url, pool_size=1) as g:
                barrier.wait()
                g.decide_many(Message(user_id="-", id=name, tier="P2"), order, at=T0, batch=50)
        except BaseException as exc:
            errors.append(exc)

    def singles() -> None:
        try:
            with Governor(db_url, pool_size=1) as g:
                barrier.wait()
                for u in reversed(users):
                    g.decide(Message(user_id=u, id="single", tier="P2"), at=T0)
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=campaign, args=("c1", users)),
        threading.Thread(target=campaign, args=("c2", list(reversed(users)))),
        threading.Thread(target=campaign, args=("c3", users[::2] + users[1::2])),
        threading.Thread(target=singles),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    # four messages raced for each user under a cap of 2 / 24 h: exactly two allowed each
    over = conn.execute(
        "SELECT user_id, count(*) FROM gov.sends WHERE budget = 'P2' GROUP BY user_id HAVING count(*) <> 2"
    ).fetchall()
    assert over == []
    assert conn.execute("SELECT count(*) FROM gov.push_suppressions").fetchone() == (800,)


def test_send_many_fans_out_and_holds(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "INSERT INTO gov.subscriptions (user_id, endpoint, p256dh, auth)"
        " SELECT 'u' || i, 'https://push.example/' || i, 'k', 'a' FROM generate_series(1, 10) i"
    )
    governor.decide(Message(user_id="u1", id="x", tier="P2"), at=T0)
    governor.decide(Message(user_id="u1", id="y", tier="P2"), at=T0)
    template = Message(user_id="-", id="promo", tier="P2", title="Sale", campaign_id="c")
    results = dict(governor.send_many(template, [f"u{i}" for i in range(1, 11)], at=T0))
    assert not results["u1"].sent and results["u1"].as_json()["reason"] == "cap_86400000ms"
    assert all(results[f"u{i}"].sent and len(results[f"u{i}"].outbox_ids) == 1 for i in range(2, 11))
    assert conn.execute("SELECT count(*) FROM gov.outbox WHERE message_id = 'promo'").fetchone() == (9,)


def test_prune_keeps_every_row_a_window_can_see(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    week = timedelta(days=7)
    for k in reversed(range(5)):  # oldest first, a day apart: all five allowed
        when = T0 - 3 * week - timedelta(days=k)
        assert governor.decide(Message(user_id="u", id=f"old{k}", tier="P2"), at=when).allowed
    governor.decide(Message(user_id="u", id="recent", tier="P2"), at=T0 - timedelta(days=6))
    before = governor.decide(Message(user_id="u", id="probe1", tier="P2"), at=T0)
    source = Source(conn)
    result = prune(source, margin=timedelta(hours=1), keep_history=timedelta(days=365), batch=3, now=T0)
    assert result.sends == 5 * 2  # P1 and P2 rows of the five old sends (no global cap: no global rows)
    remaining = conn.execute("SELECT DISTINCT message_id FROM gov.sends ORDER BY 1").fetchall()
    assert remaining == [("probe1",), ("recent",)]
    # decisions see the same windows as before pruning
    after = governor.decide(Message(user_id="u", id="probe2", tier="P2"), at=T0)
    assert before.allowed and after.allowed


def test_conservation_passes_on_a_normal_flow_and_fails_on_a_plant(
    governor: Governor, conn: psycopg.Connection[Any]
) -> None:
    conn.execute(
        "INSERT INTO gov.subscriptions (user_id, endpoint, p256dh, auth) VALUES ('u', 'https://p.example/1', 'k', 'a')"
    )
    for i in range(3):
        governor.send(Message(user_id="u", id=f"m{i}", tier="P2", title="t"), at=T0)
    governor.send(Message(user_id="u", id="otp", tier="P0", title="t"), at=T0)
    for i in range(7):
        governor.send(Message(user_id="u", id=f"p1-{i}", tier="P1", title="t"), at=T0 + timedelta(hours=20))
    source = Source(conn)
    report = conservation(source, EPOCH, FAR)
    assert report.ok, report.inconsistent
    assert report.states == {"dropped": 1, "held": 3, "in_flight": 7}  # m0, m1, otp and four P1 in flight
    # plant: a suppressed message that spent budget anyway
    conn.execute("INSERT INTO gov.sends VALUES ('u', 'P2', %s, 'm2')", (T0,))
    # plant: a deferred message lost from the queue
    conn.execute("DELETE FROM gov.deferred WHERE message_id = 'p1-6'")
    bad = conservation(source, EPOCH, FAR)
    assert not bad.ok
    assert {(m, s) for _, m, _, s in bad.inconsistent} == {
        ("m2", "INCONSISTENT: suppressed but spent budget (a partial decision)"),
        ("p1-6", "INCONSISTENT: deferred but not in the queue (lost)"),
    }


@pytest.mark.parametrize("planted", ["UPDATE gov.messages SET allowed = false, action = 'drop', reason = 'x'"
                                     " WHERE message_id = 'otp'"])
def test_conservation_flags_a_suppressed_p0(governor: Governor, conn: psycopg.Connection[Any], planted: str) -> None:
    governor.decide(Message(user_id="u", id="otp", tier="P0"), at=T0)
    conn.execute(planted)
    report = conservation(Source(conn), EPOCH, FAR)
    assert [s for *_, s in report.inconsistent] == ["INCONSISTENT: P0 counted or suppressed"]
