"""Moments and margins that would poison a budget are refused in SQL, writing nothing:
a decision at infinity once wrote send rows that sat in every later window of the user's,
and a prune with a negative margin deleted rows a window still reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from gov.queries import q

T0 = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)


def _count(conn: psycopg.Connection[Any], table: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM gov.{table}").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("moment", ["infinity", "-infinity"])
def test_a_decision_at_an_infinite_moment_is_refused_and_writes_nothing(
    conn: psycopg.Connection[Any], moment: str
) -> None:
    for sql in ("SELECT * FROM gov.decide_v1('u1', 'm', 'P3', NULL, NULL, %s::timestamptz)",
                "SELECT * FROM gov.send_v1('u1', 'm', 'P2', NULL, NULL, '{\"title\": \"t\"}', NULL, NULL,"
                " %s::timestamptz)"):
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(sql, (moment,))
        assert caught.value.sqlstate == "GV001", caught.value
    # the set path (a batch of plain users) refuses it too
    params = {"shard_key": None, "user_ids": ["a", "b"], "message_ids": ["m", "m"], "tiers": ["P2", "P2"],
              "topics": [None, None], "campaign_ids": [None, None], "contents": ['{"title": "t"}'] * 2,
              "collapse_keys": [None, None], "ttls": [None, None], "now": moment}
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(q("send_batch"), params)
    assert caught.value.sqlstate == "GV001", caught.value
    assert (_count(conn, "sends"), _count(conn, "messages")) == (0, 0)
    # the user's budget is untouched: the first P3 of the week is allowed
    row = conn.execute("SELECT allowed FROM gov.decide_v1('u1', 'now', 'P3', NULL, NULL, %s)", (T0,)).fetchone()
    assert row == (True,)


@pytest.mark.parametrize(("sql", "arg"), [
    ("SELECT gov.prune_sends_v1(1000, %s::interval, %s)", "-8 days"),
    ("SELECT gov.prune_history_v1(1000, %s::interval, %s)", "-1 day"),
])
def test_a_prune_with_a_negative_margin_is_refused_and_deletes_nothing(
    conn: psycopg.Connection[Any], sql: str, arg: str
) -> None:
    for k in range(3):  # two allowed P2 sends and a refusal (its suppression row: history)
        conn.execute("SELECT * FROM gov.decide_v1('u1', %s, 'P2', NULL, NULL, %s)", (f"m{k}", T0))
    before = (_count(conn, "sends"), _count(conn, "push_suppressions"))
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(sql, (arg, T0))
    assert caught.value.sqlstate == "GV003", caught.value
    assert (_count(conn, "sends"), _count(conn, "push_suppressions")) == before
    row = conn.execute("SELECT allowed FROM gov.decide_v1('u1', 'm3', 'P2', NULL, NULL, %s)", (T0,)).fetchone()
    assert row == (False,)  # still at the cap


# ---------------------------------------------------------------- found by an outside probe (migration 0044)

NOW = datetime.now(UTC).replace(microsecond=0)
CONTENT = '{"title": "t"}'


def _refused(conn: psycopg.Connection[Any], sql: str, args: tuple[Any, ...], sqlstate: str) -> None:
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(sql, args)
    assert caught.value.sqlstate == sqlstate, caught.value


def _fill(conn: psycopg.Connection[Any], user: str, at: datetime) -> None:
    """Two allowed P2 sends and a refusal: the user is at the daily cap of 2."""
    for k in range(3):
        conn.execute("SELECT * FROM gov.decide_v1(%s, %s, 'P2', NULL, NULL, %s)", (user, f"m{k}", at))


def test_a_prune_at_a_moment_ahead_of_the_clock_is_refused_and_the_cap_holds(conn: psycopg.Connection[Any]) -> None:
    _fill(conn, "u1", NOW)
    before = (_count(conn, "sends"), conn.execute("SELECT pruned_before FROM gov.settings").fetchone())
    for ahead in (timedelta(days=8), timedelta(days=100_000)):
        _refused(conn, "SELECT gov.prune_sends_v1(1000, '0', %s)", (NOW + ahead,), "GV003")
        _refused(conn, "SELECT gov.prune_history_v1(1000, '0', %s)", (NOW + ahead,), "GV003")
    assert (_count(conn, "sends"), conn.execute("SELECT pruned_before FROM gov.settings").fetchone()) == before
    row = conn.execute("SELECT allowed FROM gov.decide_v1('u1', 'm3', 'P2', NULL, NULL, NULL)").fetchone()
    assert row == (False,)  # still at the cap, at the real clock


@pytest.mark.parametrize("moment", ["294276-12-31 00:00:00+00", "2400-01-01 00:00:00+00"])
def test_a_decision_far_ahead_of_the_clock_is_refused_and_writes_nothing(
    conn: psycopg.Connection[Any], moment: str
) -> None:
    _refused(conn, "SELECT * FROM gov.decide_v1('u1', 'f', 'P2', NULL, NULL, %s::timestamptz)", (moment,), "GV001")
    params = {"shard_key": None, "user_ids": ["a", "b"], "message_ids": ["m", "m"], "tiers": ["P2", "P2"],
              "topics": [None, None], "campaign_ids": [None, None], "contents": [CONTENT] * 2,
              "collapse_keys": [None, None], "ttls": [None, None], "now": moment}
    _refused(conn, q("send_batch"), params, "GV001")  # type: ignore[arg-type]
    assert (_count(conn, "sends"), _count(conn, "messages")) == (0, 0)
    # a test's or a simulation's clock a little ahead is still a clock
    row = conn.execute("SELECT allowed FROM gov.decide_v1('u1', 'g', 'P2', NULL, NULL, %s)",
                       (NOW + timedelta(days=7),)).fetchone()
    assert row == (True,)


def test_a_claim_with_a_long_lease_or_far_ahead_strands_nothing(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT gov.subscribe_v2('u1', 'https://push.example/1', 'k', 'a')")
    conn.execute("SELECT * FROM gov.send_v1('u1', 'm', 'P0', NULL, NULL, %s, NULL, NULL, %s)", (CONTENT, NOW))
    claim = "SELECT * FROM gov.claim_outbox_v3(NULL, 'w', 5, %s, %s)"
    _refused(conn, claim, (3_153_600_000_000, NOW), "22023")  # a hundred years
    _refused(conn, claim, (60_000, NOW + timedelta(days=400)), "22023")
    _refused(conn, claim, (60_000, "infinity"), "22023")
    assert conn.execute("SELECT state, claim_token FROM gov.outbox").fetchall() == [("pending", 0)]
    assert len(conn.execute(claim, (86_400_000, NOW)).fetchall()) == 1  # a day is a lease


def test_an_exempt_tiers_messages_are_never_retired(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT gov.subscribe_v2('u1', 'https://push.example/1', 'k', 'a')")
    conn.execute("SELECT * FROM gov.send_v1('u1', 'm', 'P0', NULL, NULL, %s, NULL, NULL, %s)", (CONTENT, NOW))
    _refused(conn, "SELECT * FROM gov.retire_tiers_v1(ARRAY['P0'], true, NULL)", (), "GV003")
    _refused(conn, "SELECT * FROM gov.retire_tiers_v1(ARRAY[NULL], true, NULL)", (), "GV003")
    assert conn.execute("SELECT state FROM gov.outbox").fetchall() == [("pending",)]
    assert _count(conn, "push_suppressions") == 0
    # counting them (what gov policy apply asks first) is fine
    assert conn.execute("SELECT * FROM gov.retire_tiers_v1(ARRAY['P0'], false, NULL)").fetchall() == [("P0", 0, 1)]


@pytest.mark.parametrize("content", [None, "[]", '"t"', "{}", '{"title": ""}', '{"title": "  "}', '{"title": 5}',
                                     '{"title": "' + "x" * 5000 + '"}'])
def test_content_no_push_can_be_built_from_is_refused_before_a_slot_is_spent(
    conn: psycopg.Connection[Any], content: str | None
) -> None:
    _refused(conn, "SELECT * FROM gov.send_v1('u1', 'm', 'P2', NULL, NULL, %s, NULL, NULL, %s)", (content, NOW),
             "GV001")
    params = {"shard_key": None, "user_ids": ["a", "b"], "message_ids": ["m", "m"], "tiers": ["P2", "P2"],
              "topics": [None, None], "campaign_ids": [None, None], "contents": [CONTENT, content],
              "collapse_keys": [None, None], "ttls": [None, None], "now": NOW}
    _refused(conn, q("send_batch"), params, "GV001")  # type: ignore[arg-type]
    _refused(conn, "SELECT * FROM gov.send_many_v2(NULL, ARRAY['a', 'b'], 'm', 'P2', NULL, NULL, %s, NULL, NULL, %s)",
             (content, NOW), "GV001")
    assert (_count(conn, "sends"), _count(conn, "messages"), _count(conn, "message_content")) == (0, 0, 0)


def test_a_ttl_past_28_days_and_ids_past_256_characters_are_refused_by_name(conn: psycopg.Connection[Any]) -> None:
    send = "SELECT * FROM gov.send_v1(%s, %s, 'P2', NULL, NULL, %s, NULL, %s, %s)"
    _refused(conn, send, ("u1", "m", CONTENT, 2_419_201, NOW), "GV001")
    _refused(conn, send, ("u" * 257, "m", CONTENT, None, NOW), "GV001")
    _refused(conn, send, ("u1", "m" * 257, CONTENT, None, NOW), "GV001")
    assert _count(conn, "messages") == 0


def test_events_and_segments_at_infinity_are_refused(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT * FROM gov.send_v1('u1', 'm', 'P0', NULL, NULL, %s, NULL, NULL, %s)", (CONTENT, NOW))
    for moment in ("infinity", "-infinity"):
        _refused(conn, "SELECT gov.record_event_v1('u1', 'm', 'click', NULL, %s::timestamptz)", (moment,), "GV003")
        _refused(conn, "SELECT * FROM gov.refresh_segments_v1(%s::timestamptz)", (moment,), "GV003")
    assert _count(conn, "push_events") == 0


@pytest.mark.parametrize("strength", ["nan", "infinity", "-infinity", "0"])
def test_the_hour_estimates_refuse_a_prior_strength_that_is_not_a_number_of_displays(
    conn: psycopg.Connection[Any], strength: str
) -> None:
    _refused(conn, "SELECT * FROM gov.hour_curves_v1('56 days', NULL, %s::float8)", (strength,), "22023")
    _refused(conn, "SELECT * FROM gov.best_hours_v1('u1', '56 days', NULL, %s::float8)", (strength,), "22023")


def test_the_fatigue_measure_refuses_a_minimum_that_is_not_a_count(conn: psycopg.Connection[Any]) -> None:
    for minimum in (-5, None):
        _refused(conn, "SELECT * FROM gov.fatigue_marginal_v1('28 days', NULL, %s)", (minimum,), "22023")
    assert conn.execute("SELECT gov.sends_to_decide_v1(30, 10, 1000, -1.96)").fetchone() == (None,)
    assert conn.execute("SELECT gov.sends_to_decide_v1(30, 10, 1000, 'nan')").fetchone() == (None,)
    assert conn.execute("SELECT gov.sends_to_decide_v1(30, 10, 1000)").fetchone() != (None,)
