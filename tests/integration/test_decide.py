"""The decision, against a real PostgreSQL: the seeds' checks and the invariants."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from gov import Governor, InvalidMessage, Message, PolicyError
from gov import policy as policy_mod
from gov.hold.release import Releaser
from gov.users import set_user_cap

DAY_MS = 86_400_000
T0 = datetime(2026, 7, 26, 12, 0, tzinfo=UTC)


def msg(user: str, mid: str, tier: str, **kw: Any) -> Message:
    return Message(user_id=user, id=mid, tier=tier, **kw)


def count(conn: psycopg.Connection[Any], query: str, *args: Any) -> int:
    row = conn.execute(query, args or None).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return int(row[0])


def apply_policy(conn: psycopg.Connection[Any], text: str) -> None:
    with conn.transaction():
        policy_mod.apply(conn, policy_mod.parse_policy(text), text)


def test_seed_verification(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    verdicts = [governor.decide(msg("u42", f"m{i}", "P2")) for i in (1, 2, 3)]
    assert [v.allowed for v in verdicts] == [True, True, False]
    assert verdicts[2].as_json()["action"] == "drop"
    assert verdicts[2].reason == "cap_86400000ms"
    assert verdicts[2].used == 2 and verdicts[2].cap == 2
    assert governor.decide(msg("u42", "otp-1", "P0")).allowed
    # the window's rows, read in SQL: two P2 sends, each also spent in P1; the default
    # policy caps no global budget, so none is written for it
    rows = conn.execute(
        "SELECT budget, message_id FROM gov.sends WHERE user_id = 'u42' ORDER BY budget, message_id"
    ).fetchall()
    assert rows == [("P1", "m1"), ("P1", "m2"), ("P2", "m1"), ("P2", "m2")]
    sup = conn.execute(
        "SELECT user_id, message_id, tier, blocked_by, action FROM gov.push_suppressions"
    ).fetchall()
    assert sup == [("u42", "m3", "P2", "cap_86400000ms", "drop")]


def test_rolling_window_has_no_midnight_burst(governor: Governor) -> None:
    evening = datetime(2026, 7, 26, 23, 45, tzinfo=UTC)
    morning = evening + timedelta(minutes=20)  # 00:05 the next calendar day
    first = [governor.decide(msg("u1", f"e{i}", "P2"), at=evening) for i in (1, 2)]
    later = [governor.decide(msg("u1", f"n{i}", "P2"), at=morning) for i in (1, 2)]
    assert [v.allowed for v in first] == [True, True]
    assert [v.allowed for v in later] == [False, False]
    # the slot frees exactly 24 h after the oldest, as retry_after_ms said
    assert later[0].retry_after_ms == DAY_MS - 20 * 60_000
    free_at = morning + timedelta(milliseconds=later[0].retry_after_ms)
    assert free_at == evening + timedelta(days=1)
    assert not governor.decide(msg("u1", "x1", "P2"), at=free_at - timedelta(milliseconds=1)).allowed
    assert governor.decide(msg("u1", "x2", "P2"), at=free_at).allowed


def test_cascade_spends_lower_tiers(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    # P1 allows 6 / 24 h; one P2 and one P3 spend two of them
    assert governor.decide(msg("u", "a", "P2"), at=T0).allowed
    assert governor.decide(msg("u", "c", "P3"), at=T0).allowed
    budgets = dict(conn.execute("SELECT budget, count(*) FROM gov.sends GROUP BY budget").fetchall())
    assert budgets == {"P1": 2, "P2": 2, "P3": 1}  # no global cap in the default policy: no global rows
    # the P3 spent P2 budget too: P2's 2 / 24 h is now full
    p2 = governor.decide(msg("u", "b", "P2"), at=T0)
    assert (p2.allowed, p2.reason, p2.used) == (False, "cap_86400000ms", 2)
    for i in range(4):
        assert governor.decide(msg("u", f"p1-{i}", "P1"), at=T0).allowed
    blocked = governor.decide(msg("u", "p1-x", "P1"), at=T0)
    assert (blocked.allowed, blocked.action, blocked.reason) == (False, "defer", "cap_86400000ms")
    assert blocked.used == 6


def test_blocked_message_records_nothing_anywhere(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    apply_policy(conn, policy_mod.default_policy_text() + '\n[global]\nwindows = [{ window = "24h", cap = 1 }]\n')
    assert governor.decide(msg("u", "a", "P1", topic="news"), at=T0).allowed
    before = count(conn, "SELECT count(*) FROM gov.sends")
    # passes the P3, P2 and P1 windows but fails the global cap: nothing may be spent
    blocked = governor.decide(msg("u", "b", "P3", topic="other"), at=T0)
    assert (blocked.allowed, blocked.reason, blocked.action) == (False, "global_cap_86400000ms", "collapse")
    assert count(conn, "SELECT count(*) FROM gov.sends") == before
    assert count(conn, "SELECT count(*) FROM gov.sends WHERE message_id = 'b'") == 0
    assert count(conn, "SELECT count(*) FROM gov.push_suppressions WHERE message_id = 'b'") == 1


TOPIC_POLICY = """
[tiers.P0]
exempt = true
[tiers.P1]
windows = [{ window = "24h", cap = 10 }]
on_exceed = "drop"
[topics]
"*" = [{ window = "7d", cap = 2 }]
watchlist = [{ window = "7d", cap = 1 }]
[global]
windows = [{ window = "24h", cap = 3 }]
"""


def test_topic_caps_share_the_global_budget_fairly(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    apply_policy(conn, TOPIC_POLICY)
    # the price watcher runs first; its topic cap keeps a share of the global 3 for the digest
    price = [governor.decide(msg("u", f"price{i}", "P1", topic="price"), at=T0) for i in range(3)]
    assert [v.allowed for v in price] == [True, True, False]
    assert price[2].reason == "topic_cap_604800000ms"
    digest = governor.decide(msg("u", "digest1", "P1", topic="digest"), at=T0)
    assert digest.allowed
    # a topic with its own entry uses it instead of "*"
    watch = governor.decide(msg("u2", "w1", "P1", topic="watchlist"), at=T0)
    watch2 = governor.decide(msg("u2", "w2", "P1", topic="watchlist"), at=T0)
    assert watch.allowed and not watch2.allowed
    # the global cap is the backstop: 3 sends in 24 h whatever the topic
    assert not governor.decide(msg("u", "digest2", "P1", topic="digest"), at=T0).allowed
    last = governor.decide(msg("u", "other", "P1", topic="another"), at=T0)
    assert (last.allowed, last.reason, last.used, last.cap) == (False, "global_cap_86400000ms", 3, 3)


def test_user_override_only_lowers(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    with conn.transaction():
        set_user_cap(conn, "shy", "P2", DAY_MS, 1)
    assert governor.decide(msg("shy", "a", "P2"), at=T0).allowed
    blocked = governor.decide(msg("shy", "b", "P2"), at=T0)
    assert (blocked.allowed, blocked.cap) == (False, 1)
    # others keep the default
    assert governor.decide(msg("bold", "a", "P2"), at=T0).allowed
    assert governor.decide(msg("bold", "b", "P2"), at=T0).allowed
    with pytest.raises(PolicyError, match="above the default"):
        set_user_cap(conn, "greedy", "P2", DAY_MS, 3)
    with pytest.raises(PolicyError, match="no default"):
        set_user_cap(conn, "odd", "P2", 3_600_000, 1)
    assert count(conn, "SELECT count(*) FROM gov.user_caps WHERE user_id IN ('greedy', 'odd')") == 0
    # refused also when written in plain SQL: the rule lives in the database
    with pytest.raises(psycopg.Error) as refused:
        conn.execute("INSERT INTO gov.user_caps VALUES ('sql', 'P2', 86400000, 9)")
    assert refused.value.sqlstate == "GV002"


def test_lowered_cap_retry_after_waits_for_enough_slots(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    assert governor.decide(msg("u", "a", "P2"), at=T0).allowed
    assert governor.decide(msg("u", "b", "P2"), at=T0 + timedelta(hours=1)).allowed
    with conn.transaction():
        set_user_cap(conn, "u", "P2", DAY_MS, 1)
    blocked = governor.decide(msg("u", "c", "P2"), at=T0 + timedelta(hours=2))
    # two sends against a cap of one: the slot frees when the *second* leaves the window
    assert blocked.retry_after_ms == (DAY_MS - 3_600_000)


def test_repeat_returns_first_verdict_and_spends_nothing(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    first = governor.decide(msg("u", "m1", "P2"), at=T0)
    again = governor.decide(msg("u", "m1", "P2"), at=T0 + timedelta(minutes=1))
    assert first.allowed and again.allowed and again.repeated and not first.repeated
    # one spend: P1 and P2 (the default policy caps no global budget), not a second one
    assert count(conn, "SELECT count(*) FROM gov.sends WHERE message_id = 'm1'") == 2
    governor.decide(msg("u", "m2", "P2"), at=T0)
    no = governor.decide(msg("u", "m3", "P2"), at=T0)
    no_again = governor.decide(msg("u", "m3", "P2"), at=T0 + timedelta(days=2))
    assert not no.allowed and not no_again.allowed and no_again.repeated
    assert no_again.reason == no.reason and no_again.retry_after_ms == no.retry_after_ms
    assert count(conn, "SELECT count(*) FROM gov.push_suppressions WHERE message_id = 'm3'") == 1


def test_p0_never_recorded_never_suppressed(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    apply_policy(conn, policy_mod.default_policy_text() + '\n[global]\nwindows = [{ window = "24h", cap = 1 }]\n')
    for tier in ("P1", "P2", "P3"):
        governor.decide(msg("u", f"fill-{tier}", tier), at=T0)
    for i in range(20):
        assert governor.decide(msg("u", f"otp-{i}", "P0"), at=T0).allowed
    assert count(conn, "SELECT count(*) FROM gov.sends WHERE message_id LIKE 'otp-%'") == 0
    assert count(conn, "SELECT count(*) FROM gov.push_suppressions WHERE tier = 'P0'") == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"user_id": "u", "id": "m", "tier": None}, "tier is required"),
        ({"user_id": "u", "id": "m", "tier": ""}, "tier is required"),
        ({"user_id": "u", "id": "m", "tier": "urgent"}, "unknown tier"),
        ({"user_id": "", "id": "m", "tier": "P1"}, "user_id must not be empty"),
        ({"user_id": "u", "id": " ", "tier": "P1"}, "message id must not be empty"),
        ({"user_id": "u\x00", "id": "m", "tier": "P1"}, "NUL"),
        ({"user_id": "u", "id": "m" * 300, "tier": "P1"}, "at most 256"),
    ],
)
def test_bad_message_refused_before_the_database(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidMessage, match=match):
        Message(**kwargs)


def test_tier_unknown_to_policy_records_nothing(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(InvalidMessage, match="unknown tier P7"):
        governor.decide(msg("u", "m", "P7"))
    assert count(conn, "SELECT count(*) FROM gov.messages") == 0


def test_decision_commits_with_the_callers_transaction(db_url: str, conn: psycopg.Connection[Any]) -> None:
    with psycopg.connect(db_url) as own:
        gov = Governor(own)
        assert gov.decide(msg("u", "m1", "P2"), at=T0).allowed
        own.rollback()  # the caller changes their mind: the decision goes with it
        assert count(conn, "SELECT count(*) FROM gov.messages") == 0
        assert gov.decide(msg("u", "m1", "P2"), at=T0).allowed
        own.commit()
    assert count(conn, "SELECT count(*) FROM gov.sends WHERE message_id = 'm1'") == 2  # P1, P2


def test_sqlalchemy_engine_and_connection(db_url: str, conn: psycopg.Connection[Any]) -> None:
    import sqlalchemy

    from gov.db import sqlalchemy_url

    engine = sqlalchemy.create_engine(sqlalchemy_url(db_url))
    try:
        with Governor(engine) as gov:
            assert gov.decide(msg("u", "e1", "P2"), at=T0).allowed
        with engine.connect() as sa_conn:
            gov = Governor(sa_conn)
            assert gov.decide(msg("u", "e2", "P2"), at=T0).allowed
            sa_conn.commit()
    finally:
        engine.dispose()
    assert count(conn, "SELECT count(*) FROM gov.messages WHERE allowed") == 2


def test_one_round_trip_per_decision(db_url: str, tmp_path: Any) -> None:
    """Count what goes over the wire with libpq's own protocol trace."""
    trace = tmp_path / "trace.txt"
    # configured as Governor's own pool configures its connections
    with psycopg.connect(db_url, autocommit=True, prepare_threshold=0) as c:
        gov = Governor(c)
        gov.decide(msg("u", "warm", "P2"), at=T0)  # first use prepares the statement
        with open(trace, "w") as fh:
            c.pgconn.trace(fh.fileno())
            try:
                v1 = gov.decide(msg("u", "m1", "P2"), at=T0)  # allowed: the write path
                v2 = gov.decide(msg("u", "m2", "P2"), at=T0)  # suppressed: the logging path
            finally:
                c.pgconn.untrace()
    assert v1.allowed and not v2.allowed
    # libpq trace lines: timestamp, direction (F = to the server), length, message type
    sent = [line.split("\t")[3].split(" ")[0] for line in trace.read_text().splitlines() if "\tF\t" in line]
    # each decision: Bind, Execute, Sync — one Sync, one round trip; no BEGIN/COMMIT
    assert sent.count("Sync") == 2, sent
    assert "Query" not in sent, sent


