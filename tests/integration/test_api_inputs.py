"""What an app can get wrong calling the Python API is refused before anything is written
(an outside probe's findings): one user id given as the audience (a string is an
iterable of its characters), a moment that is not a datetime (PostgreSQL read "infinity"
and "yesterday" as text), an empty database URL (libpq connects to its defaults)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
import pytest

from gov import Governor, Message
from gov.aio import AsyncGovernor
from gov.errors import ConfigurationError
from tests.aio import run_async

TEMPLATE = Message(user_id="-", id="camp", tier="P2", title="Sale")


def test_a_single_user_id_as_the_audience_is_refused(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    for call in (governor.decide_many, governor.send_many):
        with pytest.raises(TypeError, match="single str"):
            call(TEMPLATE, "u42")  # type: ignore[arg-type]

    async def go() -> None:
        async with AsyncGovernor(conn.info.dsn) as aio:
            with pytest.raises(TypeError, match="single str"):
                await aio.decide_many(TEMPLATE, "u42")  # type: ignore[arg-type]

    run_async(go())
    assert conn.execute("SELECT count(*) FROM gov.messages").fetchone() == (0,)


def test_a_moment_that_is_not_a_datetime_is_refused(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    # a naive one was read in the session's time zone: 12:00 or 22:00 the day before
    for at in ("infinity", "yesterday", 1_700_000_000, datetime(2026, 1, 1, 12, 0)):
        with pytest.raises(TypeError, match="datetime"):
            governor.decide(Message(user_id="u", id="m", tier="P2"), at=at)  # type: ignore[arg-type]
    assert conn.execute("SELECT count(*) FROM gov.messages").fetchone() == (0,)


def test_an_empty_database_url_is_refused() -> None:
    for url in ("", "  "):
        with pytest.raises(ConfigurationError, match="empty database URL"):
            Governor(url)
        with pytest.raises(ConfigurationError, match="empty database URL"):
            AsyncGovernor(url)


@pytest.mark.parametrize(("setting", "value"), [
    ("pool_timeout", None), ("pool_timeout", float("nan")), ("pool_timeout", float("inf")), ("pool_timeout", 0),
    ("pool_size", 0), ("pool_size", 2.5), ("pool_size", None),
])
def test_pool_settings_that_cannot_work_are_refused_by_name(db_url: str, setting: str, value: Any) -> None:
    # a None timeout reached psycopg_pool as a TypeError; nan or inf as a wait without end
    for make in (Governor, AsyncGovernor):
        with pytest.raises(ConfigurationError, match=setting):
            make(db_url, **{setting: value})


def test_the_sync_governor_records_events_as_the_async_one_does(governor: Governor) -> None:
    assert governor.decide(Message(user_id="u", id="m", tier="P2")).allowed
    assert governor.record_event("u", "m", "display") is True
    assert governor.record_event("u", "m", "display") is False  # already recorded
