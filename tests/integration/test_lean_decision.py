"""The lean decision: compiled rules, one pass per budget, rows only for capped budgets, campaigns on N connections."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from gov import Governor, Message
from gov import policy as policy_mod
from gov.analytics.whatif import whatif
from gov.users import set_segment, set_user_cap

T0 = datetime(2026, 7, 26, 12, 0, tzinfo=UTC)
HOUR_MS = 3_600_000

POLICY = """
[tiers.P0]
exempt = true

[tiers.P1]
windows = [{ window = "24h", cap = 6 }]
on_exceed = "defer"
consumes = ["P1"]

[tiers.P2]
windows = [{ window = "24h", cap = 2 }, { window = "7d", cap = 5 }]
on_exceed = "drop"
consumes = ["P1", "P2"]

[tiers.P2.segments.dormant]
windows = [{ window = "7d", cap = 1 }]

[tiers.P3]
on_exceed = "drop"
consumes = ["P3"]

[topics]
news = [{ window = "24h", cap = 1 }]
"*" = [{ window = "7d", cap = 3 }]

[global]
windows = [{ window = "24h", cap = 4 }, { window = "1h", cap = 3 }]
"""


def apply_policy(conn: psycopg.Connection[Any], text: str) -> None:
    with conn.transaction():
        policy_mod.apply(conn, policy_mod.parse_policy(text), text)


def expected_rules(policy: policy_mod.Policy) -> set[tuple[Any, ...]]:
    """The compiled rows, derived independently from the parsed policy."""
    segments = ["", *sorted({s for t in policy.tiers.values() for s, _ in t.segments})]
    topic_keys = ["", "*", *sorted(k for k, ws in policy.topics.items() if ws and k != "*")]
    out = set()
    for tier in policy.tiers.values():
        if tier.exempt:
            continue
        for key in topic_keys:
            for segment in segments:
                budgets: list[tuple[str, str, tuple[policy_mod.Window, ...]]] = []
                if key and policy.topics.get(key):
                    budgets.append(("topic:", "topic", policy.topics[key]))
                own_first = sorted(tier.consumes, key=lambda c: (c != tier.name, -int(c[1:])))
                for c in own_first:
                    ws = policy.tiers[c].windows_for(segment or None)
                    if ws:
                        budgets.append((c, c, ws))
                if policy.global_windows:
                    budgets.append(("global", "global", policy.global_windows))
                for seq, (budget, scope, ws) in enumerate(budgets, start=1):
                    ordered = sorted(ws, key=lambda w: w.window_ms)
                    out.add((tier.name, key, segment, seq, budget, scope,
                             tuple(w.window_ms for w in ordered), tuple(w.cap for w in ordered)))
    return out


def compiled(conn: psycopg.Connection[Any]) -> set[tuple[Any, ...]]:
    rows = conn.execute(
        "SELECT tier, topic, segment, seq, budget, scope, windows, caps FROM gov.compiled_rules"
    ).fetchall()
    return {(*r[:6], tuple(r[6]), tuple(r[7])) for r in rows}


def budgets_of(conn: psycopg.Connection[Any], user: str, message_id: str) -> set[str]:
    rows = conn.execute("SELECT budget FROM gov.sends WHERE user_id = %s AND message_id = %s",
                        (user, message_id)).fetchall()
    return {r[0] for r in rows}


def test_compiled_rules_match_the_policy_after_apply(conn: psycopg.Connection[Any]) -> None:
    assert compiled(conn) == expected_rules(policy_mod.default_policy())
    apply_policy(conn, POLICY)
    assert compiled(conn) == expected_rules(policy_mod.parse_policy(POLICY))
    apply_policy(conn, policy_mod.default_policy_text())  # and back: nothing of the other policy stays
    assert compiled(conn) == expected_rules(policy_mod.default_policy())


def test_no_budget_row_for_a_budget_without_a_cap(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    # the default policy caps no topic and nothing globally: P1 and P2 rows only
    assert governor.decide(Message(user_id="u", id="a", tier="P2", topic="deals"), at=T0).allowed
    assert budgets_of(conn, "u", "a") == {"P1", "P2"}
    apply_policy(conn, POLICY)
    # now topics and global are capped; P3 has no windows: no P3 row
    assert governor.decide(Message(user_id="u", id="b", tier="P2", topic="deals"), at=T0).allowed
    assert budgets_of(conn, "u", "b") == {"P1", "P2", "topic:deals", "global"}
    assert governor.decide(Message(user_id="u", id="c", tier="P3"), at=T0).allowed
    assert budgets_of(conn, "u", "c") == {"global"}


def test_a_newly_capped_budget_counts_the_sends_before_it(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    for k in range(3):
        assert governor.decide(Message(user_id="u", id=f"m{k}", tier="P1"),
                               at=datetime.now(UTC) - timedelta(minutes=10 + k)).allowed
    assert "global" not in budgets_of(conn, "u", "m0")
    apply_policy(conn, policy_mod.default_policy_text() + '\n[global]\nwindows = [{ window = "24h", cap = 3 }]\n')
    assert budgets_of(conn, "u", "m0") == {"P1", "global"}  # filled from gov.messages
    blocked = governor.decide(Message(user_id="u", id="m3", tier="P1"))
    assert (blocked.allowed, blocked.reason, blocked.used) == (False, "global_cap_86400000ms", 3)


def test_one_pass_counts_agree_with_separate_counts(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    # five windows on one budget: four counted in one pass, the fifth on its own
    windows = [(1, 50), (2, 50), (3, 50), (4, 50), (5, 3)]
    text = policy_mod.default_policy_text().replace(
        'windows = [{ window = "24h", cap = 6 }]',
        "windows = [" + ", ".join(f'{{ window = "{h}h", cap = {c} }}' for h, c in windows) + "]",
    )
    apply_policy(conn, text)
    sends = [T0 - timedelta(minutes=m) for m in (290, 230, 170, 100, 5)]  # one in each hour back
    for k, when in enumerate(sends):
        conn.execute("INSERT INTO gov.sends VALUES ('u', 'P1', %s, %s)", (when, f"h{k}"))
    conn.commit()
    for h, _cap in windows:
        separate = conn.execute(
            "SELECT count(*) FROM gov.sends WHERE user_id = 'u' AND budget = 'P1' AND sent_at > %s",
            (T0 - timedelta(hours=h),),
        ).fetchone()
        assert separate is not None
        one_pass = conn.execute(
            """SELECT ARRAY[count(*) FILTER (WHERE s.sent_at > %(t)s - %(w)s[1] * interval '1 millisecond'),
                            count(*) FILTER (WHERE s.sent_at > %(t)s - %(w)s[2] * interval '1 millisecond'),
                            count(*) FILTER (WHERE s.sent_at > %(t)s - %(w)s[3] * interval '1 millisecond'),
                            count(*) FILTER (WHERE s.sent_at > %(t)s - %(w)s[4] * interval '1 millisecond')]
                 FROM gov.sends s WHERE s.user_id = 'u' AND s.budget = 'P1'
                  AND s.sent_at > %(t)s - %(w)s[4] * interval '1 millisecond'""",
            {"t": T0, "w": [w * HOUR_MS for w, _ in windows]},
        ).fetchone()
        assert one_pass is not None
        if h <= 4:
            assert one_pass[0][h - 1] == separate[0] == h
    # the decision: every window under its cap but the fifth (5 sends in 5 h, cap 3)
    blocked = governor.decide(Message(user_id="u", id="x", tier="P1"), at=T0)
    assert (blocked.allowed, blocked.reason, blocked.used, blocked.cap) == (False, "cap_18000000ms", 5, 3)
    # a fourth window's cap, reached in the one pass, blocks with its own count
    apply_policy(conn, text.replace("{ window = \"4h\", cap = 50 }", "{ window = \"4h\", cap = 4 }"))
    blocked = governor.decide(Message(user_id="u", id="y", tier="P1"), at=T0)
    assert (blocked.allowed, blocked.reason, blocked.used, blocked.cap) == (False, "cap_14400000ms", 4, 4)
    # the slot frees when the oldest row in the 4 h window leaves it
    assert blocked.retry_after_ms == (4 * 60 - 230) * 60_000


def test_segment_and_own_caps_with_compiled_rules(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    apply_policy(conn, POLICY)
    with conn.transaction():
        set_segment(conn, "d", "dormant")
        set_segment(conn, "e", "engaged")  # a segment without windows of its own: the tier's
    assert governor.decide(Message(user_id="d", id="1", tier="P2"), at=T0).allowed
    second = governor.decide(Message(user_id="d", id="2", tier="P2"), at=T0)
    assert (second.allowed, second.reason) == (False, "cap_604800000ms")
    assert [governor.decide(Message(user_id="e", id=str(k), tier="P2"), at=T0).allowed for k in range(3)] == [
        True, True, False]
    # a dormant user's own 24 h cap, over a window the segment lacks, still holds
    with conn.transaction():
        set_segment(conn, "d2", "dormant")
        set_user_cap(conn, "d2", "P2", 86_400_000, 0)
    own = governor.decide(Message(user_id="d2", id="1", tier="P2"), at=T0)
    assert (own.allowed, own.reason, own.cap) == (False, "cap_86400000ms", 0)


def test_whatif_counts_history_of_a_budget_the_live_policy_leaves_unwritten(
    governor: Governor, conn: psycopg.Connection[Any]
) -> None:
    now = T0
    for k in range(2):  # the day before the window: two P1 sends, no global rows written
        governor.decide(Message(user_id="u", id=f"old{k}", tier="P1"), at=now - timedelta(hours=30 + k))
    governor.decide(Message(user_id="u", id="new", tier="P1"), at=now - timedelta(hours=1))
    assert "global" not in budgets_of(conn, "u", "old0")
    candidate_text = policy_mod.default_policy_text() + '\n[global]\nwindows = [{ window = "48h", cap = 2 }]\n'
    result = whatif(governor, policy_mod.parse_policy(candidate_text), candidate_text,
                    since=timedelta(hours=24), now=now)
    assert (result.total.messages, result.total.would_allow, result.total.extra_suppressed) == (1, 0, 1)


def seed_history(governor: Governor, prefix: str, users: list[str]) -> None:
    for u in users:
        i = int(u)
        for k in range(i % 3):
            governor.decide(Message(user_id=prefix + u, id=f"p2-{k}", tier="P2"), at=T0 - timedelta(hours=k + 1))


def test_campaign_on_n_connections_decides_each_user_once_with_one_connections_verdicts(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    users = [f"{i:03d}" for i in range(90)]
    with Governor(db_url, pool_size=4) as gov:
        seed_history(gov, "a", users)
        seed_history(gov, "b", users)
        template = Message(user_id="-", id="sale", tier="P2", campaign_id="spring")
        one = gov.decide_many(template, ["a" + u for u in users], at=T0, batch=7, connections=1)
        many = gov.decide_many(template, ["b" + u for u in users] * 2, at=T0, batch=7, connections=4)
    assert [u for u, _ in many] == sorted("b" + u for u in users)  # each user once, in user order
    assert not any(d.repeated for _, d in many)
    assert {u[1:]: d for u, d in one} == {u[1:]: d for u, d in many}
    assert {d.allowed for _, d in many} == {True, False}
    decided = conn.execute("SELECT count(*), count(DISTINCT user_id) FROM gov.messages "
                           "WHERE message_id = 'sale' AND user_id LIKE 'b%%'").fetchone()
    assert decided == (90, 90)


def test_a_window_made_longer_after_a_prune_counts_the_sends_it_covers(
    governor: Governor, conn: psycopg.Connection[Any]
) -> None:
    """An outside probe: P2 sends 20, 19 and 18 days ago, `gov prune` (the longest window
    was 7 days: their rows went), then a policy with a 30-day cap of 3 on P2 allowed a 4th."""
    from gov.ops.maintenance import prune

    now = datetime.now(UTC)
    for k, days in enumerate((20, 19, 18)):
        assert governor.decide(Message(user_id="u", id=f"m{k}", tier="P2"), at=now - timedelta(days=days)).allowed
    assert prune(governor.source, margin=timedelta(hours=1)).sends == 6  # P1 and P2 rows of each
    longer = policy_mod.default_policy_text().replace(
        'windows = [{ window = "24h", cap = 2 }, { window = "7d", cap = 5 }]',
        'windows = [{ window = "24h", cap = 2 }, { window = "7d", cap = 5 }, { window = "30d", cap = 3 }]')
    apply_policy(conn, longer)
    blocked = governor.decide(Message(user_id="u", id="m3", tier="P2"))
    assert (blocked.allowed, blocked.reason, blocked.used) == (False, "cap_2592000000ms", 3)


def test_a_policy_change_gives_no_message_a_second_row_in_a_budget(
    governor: Governor, conn: psycopg.Connection[Any]
) -> None:
    """A deferred P1 released later holds its row at its release: the fill after a policy
    change must not add one at its decision too (it would count twice)."""
    from gov.hold.release import Releaser

    start = datetime.now(UTC) - timedelta(days=2)
    for k in range(6):  # P1: 6 a day
        sent = governor.send(Message(user_id="u", id=f"m{k}", tier="P1", title="t"), at=start + timedelta(minutes=k))
        assert sent.decision.allowed
    held = governor.send(Message(user_id="u", id="m6", tier="P1", title="t"), at=start + timedelta(hours=20))
    assert held.decision.action == "defer"  # its slot frees 4 hours later, within defer_max
    releaser = Releaser(governor.source, clock=lambda: start + timedelta(hours=24, minutes=10))
    assert releaser.run_once().outcomes["released"] == 1
    rows = dict(conn.execute("SELECT message_id, count(*) FROM gov.sends WHERE budget = 'P1' GROUP BY 1").fetchall())
    assert rows == {f"m{k}": 1 for k in range(7)}
    apply_policy(conn, policy_mod.default_policy_text() + '\n[global]\nwindows = [{ window = "7d", cap = 30 }]\n')
    rows = dict(conn.execute("SELECT message_id, count(*) FROM gov.sends WHERE budget = 'P1' GROUP BY 1").fetchall())
    assert rows == {f"m{k}": 1 for k in range(7)}
