"""Deferral, quiet hours, collapse and the releaser, on a simulation clock."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from gov import Governor, InvalidMessage, Message
from gov import policy as policy_mod
from gov.delivery.runner import Dispatcher
from gov.delivery.vapid import VapidSigner
from gov.hold.release import Releaser
from gov.testing import Clock, PushService
from gov.users import set_quiet_hours, set_time_zone

BERLIN = ZoneInfo("Europe/Berlin")
SUBJECT = "mailto:push-ops@example.com"


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
    with Dispatcher(db_url, signer, workers=2, clock=clock, allow_loopback_http=True) as runner:
        yield Releaser(runner.source, dispatcher=runner, clock=clock)


def held(conn: psycopg.Connection[Any], message_id: str) -> dict[str, Any]:
    row = conn.execute(
        "SELECT kind, state, outcome, blocked_by, planned_at, release_at, collapsed_into, first_at FROM gov.deferred"
        " WHERE message_id = %s",
        (message_id,),
    ).fetchone()
    assert row is not None, f"{message_id} is not in gov.deferred"
    keys = ("kind", "state", "outcome", "blocked_by", "planned_at", "release_at", "collapsed_into", "first_at")
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


def test_collapse_without_a_key_joins_the_tiers_keyless_group(gov: Governor, conn: psycopg.Connection[Any]) -> None:
    # compress, never delete: keyless digests of one user collapse into one group per tier
    gov.send(Message(user_id="u", id="d0", tier="P3", title="t"))
    r = gov.send(Message(user_id="u", id="d1", tier="P3", title="t"))
    assert r.as_json() == {"sent": False, "action": "collapse", "reason": "cap_604800000ms"}
    gov.send(Message(user_id="u", id="d2", tier="P3", title="t"))
    assert conn.execute(
        "SELECT message_id, collapse_key, stands_for FROM gov.deferred WHERE state = 'waiting'"
    ).fetchall() == [("d2", "", 2)]
    assert held(conn, "d1")["state"] == "collapsed" and held(conn, "d1")["collapsed_into"] == "d2"


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


# ---------------------------------------------------------------- hold and release to the decision's standard


def test_a_digest_held_for_the_weekly_slot_survives_to_be_summarised(
    gov: Governor, push: PushService, clock: Clock, releaser: Releaser, conn: psycopg.Connection[Any]
) -> None:
    # the default policy and no TTL of the sender's own: the tier's deadline must outlive the wait
    browser = push.subscribe()
    gov.subscribe("u", browser.info)
    start = clock.now
    assert gov.send(Message(user_id="u", id="d0", tier="P3", title="Digest 0", collapse_key="digest")).sent
    for i in (1, 2, 3):
        clock.now = start + timedelta(days=i)
        r = gov.send(Message(user_id="u", id=f"d{i}", tier="P3", title=f"Digest {i}", collapse_key="digest"))
        assert r.as_json() == {"sent": False, "action": "collapse", "reason": "cap_604800000ms"}
    # one carrier at a time, the newest, standing for all three; the others collapsed into it at once
    assert conn.execute(
        "SELECT message_id, stands_for FROM gov.deferred WHERE state = 'waiting'"
    ).fetchall() == [("d3", 3)]
    assert [held(conn, f"d{i}")["collapsed_into"] for i in (1, 2)] == ["d3", "d3"]
    clock.now = held(conn, "d3")["release_at"]
    assert clock.now >= start + timedelta(days=7)
    stats = releaser.run_once()
    assert stats.outcomes == {"summary": 1} and stats.delivered == 1
    summary = json.loads(push.delivered_payloads(browser)[-1])
    assert (summary["title"], summary["data"]["count"], summary["tag"]) == ("Digest 3", 3, "digest")
    states = conn.execute(
        "SELECT state, count(*) FROM gov.message_states_v1(%s, %s) GROUP BY 1 ORDER BY 1",
        (start, clock.now + timedelta(seconds=1)),
    ).fetchall()
    assert states == [("collapsed", 2), ("delivered", 2)]


def test_digests_held_by_quiet_hours_collapse_into_one(
    gov: Governor, push: PushService, clock: Clock, releaser: Releaser, conn: psycopg.Connection[Any]
) -> None:
    set_jitter(conn, 0)
    browser = push.subscribe()
    gov.subscribe("u", browser.info)
    set_time_zone(conn, "u", "Europe/Berlin")
    for i, minute in enumerate((10, 20, 30)):
        clock.now = datetime(2026, 6, 10, 23, minute, tzinfo=BERLIN).astimezone(UTC)
        r = gov.send(Message(user_id="u", id=f"d{i}", tier="P3", title=f"Digest {i}", collapse_key="digest"))
        assert r.as_json() == {"sent": False, "action": "collapse", "reason": "quiet_hours"}
    assert conn.execute("SELECT action FROM gov.push_suppressions ORDER BY id").fetchall() == [("collapse",)] * 3
    clock.now = datetime(2026, 6, 11, 8, 0, tzinfo=BERLIN).astimezone(UTC)
    assert releaser.run_once().outcomes == {"summary": 1}
    payloads = [json.loads(p) for p in push.delivered_payloads(browser)]
    assert [(p["title"], p["data"]["count"]) for p in payloads] == [("Digest 2", 3)]
    assert {held(conn, f"d{i}")["state"] for i in range(3)} == {"collapsed"}
    assert conn.execute("SELECT count(*) FROM gov.deferred WHERE outcome = 'ttl_expired'").fetchone() == (0,)


def test_a_newcomer_that_cannot_outlive_the_wait_expires_alone(
    gov: Governor, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    gov.send(Message(user_id="u", id="d0", tier="P3", title="t", collapse_key="k"))
    clock.now += timedelta(hours=1)
    gov.send(Message(user_id="u", id="d1", tier="P3", title="t", collapse_key="k"))
    short = gov.send(Message(user_id="u", id="d2", tier="P3", title="t", collapse_key="k", ttl=3600))
    assert short.as_json() == {"sent": False, "action": "drop", "reason": "ttl_expired"}
    assert held(conn, "d2")["state"] == "expired"
    assert held(conn, "d1")["state"] == "waiting"  # the group keeps its carrier


def test_an_expired_group_takes_its_members_with_it(
    gov: Governor, clock: Clock, releaser: Releaser, conn: psycopg.Connection[Any]
) -> None:
    gov.send(Message(user_id="u", id="d0", tier="P3", title="t", collapse_key="k"))
    for i in (1, 2):
        clock.now += timedelta(hours=1)
        gov.send(Message(user_id="u", id=f"d{i}", tier="P3", title="t", collapse_key="k"))
    clock.now += timedelta(days=30)  # no releaser ran for a month: the newest content is dead
    assert releaser.run_once().outcomes == {"ttl_expired": 1}
    assert [held(conn, f"d{i}")["state"] for i in (1, 2)] == ["expired", "expired"]


def test_one_bad_row_does_not_stop_the_release(
    gov: Governor, clock: Clock, releaser: Releaser, conn: psycopg.Connection[Any]
) -> None:
    set_jitter(conn, 0)
    set_time_zone(conn, "night", "Europe/Berlin")
    night = datetime(2026, 6, 10, 23, 0, tzinfo=BERLIN).astimezone(UTC)
    clock.now = night - timedelta(hours=20)
    for i in range(6):
        gov.send(Message(user_id="busy", id=f"m{i}", tier="P1", title="t"))
    clock.now = night
    assert gov.send(Message(user_id="night", id="sale", tier="P2", title="t")).decision.reason == "quiet_hours"
    assert gov.send(Message(user_id="busy", id="m6", tier="P1", title="t")).decision.action == "defer"
    assert held(conn, "m6")["state"] == "waiting"
    # the policy loses P2 under the held message (as a racing apply, or a hand edit, could do)
    conn.execute("DELETE FROM gov.caps WHERE scope = 'P2'")
    conn.execute("DELETE FROM gov.tier_consumes WHERE tier = 'P2' OR consumes = 'P2'")
    conn.execute("DELETE FROM gov.tiers WHERE tier = 'P2'")
    clock.now = night + timedelta(hours=10)  # both are due: 08:00 local has passed, and the P1 window freed
    stats = releaser.run_once()
    assert stats.outcomes == {"failed": 1, "released": 1}
    sale = conn.execute("SELECT state, error FROM gov.deferred WHERE message_id = 'sale'").fetchone()
    assert sale is not None and sale[0] == "failed" and "unknown tier P2" in sale[1]
    assert held(conn, "m6")["state"] == "released"
    check = conn.execute("SELECT ok, detail FROM gov.health_v1(%s) WHERE check_name = 'held_failed'",
                         (clock.now,)).fetchone()
    assert check is not None and check[0] is False and "sale" in check[1]


def test_release_once_drains_whatever_the_batch(
    gov: Governor, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    for user in ("a", "b"):
        for i in range(6):
            gov.send(Message(user_id=user, id=f"m{i}", tier="P1", title="t"))
    clock.now += timedelta(hours=20)
    assert gov.send(Message(user_id="b", id="m6", tier="P1", title="t")).decision.action == "defer"
    for i in (1, 2, 3):  # a's P1 budget is spent: digests wait (collapsed) for it to free
        assert gov.send(Message(user_id="a", id=f"d{i}", tier="P3", title="t", collapse_key="k")).decision.action \
            == "collapse"
    clock.now += timedelta(hours=4, minutes=10)  # one group and one deferral due, a batch of 2
    stats = Releaser(gov.source, batch=2, clock=clock).run_once()
    assert stats.outcomes == {"summary": 1, "released": 1}
    assert conn.execute("SELECT count(*) FROM gov.deferred WHERE state = 'waiting'").fetchone() == (0,)


def test_a_busy_user_never_holds_back_the_rest(
    db_url: str, gov: Governor, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    for user in ("a", "b", "c"):
        for i in range(6):
            gov.send(Message(user_id=user, id=f"m{i}", tier="P1", title="t"))
    clock.now += timedelta(hours=20)
    for user in ("a", "b", "c"):
        assert gov.send(Message(user_id=user, id="m6", tier="P1", title="t")).decision.action == "defer"
    clock.now += timedelta(hours=4, minutes=10)
    # an application's transaction holds user a's decision lock (Governor given a connection)
    with psycopg.connect(db_url) as other:
        other.execute("SELECT pg_advisory_xact_lock(hashtextextended('a', 0))")
        releaser = Releaser(gov.source, batch=1, clock=clock)
        stats = releaser.run_once()
        assert stats.outcomes == {"released": 2} and stats.busy == 1
        other.rollback()
    assert conn.execute(
        "SELECT user_id FROM gov.deferred WHERE state = 'waiting' ORDER BY 1"
    ).fetchall() == [("a",)]
    assert Releaser(gov.source, batch=1, clock=clock).run_once().outcomes == {"released": 1}


def _race_releasers_and_newcomers(db_url: str, clock: Clock, users: list[str]) -> list[BaseException]:
    """Four releasers (batch 10) and two senders adding a newcomer to each group, released together."""
    barrier = threading.Barrier(6)
    errors: list[BaseException] = []

    def release() -> None:
        r = Releaser(db_url, batch=10, clock=clock)
        try:
            barrier.wait()
            r.run_once()
        except BaseException as exc:
            errors.append(exc)
        finally:
            r.source.close()

    def newcomers(offset: int) -> None:
        try:
            with Governor(db_url, clock=clock) as s:
                barrier.wait()
                for user in users[offset::2]:  # a newcomer joins a group while it is released
                    s.send(Message(user_id=user, id="late", tier="P3", title="t", collapse_key="k"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=release) for _ in range(4)]
    threads += [threading.Thread(target=newcomers, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return errors


def test_four_releasers_and_senders_on_collapse_groups_never_deadlock(
    db_url: str, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    set_jitter(conn, 0)
    with Governor(db_url, clock=clock) as g:
        for round_ in range(50):
            users = [f"r{round_}u{i}" for i in range(12)]
            for user in users:
                g.send(Message(user_id=user, id="first", tier="P3", title="t", collapse_key="k"))
                for i in range(3):
                    g.send(Message(user_id=user, id=f"d{i}", tier="P3", title="t", collapse_key="k"))
                    g.send(Message(user_id=user, id=f"x{i}", tier="P3", title="t", collapse_key=f"k{i}"))
            clock.now += timedelta(days=7, hours=1)  # every group is due, none expired (P3 keeps 8 days)
            errors = _race_releasers_and_newcomers(db_url, clock, users)
            assert not errors, f"round {round_}: {errors[0]!r}"  # a deadlock is raised to one of them
            sent = conn.execute(
                "SELECT user_id, count(*) FROM gov.sends WHERE user_id = ANY(%s) AND budget = 'P3'"
                " AND sent_at >= %s GROUP BY 1",
                (users, clock.now),
            ).fetchall()
            # each user's one P3 slot of the week went to exactly one message (a group released
            # once, or a newcomer that found the slot open), never two
            assert sorted(sent) == [(user, 1) for user in sorted(users)], (round_, sent)
            assert conn.execute(
                "SELECT count(*) FROM gov.deferred WHERE user_id = ANY(%s) AND state = 'waiting'"
                " GROUP BY user_id, collapse_key HAVING count(*) > 1",
                (users,),
            ).fetchall() == []
            assert conn.execute(
                "SELECT count(*) FROM gov.message_states_v1(%s, %s) WHERE state LIKE 'INCONSISTENT%%'",
                (clock.now - timedelta(days=9), clock.now + timedelta(seconds=1)),
            ).fetchone() == (0,)


def test_quiet_hours_ending_in_the_repeated_hour_end_at_its_first(
    gov: Governor, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    set_jitter(conn, 0)
    set_time_zone(conn, "u", "Europe/Berlin")
    set_quiet_hours(conn, "u", (datetime(2000, 1, 1, 22, 0).time(), datetime(2000, 1, 1, 2, 30).time()))
    clock.now = datetime(2026, 10, 24, 23, 0, tzinfo=BERLIN).astimezone(UTC)
    assert gov.send(Message(user_id="u", id="m", tier="P1", title="t")).decision.reason == "quiet_hours"
    # 02:30 comes twice that night (CEST, then CET): the window ends at the first
    assert held(conn, "m")["release_at"] == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
    # inside the repeated hour, after the first 02:30: the wall clock reads 02:10 again, quiet until 02:30 CET
    clock.now = datetime(2026, 10, 25, 1, 10, tzinfo=UTC)
    assert gov.send(Message(user_id="u", id="n", tier="P1", title="t")).decision.reason == "quiet_hours"
    assert held(conn, "n")["release_at"] == datetime(2026, 10, 25, 1, 30, tzinfo=UTC)


def test_ttl_zero_is_refused_before_anything_is_recorded(gov: Governor, conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(InvalidMessage, match="ttl must be whole seconds from 1"):
        gov.send(Message(user_id="u", id="m", tier="P2", title="t", ttl=0))
    with pytest.raises(psycopg.DatabaseError, match="ttl must be from 1 second to 28 days"):
        conn.execute("SELECT * FROM gov.send_v1('u', 'm', 'P2', NULL, NULL, '{\"title\": \"t\"}', NULL, 0)")
    assert conn.execute("SELECT count(*) FROM gov.messages").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM gov.sends").fetchone() == (0,)


def test_conservation_holds_after_prune(gov: Governor, clock: Clock, conn: psycopg.Connection[Any]) -> None:
    from gov.ops.maintenance import conservation, prune

    start = clock.now
    assert gov.send(Message(user_id="u", id="old", tier="P2", title="t")).sent
    clock.now += timedelta(days=10)
    assert gov.send(Message(user_id="u", id="new", tier="P2", title="t")).sent
    assert prune(gov.source, now=clock.now).sends > 0
    report = conservation(gov.source, start - timedelta(seconds=1), clock.now + timedelta(seconds=1))
    assert report.ok, report.inconsistent
    # and a message whose budget rows vanish inside what prune keeps is still caught
    conn.execute("DELETE FROM gov.sends WHERE message_id = 'new'")
    states = dict(conn.execute(
        "SELECT message_id, state FROM gov.message_states_v1(%s, %s)", (start, clock.now + timedelta(seconds=1))
    ).fetchall())
    assert states["new"].startswith("INCONSISTENT") and states["old"] == "no_endpoint"


def test_a_newcomer_that_finds_the_slot_open_carries_the_waiting_group(
    gov: Governor, push: PushService, clock: Clock, releaser: Releaser, conn: psycopg.Connection[Any]
) -> None:
    browser = push.subscribe()
    gov.subscribe("u", browser.info)
    start = clock.now
    assert gov.send(Message(user_id="u", id="d0", tier="P3", title="Digest 0", collapse_key="digest")).sent
    for i in (1, 2):
        clock.now = start + timedelta(days=i)
        assert gov.send(Message(user_id="u", id=f"d{i}", tier="P3", title=f"Digest {i}",
                                collapse_key="digest")).decision.action == "collapse"
    # the slot opens, and the next digest arrives before the releaser's (jittered) round
    clock.now = start + timedelta(days=7, seconds=1)
    assert gov.send(Message(user_id="u", id="d3", tier="P3", title="Digest 3", collapse_key="digest")).sent
    payloads = [json.loads(p) for p in push.delivered_payloads(browser)]
    assert [(p["title"], p["data"].get("count")) for p in payloads] == [("Digest 0", None), ("Digest 3", 3)]
    assert [held(conn, f"d{i}")["collapsed_into"] for i in (1, 2)] == ["d3", "d3"]
    clock.now += timedelta(hours=1)
    assert releaser.run_once().handled == 0  # nothing waits: the group went out with d3
    assert conn.execute("SELECT count(*) FROM gov.deferred WHERE state = 'expired'").fetchone() == (0,)


def test_defer_max_holds_at_release_when_the_slot_is_taken_again(
    gov: Governor, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    """Released, blocked again with the next slot past give_up_at: it expires, it does not wait on."""
    set_jitter(conn, 0)
    start = clock.now
    gov.send(Message(user_id="u", id="m0", tier="P1", title="t"))
    clock.now = start + timedelta(hours=10)
    for i in range(1, 6):
        gov.send(Message(user_id="u", id=f"m{i}", tier="P1", title="t"))
    clock.now = start + timedelta(hours=20)  # the window frees at +24 h (m0 leaves): within defer_max 6 h
    assert gov.send(Message(user_id="u", id="late", tier="P1", title="t")).decision.action == "defer"
    row = held(conn, "late")
    assert row["state"] == "waiting" and row["planned_at"] == start + timedelta(hours=24)
    # at the release time, a newcomer takes the slot m0 left (a P2, which spends P1 budget: a
    # tier that drops never yields a slot to a held row); the next one opens at +34 h (m1
    # leaves), past give_up_at (+26 h) and before the message's TTL (+44 h)
    clock.now = row["release_at"]
    assert gov.send(Message(user_id="u", id="rival", tier="P2", title="t")).sent
    stats = Releaser(gov.source, clock=clock).run_once()
    assert stats.outcomes == {"defer_expired": 1}
    assert held(conn, "late")["state"] == "expired" and held(conn, "late")["outcome"] == "defer_expired"
