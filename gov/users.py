"""A user's own settings: time zone, quiet hours, and caps that only lower the defaults."""

from __future__ import annotations

from datetime import time
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import psycopg
from psycopg.rows import tuple_row

from gov.db import translate_errors
from gov.errors import PolicyError
from gov.message import MAX_ID_LENGTH
from gov.queries import q

_KNOWN_ZONES: set[str] = set()  # zones the database said it knows (zone data changes only with an upgrade)


def _check_user(user_id: str) -> None:
    if not isinstance(user_id, str) or not user_id.strip() or len(user_id) > MAX_ID_LENGTH or "\x00" in user_id:
        raise PolicyError(f"invalid user id {user_id!r}")


def set_user_cap(conn: psycopg.Connection[Any], user_id: str, scope: str, window_ms: int, cap: int) -> None:
    """Give ``user_id`` their own ``cap`` over ``window_ms`` for ``scope`` (a tier, 'topic' or 'global').

    The cap must not exceed the default for that window; a higher one raises
    PolicyError and nothing is written. Runs in ``conn``'s transaction.
    """
    _check_user(user_id)
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
        raise PolicyError(f"cap must be a whole number ≥ 0, got {cap!r}")
    with translate_errors(), conn.transaction():
        conn.execute(q("ensure_user"), {"user_id": user_id})
        conn.execute(q("set_user_cap"), {"user_id": user_id, "scope": scope, "window_ms": window_ms, "cap": cap})


def clear_user_cap(conn: psycopg.Connection[Any], user_id: str, scope: str, window_ms: int) -> None:
    """Return ``user_id`` to the default cap for (scope, window)."""
    with translate_errors():
        conn.execute(q("clear_user_cap"), {"user_id": user_id, "scope": scope, "window_ms": window_ms})


#: Names in a zone directory that are the host's configuration, not IANA zones: ``localtime``
#: is /etc/localtime (so the database host's), ``posixrules`` whatever its builder chose.
HOST_ZONES = frozenset({"localtime", "posixrules"})


def set_time_zone(conn: psycopg.Connection[Any], user_id: str, time_zone: str | None) -> None:
    """Set the IANA zone quiet hours are computed in (None: no quiet hours for this user)."""
    _check_user(user_id)
    if time_zone is not None:
        if time_zone in HOST_ZONES:
            # zone files of the host, not zones: each host's (the database's, this one's) may differ
            raise PolicyError(f"time zone {time_zone!r} follows the host's own setting; "
                              "use an IANA name such as Europe/Berlin")
        try:
            ZoneInfo(time_zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise PolicyError(f"unknown time zone {time_zone!r} (use an IANA name such as Europe/Berlin)") from None
    with translate_errors(), conn.transaction():
        if time_zone is not None and time_zone not in _KNOWN_ZONES:
            # pg_timezone_names reads every zone file (about 10 ms): ask once per zone
            row = conn.cursor(row_factory=tuple_row).execute(q("known_time_zone"), {"tz": time_zone}).fetchone()
            if not row or not row[0]:
                raise PolicyError(f"the database does not know the time zone {time_zone!r}")
            _KNOWN_ZONES.add(time_zone)
        conn.execute(q("set_user_time_zone"), {"user_id": user_id, "tz": time_zone})


def parse_quiet(value: str) -> tuple[time, time]:
    """ "22:00-08:00" → (22:00, 08:00); windows across midnight are allowed."""
    from gov.policy import parse_clock

    start, sep, end = value.partition("-")
    try:
        if not sep:
            raise ValueError("expected START-END, e.g. 22:00-08:00")
        window = parse_clock(start.strip(), "quiet start"), parse_clock(end.strip(), "quiet end")
    except ValueError as exc:
        raise PolicyError(f"quiet hours {value!r}: {exc}") from None
    if window[0] == window[1]:
        raise PolicyError(f"quiet hours {value!r}: start and end are equal")
    return window


def set_quiet_hours(conn: psycopg.Connection[Any], user_id: str, window: tuple[time, time] | None) -> None:
    """The user's own quiet window in their local time (None: the policy's default).

    Quiet hours are kept in the user's own time zone, so a window for a user who has
    none would never apply: it is refused (PolicyError); set the zone first, in the
    same transaction.
    """
    _check_user(user_id)
    start, end = window if window else (None, None)
    with translate_errors(), conn.transaction():
        if window is not None:
            row = conn.cursor(row_factory=tuple_row).execute(q("user_settings"), {"user_id": user_id}).fetchone()
            if row is None or row[0] is None:
                raise PolicyError(
                    f"user {user_id} has no time zone, and quiet hours apply in the user's own time: "
                    "give one too (--tz Europe/Berlin)"
                )
        conn.execute(q("set_user_quiet_hours"), {"user_id": user_id, "start": start, "end": end})


def set_segment(conn: psycopg.Connection[Any], user_id: str, segment: str | None) -> None:
    """Put ``user_id`` in ``segment`` (None: in none), the app's own choice.

    A name other than engaged, casual or dormant is the app's own: ``gov segments
    refresh`` leaves that user alone. One of those three (or None) is overwritten by the
    next refresh, from the policy's [segments] rules. Runs in ``conn``'s transaction.
    """
    from gov.policy import SEGMENT_NAME

    _check_user(user_id)
    if segment is not None and (not isinstance(segment, str) or not SEGMENT_NAME.match(segment)):
        raise PolicyError(
            f"segment {segment!r}: expected a lower-case letter, then up to 31 of a-z, 0-9, _ or -"
        )
    with translate_errors(), conn.transaction():
        conn.execute(q("set_user_segment"), {"user_id": user_id, "segment": segment})


def segment_of(conn: psycopg.Connection[Any], user_id: str) -> str | None:
    """The segment ``user_id`` is in now (None: none, or a user gov has not seen)."""
    row = conn.cursor(row_factory=tuple_row).execute(q("user_segment"), {"user_id": user_id}).fetchone()
    return row[0] if row else None
