"""Timing in the hold (issue 30, item 2): with [timing] on, a held message is planned for the
best hour of its user's estimate within its deadline that quiet hours allow, not the first
slot; P0 never waits, P1 at most p1_max_delay more; a share explores; off, the first slot."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from gov import Governor, Message
from gov import policy as policy_mod
from gov.delivery.vapid import VapidSigner
from gov.hold.release import Releaser
from gov.testing import Clock
from gov.users import set_time_zone
from tests.integration.test_best_hours import NOW, at_utc_hour, delivered, reach_crowd, user

EVENING = NOW + timedelta(hours=11)  # 23:00 UTC: quiet hours (22:00-08:00) for users in UTC
MORNING = EVENING + timedelta(hours=9)  # 08:00 the next day, the first slot


@pytest.fixture
def clock() -> Clock:
    return Clock(EVENING)


@pytest.fixture
def gov(db_url: str, signer: VapidSigner, clock: Clock) -> Iterator[Governor]:
    with Governor(db_url, signer=signer, clock=clock, allow_loopback_http=True) as g:
        yield g


def set_timing(conn: psycopg.Connection[Any], extra: str = "enabled = true\nexplore = 0") -> None:
    """[timing] on; by default without exploring, so that every message goes at its best hour."""
    text = policy_mod.default_policy_text() + f"\n[timing]\n{extra}\n"
    with conn.transaction():
        policy_mod.apply(conn, policy_mod.parse_policy(text, "policy.toml"), text)


def curves(conn: psycopg.Connection[Any], peak: int = 20) -> None:
    """Twelve users whose browsers run only at ``peak`` UTC, the population's curve refreshed."""
    reach_crowd(conn, peak=peak)
    assert conn.execute("SELECT gov.refresh_timing_curves_v1(p_now => %s)", (NOW,)).fetchone() == (24,)


def hold(gov: Governor, conn: psycopg.Connection[Any], user_id: str, mid: str, tier: str = "P2",
         ttl: int | None = None, zone: str = "UTC") -> dict[str, Any]:
    set_time_zone(conn, user_id, zone)
    assert gov.send(Message(user_id=user_id, id=mid, tier=tier, title="t", ttl=ttl)).decision.action == "defer"
    row = conn.execute("SELECT planned_at, release_at, timing FROM gov.deferred WHERE message_id = %s",
                       (mid,)).fetchone()
    assert row is not None
    return dict(zip(("planned_at", "release_at", "timing"), row, strict=True))


def test_off_by_default_a_held_message_waits_for_the_first_slot(
    gov: Governor, conn: psycopg.Connection[Any]
) -> None:
    curves(conn)
    row = hold(gov, conn, "u", "m")
    assert row["planned_at"] == MORNING and row["timing"] is None
    assert policy_mod.load_stored(conn).timing_enabled is False


