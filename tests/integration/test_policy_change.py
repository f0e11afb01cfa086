"""Policy changes under held and queued messages: refused, or retired on request."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from gov import Governor, Message, PolicyError
from gov import policy as policy_mod
from gov.testing import Clock
from gov.users import set_user_cap

WITHOUT_P2 = policy_mod.default_policy_text().replace(
    '''[tiers.P2]
# Marketing and lifecycle: campaigns, promotions, win-backs.
windows = [{ window = "24h", cap = 2 }, { window = "7d", cap = 5 }]
on_exceed = "drop"
consumes = ["P1", "P2"]
ttl = "24h"
urgency = "low"
''', "").replace('consumes = ["P1", "P2", "P3"]', 'consumes = ["P1", "P3"]')


@pytest.fixture
def clock() -> Clock:
    # 23:00 in Berlin: quiet hours for a user there
    return Clock(datetime(2026, 6, 10, 21, 0, tzinfo=UTC))


def _held_and_queued(db_url: str, conn: psycopg.Connection[Any], clock: Clock) -> None:
    conn.execute("INSERT INTO gov.users (user_id, time_zone) VALUES ('night', 'Europe/Berlin')")
    conn.execute(
        "INSERT INTO gov.subscriptions (user_id, endpoint, p256dh, auth)"
        " VALUES ('day', 'https://push.example/1', 'k', 'a')"
    )
    with Governor(db_url, clock=clock) as g:
        assert g.send(Message(user_id="night", id="sale", tier="P2", title="t")).decision.reason == "quiet_hours"
        assert g.send(Message(user_id="day", id="promo", tier="P2", title="t"), deliver=False).sent
        assert g.send(Message(user_id="day", id="note", tier="P1", title="t"), deliver=False).sent


def test_removing_a_tier_with_held_or_queued_messages_is_refused(
    db_url: str, conn: psycopg.Connection[Any], clock: Clock
) -> None:
    _held_and_queued(db_url, conn, clock)
    parsed = policy_mod.parse_policy(WITHOUT_P2, "p.toml")
    with conn.transaction(), pytest.raises(PolicyError) as exc:
        policy_mod.apply(conn, parsed, WITHOUT_P2, name="p.toml")
    assert str(exc.value).startswith("p.toml:")
    assert "P2: 1 held, 1 queued for delivery" in str(exc.value) and "--drop-held" in str(exc.value)
    assert conn.execute("SELECT count(*) FROM gov.tiers WHERE tier = 'P2'").fetchone() == (1,)


def test_drop_held_ends_them_as_suppressions_and_leaves_other_tiers_alone(
    db_url: str, conn: psycopg.Connection[Any], clock: Clock
) -> None:
    _held_and_queued(db_url, conn, clock)
    with conn.transaction():
        retired = policy_mod.apply(
            conn, policy_mod.parse_policy(WITHOUT_P2), WITHOUT_P2, name="p.toml", drop_held=True
        )
    assert retired == [policy_mod.Retired("P2", 1, 1)]
    assert conn.execute("SELECT state, outcome FROM gov.deferred WHERE message_id = 'sale'").fetchone() == (
        "dropped", "tier_removed")
    assert conn.execute(
        "SELECT message_id, blocked_by, action FROM gov.push_suppressions WHERE blocked_by = 'tier_removed'"
        " ORDER BY message_id"
    ).fetchall() == [("promo", "tier_removed", "drop"), ("sale", "tier_removed", "drop")]
    outbox = dict(conn.execute(
        "SELECT message_id, state || ':' || coalesce(last_error, '') FROM gov.outbox").fetchall())
    assert outbox == {"promo": "failed:tier_removed", "note": "pending:"}
    clock.now += timedelta(days=1)
    states = dict(conn.execute(
        "SELECT message_id, state FROM gov.message_states_v1(%s, %s)", (clock.now - timedelta(days=2), clock.now)
    ).fetchall())
    assert states == {"sale": "dropped", "promo": "failed", "note": "in_flight"}


def test_a_default_lowered_under_a_users_own_cap_holds_that_user_too(
    db_url: str, conn: psycopg.Connection[Any], clock: Clock
) -> None:
    """A user's cap is checked against the default only when written; the decision takes the lower."""
    set_user_cap(conn, "u", "P1", 86_400_000, 5)  # under the default 6: accepted
    text = policy_mod.default_policy_text().replace(
        'windows = [{ window = "24h", cap = 6 }]', 'windows = [{ window = "24h", cap = 2 }]', 1
    )
    assert text != policy_mod.default_policy_text()
    with conn.transaction():
        policy_mod.apply(conn, policy_mod.parse_policy(text, "p.toml"), text, name="p.toml")
    assert conn.execute(
        "SELECT cap FROM gov.caps WHERE scope = 'P1' AND window_ms = 86400000"
    ).fetchone() == (2,)
    assert conn.execute("SELECT cap FROM gov.user_caps WHERE user_id = 'u'").fetchone() == (5,)  # left as it was
    with Governor(db_url, clock=clock) as g:
        verdicts = [g.decide(Message(user_id="u", id=f"m{i}", tier="P1", title="t")) for i in range(4)]
        other = [g.decide(Message(user_id="v", id=f"m{i}", tier="P1", title="t")) for i in range(3)]
    assert [v.allowed for v in verdicts] == [True, True, False, False]
    assert verdicts[2].reason == "cap_86400000ms"
    assert [v.allowed for v in other] == [True, True, False]


def test_a_policy_that_takes_away_the_window_a_users_cap_lowers_is_refused(
    db_url: str, conn: psycopg.Connection[Any], clock: Clock
) -> None:
    """An outside probe: a user's "no marketing a day" (P2:24h=0) stopped holding without a
    word once a policy kept only P2's 7-day window, and came back with the window."""
    set_user_cap(conn, "quiet-one", "P2", 86_400_000, 0)
    text = policy_mod.default_policy_text().replace(
        'windows = [{ window = "24h", cap = 2 }, { window = "7d", cap = 5 }]', 'windows = [{ window = "7d", cap = 5 }]')
    assert text != policy_mod.default_policy_text()
    with pytest.raises(PolicyError, match=r"p\.toml:\d+: .*P2 over 24h: 1 user\(s\) \(e\.g\. 'quiet-one'\).*"
                                          r"--drop-user-caps"), conn.transaction():
        policy_mod.apply(conn, policy_mod.parse_policy(text, "p.toml"), text, name="p.toml")
    with Governor(db_url, clock=clock) as g:  # nothing changed: the cap holds
        assert not g.decide(Message(user_id="quiet-one", id="m0", tier="P2")).allowed
    with conn.transaction():
        done = policy_mod.apply(conn, policy_mod.parse_policy(text, "p.toml"), text, name="p.toml",
                                drop_user_caps=True)
    assert done == [policy_mod.OrphanedCaps("P2", 86_400_000, 1, "quiet-one")]
    assert conn.execute("SELECT count(*) FROM gov.user_caps").fetchone() == (0,)
