"""The best hours from reach (gov.hour_curves_v2, gov.best_hours_v2; migration 0053): by local
hour of DELIVERY, the share of deliveries the browser displayed at once, smoothed over the
neighbouring hours and shrunk toward the segment and all users, on hand-made events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors

from tests.integration.test_best_hours import NOW, Row, at_utc_hour, best, delivered, reach_crowd, shown, user


def reach(conn: psycopg.Connection[Any], user_id: str, **kw: Any) -> list[Row]:
    args = "".join(f", {k} => %({k})s" for k in kw)
    return conn.execute(f"SELECT * FROM gov.best_hours_v2(%(u)s, p_now => %(now)s{args})",
                        {"u": user_id, "now": NOW, **kw}).fetchall()


def curve(conn: psycopg.Connection[Any], segment: str | None = None) -> list[Row]:
    return [r for r in conn.execute("SELECT * FROM gov.hour_curves_v2(p_now => %s)", (NOW,)).fetchall()
            if r[0] == segment]


def test_the_hour_is_the_deliverys_and_prompt_means_displayed_at_once(conn: psycopg.Connection[Any]) -> None:
    """A message delivered at 03:10 to a closed browser and displayed at 08:00 says "not
    reachable at 03" and nothing about 08: the hour gov chose, not the one the browser chose."""
    user(conn, "u")
    conn.execute("INSERT INTO gov.messages (user_id, message_id, tier, allowed, decided_at) "
                 "VALUES ('u', 'late', 'P2', true, %s)", (at_utc_hour(2, 3),))
    conn.execute("INSERT INTO gov.push_events (user_id, message_id, event, created_at) VALUES "
                 "('u', 'late', 'accepted', %s), ('u', 'late', 'display', %s), ('u', 'late', 'click', %s)",
                 (at_utc_hour(2, 3), at_utc_hour(2, 8, 0), at_utc_hour(2, 8, 5)))
    delivered(conn, "u", "now", at_utc_hour(3, 9), prompt=True)
    delivered(conn, "u", "otp", at_utc_hour(3, 11), prompt=True, tier="P0")  # every tier: a browser runs or not
    # displayed 4 minutes after: prompt (within the default 5); 6 minutes after: not
    for mid, after in (("four", 4), ("six", 6)):
        conn.execute("INSERT INTO gov.messages (user_id, message_id, tier, allowed, decided_at) "
                     "VALUES ('u', %s, 'P2', true, %s)", (mid, at_utc_hour(4, 14)))
        conn.execute("INSERT INTO gov.push_events (user_id, message_id, event, created_at) VALUES "
                     "('u', %s, 'accepted', %s), ('u', %s, 'close', %s)",
                     (mid, at_utc_hour(4, 14), mid, at_utc_hour(4, 14) + timedelta(minutes=after)))
    # never answered: not prompt; shown but never accepted (no delivery gov knows of): not counted
    conn.execute("INSERT INTO gov.messages (user_id, message_id, tier, allowed, decided_at) "
                 "VALUES ('u', 'lost', 'P2', true, %s)", (at_utc_hour(5, 16),))
    conn.execute("INSERT INTO gov.push_events (user_id, message_id, event, created_at) VALUES "
                 "('u', 'lost', 'accepted', %s)", (at_utc_hour(5, 16),))
    shown(conn, "u", "stray", at_utc_hour(5, 17))
    counts = [(r[0], r[1], r[2]) for r in reach(conn, "u") if r[1]]
    assert counts == [(3, 1, 0), (9, 1, 1), (11, 1, 1), (14, 2, 1), (16, 1, 0)]
    # a wider prompt makes six minutes prompt
    assert [(r[0], r[2]) for r in reach(conn, "u", p_prompt=timedelta(minutes=10)) if r[0] == 14] == [(14, 2)]


def test_a_delivery_whose_answer_is_not_in_yet_is_left_out(conn: psycopg.Connection[Any]) -> None:
    user(conn, "u")
    delivered(conn, "u", "fresh", NOW - timedelta(minutes=2), prompt=False)
    delivered(conn, "u", "older", NOW - timedelta(minutes=8), prompt=False)
    assert sum(r[1] for r in reach(conn, "u")) == 1


