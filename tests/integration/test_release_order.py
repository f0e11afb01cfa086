"""The release order (issue 30, item 3): when one slot opens for a user with several held
rows, the nearest deadline goes first, then the higher tier, then the older hold; a fresh
message of a holding tier does not take a slot a nearer deadline is owed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from gov import Governor, Message
from gov.delivery.runner import Dispatcher
from gov.delivery.vapid import VapidSigner
from gov.hold.release import Releaser
from gov.testing import Clock, PushService
from tests.integration.test_queue import held, set_jitter

START = datetime(2026, 6, 10, 9, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> Clock:
    return Clock(START)


@pytest.fixture
def gov(db_url: str, signer: VapidSigner, clock: Clock) -> Iterator[Governor]:
    with Governor(db_url, signer=signer, clock=clock, allow_loopback_http=True) as g:
        yield g


def p3(user: str, mid: str, key: str, ttl_s: int) -> Message:
    return Message(user_id=user, id=mid, tier="P3", title=mid, collapse_key=key, ttl=ttl_s)


def two_groups(gov: Governor, clock: Clock, user: str = "u") -> None:
    """The weekly P3 slot taken at START; at +6 d a digest (8 d TTL) is held, then a
    recommendation (48 h TTL, the nearer deadline) at +6 d 1 h: both wait for the slot at +7 d."""
    clock.now = START
    assert gov.send(p3(user, f"{user}-first", "digest", 8 * 86400)).sent
    clock.now = START + timedelta(days=6, hours=1)
    assert gov.send(p3(user, f"{user}-digest", "digest", 8 * 86400)).decision.action == "collapse"
    assert gov.send(p3(user, f"{user}-recs", "recs", 48 * 3600)).decision.action == "collapse"


def test_the_slot_goes_to_the_nearest_deadline(gov: Governor, clock: Clock, conn: psycopg.Connection[Any]) -> None:
    """By release time (and id) the digest, held first, went first and the recommendation
    expired a day later; earliest deadline first, the recommendation goes and the digest
    waits for the next slot, within its own TTL."""
    set_jitter(conn, 0)  # both due at the same moment: only the order decides
    two_groups(gov, clock)
    assert held(conn, "u-digest")["release_at"] == held(conn, "u-recs")["release_at"] == START + timedelta(days=7)
    clock.now = START + timedelta(days=7)
    stats = Releaser(gov.source, clock=clock).run_once()
    assert stats.outcomes == {"released": 1, "waiting": 1}
    assert held(conn, "u-recs")["state"] == "released"
    digest = held(conn, "u-digest")
    assert digest["state"] == "waiting" and digest["planned_at"] == START + timedelta(days=14)
    # planned_at follows the slot it waits for now, the jitter (0 here) on top
    assert digest["release_at"] == digest["planned_at"]


def test_a_row_kept_back_by_its_jitter_still_competes(
    gov: Governor, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    """The digest is due first (its jitter is shorter): the slot still goes to the nearer deadline."""
    set_jitter(conn, 0)
    two_groups(gov, clock)
    slot = START + timedelta(days=7)
    conn.execute("UPDATE gov.deferred SET release_at = %s WHERE message_id = 'u-digest'", (slot,))
    conn.execute("UPDATE gov.deferred SET release_at = %s WHERE message_id = 'u-recs'", (slot + timedelta(minutes=9),))
    clock.now = slot + timedelta(minutes=1)
    Releaser(gov.source, clock=clock).run_once()
    assert held(conn, "u-recs")["state"] == "released"
    assert held(conn, "u-digest")["state"] == "waiting"


def test_on_the_same_deadline_the_higher_tier_goes_first(
    gov: Governor, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    """A P3 group and a P1 deferral wait for the same P1 slot with the same deadline: the P1
    goes, though the P3 was held first (older) and, by id, went first before."""
    set_jitter(conn, 0)
    gov.send(Message(user_id="u", id="m0", tier="P1", title="t"))
    clock.now = START + timedelta(hours=10)
    for i in range(1, 6):
        gov.send(Message(user_id="u", id=f"m{i}", tier="P1", title="t"))
    # P1's window frees at +24 h (m0 leaves), the next slot at +34 h
    clock.now = START + timedelta(hours=20)
    # the P3's TTL (6 h) ends when the P1's defer_max (6 h) does: the same deadline, +26 h
    assert gov.send(p3("u", "digest", "digest", 6 * 3600)).decision.action == "collapse"
    assert gov.send(Message(user_id="u", id="mention", tier="P1", title="t")).decision.action == "defer"
    assert held(conn, "digest")["planned_at"] == held(conn, "mention")["planned_at"] == START + timedelta(hours=24)
    clock.now = START + timedelta(hours=24)
    Releaser(gov.source, clock=clock).run_once()
    assert held(conn, "mention")["state"] == "released"
    assert held(conn, "digest")["state"] == "expired"  # its next slot (+34 h) is past its TTL


def test_a_fresh_message_does_not_take_a_slot_owed_to_a_nearer_deadline(
    gov: Governor, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    """The slot opened; the held recommendation waits out its jitter; a new digest arrives:
    the recommendation goes first (released by the send), the digest is held."""
    set_jitter(conn, 600_000)
    clock.now = START
    assert gov.send(p3("u", "first", "digest", 8 * 86400)).sent
    clock.now = START + timedelta(days=6)
    assert gov.send(p3("u", "recs", "recs", 48 * 3600)).decision.action == "collapse"
    row = held(conn, "recs")
    assert row["release_at"] > row["planned_at"] == START + timedelta(days=7)
    clock.now = row["planned_at"]
    assert gov.send(p3("u", "digest", "digest", 8 * 86400)).decision.action == "collapse"
    assert held(conn, "recs")["state"] == "released"
    assert conn.execute("SELECT count(*) FROM gov.sends WHERE message_id = 'recs' AND budget = 'P3'").fetchone() == (1,)
    # a tier that drops is never made to yield (it would be lost): a P2 takes its own slot
    assert gov.send(Message(user_id="u", id="promo", tier="P2", title="t")).sent


def test_the_order_holds_under_concurrent_releasers(
    db_url: str, gov: Governor, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    """Twenty users with two groups each, four releasers released together: every user's
    slot goes to the recommendation, exactly once, whichever releaser took which row."""
    set_jitter(conn, 0)
    users = [f"u{i:02d}" for i in range(20)]
    for user in users:
        two_groups(gov, clock, user)
    slot = START + timedelta(days=7)
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def release() -> None:
        try:
            r = Releaser(db_url, batch=3, clock=lambda: slot)
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
    rows = conn.execute(
        "SELECT split_part(message_id, '-', 2), state, count(*) FROM gov.deferred"
        " WHERE message_id LIKE 'u%%-%%' GROUP BY 1, 2 ORDER BY 1, 2"
    ).fetchall()
    assert rows == [("digest", "waiting", 20), ("recs", "released", 20)]
    # spent once each: one P3 send per user's recommendation
    assert conn.execute(
        "SELECT count(*) FROM gov.sends WHERE budget = 'P3' AND message_id LIKE '%%-recs'"
    ).fetchone() == (20,)


def _timed_recs(gov: Governor, clock: Clock, conn: psycopg.Connection[Any]) -> None:
    """With [timing] on (the population reachable at 20:00 UTC), a recommendation (48 h TTL)
    held at +6 d 2 h for the weekly slot of +7 d (09:00) is placed at 20:00 that day."""
    from tests.integration.test_timing import curves, set_timing

    set_timing(conn)
    curves(conn)
    clock.now = START + timedelta(days=6, hours=2)
    assert gov.send(p3("u", "u-recs", "recs", 48 * 3600)).decision.action == "collapse"
    recs = held(conn, "u-recs")
    assert recs["planned_at"] == START + timedelta(days=7, hours=11) and recs["first_at"] == START + timedelta(days=7)


def test_a_row_timing_placed_later_still_gets_the_slot_before_a_later_deadline(
    gov: Governor, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    """The digest (8 d TTL) was held for 09:00 before timing was on; the recommendation,
    timed to 20:00, has the nearer deadline. At 09:00 the slot goes to the recommendation
    (its first slot has passed): before migration 0054 the digest took it and the
    recommendation expired at 20:00 (the next slot, +14 d, is past its TTL)."""
    set_jitter(conn, 0)
    clock.now = START
    assert gov.send(p3("u", "u-first", "digest", 8 * 86400)).sent
    clock.now = START + timedelta(days=6, hours=1)
    assert gov.send(p3("u", "u-digest", "digest", 8 * 86400)).decision.action == "collapse"
    _timed_recs(gov, clock, conn)
    clock.now = START + timedelta(days=7)
    Releaser(gov.source, clock=clock).run_once()
    assert held(conn, "u-recs")["state"] == "released"
    digest = held(conn, "u-digest")
    assert digest["state"] == "waiting" and digest["planned_at"] == START + timedelta(days=14)
    assert digest["first_at"] is None  # held again at its first slot: not timed


def test_a_fresh_message_does_not_take_a_slot_a_timed_row_needs(
    gov: Governor, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    """The recommendation waits for 20:00; at 10:00 a digest arrives while the slot is open:
    the recommendation goes first (released by the send), the digest is held."""
    set_jitter(conn, 0)
    clock.now = START
    assert gov.send(p3("u", "u-first", "digest", 8 * 86400)).sent
    _timed_recs(gov, clock, conn)
    clock.now = START + timedelta(days=7, hours=1)
    assert gov.send(p3("u", "u-digest", "digest", 8 * 86400)).decision.action == "collapse"
    assert held(conn, "u-recs")["state"] == "released"


def test_a_timed_row_with_the_later_deadline_keeps_its_hour(
    gov: Governor, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    """Timing placed the digest (8 d TTL) at 20:00; the recommendation held for 09:00 before
    timing was on has the nearer deadline: at 09:00 it is released alone, and the digest is
    not pulled forward (it keeps its hour)."""
    from tests.integration.test_timing import curves, set_timing

    set_jitter(conn, 0)
    clock.now = START
    assert gov.send(p3("u", "u-first", "digest", 8 * 86400)).sent
    clock.now = START + timedelta(days=6, hours=1)
    assert gov.send(p3("u", "u-recs", "recs", 48 * 3600)).decision.action == "collapse"
    set_timing(conn)
    curves(conn)
    clock.now = START + timedelta(days=6, hours=2)
    assert gov.send(p3("u", "u-digest", "digest", 8 * 86400)).decision.action == "collapse"
    assert held(conn, "u-digest")["planned_at"] == START + timedelta(days=7, hours=11)
    clock.now = START + timedelta(days=7)
    assert Releaser(gov.source, clock=clock).run_once().outcomes == {"released": 1}
    assert held(conn, "u-recs")["state"] == "released"
    digest = held(conn, "u-digest")
    assert digest["state"] == "waiting" and digest["planned_at"] == START + timedelta(days=7, hours=11)


def test_the_simulation_s_paired_lift_knows_which_deliveries_the_timing_moved(
    gov: Governor, clock: Clock, conn: psycopg.Connection[Any], db_url: str, signer: VapidSigner, push: PushService
) -> None:
    """sim_delivered_non_p0, what `gov simulate --policy F --compare` pairs by message: the
    recommendation timing moved from its first slot (09:00) to 20:00, released, delivered
    through a push service and clicked, reads ('best', clicked); the first digest, sent at
    once, reads (None, not clicked); a message not delivered is not there."""
    from gov.queries import q

    set_jitter(conn, 0)
    gov.subscribe("u", push.subscribe().info)
    clock.now = START
    assert gov.send(p3("u", "u-first", "digest", 8 * 86400)).sent
    _timed_recs(gov, clock, conn)
    clock.now = START + timedelta(days=7, hours=11, minutes=5)  # (the hour's releases are spread over minutes)
    with Dispatcher(db_url, signer, workers=1, clock=clock, allow_loopback_http=True) as runner:
        assert Releaser(runner.source, dispatcher=runner, clock=clock).run_once().outcomes == {"released": 1}
        runner.run_once()
    assert gov.record_event("u", "u-recs", "click", at=clock.now)
    clock.now = START + timedelta(days=7, hours=12)
    assert gov.send(p3("u", "u-late", "digest", 8 * 86400)).decision.action == "collapse"  # held: not delivered
    assert conn.execute(q("sim_delivered_non_p0")).fetchall() == [("u", "u-first", None, False),
                                                                   ("u", "u-recs", "best", True)]
