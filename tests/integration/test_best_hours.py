"""The best hours (gov.best_hours_v1, gov.hour_curves_v1, gov.hour_curve): the click rate by
local hour of display, shrunk toward the segment and all users, on hand-made events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors

NOW = datetime(2026, 7, 26, 12, 0, tzinfo=UTC)
Row = tuple[Any, ...]


def user(conn: psycopg.Connection[Any], user_id: str, time_zone: str | None = "UTC",
         segment: str | None = None) -> None:
    conn.execute("INSERT INTO gov.users (user_id, time_zone, segment) VALUES (%s, %s, %s)",
                 (user_id, time_zone, segment))


def shown(conn: psycopg.Connection[Any], user_id: str, message_id: str, at: datetime, *, clicked: bool = False,
          tier: str = "P2", click_at: datetime | None = None, display: bool = True) -> None:
    """A message gov sent (tier), displayed at ``at`` and maybe clicked (later: ``click_at``)."""
    conn.execute("INSERT INTO gov.messages (user_id, message_id, tier, allowed, decided_at) "
                 "VALUES (%s, %s, %s, true, %s)", (user_id, message_id, tier, at - timedelta(minutes=1)))
    if display:
        conn.execute("INSERT INTO gov.push_events (user_id, message_id, event, created_at) "
                     "VALUES (%s, %s, 'display', %s)", (user_id, message_id, at))
    if clicked:
        conn.execute("INSERT INTO gov.push_events (user_id, message_id, event, created_at) "
                     "VALUES (%s, %s, 'click', %s)", (user_id, message_id, click_at or at + timedelta(minutes=3)))


def at_utc_hour(day: int, hour: int, minute: int = 10) -> datetime:
    return NOW - timedelta(days=day) + timedelta(hours=hour - NOW.hour, minutes=minute)


def crowd(conn: psycopg.Connection[Any], n: int = 12, segment: str | None = None, peak: int = 20,
          prefix: str = "c") -> None:
    """``n`` UTC users, each shown one message at every hour of 10 days, clicking only those at ``peak``
    on even days (a rate of 1/2 there, 0 elsewhere)."""
    for i in range(n):
        uid = f"{prefix}{i}"
        user(conn, uid, "UTC", segment)
        for day in range(1, 11):
            for hour in range(24):
                shown(conn, uid, f"m{day}-{hour}", at_utc_hour(day, hour), clicked=hour == peak and day % 2 == 0)


def delivered(conn: psycopg.Connection[Any], user_id: str, message_id: str, at: datetime, *, prompt: bool,
              tier: str = "P2") -> None:
    """A message a push service accepted at ``at``, displayed at once (``prompt``) or three hours later."""
    conn.execute("INSERT INTO gov.messages (user_id, message_id, tier, allowed, decided_at) "
                 "VALUES (%s, %s, %s, true, %s)", (user_id, message_id, tier, at - timedelta(minutes=1)))
    shown_at = at + (timedelta(seconds=20) if prompt else timedelta(hours=3))
    conn.execute("INSERT INTO gov.push_events (user_id, message_id, event, created_at) "
                 "VALUES (%s, %s, 'accepted', %s), (%s, %s, 'display', %s)",
                 (user_id, message_id, at, user_id, message_id, shown_at))


def reach_crowd(conn: psycopg.Connection[Any], n: int = 12, segment: str | None = None, peak: int = 20,
                prefix: str = "r") -> None:
    """``n`` UTC users, each delivered one message at every hour of 10 days, displayed at once only
    at ``peak`` on even days (a reach of 1/2 there, 0 elsewhere: the browser was closed)."""
    for i in range(n):
        uid = f"{prefix}{i}"
        user(conn, uid, "UTC", segment)
        for day in range(1, 11):
            for hour in range(24):
                delivered(conn, uid, f"m{day}-{hour}", at_utc_hour(day, hour), prompt=hour == peak and day % 2 == 0)


def best_hours(conn: psycopg.Connection[Any], user_id: str, **kw: Any) -> list[Row]:
    args = ", ".join(f"{k} => %({k})s" for k in kw)
    return conn.execute(f"SELECT * FROM gov.best_hours_v1(%(u)s, p_now => %(now)s{', ' + args if args else ''})",
                        {"u": user_id, "now": NOW, **kw}).fetchall()


def curve(conn: psycopg.Connection[Any], segment: str | None = None) -> list[Row]:
    return [r for r in conn.execute("SELECT * FROM gov.hour_curves_v1(p_now => %s)", (NOW,)).fetchall()
            if r[0] == segment]


def best(rows: list[Row]) -> list[int]:
    return [r[0] for r in rows if r[5]]


def test_a_user_with_no_data_gets_the_populations_curve(conn: psycopg.Connection[Any]) -> None:
    crowd(conn)
    user(conn, "new")
    population = curve(conn)
    assert [r[1] for r in population] == list(range(24))
    assert population[20][2:4] == (120, 60) and population[3][2:4] == (120, 0)
    rows = best_hours(conn, "new")
    assert [r[0] for r in rows] == list(range(24))
    assert all(r[1:3] == (0, 0) for r in rows)  # no data of their own
    # the population's shape, hour for hour: not one fixed hour with the rest flat
    assert [r[4] for r in rows] == pytest.approx([p[5] for p in population])
    assert [r[3] for r in rows] == pytest.approx([p[5] for p in population])
    assert best(rows) == [20]
    # shrunk toward all users' overall rate (1/48), not the raw 0 and 1/2
    assert 0 < rows[3][4] < 1 / 48 < rows[20][4] < 1 / 2


def test_a_user_with_much_data_gets_their_own_hours(conn: psycopg.Connection[Any]) -> None:
    crowd(conn)
    user(conn, "owl")
    for day in range(1, 41):  # 40 nights of clicking at 03:xx, never at 20:xx
        shown(conn, "owl", f"n{day}", at_utc_hour(day, 3), clicked=True)
        shown(conn, "owl", f"e{day}", at_utc_hour(day, 20))
    rows = best_hours(conn, "owl")
    assert rows[3][1:3] == (40, 40) and rows[20][1:3] == (40, 0)
    assert best(rows) == [3]
    assert rows[3][4] > 0.6 and rows[20][4] < 0.5 * rows[20][3]
    # and a user with a little data stays near the population: one click at 03:xx moves
    # that hour up, but not to the top
    user(conn, "sip")
    shown(conn, "sip", "one", at_utc_hour(2, 3), clicked=True)
    few = best_hours(conn, "sip")
    assert few[3][4] > few[3][3] and best(few) == [20]


def test_a_stronger_prior_pulls_harder(conn: psycopg.Connection[Any]) -> None:
    crowd(conn)
    user(conn, "owl")
    for day in range(1, 11):
        shown(conn, "owl", f"n{day}", at_utc_hour(day, 3), clicked=True)
    assert best(best_hours(conn, "owl", p_strength=5.0)) == [3]
    assert best(best_hours(conn, "owl", p_strength=500.0)) == [20]
    with pytest.raises(errors.InvalidParameterValue, match="positive"):
        best_hours(conn, "owl", p_strength=0.0)


def test_a_segment_with_its_own_hours_is_the_prior_of_its_users(conn: psycopg.Connection[Any]) -> None:
    crowd(conn, n=12, peak=20)
    crowd(conn, n=12, segment="early", peak=7, prefix="e")
    user(conn, "new-early", segment="early")
    user(conn, "new-none")
    early = curve(conn, "early")
    assert [r[1] for r in early] == list(range(24)) and early[7][2:4] == (120, 60)
    rows = best_hours(conn, "new-early")
    assert [r[3] for r in rows] == pytest.approx([r[5] for r in early])
    assert best(rows) == [7]
    # all users' curve has both peaks; a user without a segment gets it
    population = curve(conn)
    assert population[7][3] == population[20][3] == 60
    assert [r[4] for r in best_hours(conn, "new-none")] == pytest.approx([p[5] for p in population])


def test_hours_are_local_at_display_and_dst_moves_none(conn: psycopg.Connection[Any]) -> None:
    # Tokyo (UTC+9, no DST): displayed 11:10 UTC is 20:10 local
    user(conn, "tokyo", "Asia/Tokyo")
    shown(conn, "tokyo", "t1", at_utc_hour(1, 11), clicked=True, click_at=at_utc_hour(1, 15))
    # the click counts at the hour of display, not of the click
    rows = best_hours(conn, "tokyo")
    assert [(r[0], r[1], r[2]) for r in rows if r[1]] == [(20, 1, 1)]
    # Berlin across the spring change (29 March 2026): 08:30 local on the Saturday is
    # 07:30 UTC, on the Monday 06:30 UTC; both are hour 8
    user(conn, "berlin", "Europe/Berlin")
    for mid, at in (("b1", datetime(2026, 3, 28, 7, 30, tzinfo=UTC)), ("b2", datetime(2026, 3, 30, 6, 30, tzinfo=UTC))):
        shown(conn, "berlin", mid, at, clicked=True)
    spring = conn.execute(
        "SELECT hour, displays, clicks FROM gov.best_hours_v1('berlin', interval '7 days', %s) WHERE displays > 0",
        (datetime(2026, 4, 1, tzinfo=UTC),)).fetchall()
    assert spring == [(8, 2, 2)]
    # no zone told: UTC hours
    user(conn, "nowhere", None)
    shown(conn, "nowhere", "x1", at_utc_hour(1, 11))
    assert [r[0] for r in best_hours(conn, "nowhere") if r[1]] == [11]


def test_what_counts(conn: psycopg.Connection[Any]) -> None:
    user(conn, "u")
    shown(conn, "u", "otp", at_utc_hour(1, 9), clicked=True, tier="P0")  # urgent, not timely: left out
    shown(conn, "u", "clicked-only", at_utc_hour(1, 10), clicked=True, display=False)  # shown when clicked
    shown(conn, "u", "old", at_utc_hour(70, 12), clicked=True)  # outside the 56 days
    shown(conn, "u", "p3", at_utc_hour(2, 13), tier="P3")
    rows = best_hours(conn, "u")
    assert [(r[0], r[1], r[2]) for r in rows if r[1]] == [(10, 1, 1), (13, 1, 0)]
    wide = best_hours(conn, "u", p_since=timedelta(days=100))
    assert [(r[0], r[1], r[2]) for r in wide if r[1]] == [(10, 1, 1), (12, 1, 1), (13, 1, 0)]


def test_no_data_at_all_gives_no_best_hour(conn: psycopg.Connection[Any]) -> None:
    user(conn, "u")
    rows = best_hours(conn, "u")
    assert len(rows) == 24 and all(r[3] is None and r[4] is None and r[5] is None for r in rows)
    assert conn.execute("SELECT count(*) FROM gov.hour_curve").fetchone() == (24,)
    with pytest.raises(errors.InvalidParameterValue):
        conn.execute("SELECT * FROM gov.best_hours_v1(NULL)")


def test_everyones_estimates_at_once_are_each_users_own(conn: psycopg.Connection[Any]) -> None:
    crowd(conn, n=4, peak=20)
    crowd(conn, n=3, segment="early", peak=7, prefix="e")
    user(conn, "owl", "Asia/Tokyo")
    for day in range(1, 31):
        shown(conn, "owl", f"n{day}", at_utc_hour(day, 18), clicked=True)  # 03:10 in Tokyo
    user(conn, "silent")  # no display: not among everyone's (nothing of their own to estimate)
    everyone = conn.execute(
        "SELECT user_id, hour, displays, clicks, prior, estimate, best"
        " FROM gov.user_hour_estimates(interval '56 days', %s, 20, NULL)", (NOW,)).fetchall()
    users = sorted({r[0] for r in everyone})
    assert users == sorted([*(f"c{i}" for i in range(4)), *(f"e{i}" for i in range(3)), "owl"])
    for uid in users:
        mine = [r[1:] for r in everyone if r[0] == uid]
        assert mine == [tuple(pytest.approx(v) if isinstance(v, float) else v for v in r)
                        for r in best_hours(conn, uid)]
    assert {r[0]: r[1] for r in everyone if r[6]} == {**{f"c{i}": 20 for i in range(4)},
                                                      **{f"e{i}": 7 for i in range(3)}, "owl": 3}