def test_hours_are_local_and_dst_moves_none(conn: psycopg.Connection[Any]) -> None:
    user(conn, "tokyo", "Asia/Tokyo")  # delivered 11:10 UTC is 20:10 in Tokyo
    delivered(conn, "tokyo", "t1", at_utc_hour(1, 11), prompt=True)
    assert [(r[0], r[1], r[2]) for r in reach(conn, "tokyo") if r[1]] == [(20, 1, 1)]
    user(conn, "berlin", "Europe/Berlin")  # 08:30 local either side of the spring change
    for mid, at in (("b1", datetime(2026, 3, 28, 7, 30, tzinfo=UTC)), ("b2", datetime(2026, 3, 30, 6, 30, tzinfo=UTC))):
        delivered(conn, "berlin", mid, at, prompt=True)
    spring = conn.execute(
        "SELECT hour, deliveries, prompt FROM gov.best_hours_v2('berlin', interval '7 days', %s) WHERE deliveries > 0",
        (datetime(2026, 4, 1, tzinfo=UTC),)).fetchall()
    assert spring == [(8, 2, 2)]


def test_the_curve_is_smoothed_over_neighbouring_hours_and_shrunk(conn: psycopg.Connection[Any]) -> None:
    """Reach 1/2 at 20:00, 0 elsewhere: the estimate is highest at 20, next at 19 and 21 (a
    quarter of 20's counts each), equal at every other hour, and shrunk toward the overall
    rate (1/48) with two pseudo-deliveries."""
    reach_crowd(conn)
    population = curve(conn)
    assert [r[1] for r in population] == list(range(24))
    assert population[20][2:5] == (120, 60, 0.5) and population[3][2:5] == (120, 0, 0.0)
    est = [r[5] for r in population]
    overall = 60 / (24 * 120)
    assert est[20] == pytest.approx((0.5 * 60 + 2 * overall) / (120 + 2))
    assert est[19] == est[21] == pytest.approx((0.25 * 60 + 2 * overall) / (120 + 2))
    far = [est[h] for h in range(24) if h not in (19, 20, 21)]
    assert far == pytest.approx([2 * overall / 122] * 21)
    assert est[20] > est[19] > far[0] > 0


def test_a_user_without_data_gets_the_shape_and_one_with_data_their_own(conn: psycopg.Connection[Any]) -> None:
    reach_crowd(conn)
    user(conn, "new")
    population = curve(conn)
    rows = reach(conn, "new")
    assert all(r[1:3] == (0, 0) for r in rows)
    assert [r[3] for r in rows] == [r[4] for r in rows] == pytest.approx([p[5] for p in population])
    assert best(rows) == [20]
    user(conn, "owl")
    for day in range(1, 21):  # twenty nights reachable at 03:xx, never at 20:xx
        delivered(conn, "owl", f"n{day}", at_utc_hour(day, 3), prompt=True)
        delivered(conn, "owl", f"e{day}", at_utc_hour(day, 20), prompt=False)
    owl = reach(conn, "owl")
    assert owl[3][1:3] == (20, 20) and best(owl) == [3]
    assert owl[20][4] < owl[20][3]  # their own evenings pull 20:00 below the prior
    # a stronger prior pulls back to the population's hour
    assert best(reach(conn, "owl", p_strength=500.0)) == [20]


def test_a_segments_curve_is_the_prior_of_its_users(conn: psycopg.Connection[Any]) -> None:
    reach_crowd(conn, n=6, peak=20)
    reach_crowd(conn, n=6, segment="early", peak=7, prefix="e")
    user(conn, "new-early", segment="early")
    early = curve(conn, "early")
    assert early[7][2:4] == (60, 30)
    rows = reach(conn, "new-early")
    assert [r[3] for r in rows] == pytest.approx([r[5] for r in early]) and best(rows) == [7]


def test_nonsense_arguments_are_refused(conn: psycopg.Connection[Any]) -> None:
    user(conn, "u")
    for kw in ({"p_strength": 0.0}, {"p_strength": float("nan")}, {"p_strength": float("inf")},
               {"p_prompt": timedelta(0)}, {"p_prompt": timedelta(hours=2)}, {"p_prompt": None}):
        with pytest.raises(errors.InvalidParameterValue):
            reach(conn, "u", **kw)
        conn.rollback()
    with pytest.raises(errors.InvalidParameterValue):
        conn.execute("SELECT * FROM gov.best_hours_v2(NULL)")
    conn.rollback()
    no_data = reach(conn, "u")
    assert len(no_data) == 24 and all(r[3] is None and r[4] is None and r[5] is None for r in no_data)
