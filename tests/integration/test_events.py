"""Telemetry: accepted events from the runner (a trigger), the rest through record_event."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from gov import Governor, InvalidInput, Message
from gov.analytics.events import InvalidEvent, record_event
from gov.delivery.vapid import VapidSigner
from gov.testing import Clock, PushService

SUBJECT = "mailto:push-ops@example.com"


@pytest.fixture
def clock() -> Clock:
    # near the real time: the push service checks the VAPID token's exp against its clock
    return Clock(datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5))


@pytest.fixture
def gov(db_url: str, signer: VapidSigner, clock: Clock) -> Iterator[Governor]:
    with Governor(db_url, signer=signer, clock=clock, allow_loopback_http=True, delivery_timeout_s=2.0) as g:
        yield g


def events(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT user_id, message_id, subscription_id, event, created_at FROM gov.push_events "
        "ORDER BY subscription_id, id"
    ).fetchall()


def test_the_runner_records_accepted_once_per_endpoint(
    gov: Governor, push: PushService, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    laptop, phone, dead = push.subscribe("laptop"), push.subscribe("phone"), push.subscribe("dead")
    ids = [gov.subscribe("u42", b.info) for b in (laptop, phone, dead)]
    push.script(dead, [410])
    assert gov.send(Message(user_id="u42", id="m1", tier="P2", title="Sale")).delivered == 2
    # accepted, at the attempt's (simulated) time, for the two live endpoints; nothing for the 410
    assert events(conn) == [("u42", "m1", ids[0], "accepted", clock.now), ("u42", "m1", ids[1], "accepted", clock.now)]
    outcomes = conn.execute("SELECT outcome, count(*) FROM gov.delivery_attempts GROUP BY 1 ORDER BY 1").fetchall()
    assert outcomes == [("accepted", 2), ("gone", 1)]
    # a duplicate acceptance (at-least-once delivery: a runner killed after the 201, before
    # its record, and the row sent again by the next holder of its lease) is the same event
    conn.execute(
        "INSERT INTO gov.delivery_attempts (outbox_id, user_id, message_id, subscription_id, origin, worker,"
        " outcome, status, attempted_at)"
        " SELECT outbox_id, user_id, message_id, subscription_id, origin, 'next-holder', outcome, status,"
        " attempted_at + interval '1 minute' FROM gov.delivery_attempts WHERE subscription_id = %s",
        (ids[0],),
    )
    assert len(events(conn)) == 2
    assert conn.execute("SELECT count(*) FROM gov.delivery_attempts").fetchone() == (4,)


def test_record_event_is_idempotent(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    at = datetime(2026, 7, 26, 12, 0, tzinfo=UTC)
    governor.decide(Message(user_id="u", id="m", tier="P0"), at=at)
    assert record_event(governor, "u", "m", "display", at=at) is True
    assert record_event(governor, "u", "m", "display", at=at + timedelta(seconds=3)) is False  # no subscription: once
    assert record_event(governor, "u", "m", "click") is True  # at the database's clock
    rows = events(conn)
    assert [(r[3], r[2]) for r in rows] == [("display", None), ("click", None)]
    assert rows[0][4] == at and rows[1][4] > at


def test_record_event_accepts_a_dsn_and_a_callers_transaction(db_url: str, governor: Governor) -> None:
    governor.decide(Message(user_id="u", id="m", tier="P0"))
    assert record_event(db_url, "u", "m", "close") is True
    with psycopg.connect(db_url) as mine:
        assert record_event(mine, "u", "m", "click") is True
        mine.rollback()  # the event was in my transaction: gone with it
        assert mine.execute("SELECT event FROM gov.push_events").fetchall() == [("close",)]


@pytest.mark.parametrize(
    ("user", "message", "event", "subscription", "match"),
    [
        ("u", "nope", "click", None, "unknown message nope for user u"),
        ("other", "m", "click", None, "unknown message m for user other"),
        ("u", "m", "open", None, "unknown event 'open'"),
        ("u", "m", "", None, "unknown event"),
        ("u", "blocked", "display", None, "suppressed, never sent"),
        ("u", "m", "click", "foreign", "subscription .* is not one of user u's"),
        ("u", "m", "click", 0, "positive integer"),
        ("", "m", "click", None, "user_id is required"),
    ],
)
def test_refused_events_write_nothing(
    db_url: str, conn: psycopg.Connection[Any], user: str, message: str, event: str, subscription: Any, match: str
) -> None:
    with PushService() as service, Governor(db_url, allow_loopback_http=True, pool_size=1) as g:
        g.decide(Message(user_id="u", id="m", tier="P0"))
        for i in range(3):  # the default P2 cap is 2 a day: the third is suppressed
            g.decide(Message(user_id="u", id="blocked" if i == 2 else f"p{i}", tier="P2"))
        foreign = g.subscribe("someone-else", service.subscribe().info)
        sub_id = foreign if subscription == "foreign" else subscription
        with pytest.raises(InvalidEvent, match=match) as raised:
            record_event(g, user, message, event, subscription_id=sub_id)
    assert isinstance(raised.value, InvalidInput)
    assert conn.execute("SELECT count(*) FROM gov.push_events").fetchone() == (0,)


def test_the_sql_function_refuses_with_gv003(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(psycopg.Error, match="unknown message m9 for user u42") as raised:
        conn.execute("SELECT gov.record_event_v1('u42', 'm9', 'click')")
    assert raised.value.sqlstate == "GV003"
