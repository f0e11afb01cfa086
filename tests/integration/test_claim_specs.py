"""Concurrency specs for the two claims, in named steps across real sessions.

Two releasers (``gov.release_due_v2``) and two runners (``gov.claim_outbox_v3``) must
never block on each other's rows and never take one row twice. Each spec drives two
sessions by hand: session A claims inside a transaction it keeps open, session B
claims while A still holds its rows, then A commits. B runs with a ``lock_timeout``:
a claim that waited on A's rows (one without ``SKIP LOCKED``) fails with
LockNotAvailable instead of hanging. ``lock_timeout`` counts only time spent waiting
for a lock, so a loaded machine cannot trip it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from gov import Governor, Message
from gov.testing import Clock

T0 = datetime(2026, 6, 10, 9, 0, tzinfo=UTC)
NOT_WAITING = "1500ms"  # B's lock_timeout: a blocked claim fails, a free one never waits


@pytest.fixture
def session_a(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(db_url) as c:  # not autocommit: the first statement opens a transaction
        yield c


@pytest.fixture
def session_b(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(db_url) as c:
        c.execute(f"SET lock_timeout = '{NOT_WAITING}'")
        c.commit()
        yield c


def _b_claims(session_b: psycopg.Connection[Any], sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    try:
        return session_b.execute(sql, params).fetchall()
    except psycopg.errors.LockNotAvailable:
        session_b.rollback()
        pytest.fail("session B waited on session A's rows: the claim does not skip locked rows")


# -- two releasers ---------------------------------------------------------------------

USERS = [f"u{i:02d}" for i in range(16)]  # more than PL/pgSQL's 10-row prefetch of A's loop
RELEASE = "SELECT user_id, message_id, state FROM gov.release_due_v2(NULL, %s, %s)"


@pytest.fixture
def held_for_release(db_url: str, conn: psycopg.Connection[Any]) -> datetime:
    """One held P1 per user, all due at the returned time."""
    conn.execute("UPDATE gov.settings SET jitter_ms = 0")
    clock = Clock(T0)
    with Governor(db_url, clock=clock) as g:
        for user in USERS:
            clock.now = T0
            for i in range(6):
                assert g.send(Message(user_id=user, id=f"m{i}", tier="P1", title="t"), deliver=False).sent
            clock.now = T0 + timedelta(hours=20)
            held = g.send(Message(user_id=user, id="held", tier="P1", title="t"), deliver=False)
            assert held.decision.action == "defer"
    assert conn.execute("SELECT count(*) FROM gov.deferred WHERE state = 'waiting'").fetchone() == (len(USERS),)
    return T0 + timedelta(hours=24, minutes=1)


def test_two_releasers_never_block_on_or_share_a_held_row(
    session_a: psycopg.Connection[Any],
    session_b: psycopg.Connection[Any],
    conn: psycopg.Connection[Any],
    held_for_release: datetime,
) -> None:
    due = held_for_release

    # step 1: session A releases one row and keeps its transaction open
    a_rows = session_a.execute(RELEASE, (1, due)).fetchall()
    assert [state for _, _, state in a_rows] == ["released"]
    a_users = {user for user, _, _ in a_rows}

    # step 2: session B releases the rest at once, without waiting on A's rows
    b_rows = _b_claims(session_b, RELEASE, (len(USERS), due))
    b_users = {user for user, _, state in b_rows if state == "released"}
    assert b_users, "session B released nothing while A held one row"
    assert not a_users & b_users, "a held row was released by both sessions"
    assert all(state in ("released", "busy") for _, _, state in b_rows)
    session_b.commit()

    # step 3: A commits; a last pass takes what A's open transaction still had locked
    session_a.commit()
    rest = conn.execute(RELEASE, (len(USERS), due)).fetchall()
    rest_users = {user for user, _, state in rest if state == "released"}
    assert not rest_users & (a_users | b_users), "a row was released twice"

    # every held message released exactly once, and spent its slot once
    assert a_users | b_users | rest_users == set(USERS)
    assert conn.execute(
        "SELECT count(*), count(DISTINCT user_id) FROM gov.deferred WHERE state = 'released'"
    ).fetchone() == (len(USERS), len(USERS))
    spent = "SELECT count(*) FROM gov.sends WHERE message_id = %s"
    assert conn.execute(spent, ("held",)).fetchone() == conn.execute(spent, ("m0",)).fetchone()
    assert conn.execute(RELEASE, (len(USERS), due)).fetchall() == []


# -- two runners -------------------------------------------------------------------------

CLAIM = "SELECT outbox_id, claim_token FROM gov.claim_outbox_v3(NULL, %s, %s, 60000)"
QUEUED = 6


@pytest.fixture
def queued(db_url: str, conn: psycopg.Connection[Any]) -> None:
    """Six messages queued for delivery, one subscription each, all due now."""
    with Governor(db_url) as g:
        for i in range(QUEUED):
            conn.execute(
                "INSERT INTO gov.subscriptions (user_id, endpoint, p256dh, auth) VALUES (%s, %s, 'k', 'a')",
                (f"r{i}", f"https://push.example/{i}"),
            )
            assert g.send(Message(user_id=f"r{i}", id="m", tier="P1", title="t"), deliver=False).sent
    assert conn.execute("SELECT count(*) FROM gov.outbox WHERE state = 'pending'").fetchone() == (QUEUED,)


@pytest.mark.usefixtures("queued")
def test_two_runners_never_block_on_or_share_an_outbox_row(
    session_a: psycopg.Connection[Any],
    session_b: psycopg.Connection[Any],
    conn: psycopg.Connection[Any],
) -> None:
    # step 1: runner A claims two rows and keeps its transaction open
    a_ids = {row[0] for row in session_a.execute(CLAIM, ("runner-a", 2)).fetchall()}
    assert len(a_ids) == 2

    # step 2: runner B claims everything it can, at once, and gets only the others
    b_ids = {row[0] for row in _b_claims(session_b, CLAIM, ("runner-b", QUEUED))}
    assert len(b_ids) == QUEUED - 2
    assert not a_ids & b_ids, "an outbox row was claimed by both runners"
    session_b.commit()

    # step 3: A commits; nothing is left to claim, and each row has one lease holder
    session_a.commit()
    assert conn.execute(CLAIM, ("runner-c", QUEUED)).fetchall() == []
    leased = dict(conn.execute("SELECT id, leased_by FROM gov.outbox WHERE state = 'sending'").fetchall())
    assert leased == {**dict.fromkeys(a_ids, "runner-a"), **dict.fromkeys(b_ids, "runner-b")}


@pytest.mark.usefixtures("queued")
def test_a_runner_that_rolls_back_leaves_its_rows_to_the_other(
    session_a: psycopg.Connection[Any],
    session_b: psycopg.Connection[Any],
    conn: psycopg.Connection[Any],
) -> None:
    # step 1: runner A claims everything, and does not commit
    a_ids = {row[0] for row in session_a.execute(CLAIM, ("runner-a", QUEUED)).fetchall()}
    assert len(a_ids) == QUEUED

    # step 2: runner B finds nothing free, and does not wait for A
    assert _b_claims(session_b, CLAIM, ("runner-b", QUEUED)) == []
    session_b.commit()

    # step 3: A rolls back; B now takes every row, each once
    session_a.rollback()
    b_ids = {row[0] for row in _b_claims(session_b, CLAIM, ("runner-b", QUEUED))}
    session_b.commit()
    assert b_ids == a_ids
    assert conn.execute(
        "SELECT count(*) FROM gov.outbox WHERE state = 'sending' AND leased_by = 'runner-b' AND attempts = 1"
    ).fetchone() == (QUEUED,)