ROUNDS = 20
RACERS = 20


def race_once(conns: list[psycopg.Connection[Any]], user: str,
              decide: Callable[[Governor, int, str], bool] | None = None) -> list[bool]:
    """Every connection decides a P2 for ``user`` at once, released by one barrier.
    ``decide(governor, i, user)`` says whether racer ``i``'s message was allowed (default:
    ``Governor.decide`` of message ``m<i>``)."""
    barrier = threading.Barrier(len(conns))
    results: list[bool] = []
    lock = threading.Lock()

    def racer(i: int, c: psycopg.Connection[Any]) -> None:
        gov = Governor(c)
        barrier.wait()
        allowed = decide(gov, i, user) if decide is not None else gov.decide(msg(user, f"m{i}", "P2")).allowed
        with lock:
            results.append(allowed)

    threads = [threading.Thread(target=racer, args=(i, c)) for i, c in enumerate(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return results


def test_twenty_way_race_gives_exactly_two(db_url: str, conn: psycopg.Connection[Any]) -> None:
    """The seeds' atomicity check: 20 connections released together, cap 2 / 24 h."""
    conns = [psycopg.connect(db_url, autocommit=True) for _ in range(RACERS)]
    try:
        for round_no in range(ROUNDS):
            user = f"fresh-{round_no}"
            results = race_once(conns, user)
            assert len(results) == RACERS
            assert results.count(True) == 2, f"round {round_no}: {results.count(True)} allowed"
            # and no budget leaked: exactly two P1 and two P2 rows for the user
            assert count(conn, "SELECT count(*) FROM gov.sends WHERE user_id = %s AND budget = 'P1'", user) == 2
            assert count(conn, "SELECT count(*) FROM gov.push_suppressions WHERE user_id = %s", user) == 18
    finally:
        for c in conns:
            c.close()


# Each segment its own P2 cap over its own window (none: the tier's 2 a day), so a race
# that used the wrong segment's windows, or none, would allow the wrong count.
SEGMENT_RACE_POLICY = policy_mod.default_policy_text() + """
[tiers.P2.segments.engaged]
windows = [{ window = "24h", cap = 5 }]
[tiers.P2.segments.casual]
windows = [{ window = "24h", cap = 3 }, { window = "7d", cap = 4 }]
[tiers.P2.segments.dormant]
windows = [{ window = "7d", cap = 1 }]
"""
SEGMENT_RACE_CAPS = {"engaged": 5, "casual": 3, "dormant": 1, None: 2}


@pytest.mark.parametrize("segment", ["engaged", "casual", "dormant", None], ids=str)
def test_twenty_way_race_is_exact_for_a_user_of_each_segment(
    db_url: str, conn: psycopg.Connection[Any], segment: str | None
) -> None:
    """The same race for a user of each segment: 20 connections released together against
    that segment's cap allow exactly the cap, spend it once, and log the rest."""
    apply_policy(conn, SEGMENT_RACE_POLICY)
    cap = SEGMENT_RACE_CAPS[segment]
    conns = [psycopg.connect(db_url, autocommit=True) for _ in range(RACERS)]
    try:
        for round_no in range(ROUNDS):
            user = f"{segment}-{round_no}"
            conn.execute("INSERT INTO gov.users (user_id, segment) VALUES (%s, %s)", (user, segment))
            results = race_once(conns, user)
            assert len(results) == RACERS
            assert results.count(True) == cap, f"{segment} round {round_no}: {results.count(True)} allowed"
            for budget in ("P1", "P2"):
                assert count(conn, "SELECT count(*) FROM gov.sends WHERE user_id = %s AND budget = %s",
                             user, budget) == cap
            assert count(conn, "SELECT count(*) FROM gov.push_suppressions WHERE user_id = %s AND cap = %s "
                               "AND segment IS NOT DISTINCT FROM %s", user, cap, segment) == RACERS - cap
    finally:
        for c in conns:
            c.close()


def test_topic_opt_out_drops_whatever_the_verb(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    conn.execute("INSERT INTO gov.user_topic_optouts (user_id, topic) VALUES ('u', 'promos')")
    for tier in ("P1", "P2", "P3"):
        v = governor.decide(msg("u", f"{tier}-promo", tier, topic="promos"), at=T0)
        assert (v.allowed, v.action, v.reason) == (False, "drop", "topic_opt_out")
    assert governor.decide(msg("u", "news", "P2", topic="news"), at=T0).allowed
    assert governor.decide(msg("u", "otp", "P0", topic="promos"), at=T0).allowed  # P0 is never suppressed
    assert count(conn, "SELECT count(*) FROM gov.sends WHERE message_id LIKE '%%promo'") == 0


SENT: list[Any] = []  # every parameter RecordingCursor passed on


class RecordingCursor(psycopg.Cursor[Any]):
    """Keeps every parameter gov sends, to show which clock a statement was given."""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        SENT.extend(params.values() if isinstance(params, dict) else (params or ()))
        return super().execute(query, params, **kwargs)


def _times_sent(db_url: str, clock: Any) -> list[datetime]:
    """Decide, send and release once through a connection that records the parameters."""
    SENT.clear()
    with psycopg.connect(db_url, autocommit=True, cursor_factory=RecordingCursor) as c:
        gov = Governor(c, clock=clock)
        assert gov.decide(msg("u", "m1", "P2")).allowed
        gov.send(Message(user_id="u", id="m2", tier="P1", title="t"), deliver=False)
        Releaser(gov.source, clock=clock).run_once()
    return [v for v in SENT if isinstance(v, datetime)]


def test_with_no_clock_given_the_database_clock_decides(db_url: str, conn: psycopg.Connection[Any]) -> None:
    """Invariant 2: the host's clock never becomes a decision's time.

    The host and the server share a clock here, so a skew test could not tell them apart;
    what the SQL is given can: no time at all, so the statement reads clock_timestamp().
    """
    assert _times_sent(db_url, None) == []
    # the recorder does see a time when one is given: the simulation clock's
    assert set(_times_sent(db_url, lambda: T0)) == {T0}
