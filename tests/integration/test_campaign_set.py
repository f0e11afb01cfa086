"""A campaign batch decides its plain users together (migration 0020): every user of every
kind, in every tier and topic, gets from ``decide_many`` exactly what one-by-one decisions
give — the verdict, the message row, the suppression row and the send rows."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from typing import Any

import psycopg
import pytest

from gov import Governor, InvalidMessage, Message
from gov import policy as policy_mod
from gov.testing import PushService
from gov.users import set_quiet_hours, set_segment, set_time_zone, set_user_cap

T0 = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)

POLICY = """
[tiers.P0]
exempt = true

[tiers.P1]
windows = [{ window = "24h", cap = 6 }]
on_exceed = "defer"
consumes = ["P1"]

[tiers.P2]
windows = [{ window = "1h", cap = 1 }, { window = "24h", cap = 2 }, { window = "3d", cap = 3 },
           { window = "7d", cap = 4 }, { window = "30d", cap = 9 }]
on_exceed = "drop"
consumes = ["P1", "P2"]

[tiers.P2.segments.dormant]
windows = [{ window = "7d", cap = 1 }]

[tiers.P3]
windows = [{ window = "7d", cap = 0 }]
on_exceed = "collapse"
consumes = ["P3"]

[topics]
news = [{ window = "24h", cap = 1 }]
"*" = [{ window = "7d", cap = 3 }]

