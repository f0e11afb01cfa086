"""A campaign at each user's best hour (issue 30, item 2; `gov send-campaign --at best`):
every user is decided now (the budget spent now, exact under the race, idempotent), and
each allowed delivery waits in the outbox for the user's best slot within the window, its
TTL counted from there; P0 goes at once; quiet hours are never chosen."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from gov import Governor, Message
from gov.delivery.vapid import VapidSigner
from gov.testing import Clock, PushService
from gov.users import set_time_zone
from tests.integration.test_best_hours import NOW
from tests.integration.test_decide import race_once
from tests.integration.test_timing import curves

BEST = NOW + timedelta(hours=8)  # 20:00 UTC, the hour the crowd of curves() is reachable at
DAY = timedelta(hours=24)


@pytest.fixture
def clock() -> Clock:
    return Clock(NOW)


@pytest.fixture
def gov(db_url: str, signer: VapidSigner, clock: Clock) -> Iterator[Governor]:
    with Governor(db_url, signer=signer, clock=clock, allow_loopback_http=True) as g:
        yield g


def sale(tier: str = "P2", mid: str = "sale", ttl: int | None = 3600) -> Message:
    return Message(user_id="-", id=mid, tier=tier, title="t", ttl=ttl)


def test_decided_now_delivered_at_the_best_hour_with_its_ttl_from_there(
    gov: Governor, clock: Clock, conn: psycopg.Connection[Any], push: PushService
) -> None:
    """[timing] is off (the default policy): the campaign asked, so it gets the best hour."""
    curves(conn)
    browsers = {}
    for u in ("a", "b"):
        set_time_zone(conn, u, "UTC")
        browsers[u] = push.subscribe()
        gov.subscribe(u, browsers[u].info)
    results = dict(gov.send_many(sale(), ["a", "b"], best_within=DAY))
    for r in results.values():
        assert r.sent and r.timing == "best" and r.deliver_at is not None
        assert BEST <= r.deliver_at < BEST + timedelta(minutes=10)  # the hour, plus the user's jitter
    # the budget is spent now: the sends are counted at the decision, not at delivery
    assert conn.execute("SELECT count(*) FROM gov.sends WHERE message_id = 'sale' AND budget = 'P2' AND sent_at = %s",
                        (NOW,)).fetchone() == (2,)
    runner = gov.dispatcher()
    clock.now = BEST - timedelta(minutes=1)
    assert runner.run_once().attempts == 0 and push.delivered() == []
    clock.now = max(r.deliver_at for r in results.values() if r.deliver_at is not None)
    assert runner.run_once().outcomes == {"delivered": 2}
    # an hour to live, counted from the slot (from the decision it would be dead by now)
    assert all(0 < int(d.headers["ttl"]) <= 3600 for d in push.delivered())
    assert conn.execute("SELECT count(*) FROM gov.message_content WHERE timing = 'best'").fetchone() == (2,)


def test_a_retry_returns_the_first_slot_and_spends_nothing(gov: Governor, conn: psycopg.Connection[Any],
                                                          push: PushService) -> None:
    curves(conn)
    gov.subscribe("a", push.subscribe().info)
    first = dict(gov.send_many(sale(), ["a"], best_within=DAY))["a"]
    again = dict(gov.send_many(sale(), ["a"], best_within=DAY))["a"]
    assert again.decision.repeated and again.sent
    assert again.deliver_at == first.deliver_at and again.timing == first.timing == "best"
    assert conn.execute("SELECT count(*) FROM gov.sends WHERE user_id = 'a'").fetchone() == (2,)  # P1 and P2
    assert conn.execute("SELECT count(*) FROM gov.outbox WHERE user_id = 'a'").fetchone() == (1,)


def test_p0_goes_at_once_and_a_short_window_keeps_the_first_slot(gov: Governor, conn: psycopg.Connection[Any],
                                                                push: PushService) -> None:
    curves(conn)
    for u in ("a", "b"):
        gov.subscribe(u, push.subscribe().info)
    otp = dict(gov.send_many(sale("P0", "otp"), ["a"], best_within=DAY))["a"]
    assert otp.sent and otp.deliver_at == NOW and otp.timing is None
    soon = dict(gov.send_many(sale(mid="soon"), ["b"], best_within=timedelta(hours=2)))["b"]
    assert soon.sent and soon.deliver_at == NOW  # 20:00 lies beyond two hours
    assert conn.execute("SELECT min(next_attempt_at) FROM gov.outbox").fetchone() == (NOW,)


def test_quiet_hours_are_never_chosen(gov: Governor, conn: psycopg.Connection[Any], push: PushService) -> None:
    """Everybody is reachable at 23:00 only, inside quiet hours (22:00-08:00): never that hour."""
    curves(conn, peak=23)
    set_time_zone(conn, "a", "UTC")
    gov.subscribe("a", push.subscribe().info)
    r = dict(gov.send_many(sale(), ["a"], best_within=DAY))["a"]
    assert r.deliver_at is not None
    local = r.deliver_at.hour
    assert 8 <= local < 22, r.deliver_at


def send_at_best(g: Governor, i: int, user: str) -> bool:
    """Racer ``i``'s own campaign at best, to ``user`` alone: was it allowed?"""
    [(_, r)] = g.send_many(sale(mid=f"c{i}"), [user], best_within=DAY)
    return r.sent


