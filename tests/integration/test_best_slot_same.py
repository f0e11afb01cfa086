"""gov.best_slot after migration 0055 (quiet hours asked in the estimate's order, only as far
as the answer needs) chooses what it chose at 0054 (every candidate asked first), on a grid of
users, zones, quiet hours, own data, tiers, first slots, deadlines and explore draws."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from typing import Any

import psycopg

from gov.queries import sql_dir
from gov.users import set_quiet_hours, set_time_zone
from tests.integration.test_best_hours import at_utc_hour, delivered, user
from tests.integration.test_timing import curves, set_timing

FIRSTS = (datetime(2026, 7, 27, 8, 0, tzinfo=UTC), datetime(2026, 7, 27, 13, 30, tzinfo=UTC),
          datetime(2026, 10, 24, 21, 0, tzinfo=UTC), datetime(2026, 3, 28, 23, 45, tzinfo=UTC))
WITHIN = (timedelta(minutes=30), timedelta(hours=3), timedelta(hours=13), timedelta(hours=25),
          timedelta(hours=49), timedelta(days=8))


def reference(conn: psycopg.Connection[Any]) -> None:
    """gov.best_slot as migration 0054 left it (0055's down script), as gov.best_slot_0054."""
    text = (sql_dir() / "migrations" / "0055_hold_timing_cheap.down.sql").read_text()
    start = text.index("CREATE OR REPLACE FUNCTION gov.best_slot(")
    body = text[start:text.index("\n$$;\n", start) + 4]
    conn.execute(body.replace("FUNCTION gov.best_slot(", "FUNCTION gov.best_slot_0054(", 1))


def test_the_slot_is_the_one_every_candidate_asked_first_gave(conn: psycopg.Connection[Any]) -> None:
    set_timing(conn, "enabled = true\nexplore = 0.3")
    curves(conn)  # all users reachable at 20:00 UTC
    reference(conn)
    people = {"utc": "UTC", "berlin": "Europe/Berlin", "tokyo": "Asia/Tokyo", "ny": "America/New_York",
              "lunch": "Europe/Berlin", "owl": "UTC"}
    for uid, zone in people.items():
        user(conn, uid, None)
        set_time_zone(conn, uid, zone)
    set_quiet_hours(conn, "lunch", (time(12, 0), time(15, 0)))  # quiet at the lunch hours, not at night
    for day in range(1, 15):  # the owl is reachable at 03:00 UTC, inside the default quiet hours
        delivered(conn, "owl", f"owl-{day}", at_utc_hour(day, 3), prompt=True)
    user(conn, "nowhere", None)  # no zone: no quiet hours
    compared = differ = 0
    for uid in [*people, "nowhere"]:
        for first in FIRSTS:
            first = conn.execute("SELECT gov.quiet_until(%s, %s)", (uid, first)).fetchone()[0]  # type: ignore[index]
            for within in WITHIN:
                for tier in ("P1", "P2", "P3"):
                    for seed in ("m1", "m2", "m3"):
                        args = (uid, tier, f"{uid}-{seed}", first, first + within, first)
                        new = conn.execute("SELECT * FROM gov.best_slot(%s, %s, %s, %s, %s, %s)", args).fetchone()
                        old = conn.execute("SELECT * FROM gov.best_slot_0054(%s, %s, %s, %s, %s, %s)",
                                           args).fetchone()
                        compared += 1
                        differ += new != old
                        assert new == old, (args, new, old)
    assert compared == 7 * 4 * 6 * 3 * 3 and differ == 0
    timings = {r[0] for r in conn.execute(
        "SELECT (gov.best_slot(u, 'P2', u || '-x', t, t + interval '2 days', t)).o_timing "
        "FROM unnest(ARRAY['utc', 'ny', 'owl']) u, unnest(ARRAY[%s::timestamptz]) t", (FIRSTS[0],)).fetchall()}
    assert "best" in timings  # the grid exercised the choice, not only its refusals
