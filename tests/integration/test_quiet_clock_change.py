"""Quiet hours end when the user's clock reads their end, also on the nights the clocks
change (migration 0046). An outside probe compared gov.quiet_until with a minute-by-minute
model in zoneinfo: the end came 15 minutes to 2 hours late where the end's local time is
skipped (spring) or repeated by a shift of two hours (Antarctica/Troll)."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest


def _user(conn: psycopg.Connection[Any], user: str, zone: str, start: str, end: str) -> None:
    conn.execute("INSERT INTO gov.users (user_id, time_zone, quiet_start, quiet_end) VALUES (%s, %s, %s, %s)",
                 (user, zone, start, end))


def _until(conn: psycopg.Connection[Any], user: str, at: datetime) -> datetime:
    row = conn.execute("SELECT gov.quiet_until(%s, %s)", (user, at)).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize(("zone", "start", "end", "at", "expected"), [
    # 02:30 does not exist on 2026-03-29 in Berlin: the clocks go from 02:00 to 03:00
    ("Europe/Berlin", "01:00", "02:30", datetime(2026, 3, 29, 0, 0, tzinfo=UTC),
     datetime(2026, 3, 29, 1, 0, tzinfo=UTC)),
    ("America/New_York", "01:00", "02:30", datetime(2026, 3, 8, 6, 0, tzinfo=UTC),
     datetime(2026, 3, 8, 7, 0, tzinfo=UTC)),
    # Troll goes from +02 to +00 at 01:00 UTC: 02:30 local first comes at 00:30 UTC
    ("Antarctica/Troll", "01:00", "02:30", datetime(2026, 10, 24, 23, 0, tzinfo=UTC),
     datetime(2026, 10, 25, 0, 30, tzinfo=UTC)),
    # Santiago skips from 00:00 to 01:00: a quiet end at 00:30 comes at 01:00 local
    ("America/Santiago", "23:30", "00:30", datetime(2026, 9, 6, 3, 30, tzinfo=UTC),
     datetime(2026, 9, 6, 4, 0, tzinfo=UTC)),
    # Havana repeats 00:00-01:00 (01:00 CDT back to 00:00 CST): at 00:05 CDT the next 00:00 is the CST one
    ("America/Havana", "00:01", "00:00", datetime(2026, 11, 1, 4, 5, tzinfo=UTC),
     datetime(2026, 11, 1, 5, 0, tzinfo=UTC)),
])
def test_quiet_hours_end_when_the_clock_reads_their_end(
    conn: psycopg.Connection[Any], zone: str, start: str, end: str, at: datetime, expected: datetime
) -> None:
    _user(conn, "u", zone, start, end)
    assert _until(conn, "u", at) == expected


def _quiet(local: time, start: time, end: time) -> bool:
    return start <= local < end if start < end else (local >= start or local < end)


def test_on_clock_change_nights_the_end_is_never_inside_quiet_hours_nor_past_the_model(
    conn: psycopg.Connection[Any]
) -> None:
    """Every 15 minutes over two days around each change, three zones, three windows: the end
    gov gives is outside quiet hours, and no later than the first minute the model finds
    outside them (gov may hold through a repeated hour the window's end falls in: never
    earlier than the model)."""
    days = {"Europe/Berlin": ["2026-03-29", "2026-10-25"], "Australia/Lord_Howe": ["2026-04-05", "2026-10-04"],
            "Antarctica/Troll": ["2026-03-29", "2026-10-25"]}
    windows = [("22:00", "08:00"), ("01:00", "02:30"), ("00:00", "02:00")]
    for zone, dates in days.items():
        tz = ZoneInfo(zone)
        for start, end in windows:
            user = f"{zone}-{start}-{end}"
            _user(conn, user, zone, start, end)
            s, e = time.fromisoformat(start), time.fromisoformat(end)
            for day in dates:
                t0 = datetime.fromisoformat(day).replace(tzinfo=UTC) - timedelta(hours=18)
                for k in range(0, 48 * 4):
                    at = t0 + timedelta(minutes=15 * k)
                    got = _until(conn, user, at)
                    assert not _quiet(got.astimezone(tz).time(), s, e) or got == at, (user, at, got)
                    model = at
                    while _quiet(model.astimezone(tz).time(), s, e):
                        model += timedelta(minutes=1)
                    assert got >= model, (user, at, got, model)
                    if not (model.astimezone(tz).fold or (model - timedelta(hours=2)).astimezone(tz).dst()
                            != model.astimezone(tz).dst()):
                        assert got == model, (user, at, got, model)
