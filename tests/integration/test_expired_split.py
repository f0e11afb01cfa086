"""The simulation's expired split (sql/queries_simulate.sql, sim_expired_split): a message
that expired waiting is counted as "a slot went to a later deadline" only when a message
with a later deadline was sent in a budget it waited for, at a moment it would itself
have passed every rule it reads; a send in a budget that was not the full one took
nothing from it (a probe with a topic cap found that false alarm in the summary)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from gov import Governor, Message
from gov import policy as policy_mod
from gov.queries import q

T0 = datetime(2026, 6, 10, 9, 0, tzinfo=UTC)
POLICY = """
[tiers.P0]
exempt = true

[tiers.P1]
windows = [{ window = "2h", cap = 1 }, { window = "12h", cap = 3 }]
on_exceed = "defer"
defer_max = "8d"
consumes = ["P1"]

[tiers.P2]
windows = [{ window = "24h", cap = 2 }]
on_exceed = "drop"
consumes = ["P2"]

[tiers.P3]
windows = [{ window = "7d", cap = 1 }]
on_exceed = "collapse"
consumes = ["P3"]

[topics]
watchlist = [{ window = "7d", cap = 1 }]
"""


@pytest.fixture
def governor(db_url: str, conn: psycopg.Connection[Any]) -> Iterator[Governor]:
    with conn.transaction():
        policy_mod.apply(conn, policy_mod.parse_policy(POLICY), POLICY)
    with Governor(db_url) as g:
        yield g


def split(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(q("sim_expired_split")).fetchall()


def test_a_later_deadline_sent_in_a_budget_that_was_not_full_took_no_slot(
    governor: Governor, conn: psycopg.Connection[Any]
) -> None:
    # the watchlist topic's weekly slot is taken; a second watch message (2 h TTL) waits for
    # it and expires at once (the slot frees in a week); a P1 message with a day's TTL is
    # then sent in the P1 budget the watch message also reads, which had room: the watch
    # message waited for its topic, not for P1
    governor.send(Message(user_id="u", id="w1", tier="P1", topic="watchlist", title="w"), at=T0 - timedelta(hours=3))
    held = governor.send(Message(user_id="u", id="w2", tier="P1", topic="watchlist", title="w", ttl=7200), at=T0)
    assert held.decision.reason == "ttl_expired" and not held.decision.allowed  # waiting for its topic
    later = governor.send(Message(user_id="u", id="p1", tier="P1", title="p", ttl=86400),
                          at=T0 + timedelta(minutes=1))
    assert later.decision.allowed
    assert split(conn) == [("P1", 1, 0)]


def test_a_later_deadline_sent_where_the_waiting_message_had_room_is_counted(
    governor: Governor, conn: psycopg.Connection[Any]
) -> None:
    # w waits for the 2-hour P1 slot (4 h TTL); when that slot frees, a message with a later
    # deadline is written into it (a release order gov does not make: written by hand),
    # and w then expires: that slot was owed to w
    governor.send(Message(user_id="u", id="a", tier="P1", title="a"), at=T0)
    held = governor.send(Message(user_id="u", id="w", tier="P1", title="w", ttl=4 * 3600),
                         at=T0 + timedelta(minutes=5))
    assert held.decision.action == "defer"
    stolen_at = T0 + timedelta(hours=2, minutes=1)
    conn.execute("INSERT INTO gov.message_content (user_id, message_id, content, ttl_s, expires_at)"
                 " VALUES ('u', 'late', '{}', 86400, %s)", (stolen_at + timedelta(days=1),))
    conn.execute("INSERT INTO gov.sends (user_id, budget, sent_at, message_id) VALUES ('u', 'P1', %s, 'late')",
                 (stolen_at,))
    conn.execute("UPDATE gov.deferred SET state = 'expired', outcome = 'ttl_expired', finished_at = %s"
                 " WHERE user_id = 'u' AND message_id = 'w'", (T0 + timedelta(hours=4),))
    assert split(conn) == [("P1", 1, 1)]
    # the same send a minute before the slot freed (a's 2 hours not yet over): w had no room
    conn.execute("UPDATE gov.sends SET sent_at = %s WHERE message_id = 'late'", (T0 + timedelta(hours=1, minutes=59),))
    assert split(conn) == [("P1", 1, 0)]


DEFER_POLICY = POLICY.replace('defer_max = "8d"', 'defer_max = "1h"')


def test_a_message_expired_at_its_decision_is_named_for_its_outcome_not_a_plain_drop(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """The summary's blocking rules showed `cap_... P1 drop 13` for messages the per-tier table
    counts as expired (defer_expired at the decision, logged as drops): the action now names
    the outcome, and sim_expired_outcomes counts them by why, how many at the decision."""
    with conn.transaction():
        policy_mod.apply(conn, policy_mod.parse_policy(DEFER_POLICY), DEFER_POLICY)
    with Governor(db_url) as governor:
        governor.send(Message(user_id="u", id="a", tier="P1", title="a"), at=T0)
        # the 2-hour slot frees past defer_max (1 h): held and expired at once, logged as a drop
        late = governor.send(Message(user_id="u", id="b", tier="P1", title="b"), at=T0 + timedelta(minutes=1))
        assert late.decision.action == "drop" and late.decision.reason == "defer_expired"
        # a plain drop stays a drop: P2's verb
        for i in range(3):
            governor.send(Message(user_id="u", id=f"p2-{i}", tier="P2", title="p"), at=T0 + timedelta(minutes=2 + i))
    rules = {(r, t, a): n for r, t, a, n in conn.execute(q("sim_blocking_rules"), {"limit": 10}).fetchall()}
    assert rules == {("cap_7200000ms", "P1", "drop: defer_expired"): 1, ("cap_86400000ms", "P2", "drop"): 1}
    outcomes = conn.execute(q("sim_expired_outcomes")).fetchall()
    assert outcomes == [("P1", "defer_expired", 1, 1)]
    # the row the summary reads is unchanged: what the SQL logs stays a drop
    logged = conn.execute("SELECT action FROM gov.push_suppressions WHERE message_id = 'b'").fetchall()
    assert logged == [("drop",)]