def test_a_held_message_goes_at_the_best_hour_within_its_deadline(
    gov: Governor, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    """Held by quiet hours at 23:00 with a day to live: planned for 20:00, the population's
    best hour, not 08:00; the jitter on top; released then, and not before."""
    set_timing(conn)
    curves(conn)
    row = hold(gov, conn, "u", "m")
    best = MORNING + timedelta(hours=12)
    assert row["planned_at"] == best and row["timing"] == "best"
    assert best <= row["release_at"] < best + timedelta(minutes=10)
    clock.now = MORNING + timedelta(hours=1)
    assert Releaser(gov.source, clock=clock).run_once().handled == 0
    clock.now = row["release_at"]
    assert Releaser(gov.source, clock=clock).run_once().outcomes == {"released": 1}


def test_a_deadline_before_the_best_hour_keeps_the_first_slot(gov: Governor, conn: psycopg.Connection[Any]) -> None:
    set_timing(conn)
    curves(conn)
    assert hold(gov, conn, "u", "m", ttl=10 * 3600)["planned_at"] == MORNING  # dies at 09:00
    # with 21 h 30 it lives past 20:00 and its jitter: 20:00
    assert hold(gov, conn, "v", "m2", ttl=21 * 3600 + 1800)["planned_at"] == MORNING + timedelta(hours=12)


def test_p1_waits_at_most_its_bounded_extra_delay_and_p0_never(
    gov: Governor, conn: psycopg.Connection[Any]
) -> None:
    """The best hour is 09:00: a P1 first allowed at 08:00 waits for it (1 h, the default
    bound), not with a bound of 30 min. At 20:00 a P2 waits for it, a P1 does not (it goes
    at 08:00, its hours up to 09:00 being equal). A P0 is sent at once."""
    set_timing(conn)
    curves(conn, peak=9)
    assert hold(gov, conn, "u", "p1", tier="P1")["planned_at"] == MORNING + timedelta(hours=1)
    set_timing(conn, 'enabled = true\nexplore = 0\np1_max_delay = "30m"')
    assert hold(gov, conn, "v", "p1b", tier="P1")["planned_at"] == MORNING
    set_timing(conn)
    conn.execute("DELETE FROM gov.push_events")
    reach_crowd(conn, peak=20, prefix="d")
    conn.execute("SELECT gov.refresh_timing_curves_v1(p_now => %s)", (NOW,))
    assert hold(gov, conn, "w", "p1c", tier="P1")["planned_at"] == MORNING
    assert hold(gov, conn, "x", "p2", tier="P2")["planned_at"] == MORNING + timedelta(hours=12)
    set_time_zone(conn, "y", "UTC")
    assert gov.send(Message(user_id="y", id="otp", tier="P0", title="code")).sent


def test_quiet_hours_are_never_chosen(gov: Governor, conn: psycopg.Connection[Any]) -> None:
    """The population is reachable at 23:00 only, inside quiet hours; with two days to live the
    message could go at 23:00 tomorrow: the best allowed hour is the earliest of the
    (equal) others, the first slot."""
    set_timing(conn)
    curves(conn, peak=23)
    row = hold(gov, conn, "u", "m", ttl=48 * 3600)
    assert row["planned_at"] == MORNING


def test_a_users_own_reach_beats_the_population(gov: Governor, conn: psycopg.Connection[Any]) -> None:
    set_timing(conn)
    curves(conn)
    user(conn, "own", "UTC")
    for day in range(1, 41):  # forty deliveries at 12:00 UTC, all displayed at once; at 20:00, none
        delivered(conn, "own", f"own-a{day}", at_utc_hour(day, 12), prompt=True)
        delivered(conn, "own", f"own-b{day}", at_utc_hour(day, 20), prompt=False)
    assert hold(gov, conn, "own", "m")["planned_at"] == MORNING + timedelta(hours=4)


def test_an_explored_share_goes_at_a_drawn_hour_and_says_so(gov: Governor, conn: psycopg.Connection[Any]) -> None:
    """explore = 0.5: about half of 120 messages are explored (drawn from the message id,
    so a message always draws the same), at an allowed hour within the deadline."""
    set_timing(conn, "enabled = true\nexplore = 0.5")
    curves(conn)
    rows = [hold(gov, conn, f"e{i}", f"e{i}-m") for i in range(120)]
    explored = [r for r in rows if r["timing"] == "explore"]
    assert 40 <= len(explored) <= 80
    assert all(r["timing"] == "best" and r["planned_at"] == MORNING + timedelta(hours=12)
               for r in rows if r["timing"] != "explore")
    assert len({r["planned_at"] for r in explored}) > 5
    assert all(MORNING <= r["planned_at"] <= EVENING + timedelta(hours=23) and r["planned_at"].minute == 0
               for r in explored)
    again = conn.execute(
        "SELECT o_slot, o_timing FROM gov.best_slot('e0', 'P2', 'e0-m', %s, %s, %s)",
        (MORNING, EVENING + timedelta(days=1), EVENING),
    ).fetchone()
    assert again == (rows[0]["planned_at"], rows[0]["timing"])
    set_timing(conn, "enabled = true\nexplore = 0")
    assert {hold(gov, conn, f"f{i}", f"f{i}-m")["timing"] for i in range(40)} == {"best"}


@pytest.mark.parametrize(
    ("evening", "best"),
    [
        # the night DST ends in Berlin (03:00 CEST -> 02:00 CET): 20:00 CET is 19:00 UTC
        (datetime(2026, 10, 24, 21, 0, tzinfo=UTC), datetime(2026, 10, 25, 19, 0, tzinfo=UTC)),
        # the night it begins (02:00 CET -> 03:00 CEST): 20:00 CEST is 18:00 UTC
        (datetime(2026, 3, 28, 22, 0, tzinfo=UTC), datetime(2026, 3, 29, 18, 0, tzinfo=UTC)),
    ],
)
def test_the_best_hour_is_local_across_dst(
    gov: Governor, clock: Clock, conn: psycopg.Connection[Any], evening: datetime, best: datetime
) -> None:
    set_timing(conn)
    curves(conn)  # the crowd is in UTC: its best local hour is 20
    clock.now = evening
    assert hold(gov, conn, "b", "m", zone="Europe/Berlin")["planned_at"] == best


def test_policy_timing_round_trips_and_refuses_nonsense() -> None:
    text = policy_mod.default_policy_text() + '\n[timing]\nenabled = true\np1_max_delay = "30m"\nexplore = 0.1\n'
    policy = policy_mod.parse_policy(text, "p.toml")
    assert (policy.timing_enabled, policy.timing_p1_max_delay_ms, policy.timing_explore) == (True, 1_800_000, 0.1)
    assert policy_mod.parse_policy(policy.to_toml(), "again.toml") == policy
    assert "[timing]" not in policy_mod.default_policy().to_toml()
    for bad in ('enabled = "yes"', "explore = 1.5", "explore = true", 'p1_max_delay = "soon"', "when = 1"):
        with pytest.raises(policy_mod.PolicyError):
            policy_mod.parse_policy(policy_mod.default_policy_text() + f"\n[timing]\n{bad}\n", "p.toml")
