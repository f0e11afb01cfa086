"""kill -9 of the runner and of the releaser in the middle of a batch.

* The **runner** claims rows with a committed lease and sends after the commit. Killed
  with requests in flight, its rows stay leased until the lease runs out; then another
  runner takes them. Nothing is lost; a row may be sent twice only if the dead runner had
  claimed it (delivery is at least once).
* The **releaser**'s batch is one transaction. Killed while the batch is half done (it
  is made to wait, mid-batch, on a user's lock the test holds), the batch rolls back:
  nothing it had released is visible, and the next releaser releases every message
  exactly once.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gov import Governor, Message
from gov.testing import Clock, PushService
from tests.faults import (
    GovProcess,
    assert_integrity,
    db_now,
    gov_env,
    scalar,
    use_fault_policy,
    wait_for,
)

HUNG = 2  # endpoints whose first request hangs: the runner is surely mid-batch when killed


def _accepted(push: PushService) -> Counter[tuple[str, str]]:
    """(endpoint, message id) → how many times the push service accepted it."""
    return Counter((r.endpoint, json.loads(r.payload or b"{}")["data"]["id"]) for r in push.delivered())


def _outbox(url: str) -> list[tuple[str, str, str, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT s.endpoint, o.message_id, o.state, o.attempts FROM gov.outbox o"
            " JOIN gov.subscriptions s ON s.id = o.subscription_id ORDER BY o.id"
        ).fetchall()
    return [tuple(r) for r in rows]  # type: ignore[misc]


@pytest.mark.parametrize("run", range(3))
def test_kill_runner_mid_batch(db_url: str, key_path: Path, make_push: Any, tmp_path: Path, run: int) -> None:
    push = make_push(hang_s=30.0)
    since = db_now(db_url)
    users = [f"k{i:02d}" for i in range(40)]
    hung = []
    with Governor(db_url, allow_loopback_http=True, pool_size=1) as gov:
        for i, user in enumerate(users):
            browser = push.subscribe(user)
            gov.subscribe(user, browser.info)
            if 20 <= i < 20 + HUNG:  # later in the outbox: some rows are delivered before
                push.script(browser, ["hang"])
                hung.append(browser.endpoint)
            for tier in ("P0", "P1", "P2"):
                gov.send(Message(user_id=user, id=f"{user}-{tier}", tier=tier, title=tier), deliver=False)
    expected = {(e, m) for e, m, _, _ in _outbox(db_url)}
    assert len(expected) == len(users) * 3

    env = gov_env(db_url, key_path)
    # a whole attempt (the total deadline, 4 s) fits in the lease: the hung requests are
    # still in flight, under a live lease, when the runner is killed
    with GovProcess(["dispatch", "--workers", "4", "--lease", "5", "--timeout", "4", "--idle", "0.05"], env,
                    tmp_path, "victim") as victim:
        # mid-batch: the hung requests are in flight, other rows were delivered before them
        wait_for(lambda: sum(1 for r in push.received if r.status is None) == HUNG, 30, "the hung requests")
        assert push.delivered(), "nothing delivered before the kill"
        victim.kill9()
    leased = {(e, m) for e, m, state, _ in _outbox(db_url) if state == "sending"}
    assert {e for e, _ in leased} >= set(hung), "the hung rows must still be leased by the dead runner"
    accepted_at_kill = _accepted(push)
    assert 0 < len(accepted_at_kill) < len(expected)

    # the dead runner's leases run out (database time); then another runner takes its rows
    wait_for(lambda: scalar(db_url, "SELECT coalesce(max(lease_until) < clock_timestamp(), true) FROM gov.outbox"),
             10, "the dead runner's leases to run out")
    with GovProcess(["dispatch", "--once", "--workers", "4", "--timeout", "5"], env, tmp_path, "rescuer") as rescuer:
        assert rescuer.wait(timeout=120) == 0, rescuer.stderr()[-3000:]

    accepted = _accepted(push)
    assert set(accepted) == expected, f"lost: {expected - set(accepted)}"
    twice = {key for key, n in accepted.items() if n > 1}
    assert twice <= leased, f"sent twice though the dead runner never held them: {twice - leased}"
    assert all(n <= 2 for n in accepted.values())
    assert {state for _, _, state, _ in _outbox(db_url)} == {"delivered"}
    states = assert_integrity(db_url, since)
    assert states == {"delivered": len(expected)}


# ---------------------------------------------------------------- the releaser


@pytest.fixture
def fault_db(db_url: str) -> Iterator[str]:
    use_fault_policy(db_url)
    yield db_url


def _server_version(url: str) -> int:
    return int(scalar(url, "SHOW server_version_num"))


def _victim_backend(url: str) -> Any:
    """The killed releaser's backend, while it still exists: (pid, state, wait_event)."""
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT pid, state, wait_event FROM pg_stat_activity WHERE application_name = 'gov-victim-releaser'"
            " AND state <> 'idle'"
        ).fetchone()


