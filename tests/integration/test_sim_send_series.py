"""The simulation's messages alone at their instant, decided in one statement, get what
Governor.send gives each one by one (gov.lab.simulate.engine.send_series, sim_send_series).

Two databases from one template play the same sequence: one through ``send_series``, one
through ``Governor.send`` a call at a time. Every verdict, every outbox id and every row the
decisions wrote must be the same: drops at the P2 cap, a P1 deferred in quiet hours, a P3
collapsed behind its carrier, a P0 in the middle of the night, a repeated id, two users
interleaved, each message at a moment of its own (11:00 to 12:00 the next day in Berlin).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from gov import Governor, Message
from gov.delivery.vapid import VapidSigner
from gov.lab.simulate import SimConfig, engine, simulate
from gov.lab.simulate.engine import RunOutcome, send_series
from gov.testing import PushService
from gov.testing.postgres import TemplateDatabases
from gov.users import set_time_zone

START = datetime(2026, 6, 2, 9, 0, tzinfo=UTC)  # a Tuesday, 11:00 in Berlin


def story() -> list[tuple[Message, datetime]]:
    def at(minutes: int) -> datetime:
        return START + timedelta(minutes=minutes)

    def msg(user: str, mid: str, tier: str, **kw: Any) -> Message:
        return Message(user_id=user, id=mid, tier=tier, title=f"{tier} {mid}", body="b", **kw)

    return [
        (msg("ann", "p2-1", "P2"), at(0)),
        (msg("bob", "p2-1", "P2"), at(1)),
        (msg("ann", "p2-2", "P2"), at(2)),
        (msg("ann", "p2-3", "P2"), at(3)),  # ann's third P2 in 24 h: dropped at the cap
        (msg("ann", "p3-1", "P3", collapse_key="recs"), at(4)),  # P3 counts ann's sends: collapsed
        (msg("ann", "p3-2", "P3", collapse_key="recs"), at(5)),  # folded behind the held one
        (msg("ann", "p3-3", "P3", collapse_key="recs"), at(6)),
        (msg("bob", "p1-night", "P1"), at(13 * 60)),  # 00:00 in Berlin: quiet hours, deferred
        (msg("bob", "p0-night", "P0"), at(13 * 60 + 1)),  # P0: never quieted
        (msg("ann", "p2-1", "P2"), at(13 * 60 + 2)),  # a repeated id: its first verdict
        (msg("bob", "p2-2", "P2"), at(13 * 60 + 3)),  # bob's second P2, in quiet hours: deferred
        (msg("ann", "p2-4", "P2"), at(25 * 60)),  # a day later, 12:00 in Berlin: the 24 h window moved on
    ]


WRITTEN = [
    "SELECT user_id, message_id, allowed, action, reason, used, cap FROM gov.messages ORDER BY 1, 2",
    "SELECT user_id, id, message_id, subscription_id, state, next_attempt_at FROM gov.outbox ORDER BY 1, 2",
    "SELECT user_id, message_id, state, collapse_key, release_at FROM gov.deferred ORDER BY 1, 2",
    "SELECT user_id, message_id, action, blocked_by FROM gov.push_suppressions ORDER BY 1, 2",
    "SELECT user_id, count(*) FROM gov.sends GROUP BY 1 ORDER BY 1",
]


@pytest.fixture
def two(databases: TemplateDatabases, signer: VapidSigner, push: PushService) -> Iterator[list[Governor]]:
    """Two migrated databases with the same users, the same subscriptions and time zones."""
    urls = [databases.clone(), databases.clone()]
    browsers = {u: push.subscribe() for u in ("ann", "bob")}
    govs: list[Governor] = []
    try:
        for url in urls:
            g = Governor(url, signer=signer, allow_loopback_http=True)
            govs.append(g)
            with psycopg.connect(url, autocommit=True) as c:
                for u in browsers:
                    set_time_zone(c, u, "Europe/Berlin")
            for u, b in browsers.items():
                g.subscribe(u, b.info)
        yield govs
    finally:
        for g in govs:
            g.close()
        for url in urls:
            databases.drop(url)


def rows(gov: Governor) -> list[list[Any]]:
    with gov.source.connection() as c:
        return [c.execute(sql).fetchall() for sql in WRITTEN]


def test_a_series_decides_each_message_as_send_would_alone(two: list[Governor]) -> None:
    series, alone = two
    messages = story()
    got = send_series(series, messages)
    expected = []
    for m, at in messages:
        result = alone.send(m, at=at, deliver=False)
        expected.append((result.decision.action, list(result.outbox_ids)))
    assert got == expected
    # the story reaches every kind of verdict it is there for
    actions = [a for a, _ in expected]
    assert {None, "drop", "defer", "collapse"} <= set(actions), actions  # None: allowed
    assert rows(series) == rows(alone)


def test_an_empty_series_sends_nothing(two: list[Governor]) -> None:
    assert send_series(two[0], []) == []


def test_a_simulation_cut_into_small_statements_tells_the_same_story(
    pg_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At most STATEMENT_MAX messages a statement (a 20,000-user campaign in one held 10,000
    advisory locks and ran out of PostgreSQL's shared lock table): cutting a campaign's
    batch and a tick's series into statements of two changes no verdict."""

    def story_of(outcome: RunOutcome) -> tuple[Any, ...]:
        s = outcome.summary
        return (s.by_tier, s.by_team, s.blocking, s.sends_per_user, s.attempts, s.events, s.unsubscribed,
                s.messages_sent, s.push_requests, s.expired_split, s.curve)

    config = SimConfig(users=40, days=2, seed=5)
    whole = simulate(pg_server, config, governed=True)
    monkeypatch.setattr(engine, "STATEMENT_MAX", 2)
    cut = simulate(pg_server, config, governed=True)
    assert whole.summary.messages_sent > 100
    assert story_of(cut) == story_of(whole)
