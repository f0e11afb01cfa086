"""Telemetry: the events the fatigue report reads (``gov.push_events``).

``accepted`` is recorded by the database itself when the runner records an attempt a
push service accepted (a trigger on ``gov.delivery_attempts``). The service worker
reports the rest — ``display`` (``showNotification`` resolved), ``click``
(``notificationclick``), ``close`` (``notificationclose``) and ``unsubscribe`` (the
user left through your preference centre or a notification action) — through the
``POST /events`` beacon of ``gov serve``, or your own backend calls
:func:`record_event`.

Recording is idempotent: one row per (user, message, subscription, event).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from gov.db import Source
from gov.errors import InvalidInput
from gov.message import MAX_ID_LENGTH, is_utf8
from gov.queries import q

EVENTS = ("accepted", "display", "click", "close", "unsubscribe")
#: What a browser may report. ``accepted`` is the push service's answer, which only the
#: runner sees: a beacon claiming it is refused.
MAX_SUBSCRIPTION_ID = 2**63 - 1  # gov.subscriptions.id is a bigint
BEACON_EVENTS = ("display", "click", "close", "unsubscribe")
REFUSED_SQLSTATE = "GV003"  # SQLSTATE of gov.record_event_v1's refusals


class InvalidEvent(InvalidInput):
    """An event was refused: unknown kind, unknown or suppressed message, foreign subscription."""


def _check_id(name: str, value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise InvalidEvent(f"{name} is required and must be a non-empty string")
    if len(value) > MAX_ID_LENGTH or "\x00" in value or not is_utf8(value):
        raise InvalidEvent(f"{name} must be at most {MAX_ID_LENGTH} characters of valid text without NUL bytes")


def check_event(user_id: object, message_id: object, event: object, subscription_id: object = None) -> None:
    """Refuse a malformed event before the database is touched (raises :class:`InvalidEvent`)."""
    _check_id("user_id", user_id)
    _check_id("message_id", message_id)
    if event not in EVENTS:
        raise InvalidEvent(f"unknown event {event!r}: expected one of {', '.join(EVENTS)}")
    if subscription_id is not None and (
        isinstance(subscription_id, bool)
        or not isinstance(subscription_id, int)
        or not 0 < subscription_id <= MAX_SUBSCRIPTION_ID
    ):
        raise InvalidEvent(f"subscription_id must be a positive integer, got {subscription_id!r}")


def as_source(source: Any) -> tuple[Source, bool]:
    """``(Source, owned)`` for a Governor, a Source, or anything :class:`gov.db.Source` takes.

    ``owned`` is True when the Source was made here (from a DSN, say) and must be closed.
    """
    # a Governor by what it has (its Source), not by its class: gov.governor uses this
    # module (Governor.record_event), and the two must not import each other
    inner = getattr(source, "source", None)
    if isinstance(inner, Source):
        return inner, False
    if isinstance(source, Source):
        return source, False
    return Source(source, pool_size=1), True


def record_event(
    source: Any,
    user_id: str,
    message_id: str,
    event: str,
    subscription_id: int | None = None,
    at: datetime | None = None,
) -> bool:
    """Record one telemetry event; True when recorded now, False when it already was.

    ``source`` is a :class:`gov.Governor` (its connections are used), a psycopg
    ``Connection`` (the event commits with your transaction) or ``ConnectionPool``, a
    SQLAlchemy ``Engine`` or ``Connection``, or a DSN (a pool is opened and closed for
    this one call: prefer a long-lived source). ``at`` defaults to the database clock.

    Raises :class:`InvalidEvent` and writes nothing for an unknown event, a message gov
    never decided for ``user_id`` (or suppressed: it was never sent), or a subscription
    that is not the user's.
    """
    check_event(user_id, message_id, event, subscription_id)
    src, owned = as_source(source)
    params = {"user_id": user_id, "message_id": message_id, "event": event, "subscription_id": subscription_id,
              "at": at}

    def record(conn: psycopg.Connection[Any]) -> Any:
        try:  # the caller's connection may make dicts
            return conn.cursor(row_factory=tuple_row).execute(q("record_event"), params).fetchone()
        except psycopg.Error as exc:
            if exc.sqlstate == REFUSED_SQLSTATE and exc.diag.message_primary:
                raise InvalidEvent(exc.diag.message_primary) from exc
            raise

    try:  # safe to repeat on a fresh connection: an event is recorded once (its key)
        row = src.transaction(record)
    finally:
        if owned:
            src.close()
    assert row is not None
    return bool(row[0])