@pytest.mark.parametrize("run", range(3))
def test_kill_releaser_mid_batch(fault_db: str, key_path: Path, make_push: Any, tmp_path: Path, run: int) -> None:
    url = fault_db
    push = make_push()
    users = [f"h{i:02d}" for i in range(30)]
    blocker = users[15]
    now = db_now(url)
    since = now - timedelta(minutes=5)
    # held messages already due: each user's third P1 within a second, decided a minute ago
    with Governor(url, allow_loopback_http=True, pool_size=1, clock=Clock(now - timedelta(minutes=1))) as gov:
        for user in users:
            gov.subscribe(user, push.subscribe(user).info)
            for i in range(3):
                result = gov.send(Message(user_id=user, id=f"{user}-{i}", tier="P1", title=f"t{i}"), deliver=False)
                assert result.decision.action == ("defer" if i == 2 else None)
    held = {f"{u}-2" for u in users}
    due = scalar(url, "SELECT count(*) FROM gov.deferred WHERE state = 'waiting' AND release_at <= clock_timestamp()")
    assert due == len(users)
    delivered_before = len(push.delivered())

    # PostgreSQL 14+ notices a dead client even while its query waits on a lock, and rolls
    # back at once; older servers roll back when the waiting query next talks to the client
    pg14 = _server_version(url) >= 140000
    extra = {"PGAPPNAME": "gov-victim-releaser"}
    if pg14:
        extra["PGOPTIONS"] = "-c client_connection_check_interval=100"
    env = gov_env(url, key_path, **extra)
    with psycopg.connect(url) as lock_holder:
        # hold the row of one held message's decision: the releaser never waits for a user's
        # lock (it tries it), but re-deciding that message must update this row, so it waits
        # there, mid-batch, with the messages before it decided in its open transaction
        lock_holder.execute(
            "SELECT 1 FROM gov.messages WHERE user_id = %s AND message_id = %s FOR UPDATE", (blocker, f"{blocker}-2")
        )
        with GovProcess(["release", "--once", "--batch", "200"], env, tmp_path, "victim") as victim:
            backend = wait_for(
                lambda: (b := _victim_backend(url)) and b[2] in ("transactionid", "tuple") and b, 30,
                "the releaser to wait mid-batch",
            )
            # mid-batch: the blocker's user lock is taken, with those of the users decided before it
            decided = scalar(
                url, "SELECT count(*) FROM pg_locks WHERE pid = %s AND locktype = 'advisory' AND granted", (backend[0],)
            )
            assert decided >= 1, decided
            victim.kill9()
        if pg14:
            wait_for(lambda: _victim_backend(url) is None, 10, "the dead releaser's transaction to end")
            # rolled back: nothing of the half batch is visible
            assert scalar(url, "SELECT count(*) FROM gov.deferred WHERE state = 'waiting'") == len(users)
            assert scalar(url, "SELECT count(*) FROM gov.outbox o WHERE o.message_id = ANY(%s)", (list(held),)) == 0
        lock_holder.rollback()
    wait_for(lambda: _victim_backend(url) is None, 10, "the dead releaser's transaction to end")
    waiting = scalar(url, "SELECT count(*) FROM gov.deferred WHERE state = 'waiting'")
    assert waiting in (0, len(users)), f"a batch was half applied: {waiting} of {len(users)} still waiting"
    assert len(push.delivered()) == delivered_before, "the dead releaser delivered something"

    with GovProcess(["release", "--once"], gov_env(url, key_path), tmp_path, "rescuer") as rescuer:
        assert rescuer.wait(timeout=60) == 0, rescuer.stderr()[-3000:]
    out = json.loads(rescuer.stdout())
    # the usual case: the rescuer releases the whole batch; an old server may have let the
    # dead batch commit, and then nothing is left to release
    assert out["released"] == ({"released": len(users)} if waiting else {}), out
    # what the releaser did not deliver itself, the runner does
    with GovProcess(["dispatch", "--once"], gov_env(url, key_path), tmp_path, "runner") as runner:
        assert runner.wait(timeout=60) == 0, runner.stderr()[-3000:]

    # each held message released once: one outbox row, one spend per budget, one delivery
    assert scalar(url, "SELECT count(*) FROM gov.deferred WHERE state = 'released'") == len(users)
    rows = _outbox(url)
    released = Counter(m for _, m, _, _ in rows if m in held)
    assert released == Counter(held), released
    accepted = _accepted(push)
    assert {m for (_, m), n in accepted.items() if m in held and n == 1} == held, accepted
    assert {state for _, _, state, _ in rows} == {"delivered"}
    assert_integrity(url, since)


def test_release_once_delivers_everything_it_released(
    fault_db: str, key_path: Path, make_push: Any, tmp_path: Path
) -> None:
    url = fault_db
    push = make_push()
    users = [f"d{i:02d}" for i in range(20)]
    now = db_now(url)
    with Governor(url, allow_loopback_http=True, pool_size=1, clock=Clock(now - timedelta(minutes=1))) as gov:
        for user in users:
            gov.subscribe(user, push.subscribe(user).info)
            for i in range(3):
                gov.send(Message(user_id=user, id=f"{user}-{i}", tier="P1", title=f"t{i}"), deliver=False)
    with GovProcess(["release", "--once"], gov_env(url, key_path), tmp_path, "releaser") as releaser:
        assert releaser.wait(timeout=60) == 0, releaser.stderr()[-3000:]
    assert json.loads(releaser.stdout()) == {"released": {"released": len(users)}, "delivered": len(users)}
