"""The release capacity (issue 30, item 2): the policy's [release] per_minute bounds how many
held messages the releasers let go in one minute, exactly, however many run together; what
does not fit waits for the following minutes, a user's own rows still earliest deadline first."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from gov import Governor, Message
from gov import policy as policy_mod
from gov.delivery.vapid import VapidSigner
from gov.errors import PolicyError
from gov.hold.release import Releaser
from gov.testing import Clock
from gov.users import set_time_zone
from tests.integration.test_queue import held, set_jitter

NIGHT = datetime(2026, 6, 10, 23, 0, tzinfo=UTC)  # quiet hours (22:00-08:00) for users in UTC
MORNING = datetime(2026, 6, 11, 8, 0, tzinfo=UTC)  # the moment they all wait for


@pytest.fixture
def clock() -> Clock:
    return Clock(NIGHT)


@pytest.fixture
def gov(db_url: str, signer: VapidSigner, clock: Clock) -> Iterator[Governor]:
    with Governor(db_url, signer=signer, clock=clock, allow_loopback_http=True) as g:
        yield g


def set_capacity(conn: psycopg.Connection[Any], per_minute: int | None) -> None:
    text = policy_mod.default_policy_text()
    if per_minute is not None:
        text += f"\n[release]\nper_minute = {per_minute}\n"
    with conn.transaction():
        policy_mod.apply(conn, policy_mod.parse_policy(text, "policy.toml"), text)


def hold_at_night(gov: Governor, conn: psycopg.Connection[Any], users: list[str]) -> None:
    """One P2 per user at 23:00 UTC, held by quiet hours for 08:00: all due at once."""
    for user in users:
        set_time_zone(conn, user, "UTC")
        assert gov.send(Message(user_id=user, id=f"{user}-m", tier="P2", title="t")).decision.action == "defer"


def released_by_minute(conn: psycopg.Connection[Any]) -> list[tuple[datetime, int]]:
    return [
        (m, n)
        for m, n in conn.execute(
            "SELECT date_trunc('minute', finished_at), count(*) FROM gov.deferred"
            " WHERE state IN ('released', 'collapsed') AND outcome IN ('released', 'summary') GROUP BY 1 ORDER BY 1"
        ).fetchall()
    ]


def test_the_policy_states_the_capacity_and_refuses_nonsense() -> None:
    text = policy_mod.default_policy_text() + "\n[release]\nper_minute = 500\n"
    policy = policy_mod.parse_policy(text, "p.toml")
    assert policy.release_per_minute == 500
    assert "[release]\nper_minute = 500" in policy.to_toml()
    assert policy_mod.parse_policy(policy.to_toml(), "again.toml") == policy
    # no section: no limit, and the canonical text says nothing of it
    assert policy_mod.default_policy().release_per_minute is None
    assert "[release]" not in policy_mod.default_policy().to_toml()
    for bad in ("0", "-3", "true", '"500"', "1.5"):
        with pytest.raises(PolicyError, match="per_minute"):
            policy_mod.parse_policy(policy_mod.default_policy_text() + f"\n[release]\nper_minute = {bad}\n", "p.toml")
    with pytest.raises(PolicyError, match=r"\[release\] takes per_minute"):
        policy_mod.parse_policy(policy_mod.default_policy_text() + "\n[release]\nper_hour = 5\n", "p.toml")


def test_the_capacity_is_stored_and_read_back(conn: psycopg.Connection[Any]) -> None:
    set_capacity(conn, 40)
    assert policy_mod.load_stored(conn).release_per_minute == 40
    set_capacity(conn, None)
    assert policy_mod.load_stored(conn).release_per_minute is None


def test_no_minute_gets_more_than_the_capacity(gov: Governor, clock: Clock, conn: psycopg.Connection[Any]) -> None:
    """Ten messages due at 08:00, four a minute: 4 at 08:00, 4 at 08:01, 2 at 08:02, each
    message once; without a limit all ten would go at 08:00."""
    set_capacity(conn, 4)
    set_jitter(conn, 0)  # (after the policy, which sets its own)
    users = [f"u{i}" for i in range(10)]
    hold_at_night(gov, conn, users)
    for minutes in range(3):
        clock.now = MORNING + timedelta(minutes=minutes, seconds=30)
        Releaser(gov.source, clock=clock).run_once()
    assert released_by_minute(conn) == [
        (MORNING, 4), (MORNING + timedelta(minutes=1), 4), (MORNING + timedelta(minutes=2), 2)
    ]
    assert conn.execute("SELECT count(*) FROM gov.sends WHERE budget = 'P2'").fetchone() == (10,)
    # the backlog went in its own release order (the oldest hold first), nothing rewritten
    first = conn.execute(
        "SELECT message_id FROM gov.deferred WHERE date_trunc('minute', finished_at) = %s ORDER BY 1", (MORNING,)
    ).fetchall()
    assert [m for (m,) in first] == ["u0-m", "u1-m", "u2-m", "u3-m"]


def test_a_user_cut_at_the_minute_waits_for_the_next_with_its_order_kept(
    gov: Governor, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    """The minute's last release goes to a user's nearest deadline; the user's other row
    waits for the next minute at a moment derived from the user, its slot (planned_at)
    unchanged, and goes then."""
    set_capacity(conn, 1)
    set_jitter(conn, 0)  # (after the policy, which sets its own)
    set_time_zone(conn, "u", "UTC")
    # two P1 held by quiet hours: the later one has the nearer deadline (a 2 h TTL)
    assert gov.send(Message(user_id="u", id="far", tier="P1", title="t", ttl=20 * 3600)).decision.action == "defer"
    assert gov.send(Message(user_id="u", id="near", tier="P1", title="t", ttl=10 * 3600)).decision.action == "defer"
    clock.now = MORNING
    stats = Releaser(gov.source, clock=clock).run_once()
    assert stats.outcomes == {"released": 1, "waiting": 1}
    assert held(conn, "near")["state"] == "released"
    far = held(conn, "far")
    assert far["state"] == "waiting" and far["planned_at"] == MORNING
    assert MORNING + timedelta(minutes=1) <= far["release_at"] < MORNING + timedelta(minutes=2)
    clock.now = far["release_at"]
    assert Releaser(gov.source, clock=clock).run_once().outcomes == {"released": 1}


def test_a_release_that_does_not_go_gives_its_place_back(
    gov: Governor, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    """Three users already had their two P2 of the day: at 08:00 their held P2 is dropped,
    not sent, and the minute's four releases go to four others."""
    set_capacity(conn, 4)
    set_jitter(conn, 0)  # (after the policy, which sets its own)
    full = ["a0", "a1", "a2"]
    for user in full:
        clock.now = NIGHT - timedelta(hours=3)
        for i in range(2):
            assert gov.send(Message(user_id=user, id=f"{user}-day{i}", tier="P2", title="t")).sent
    clock.now = NIGHT
    hold_at_night(gov, conn, full + [f"u{i}" for i in range(6)])
    clock.now = MORNING
    Releaser(gov.source, clock=clock).run_once()
    assert [held(conn, f"{u}-m")["state"] for u in full] == ["dropped"] * 3
    assert released_by_minute(conn) == [(MORNING, 4)]


def test_the_capacity_is_exact_under_concurrent_releasers(
    db_url: str, gov: Governor, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    """Forty messages due together, seven a minute, four releasers released together on
    their own connections: seven go in the minute, each once, whichever releaser took them."""
    set_capacity(conn, 7)
    set_jitter(conn, 0)  # (after the policy, which sets its own)
    hold_at_night(gov, conn, [f"u{i:02d}" for i in range(40)])
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def release() -> None:
        try:
            r = Releaser(db_url, batch=2, clock=lambda: MORNING + timedelta(seconds=5))
            try:
                barrier.wait()
                r.run_once()
            finally:
                r.source.close()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=release) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert released_by_minute(conn) == [(MORNING, 7)]
    assert conn.execute("SELECT count(*) FROM gov.sends WHERE budget = 'P2'").fetchone() == (7,)
    assert conn.execute("SELECT used FROM gov.release_minutes").fetchall() == [(7,)]