def test_twenty_campaigns_at_best_for_one_fresh_user_allow_exactly_two(db_url: str,
                                                                       conn: psycopg.Connection[Any]) -> None:
    """The 20-way race: twenty campaigns released together, one fresh user, P2 2 / 24 h."""
    conns = [psycopg.connect(db_url, autocommit=True) for _ in range(20)]
    try:
        for round_no in range(5):
            user = f"fresh-{round_no}"
            allowed = race_once(conns, user, send_at_best)
            assert len(allowed) == 20 and allowed.count(True) == 2, f"round {round_no}: {allowed.count(True)}"
            assert conn.execute("SELECT count(*) FROM gov.sends WHERE user_id = %s AND budget = 'P2'",
                                (user,)).fetchone() == (2,)
    finally:
        for c in conns:
            c.close()


def test_the_command_line(db_url: str, conn: psycopg.Connection[Any], push: PushService, tmp_path: Any) -> None:
    from gov.cli.main import main

    curves(conn)
    users = tmp_path / "users.txt"
    users.write_text("a\nb\n")
    base = ["send-campaign", "--users", str(users), "--tier", "P2", "--title", "t", "--database-url", db_url]
    out = CliRunner().invoke(main, [*base, "--id", "m1", "--at", "best", "--within", "36h"])
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output)
    assert summary["users"] == 2 and summary["sent"] == 2 and summary["timing"] == {"best": 2}
    bad = CliRunner().invoke(main, [*base, "--id", "m2", "--at", "best", "--within", "8d"])
    assert bad.exit_code == 2 and "--within" in bad.output
    bad = CliRunner().invoke(main, [*base, "--id", "m3", "--within", "2h"])
    assert bad.exit_code == 2 and "--at best" in bad.output


def test_a_held_delivery_is_in_one_state_and_alarms_nobody(gov: Governor, clock: Clock,
                                                          conn: psycopg.Connection[Any], push: PushService) -> None:
    """Waiting for its hour, a campaign's delivery is in flight (conservation), and no
    health check calls the outbox stuck or overdue; after its hour it is delivered."""
    from gov.ops.health import conservation_check, run_checks

    curves(conn)
    gov.subscribe("a", push.subscribe().info)
    [(_, r)] = gov.send_many(sale(), ["a"], best_within=DAY)
    assert r.deliver_at is not None and r.deliver_at > NOW
    for at in (NOW + timedelta(hours=1), r.deliver_at + timedelta(minutes=1)):
        clock.now = at
        if at > r.deliver_at:
            assert gov.dispatcher().run_once().outcomes == {"delivered": 1}
        # the messages decided since the campaign (curves() wrote a crowd's history by hand)
        check = conservation_check(conn, since=at - NOW + timedelta(seconds=1), now=at)
        assert check.ok, check
        failing = [c for c in run_checks(conn, now=at) if not c.ok]
        assert failing == [], failing


def test_the_async_governor_sends_at_best_too(db_url: str, gov: Governor, conn: psycopg.Connection[Any],
                                              push: PushService) -> None:
    from gov.aio import AsyncGovernor
    from tests.aio import run_async

    curves(conn)
    gov.subscribe("a", push.subscribe().info)

    async def go() -> Any:
        async with AsyncGovernor(db_url) as g:
            return await g.send_many(sale(), ["a"], at=NOW, best_within=DAY)

    [(_, r)] = run_async(go())
    assert r.sent and r.timing == "best" and r.deliver_at is not None
    assert BEST <= r.deliver_at < BEST + timedelta(minutes=10)