[global]
windows = [{ window = "24h", cap = 5 }]
"""

KINDS = 11  # user i is of kind i % KINDS (see populate)
TEMPLATES = (  # two hours apart: the 1-hour window of one does not decide the next
    Message(user_id="-", id="headline", tier="P2", topic="news", campaign_id="daily"),
    Message(user_id="-", id="tip", tier="P2", topic="tips"),
    Message(user_id="-", id="sale", tier="P2", campaign_id="spring"),
    Message(user_id="-", id="reminder", tier="P1"),
    Message(user_id="-", id="outage", tier="P0"),
    Message(user_id="-", id="recs", tier="P3"),
)


def populate(governor: Governor, conn: psycopg.Connection[Any], user: str, i: int) -> None:
    """One user of kind ``i % KINDS``, with a history that depends on ``i``."""
    kind = i % KINDS
    # a history: P2 sends spread over the month (old first, as time passes), and P1 sends today
    for k, hours in enumerate(sorted(({1: [0.5], 2: [2, 5], 3: [30, 60, 100], 4: [3, 50, 120, 160, 600]}
                                      .get(i % 5, [])), reverse=True)):
        topic = "tips" if i % 10 == 4 else "news" if k % 2 else None
        governor.decide(Message(user_id=user, id=f"p2-{k}", tier="P2", topic=topic), at=T0 - timedelta(hours=hours))
    for k in range(i % 4 * 2):
        governor.decide(Message(user_id=user, id=f"p1-{k}", tier="P1"), at=T0 - timedelta(minutes=10 * k + 5))
    if kind == 1:  # in quiet hours now (12:00 UTC is 00:00 in Auckland in July)
        set_time_zone(conn, user, "Pacific/Auckland")
        set_quiet_hours(conn, user, (time(22), time(8)))
    elif kind == 2:  # a time zone, out of quiet hours
        set_time_zone(conn, user, "Europe/Berlin")
    elif kind == 3:  # a cap of their own, below the default
        set_user_cap(conn, user, "P2", 86_400_000, 1)
    elif kind == 4:  # a segment with windows of its own
        set_segment(conn, user, "dormant")
    elif kind == 5:  # a segment without
        set_segment(conn, user, "casual")
    elif kind == 6:  # opted out of the news topic
        conn.execute("INSERT INTO gov.user_topic_optouts (user_id, topic) VALUES (%s, 'news')", (user,))
    elif kind == 7:  # decided already: the campaign is a repeat for them
        for t in TEMPLATES:
            governor.decide(Message(user_id=user, id=t.id, tier=t.tier, topic=t.topic), at=T0 - timedelta(hours=3))
    elif kind == 8:  # a user row and nothing in it
        set_segment(conn, user, None)
    # kinds 0, 9, 10: nobody gov knows beyond their sends


def rows(conn: psycopg.Connection[Any], sql: str, prefix: str) -> list[tuple[Any, ...]]:
    return conn.execute(sql, (prefix + "%",)).fetchall()


MESSAGES = ("SELECT substr(user_id, 2), message_id, tier, topic, campaign_id, allowed, action, reason, used, cap,"
            " retry_after_ms, decided_at FROM gov.messages WHERE user_id LIKE %s ORDER BY 1, 2")
SUPPRESSIONS = ("SELECT substr(user_id, 2), message_id, tier, blocked_by, action, campaign_id, topic, blocked_scope,"
                " used, cap, retry_after_ms, created_at, segment FROM gov.push_suppressions"
                " WHERE user_id LIKE %s ORDER BY 1, 2")
SENDS = ("SELECT substr(user_id, 2), budget, sent_at, message_id FROM gov.sends"
         " WHERE user_id LIKE %s ORDER BY 1, 2, 3, 4")


@pytest.mark.parametrize("batch", [500, 6])
def test_a_batch_gives_every_user_the_one_by_one_decision(
    governor: Governor, conn: psycopg.Connection[Any], batch: int
) -> None:
    with conn.transaction():
        policy_mod.apply(conn, policy_mod.parse_policy(POLICY), POLICY)
    users = [f"{i:03d}" for i in range(4 * KINDS * 5)]
    for prefix in ("a", "b"):
        for u in users:
            populate(governor, conn, prefix + u, int(u))
    reasons: set[str | None] = set()
    for n, template in enumerate(TEMPLATES):
        at = T0 + timedelta(hours=2 * n)
        single = {u: governor.decide(Message(user_id="a" + u, id=template.id, tier=template.tier,
                                             topic=template.topic, campaign_id=template.campaign_id), at=at)
                  for u in users}
        audience = ["b" + u for u in reversed(users)] + ["b" + u for u in users[::3]]  # repeats in the list
        bulk = governor.decide_many(template, audience, at=at, batch=batch)
        assert [u for u, _ in bulk] == sorted("b" + u for u in users)  # each user once, in user order
        assert {u: single[u] for u in users} == {u[1:]: d for u, d in bulk}, template
        reasons |= {d.reason for d in single.values()}
    # every path was taken: each window, the topic's, the global one, quiet hours, the opt-out
    assert reasons >= {None, "cap_3600000ms", "cap_86400000ms", "cap_604800000ms", "topic_cap_86400000ms",
                       "topic_cap_604800000ms", "global_cap_86400000ms", "quiet_hours", "topic_opt_out"}, reasons
    for sql in (MESSAGES, SUPPRESSIONS, SENDS):
        assert rows(conn, sql, "a") == rows(conn, sql, "b")
    spent = {budget for _, budget, _, message in rows(conn, SENDS, "b") if message in {t.id for t in TEMPLATES}}
    assert spent == {"topic:news", "topic:tips", "P1", "P2", "global"}  # every budget a campaign spends


CONTENT = ("SELECT substr(user_id, 2), message_id, content, collapse_key, ttl_s, expires_at FROM gov.message_content"
           " WHERE user_id LIKE %s ORDER BY 1, 2")
OUTBOX = ("SELECT substr(user_id, 2), message_id, count(*), min(state), max(state), min(next_attempt_at)"
          " FROM gov.outbox WHERE user_id LIKE %s GROUP BY 1, 2 ORDER BY 1, 2")
DEFERRED = ("SELECT substr(user_id, 2), message_id, tier, kind, collapse_key, blocked_by, planned_at, release_at,"
            " give_up_at, state, outcome FROM gov.deferred WHERE user_id LIKE %s ORDER BY 1, 2")
SEND_TEMPLATES = (  # a tier that drops and an exempt one go together; one that defers, one by one
    Message(user_id="-", id="flash", tier="P2", campaign_id="spring", title="Flash sale", ttl=3600),
    Message(user_id="-", id="news-1", tier="P2", topic="news", title="Headline"),
    Message(user_id="-", id="down", tier="P0", title="We are down", body="Sorry"),
    Message(user_id="-", id="nudge", tier="P1", title="Your cart"),
    Message(user_id="-", id="recs-1", tier="P3", title="For you", collapse_key="recs"),
)


def test_a_send_batch_gives_every_user_what_send_gives(
    db_url: str, conn: psycopg.Connection[Any], push: PushService
) -> None:
    """send_many against send, user for user: the verdict, the outbox ids' count, and every
    row in messages, suppressions, sends, content, outbox and the deferral queue."""
    with conn.transaction():
        policy_mod.apply(conn, policy_mod.parse_policy(POLICY), POLICY)
    users = [f"{i:03d}" for i in range(2 * KINDS * 5)]
    with Governor(db_url, allow_loopback_http=True, pool_size=2) as governor:
        for prefix in ("a", "b"):
            for u in users:
                i = int(u)
                populate(governor, conn, prefix + u, i)
                for _ in range(i % 3):  # none, one or two browsers
                    governor.subscribe(prefix + u, push.subscribe().info)
                if i % 7 == 0 and i % 3:  # and one of them retired
                    conn.execute("UPDATE gov.subscriptions SET retired_at = %s, retired_reason = 'gone'"
                                 " WHERE id = (SELECT min(id) FROM gov.subscriptions WHERE user_id = %s)",
                                 (T0, prefix + u))
        actions: set[str | None] = set()
        for n, t in enumerate(SEND_TEMPLATES):
            at = T0 + timedelta(hours=2 * n)
            single = {u: governor.send(Message(user_id="a" + u, id=t.id, tier=t.tier, topic=t.topic,
                                               campaign_id=t.campaign_id, title=t.title, body=t.body,
                                               collapse_key=t.collapse_key, ttl=t.ttl), at=at, deliver=False)
                      for u in users}
            bulk = governor.send_many(t, ["b" + u for u in reversed(users)] + ["b" + users[0]], at=at, batch=9)
            assert [u for u, _ in bulk] == sorted("b" + u for u in users)
            def said(r: Any) -> tuple[Any, ...]:  # send_many's rows carry the verdict, not its counts
                d = r.decision
                return d.allowed, d.action, d.reason, d.repeated, len(r.outbox_ids)

            assert {u: said(r) for u, r in single.items()} == {u[1:]: said(r) for u, r in bulk}, t
            actions |= {r.decision.action for r in single.values()}
    assert actions >= {None, "drop", "defer"}, actions
    for sql in (MESSAGES, SUPPRESSIONS, SENDS, CONTENT, OUTBOX, DEFERRED):
        assert rows(conn, sql, "a") == rows(conn, sql, "b"), sql
    fanned = conn.execute("SELECT count(*) FROM gov.outbox WHERE user_id LIKE 'b%%'"
                          " AND message_id IN ('flash', 'down')").fetchone()
    assert fanned is not None and fanned[0] > 20  # the batch path did fan out


def test_bad_input_in_a_batch_is_refused_as_one_by_one(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    for user_ids, message_id, tier, error in (
        (["u1", ""], "m", "P2", "user_id is required"),
        (["u1", None], "m", "P2", "user_id is required"),
        (["u1"], "", "P2", "message id is required"),
        (["u1"], "m", "P9", "unknown tier P9"),
    ):
        with pytest.raises(psycopg.DatabaseError, match=error), conn.transaction():
            conn.execute("SELECT * FROM gov.decide_many_v2(NULL, %s, %s, %s)", (user_ids, message_id, tier))
    assert conn.execute("SELECT count(*) FROM gov.messages").fetchone() == (0,)


@pytest.mark.parametrize("bad", ["", "  ", None, 42, "nul\x00", "x" * 300, "\ud800"])
def test_a_bad_user_id_in_an_audience_is_refused_before_anything_is_decided(
    governor: Governor, conn: psycopg.Connection[Any], bad: object
) -> None:
    template = Message(user_id="-", id="sale", tier="P2", title="Sale")
    for call in (governor.decide_many, governor.send_many):
        with pytest.raises(InvalidMessage, match="user_id"):
            call(template, ["u1", bad, "u2"])  # type: ignore[list-item]
    assert conn.execute("SELECT count(*) FROM gov.messages").fetchone() == (0,)
