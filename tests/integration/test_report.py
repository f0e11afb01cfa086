"""The fatigue report, revocation suspects and the suppression views, on known data."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from gov import Governor, Message
from gov.analytics.events import record_event
from gov.analytics.report import fatigue_html, fatigue_report, fatigue_table, revocation_suspects
from gov.cli import main
from gov.testing import PushService

# Users by bucket, and what they did with message i (m0 is the digest, in the segment):
#   bucket 1: a1..a4, 1 send each; clicks a1 m0, a2 m0; close a3 m0
#   bucket 2: b1..b4, 2 sends each; clicks b1 m0, b2 m0, b3 m1 (b4 m0 clicks after the window)
#   bucket 3: c1..c4, 3 sends each; clicks c1 m1, c2 m2, c3 m0; closes c4 m0, c4 m1; c4 unsubscribes
#   bucket 8: d1, 10 sends; no display, no click; unsubscribes
# Everyone but d1 displays every message. a1 also got one message 8 days ago (outside the
# window); d1 got and displayed one 10 days ago. b1's m0 reached two of b1's browsers.
BUCKETS = {1: ["a1", "a2", "a3", "a4"], 2: ["b1", "b2", "b3", "b4"], 3: ["c1", "c2", "c3", "c4"], 10: ["d1"]}
CLICKS = {("a1", 0), ("a2", 0), ("b1", 0), ("b2", 0), ("b3", 1), ("c1", 1), ("c2", 2), ("c3", 0)}
CLOSES = {("a3", 0), ("c4", 0), ("c4", 1)}
UNSUBSCRIBES = {("c4", 2), ("d1", 9)}

# (bucket, subscribers, accepted, displays, clicks, closes, unsubscribes, ctr, unsub rate, display rate,
#  close/click, crossover)
EXPECTED = [
    (1, 4, 4, 4, 2, 1, 0, "0.5", "0", "1", "0.5", False),
    (2, 4, 8, 8, 3, 0, 0, "0.375", "0", "1", "0", False),
    (3, 4, 12, 12, 3, 2, 1, "0.25", "0.25", "1", "0.666667", True),
    (8, 1, 10, 0, 0, 0, 1, "0", "1", "0", None, False),
]
EXPECTED_DIGEST = [
    (1, 4, 4, 4, 2, 1, 0, "0.5", "0", "1", "0.5", False),
    (2, 4, 4, 4, 2, 0, 0, "0.5", "0", "1", "0", False),
    (3, 4, 4, 4, 1, 1, 1, "0.25", "0.25", "1", "1", True),
    (8, 1, 1, 0, 0, 0, 1, "0", "1", "0", None, False),
]


def _mid(user: str, i: int) -> str:
    return f"{user}-m{i}"


def seed_fatigue(gov: Governor, push: PushService, now: datetime) -> None:
    """The users of the table above, their messages and events; the window ends at ``now``."""
    day_ago = now - timedelta(days=1)

    def decide(user: str, mid: str, at: datetime, campaign: str) -> None:
        assert gov.decide(Message(user_id=user, id=mid, tier="P0", campaign_id=campaign), at=at).allowed

    for sends, users_ in BUCKETS.items():
        for user in users_:
            for i in range(sends):
                at = day_ago + timedelta(minutes=i)
                decide(user, _mid(user, i), at, "digest-w30" if i == 0 else f"sale-{i}")
                record_event(gov, user, _mid(user, i), "accepted", at=at)
                if user != "d1":
                    record_event(gov, user, _mid(user, i), "display", at=at + timedelta(seconds=5))
                if (user, i) in CLICKS:
                    record_event(gov, user, _mid(user, i), "click", at=at + timedelta(seconds=30))
                if (user, i) in CLOSES:
                    record_event(gov, user, _mid(user, i), "close", at=at + timedelta(seconds=30))
                if (user, i) in UNSUBSCRIBES:
                    record_event(gov, user, _mid(user, i), "unsubscribe", at=at + timedelta(seconds=60))
    # outside the window: a1's old send, d1's old send that displayed
    decide("a1", "a1-old", now - timedelta(days=8), "sale-old")
    record_event(gov, "a1", "a1-old", "accepted", at=now - timedelta(days=8))
    decide("d1", "d1-old", now - timedelta(days=10), "sale-old")
    record_event(gov, "d1", "d1-old", "accepted", at=now - timedelta(days=10))
    record_event(gov, "d1", "d1-old", "display", at=now - timedelta(days=10))
    # after the window's end: not counted
    record_event(gov, "b4", _mid("b4", 0), "click", at=now + timedelta(hours=1))
    # one message on two browsers is one send
    laptop = gov.subscribe("b1", push.subscribe("b1-laptop").info)
    phone = gov.subscribe("b1", push.subscribe("b1-phone").info)
    for sub in (laptop, phone):
        record_event(gov, "b1", _mid("b1", 0), "accepted", subscription_id=sub, at=day_ago)


def seed_suppressions(gov: Governor, now: datetime) -> None:
    """A spring sale: s1 and s2 get three P2 messages each in an hour; the third is dropped."""
    for user in ("s1", "s2"):
        for i in range(3):
            gov.decide(
                Message(user_id=user, id=f"{user}-sale-{i}", tier="P2", campaign_id="spring-sale", topic="sale"),
                at=now - timedelta(hours=1) + timedelta(minutes=i),
            )


@pytest.fixture
def push() -> Iterator[PushService]:
    with PushService() as service:
        yield service


@pytest.fixture
def gov(db_url: str) -> Iterator[Governor]:
    with Governor(db_url, allow_loopback_http=True, pool_size=2) as g:
        yield g


@pytest.fixture
def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


@pytest.fixture
def seeded(gov: Governor, push: PushService, now: datetime) -> datetime:
    seed_fatigue(gov, push, now)
    return now


def _as_tuples(rows: Any) -> list[tuple[Any, ...]]:
    def num(v: Decimal | None) -> str | None:
        return None if v is None else format(v.normalize(), "f")

    return [
        (
            r.bucket,
            r.subscribers,
            r.accepted,
            r.displays,
            r.clicks,
            r.closes,
            r.unsubscribes,
            num(r.ctr),
            num(r.unsubscribe_rate),
            num(r.display_rate),
            num(r.close_to_click),
            r.crossover,
        )
        for r in rows
    ]


def test_buckets_rates_and_crossover(gov: Governor, seeded: datetime) -> None:
    report = fatigue_report(gov, now=seeded)
    assert _as_tuples(report.rows) == EXPECTED
    assert report.crossover_bucket == 3
    assert [r.label for r in report.rows] == ["1", "2", "3", "8+"]


def test_segment_counts_only_its_messages_but_buckets_every_send(gov: Governor, seeded: datetime) -> None:
    report = fatigue_report(gov, now=seeded, segment="digest-")
    assert _as_tuples(report.rows) == EXPECTED_DIGEST
    assert fatigue_report(gov, now=seeded, segment="nothing-like-it").rows == ()


def test_window_moves_with_p_now(gov: Governor, seeded: datetime) -> None:
    # two days earlier, only a1's old send is in a week's window (d1's is older still)
    earlier = fatigue_report(gov, now=seeded - timedelta(days=2))
    assert [(r.bucket, r.subscribers, r.accepted) for r in earlier.rows] == [(1, 1, 1)]
    assert not any(r.crossover for r in earlier.rows)
    # a 12-hour window ending now holds nothing
    assert fatigue_report(gov, now=seeded, since=timedelta(hours=12)).rows == ()


def test_revocation_suspects(gov: Governor, seeded: datetime, conn: psycopg.Connection[Any]) -> None:
    (suspect,) = revocation_suspects(gov, now=seeded)
    assert (suspect.user_id, suspect.accepted, suspect.live_subscriptions) == ("d1", 10, 0)
    assert suspect.last_display_at == seeded - timedelta(days=10)
    assert revocation_suspects(gov, now=seeded, min_accepted=11) == []
    # the view is the function's defaults, on the database clock
    assert conn.execute("SELECT user_id, accepted FROM gov.revocation_suspects").fetchall() == [("d1", 10)]


def test_suppression_views(gov: Governor, conn: psycopg.Connection[Any], now: datetime) -> None:
    seed_suppressions(gov, now)
    gov.decide(Message(user_id="s3", id="no-campaign", tier="P2"), at=now)
    assert conn.execute(
        "SELECT campaign_id, blocked_by, suppressed, users, decided, share FROM gov.campaign_shortfall"
    ).fetchall() == [("spring-sale", "cap_86400000ms", 2, 2, 6, Decimal("0.3333"))]
    day = (now - timedelta(hours=1) + timedelta(minutes=2)).astimezone(UTC).date()
    rows = conn.execute("SELECT day, tier, suppressed, dropped, deferred, collapsed, users FROM gov.suppressions_daily")
    assert rows.fetchall() == [(day, "P2", 2, 2, 0, 0, 2)]


def test_table_and_html_render(gov: Governor, seeded: datetime) -> None:
    from rich.console import Console

    report = fatigue_report(gov, now=seeded)
    console = Console(width=200, record=True)
    console.print(fatigue_table(report))
    text = console.export_text()
    assert "◀ crossover" in text and "8+" in text and "37.5%" in text
    page = fatigue_html(report, suspects=1)
    assert page.count('data-series="ctr"') == 1 and page.count('data-series="unsubscribe_rate"') == 1
    assert page.count('class="crossover" data-bucket="3"') == 2  # marked on both charts
    for external in ("<script", "<link", "src=", "url(", "@import"):
        assert external not in page, external
    empty = fatigue_html(fatigue_report(gov, now=seeded, segment="none-"))
    assert "No accepted sends" in empty and "<svg" not in empty
    hostile = fatigue_html(fatigue_report(gov, now=seeded, segment="<script>x</script>"))
    assert "<script" not in hostile and "&lt;script&gt;x&lt;/script&gt;" in hostile  # escaped, never markup


def test_cli_fatigue_json_table_and_bad_input(db_url: str, seeded: datetime, tmp_path: Any) -> None:
    runner = CliRunner()
    env = {"GOV_DATABASE_URL": db_url}
    at = seeded.isoformat()
    out = runner.invoke(main, ["report", "fatigue", "--by", "volume", "--at", at, "--json"], env=env)
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["crossover_bucket"] == 3 and [b["bucket"] for b in data["buckets"]] == [1, 2, 3, 8]
    html = tmp_path / "fatigue.html"
    table = runner.invoke(
        main, ["report", "fatigue", "--by", "volume", "--at", at, "--segment", "digest-", "--html", str(html)], env=env
    )
    assert table.exit_code == 0, table.output
    assert "crossover" in table.stdout and "digest-" in table.stdout
    assert 'data-series="unsubscribe_rate"' in html.read_text()
    suspects = runner.invoke(main, ["report", "suspects", "--at", at], env=env)
    assert suspects.exit_code == 0 and "d1" in suspects.stdout
    bad = runner.invoke(main, ["report", "fatigue", "--since", "a week"], env=env)
    assert bad.exit_code == 1 and "--since" in bad.stderr


def test_an_early_leaver_is_bucketed_by_what_they_had_received(conn: psycopg.Connection[Any]) -> None:
    """Six sends in the week before leaving put a leaver in bucket 6, not in the 2 the window still sees."""
    at = datetime(2026, 7, 26, 12, 0, tzinfo=UTC)
    sends = [at - timedelta(days=8, hours=h) for h in range(4)]
    sends += [at - timedelta(days=6, hours=12 + h) for h in range(2)]
    for i, when in enumerate(sends):
        conn.execute(
            "INSERT INTO gov.messages (user_id, message_id, tier, allowed, decided_at)"
            " VALUES ('leaver', %s, 'P2', true, %s)",
            (f"m{i}", when),
        )
        conn.execute(
            "INSERT INTO gov.push_events (user_id, message_id, event, created_at)"
            " VALUES ('leaver', %s, 'accepted', %s)",
            (f"m{i}", when),
        )
    conn.execute(
        "INSERT INTO gov.push_events (user_id, message_id, event, created_at)"
        " VALUES ('leaver', 'm5', 'unsubscribe', %s)",
        (at - timedelta(days=6),),
    )
    report = conn.execute("SELECT bucket, subscribers, unsubscribes FROM gov.fatigue_report_v1('7 days', %s)", (at,))
    assert {r[0]: r for r in report} == {6: (6, 1, 1)}
