"""Segments: a tier's windows per user segment in the decision, `gov segments refresh`,
`gov user set --segment`, the what-if replay and the analysts' view, on a real PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from gov import Governor, Message, PolicyError
from gov import policy as policy_mod
from gov.analytics.events import record_event
from gov.analytics.whatif import whatif
from gov.cli import main
from gov.segments import refresh
from gov.users import segment_of, set_segment, set_user_cap

DAY_MS = 86_400_000
WEEK_MS = 7 * DAY_MS
T0 = datetime(2026, 7, 26, 12, 0, tzinfo=UTC)

# P2: 2 a day and 5 a week for everyone, but a dormant user gets 1 a week, an engaged one
# 3 a day (a segment's windows replace the tier's own for its users).
SEGMENTED = policy_mod.default_policy_text() + """
[tiers.P2.segments.dormant]
windows = [{ window = "7d", cap = 1 }]

[tiers.P2.segments.engaged]
windows = [{ window = "24h", cap = 3 }, { window = "7d", cap = 8 }]
"""


def apply_policy(conn: psycopg.Connection[Any], text: str) -> None:
    with conn.transaction():
        policy_mod.apply(conn, policy_mod.parse_policy(text), text)


def put(conn: psycopg.Connection[Any], user: str, segment: str | None) -> None:
    with conn.transaction():
        set_segment(conn, user, segment)


def p2_run(governor: Governor, user: str, n: int, at: datetime = T0, prefix: str = "m") -> list[bool]:
    return [governor.decide(Message(user_id=user, id=f"{prefix}{i}", tier="P2"), at=at).allowed for i in range(n)]


def test_the_decision_uses_the_users_segments_windows(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    apply_policy(conn, SEGMENTED)
    put(conn, "sleepy", "dormant")
    put(conn, "keen", "engaged")
    put(conn, "usual", "casual")  # no windows of its own: the tier's
    put(conn, "vip", "vip")  # the app's own segment, no windows in the policy: the tier's
    assert p2_run(governor, "sleepy", 3) == [True, False, False]
    assert p2_run(governor, "keen", 5) == [True, True, True, False, False]
    assert p2_run(governor, "usual", 3) == [True, True, False]
    assert p2_run(governor, "vip", 3) == [True, True, False]
    assert p2_run(governor, "nobody", 3) == [True, True, False]  # no user row at all
    rows = conn.execute(
        "SELECT DISTINCT ON (user_id) user_id, blocked_by, cap, segment FROM gov.push_suppressions ORDER BY 1, id"
    ).fetchall()
    assert rows == [
        ("keen", "cap_86400000ms", 3, "engaged"),
        ("nobody", "cap_86400000ms", 2, None),
        ("sleepy", "cap_604800000ms", 1, "dormant"),
        ("usual", "cap_86400000ms", 2, "casual"),
        ("vip", "cap_86400000ms", 2, "vip"),
    ]
    # the dormant user's week is spent: still blocked the next day, by the segment's window
    nxt = governor.decide(Message(user_id="sleepy", id="later", tier="P2"), at=T0 + timedelta(days=2))
    assert (nxt.allowed, nxt.reason, nxt.retry_after_ms) == (False, "cap_604800000ms", 5 * DAY_MS)


def test_a_users_own_cap_lowers_the_segment_cap_and_never_raises(
    governor: Governor, conn: psycopg.Connection[Any]
) -> None:
    apply_policy(conn, SEGMENTED)
    for user in ("keen-shy", "keen-3", "casual-3"):
        put(conn, user, "engaged" if user.startswith("keen") else "casual")
    with conn.transaction():
        set_user_cap(conn, "keen-shy", "P2", DAY_MS, 1)  # below the engaged 3
        # 3 a day is above the tier's 2 but within the engaged segment's 3: admitted...
        set_user_cap(conn, "keen-3", "P2", DAY_MS, 3)
        set_user_cap(conn, "casual-3", "P2", DAY_MS, 3)
    assert p2_run(governor, "keen-shy", 2) == [True, False]
    blocked = conn.execute("SELECT cap FROM gov.push_suppressions WHERE user_id = 'keen-shy'").fetchone()
    assert blocked == (1,)
    assert p2_run(governor, "keen-3", 4) == [True, True, True, False]
    # ...and never lifts anyone: a casual user with it still gets the tier's 2
    assert p2_run(governor, "casual-3", 3) == [True, True, False]
    # above every default for that window: refused, in SQL too
    with pytest.raises(PolicyError, match="above the default 3"):
        set_user_cap(conn, "greedy", "P2", DAY_MS, 4)
    # a user's own 24 h cap holds for a dormant user too, although the dormant windows have no 24 h
    put(conn, "sleepy-shy", "dormant")
    apply_policy(conn, SEGMENTED.replace('{ window = "7d", cap = 1 }', '{ window = "7d", cap = 4 }'))
    with conn.transaction():
        set_user_cap(conn, "sleepy-shy", "P2", DAY_MS, 1)
    assert p2_run(governor, "sleepy-shy", 2) == [True, False]
    assert conn.execute(
        "SELECT blocked_by, cap FROM gov.push_suppressions WHERE user_id = 'sleepy-shy'"
    ).fetchone() == ("cap_86400000ms", 1)


def test_segment_windows_of_a_consumed_tier_hold_the_cascade(
    governor: Governor, conn: psycopg.Connection[Any]
) -> None:
    # a P3 spends P2 budget: for a dormant user, by the dormant P2 windows
    apply_policy(conn, SEGMENTED)
    put(conn, "sleepy", "dormant")
    assert governor.decide(Message(user_id="sleepy", id="p2", tier="P2"), at=T0).allowed
    p3 = governor.decide(Message(user_id="sleepy", id="p3", tier="P3"), at=T0)
    assert (p3.allowed, p3.reason, p3.cap) == (False, "cap_604800000ms", 1)


def test_a_policy_change_applies_to_existing_users_at_once(
    governor: Governor, conn: psycopg.Connection[Any]
) -> None:
    for user in ("sleepy", "usual"):
        put(conn, user, "dormant" if user == "sleepy" else "casual")
        assert p2_run(governor, user, 2, at=T0 - timedelta(days=2), prefix="old") == [True, True]
    shown_before = policy_mod.load_stored(conn)
    apply_policy(conn, SEGMENTED)
    stored = policy_mod.load_stored(conn)
    assert stored == policy_mod.parse_policy(SEGMENTED)  # what `gov policy show` prints
    assert "[tiers.P2.segments.dormant]" in stored.to_toml()
    assert "+[tiers.P2.segments.dormant]" in policy_mod.diff(shown_before, stored)
    # the dormant user's two sends of two days ago already fill the new dormant week
    assert p2_run(governor, "sleepy", 1) == [False]
    assert p2_run(governor, "usual", 1) == [True]
    # moving the user moves their windows, with the same history
    put(conn, "sleepy", "casual")
    assert p2_run(governor, "sleepy", 1, prefix="moved") == [True]
    put(conn, "sleepy", "dormant")
    # and a policy without segment caps brings everyone back to the tier's windows
    apply_policy(conn, policy_mod.default_policy_text())
    assert conn.execute("SELECT count(*) FROM gov.segment_caps").fetchone() == (0,)
    assert p2_run(governor, "sleepy", 1, at=T0 + timedelta(days=1), prefix="back") == [True]


def test_removing_a_tier_removes_its_segment_windows(conn: psycopg.Connection[Any]) -> None:
    apply_policy(conn, SEGMENTED)
    assert conn.execute("SELECT count(*) FROM gov.segment_caps").fetchone() == (3,)
    with pytest.raises(psycopg.Error) as refused:
        conn.execute("INSERT INTO gov.segment_caps VALUES ('P0', 'dormant', 86400000, 0)")
    assert refused.value.sqlstate in ("23503", "23514")  # P0: never capped, for a segment neither


# ---------------------------------------------------------------- gov segments refresh

def _subscribe(conn: psycopg.Connection[Any], user: str, at: datetime) -> None:
    conn.execute(
        "INSERT INTO gov.subscriptions (user_id, endpoint, p256dh, auth, created_at) VALUES (%s, %s, 'k', 'a', %s)",
        (user, f"https://push.example/{user}", at),
    )


def _clicked(governor: Governor, user: str, at: datetime) -> None:
    mid = f"click-{at:%m%d%H%M}"
    assert governor.decide(Message(user_id=user, id=mid, tier="P1"), at=at).allowed
    assert record_event(governor, user, mid, "click", at=at)


def _population(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    """Users around the default rules (engaged: click < 7 d; dormant: no click for 30 d)."""
    for user in ("fresh", "new", "old-silent", "clicked-2d", "clicked-20d", "clicked-40d", "was-engaged",
                 "vip", "edge-7d"):
        _subscribe(conn, user, T0 - timedelta(days=60 if user not in ("fresh", "new") else 5))
    _clicked(governor, "clicked-2d", T0 - timedelta(days=2))
    _clicked(governor, "clicked-20d", T0 - timedelta(days=20))
    _clicked(governor, "clicked-40d", T0 - timedelta(days=40))
    _clicked(governor, "was-engaged", T0 - timedelta(days=35))
    _clicked(governor, "edge-7d", T0 - timedelta(days=7))  # exactly 7 days: no longer "within"
    _clicked(governor, "new", T0 + timedelta(hours=1))  # after the clock: not seen yet
    put(conn, "was-engaged", "engaged")  # rule-based: reclassified
    put(conn, "vip", "vip")  # the app's own: left alone
    # a user gov only decided for (no subscription), 40 days ago
    assert governor.decide(Message(user_id="decided-only", id="d", tier="P2"), at=T0 - timedelta(days=40)).allowed
    # a user the app knows but gov never decided for nor subscribed: not touched
    put(conn, "stranger", "dormant")


EXPECTED = {
    "fresh": "casual",  # subscribed 5 days ago, no click yet
    "new": "casual",  # its click is after the clock
    "old-silent": "dormant",  # never clicked, subscribed 60 days ago
    "clicked-2d": "engaged",
    "clicked-20d": "casual",
    "clicked-40d": "dormant",
    "was-engaged": "dormant",
    "edge-7d": "casual",
    "vip": "vip",
    "decided-only": "dormant",
    "stranger": "dormant",
}


def segments(conn: psycopg.Connection[Any]) -> dict[str, str | None]:
    return dict(conn.execute("SELECT user_id, segment FROM gov.users").fetchall())


def test_refresh_classifies_with_an_explicit_clock(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    _population(governor, conn)
    with conn.transaction():
        counts = refresh(conn, T0)
    assert segments(conn) == EXPECTED
    assert {r.segment: r.users for r in counts} == {"casual": 4, "dormant": 4, "engaged": 1}
    assert {r.segment: r.changed for r in counts} == {"casual": 4, "dormant": 4, "engaged": 1}
    # a second refresh at the same clock changes nothing
    with conn.transaction():
        again = refresh(conn, T0)
    assert sum(r.changed for r in again) == 0 and segments(conn) == EXPECTED
    # a month later nobody has clicked: the engaged user is dormant
    with conn.transaction():
        refresh(conn, T0 + timedelta(days=31))
    assert segment_of(conn, "clicked-2d") == "dormant" and segment_of(conn, "vip") == "vip"


def test_refresh_follows_the_policys_rules(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    _population(governor, conn)
    rules = '\n[segments]\nengaged_within = "21d"\ndormant_after = "50d"\n'
    apply_policy(conn, policy_mod.default_policy_text() + rules)
    with conn.transaction():
        refresh(conn, T0)
    got = segments(conn)
    assert got["clicked-20d"] == "engaged" and got["clicked-40d"] == "casual" and got["old-silent"] == "dormant"
    assert got["decided-only"] == "casual"


def test_segments_refresh_command_and_user_set_segment(
    governor: Governor, conn: psycopg.Connection[Any], db_url: str
) -> None:
    _population(governor, conn)
    runner = CliRunner()
    env = {"GOV_DATABASE_URL": db_url}
    out = runner.invoke(main, ["segments", "refresh", "--at", T0.isoformat(), "--json"], env=env)
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["dormant"] == {"users": 4, "changed": 4}
    assert segments(conn) == EXPECTED
    # the app takes a user over, then gives them back to the rules
    assert runner.invoke(main, ["user", "set", "--user", "clicked-2d", "--segment", "beta"], env=env).exit_code == 0
    assert runner.invoke(main, ["segments", "refresh", "--at", T0.isoformat()], env=env).exit_code == 0
    assert segment_of(conn, "clicked-2d") == "beta"
    assert runner.invoke(main, ["user", "set", "--user", "clicked-2d", "--segment", "none"], env=env).exit_code == 0
    assert segment_of(conn, "clicked-2d") is None
    assert runner.invoke(main, ["segments", "refresh", "--at", T0.isoformat()], env=env).exit_code == 0
    assert segment_of(conn, "clicked-2d") == "engaged"
    bad = runner.invoke(main, ["user", "set", "--user", "x", "--segment", "Not A Name"], env=env)
    assert bad.exit_code == 1 and "segment 'Not A Name'" in bad.output
    assert segment_of(conn, "x") is None


# ---------------------------------------------------------------- what-if and analysts

def test_whatif_replays_with_each_users_current_segment(
    governor: Governor, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    for user, segment in (("sleepy", "dormant"), ("usual", "casual"), ("keen", "engaged")):
        put(conn, user, segment)
        assert p2_run(governor, user, 3, at=T0 - timedelta(days=1)) == [True, True, False]
    before = conn.execute("SELECT count(*), max(id) FROM gov.push_suppressions").fetchone()
    result = whatif(governor, policy_mod.parse_policy(SEGMENTED), SEGMENTED, now=T0)
    assert (result.total.messages, result.total.allowed, result.total.would_allow) == (9, 6, 6)
    # the dormant user would have had 1 (one extra suppression), the engaged one 3 (one freed)
    assert (result.total.extra_suppressed, result.total.freed) == (1, 1)
    assert conn.execute("SELECT count(*), max(id) FROM gov.push_suppressions").fetchone() == before
    assert conn.execute("SELECT count(*) FROM gov.segment_caps").fetchone() == (0,)  # nothing stored


def test_analysts_see_suppressions_by_segment(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    apply_policy(conn, SEGMENTED)
    put(conn, "sleepy", "dormant")
    put(conn, "sleepy2", "dormant")
    for user in ("sleepy", "sleepy2", "plain"):
        p2_run(governor, user, 3)
    rows = conn.execute(
        "SELECT tier, segment, blocked_by, suppressed, users FROM gov.segment_suppressions_daily ORDER BY 2 NULLS FIRST"
    ).fetchall()
    assert rows == [("P2", None, "cap_86400000ms", 1, 1), ("P2", "dormant", "cap_604800000ms", 4, 2)]
    sizes = dict(conn.execute("SELECT segment, users FROM gov.segment_sizes").fetchall())
    assert sizes == {"dormant": 2}


def test_prune_keeps_the_rows_a_segments_longer_window_reads(
    governor: Governor, conn: psycopg.Connection[Any]
) -> None:
    """A segment window longer than every tier's own (here 30 days against 7) still finds
    its sends after `gov prune`: the horizon is the longest window any cap reads."""
    from gov.db import Source
    from gov.ops.maintenance import prune

    apply_policy(conn, policy_mod.default_policy_text() + """
[tiers.P2.segments.dormant]
windows = [{ window = "30d", cap = 1 }]
""")
    put(conn, "d", "dormant")
    assert governor.decide(Message(user_id="d", id="old", tier="P2"), at=T0 - timedelta(days=20)).allowed
    before = governor.decide(Message(user_id="d", id="probe1", tier="P2"), at=T0)
    assert not before.allowed and before.reason == "cap_2592000000ms"
    prune(Source(conn), margin=timedelta(hours=1), keep_history=timedelta(days=365), batch=100, now=T0)
    after = governor.decide(Message(user_id="d", id="probe2", tier="P2"), at=T0)
    assert (after.allowed, after.reason) == (False, "cap_2592000000ms")
