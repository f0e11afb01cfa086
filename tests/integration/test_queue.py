"""Deferral, quiet hours, collapse and the releaser, on a simulation clock."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from gov import Governor, Message
from gov import policy as policy_mod
from gov.delivery import Dispatcher
from gov.queue import Releaser
from gov.testing import PushService
from gov.users import set_quiet_hours, set_time_zone
from gov.vapid import VapidSigner, generate_keypair

BERLIN = ZoneInfo("Europe/Berlin")
SUBJECT = "mailto:push-ops@example.com"


class Clock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def signer(tmp_path: Path) -> VapidSigner:
    generate_keypair(tmp_path / "vapid.pem")
    return VapidSigner.from_env({"GOV_VAPID_PRIVATE_KEY": str(tmp_path / "vapid.pem"), "GOV_VAPID_SUBJECT": SUBJECT})


@pytest.fixture
def push(signer: VapidSigner) -> Iterator[PushService]:
    # the push service checks VAPID exp against its own clock: keep it on wall time
    with PushService(expected_public_key=signer.public_key) as service:
        yield service


@pytest.fixture
def clock() -> Clock:
    return Clock(datetime(2026, 6, 10, 9, 0, tzinfo=UTC))


@pytest.fixture
def gov(db_url: str, signer: VapidSigner, clock: Clock) -> Iterator[Governor]:
    with Governor(db_url, signer=signer, clock=clock, allow_loopback_http=True) as g:
        yield g


@pytest.fixture
def releaser(db_url: str, signer: VapidSigner, clock: Clock) -> Iterator[Releaser]:
    # the VAPID token's exp is signed from the wall clock, whatever the simulation says
    with Dispatcher(db_url, signer, workers=2, clock=clock) as runner:
        yield Releaser(runner.source, dispatcher=runner, clock=clock)


def held(conn: psycopg.Connection[Any], message_id: str) -> dict[str, Any]:
    row = conn.execute(
        "SELECT kind, state, outcome, blocked_by, planned_at, release_at, collapsed_into FROM gov.deferred"
        " WHERE message_id = %s",
        (message_id,),
    ).fetchone()
    assert row is not None, f"{message_id} is not in gov.deferred"
    keys = ("kind", "state", "outcome", "blocked_by", "planned_at", "release_at", "collapsed_into")
    return dict(zip(keys, row, strict=True))


def set_jitter(conn: psycopg.Connection[Any], jitter_ms: int) -> None:
    conn.execute("UPDATE gov.settings SET jitter_ms = %s", (jitter_ms,))


def test_seventh_p1_waits_for_the_oldest_to_leave_the_window(
    gov: Governor, push: PushService, clock: Clock, releaser: Releaser, conn: psycopg.Connection[Any]
) -> None:
    browser = push.subscribe()
    gov.subscribe("u", browser.info)
    start = clock.now
    for i in range(6):
        clock.now = start + timedelta(hours=i)
        assert gov.send(Message(user_id="u", id=f"m{i}", tier="P1", title=f"t{i}")).sent
    clock.now = start + timedelta(hours=20)
    seventh = gov.send(Message(user_id="u", id="m6", tier="P1", title="t6"))
    assert seventh.as_json() == {"sent": False, "action": "defer", "reason": "cap_86400000ms"}
    row = held(conn, "m6")
    oldest_out = start + timedelta(hours=24)
    assert row["state"] == "waiting" and row["planned_at"] == oldest_out
    assert oldest_out <= row["release_at"] < oldest_out + timedelta(minutes=10)  # the policy's jitter bound
    clock.now = row["release_at"] - timedelta(milliseconds=1)
    assert releaser.run_once().handled == 0  # not before its time
    clock.now = row["release_at"]
    stats = releaser.run_once()
    assert stats.outcomes == {"released": 1} and stats.delivered == 1
    assert [json.loads(p)["data"]["id"] for p in push.delivered_payloads(browser)][-1] == "m6"
    assert held(conn, "m6")["state"] == "released"
    # the release spent its slot then: the window holds m1..m6 now
    assert conn.execute(
        "SELECT count(*) FROM gov.sends WHERE budget = 'P1' AND sent_at > %s", (clock.now - timedelta(days=1),)
    ).fetchone() == (6,)


def test_a_wait_longer_than_defer_max_is_dropped_at_once(
    gov: Governor, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    for i in range(6):
        gov.send(Message(user_id="u", id=f"m{i}", tier="P1", title="t"))
    clock.now += timedelta(hours=1)  # the window frees in 23 h: more than 6 h away
    late = gov.send(Message(user_id="u", id="late", tier="P1", title="t"))
    assert late.as_json() == {"sent": False, "action": "drop", "reason": "defer_expired"}
    assert held(conn, "late")["state"] == "expired" and held(conn, "late")["outcome"] == "defer_expired"
    assert conn.execute("SELECT action FROM gov.push_suppressions WHERE message_id = 'late'").fetchone() == ("drop",)


@pytest.mark.parametrize(
    ("evening", "expected_utc"),
    [
        (datetime(2026, 6, 10, 23, 0, tzinfo=BERLIN), datetime(2026, 6, 11, 6, 0, tzinfo=UTC)),  # CEST
        (datetime(2026, 3, 28, 23, 0, tzinfo=BERLIN), datetime(2026, 3, 29, 6, 0, tzinfo=UTC)),  # clocks go forward
        (datetime(2026, 10, 24, 23, 0, tzinfo=BERLIN), datetime(2026, 10, 25, 7, 0, tzinfo=UTC)),  # clocks go back
        (datetime(2026, 1, 15, 23, 0, tzinfo=BERLIN), datetime(2026, 1, 16, 7, 0, tzinfo=UTC)),  # CET
    ],
)
def test_quiet_hours_hold_until_eight_local(
    gov: Governor, push: PushService, clock: Clock, releaser: Releaser, conn: psycopg.Connection[Any],
    evening: datetime, expected_utc: datetime,
) -> None:
    set_jitter(conn, 0)
    browser = push.subscribe()
    gov.subscribe("u", browser.info)
    set_time_zone(conn, "u", "Europe/Berlin")
    clock.now = evening.astimezone(UTC)
    p2 = gov.send(Message(user_id="u", id="sale", tier="P2", title="Sale", ttl=86400))
    assert p2.as_json() == {"sent": False, "action": "defer", "reason": "quiet_hours"}
    otp = gov.send(Message(user_id="u", id="otp", tier="P0", title="Your code"))
    assert otp.sent and otp.delivered == 1  # P0 is never quieted
    row = held(conn, "sale")
    assert (row["kind"], row["blocked_by"]) == ("quiet", "quiet_hours")
    assert row["release_at"] == expected_utc
    assert row["release_at"].astimezone(BERLIN).hour == 8
    clock.now = expected_utc - timedelta(seconds=1)
    assert releaser.run_once().handled == 0
    clock.now = expected_utc
    assert releaser.run_once().outcomes == {"released": 1}
    assert sorted(json.loads(p)["data"]["id"] for p in push.delivered_payloads(browser)) == ["otp", "sale"]


def test_users_own_quiet_window_across_midnight(gov: Governor, clock: Clock, conn: psycopg.Connection[Any]) -> None:
    set_jitter(conn, 0)
    set_time_zone(conn, "u", "America/New_York")
    set_quiet_hours(conn, "u", (datetime(2000, 1, 1, 20, 30).time(), datetime(2000, 1, 1, 7, 15).time()))
    clock.now = datetime(2026, 6, 10, 21, 0, tzinfo=ZoneInfo("America/New_York")).astimezone(UTC)
    assert gov.send(Message(user_id="u", id="a", tier="P1", title="t")).decision.reason == "quiet_hours"
    assert held(conn, "a")["release_at"] == datetime(2026, 6, 11, 7, 15, tzinfo=ZoneInfo("America/New_York"))
    clock.now = datetime(2026, 6, 11, 12, 0, tzinfo=ZoneInfo("America/New_York")).astimezone(UTC)
    assert gov.send(Message(user_id="u", id="b", tier="P1", title="t")).sent


def test_three_p3_collapse_into_one_summary(
    gov: Governor, push: PushService, clock: Clock, releaser: Releaser, conn: psycopg.Connection[Any]
) -> None:
    browser = push.subscribe()
    gov.subscribe("u", browser.info)
    week = 8 * 86400  # a digest keeps its value for a week: its TTL must outlast the 7-day window
    assert gov.send(Message(user_id="u", id="d0", tier="P3", title="Digest 0", collapse_key="digest", ttl=week)).sent
    for i in (1, 2, 3):
        clock.now += timedelta(hours=1)
        r = gov.send(
            Message(user_id="u", id=f"d{i}", tier="P3", title=f"Digest {i}", collapse_key="digest", ttl=week)
        )
        assert r.as_json() == {"sent": False, "action": "collapse", "reason": "cap_604800000ms"}
    releases = {held(conn, f"d{i}")["release_at"] for i in (1, 2, 3)}
    assert len(releases) == 1  # one group, one release
    clock.now = releases.pop()
    stats = releaser.run_once()
    assert stats.outcomes == {"summary": 1} and stats.delivered == 1
    summaries = push.delivered_payloads(browser)[1:]
    assert len(summaries) == 1
    summary = json.loads(summaries[0])
    assert summary["data"]["count"] == 3 and summary["title"] == "Digest 3"  # the newest content
    assert summary["tag"] == "digest"
    topics = {r.headers.get("topic") for r in push.delivered(browser)}
    assert len(topics) == 1 and None not in topics  # the same Topic as the first digest
    for i in (1, 2, 3):
        assert held(conn, f"d{i}")["state"] == "collapsed" and held(conn, f"d{i}")["collapsed_into"] == "d3"
    # a collapsed summary spends one slot
    assert conn.execute("SELECT count(*) FROM gov.sends WHERE budget = 'P3'").fetchone() == (2,)


def test_collapse_without_a_key_is_a_drop(gov: Governor, conn: psycopg.Connection[Any]) -> None:
    gov.send(Message(user_id="u", id="d0", tier="P3", title="t"))
    r = gov.send(Message(user_id="u", id="d1", tier="P3", title="t"))
    assert r.as_json() == {"sent": False, "action": "drop", "reason": "cap_604800000ms"}
    assert conn.execute("SELECT count(*) FROM gov.deferred WHERE state = 'waiting'").fetchone() == (0,)


def test_ttl_is_checked_again_at_release(
    gov: Governor, push: PushService, clock: Clock, releaser: Releaser, conn: psycopg.Connection[Any]
) -> None:
    browser = push.subscribe()
    gov.subscribe("u", browser.info)
    set_time_zone(conn, "u", "Europe/Berlin")
    clock.now = datetime(2026, 6, 10, 7, 0, tzinfo=BERLIN).astimezone(UTC)
    gov.send(Message(user_id="u", id="m", tier="P1", title="t", ttl=3600 + 1800))
    assert held(conn, "m")["state"] == "waiting"  # opens at 08:00, before its deadline
    clock.now += timedelta(hours=5)  # the releaser did not run for five hours
    assert releaser.run_once().outcomes == {"ttl_expired": 1}
    assert held(conn, "m")["state"] == "expired" and push.requests_for(browser) == []


def test_held_past_its_ttl_is_never_queued(gov: Governor, clock: Clock, conn: psycopg.Connection[Any]) -> None:
    set_time_zone(conn, "u", "Europe/Berlin")
    clock.now = datetime(2026, 6, 10, 3, 0, tzinfo=BERLIN).astimezone(UTC)  # quiet until 08:00: 5 h
    r = gov.send(Message(user_id="u", id="m", tier="P2", title="t", ttl=3600))
    assert r.as_json() == {"sent": False, "action": "drop", "reason": "ttl_expired"}
    assert held(conn, "m")["outcome"] == "ttl_expired"


def test_four_releasers_release_each_message_once(db_url: str, clock: Clock, conn: psycopg.Connection[Any]) -> None:
    text = policy_mod.default_policy_text().replace('windows = [{ window = "24h", cap = 6 }]',
                                                    'windows = [{ window = "1h", cap = 1 }]')
    with conn.transaction():
        policy_mod.apply(conn, policy_mod.parse_policy(text), text)
    n = 1000
    conn.execute(
        "INSERT INTO gov.sends (user_id, budget, sent_at, message_id)"
        " SELECT 'u' || i, 'P1', %s, 'seed' FROM generate_series(1, %s) i",
        (clock.now, n),
    )
    conn.execute(
        "INSERT INTO gov.subscriptions (user_id, endpoint, p256dh, auth)"
        " SELECT 'u' || i, 'https://push.example/' || i, 'k', 'a' FROM generate_series(1, %s) i",
        (n,),
    )
    with Governor(db_url, clock=clock) as g:
        for i in range(1, n + 1):
            assert g.send(Message(user_id=f"u{i}", id=f"m{i}", tier="P1", title="t")).decision.action == "defer"
    clock.now += timedelta(hours=2)
    barrier = threading.Barrier(4)
    results: list[dict[str, int]] = []

    def run() -> None:
        r = Releaser(db_url, batch=50, clock=clock)
        barrier.wait()
        results.append(dict(r.run_once().outcomes))
        r.source.close()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sum(r.get("released", 0) for r in results) == n
    assert sum(1 for r in results if r.get("released")) >= 2, f"one releaser did everything: {results}"
    assert conn.execute("SELECT count(*), count(DISTINCT message_id) FROM gov.outbox").fetchone() == (n, n)
    assert conn.execute("SELECT state, count(*) FROM gov.deferred GROUP BY state").fetchall() == [("released", n)]
