"""Four `gov dispatch` processes over one outbox of 5,000 rows.

* Side by side, they deliver every row **exactly once**, as counted by a real push service
  (it verifies the VAPID token and decrypts every request): claims skip each other's rows,
  and every outcome is recorded once, by the runner that holds the row (invariant 12).
* With one of them killed by SIGKILL mid-run, **nothing is lost** (its rows are reclaimed
  by the others when their lease runs out: invariant 7) and a row is sent twice **only if
  the killed runner held it** when it died: the at-least-once window of docs/states.md (a
  runner killed between the push service's 201 and its record). A duplicate of any other
  row fails the test.
* A runner frozen (SIGSTOP) past its lease and then let go on records nothing for the rows
  the others took over meanwhile: its outcomes are fenced off by the claim token.

The push service runs in a thread of the test process and takes the 5,000 verified and
decrypted requests in a few seconds; the four runners are real subprocesses in test mode
(GOV_ALLOW_LOOPBACK_HTTP=1), one worker name each (``host:pid:…``, see
gov.delivery.runner.Dispatcher), which is how the killed runner's rows are found in gov.outbox.
Each test takes 15–20 s on a 2-core machine; nothing here asserts a duration.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gov import Governor, Message
from gov.testing import PushService
from tests.faults import GovProcess, assert_integrity, db_now, gov_env, scalar, wait_for

pytestmark = pytest.mark.slow

USERS = 2000
TWO_SUBSCRIPTIONS = 500  # the first 500 users have two browsers: 2,500 endpoints
MESSAGES = ("m1", "m2")  # to every user, P0 (exempt: no cap interferes): 5,000 outbox rows
ROWS = (USERS + TWO_SUBSCRIPTIONS) * len(MESSAGES)
RUNNERS = 4
DRAIN_TIMEOUT_S = 180.0  # generous: a loaded 2-core machine; the usual drain is ~10 s
STALL_S = 45.0  # no row finishing for this long (9 leases of the kill test): stuck
WANT_TRIES = 30  # freezes of the victim to catch it inside the at-least-once window
VICTIM_APP = "gov-victim-dispatch"

Key = tuple[str, str]  # (endpoint, message id): one outbox row


def _outbox_rows(push: PushService, gov: Governor) -> None:
    """Subscribe the users and queue the messages through the public API (no delivery)."""
    users = [f"u{i:04d}" for i in range(USERS)]
    for i, user in enumerate(users):
        for _ in range(2 if i < TWO_SUBSCRIPTIONS else 1):
            gov.subscribe(user, push.subscribe(user).info)
    for message_id in MESSAGES:
        results = gov.send_many(Message(user_id="-", id=message_id, tier="P0", title="code", body="123456"), users)
        assert all(result.decision.allowed for _, result in results)


def _rows(url: str) -> dict[int, tuple[Key, str]]:
    """outbox id → ((endpoint, message id), state)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT o.id, s.endpoint, o.message_id, o.state FROM gov.outbox o"
            " JOIN gov.subscriptions s ON s.id = o.subscription_id"
        ).fetchall()
    return {oid: ((endpoint, mid), state) for oid, endpoint, mid, state in rows}


def _requests(push: PushService) -> Counter[Key]:
    """(endpoint, message id) → requests the push service accepted for it (verified, decrypted, 201)."""
    return Counter((r.endpoint, json.loads(r.payload or b"{}")["data"]["id"]) for r in push.delivered())


def _refused(push: PushService) -> list[tuple[str, int | None, str | None]]:
    """The requests the push service did not accept: (endpoint, status, reason)."""
    return [(r.endpoint, r.status, r.reason) for r in push.received if r.status != 201]


def _attempts(url: str) -> dict[int, Counter[str]]:
    """outbox id → its recorded attempts by outcome."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT outbox_id, outcome, count(*) FROM gov.delivery_attempts GROUP BY outbox_id, outcome"
        ).fetchall()
    attempts: dict[int, Counter[str]] = {}
    for oid, outcome, n in rows:
        attempts.setdefault(oid, Counter())[outcome] += n
    return attempts


def _to_do(url: str) -> int:
    return int(scalar(url, "SELECT count(*) FROM gov.outbox WHERE state IN ('pending', 'sending')"))


def _drain(url: str, procs: list[GovProcess], what: str) -> None:
    """Wait until no row is pending or sending. Fails when a runner exits, or when nothing
    moves for STALL_S seconds (many leases long: rows stuck for good, say, lost)."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    last, moved = -1, time.monotonic()
    while True:
        dead = [(p.name, p.stderr()[-2000:]) for p in procs if not p.alive()]
        assert not dead, dead
        left = _to_do(url)
        if left == 0:
            return
        now = time.monotonic()
        if left != last:
            last, moved = left, now
        assert now - moved < STALL_S, f"{what}: {left} rows stuck in pending/sending for {STALL_S:g} s"
        assert now < deadline, f"{what}: {left} rows still to do after {DRAIN_TIMEOUT_S:g} s"
        time.sleep(0.2)


def _runners(url: str, key_path: Path, tmp_path: Path, lease: float, timeout: float,
             victim: bool = False) -> list[GovProcess]:
    """Four looping runners started together (the first one named for pg_stat_activity when
    it is to be killed). One process each: ``--processes``, where the runner has it, is 1."""
    args = ["dispatch", "--workers", "8", "--lease", str(lease), "--timeout", str(timeout), "--idle", "0.05"]
    procs = []
    for i in range(RUNNERS):
        extra = {"GOV_DISPATCH_PROCESSES": "1"}  # ignored by a runner without --processes
        if victim and i == 0:
            extra["PGAPPNAME"] = VICTIM_APP
        procs.append(GovProcess(args, gov_env(url, key_path, **extra), tmp_path, f"runner{i}"))
    return procs


def _stop_all(procs: list[GovProcess]) -> None:
    try:
        for proc in procs:
            if proc.alive():
                assert proc.stop(timeout=60) == 0, f"{proc.name}: {proc.stderr()[-3000:]}"
    finally:
        for proc in procs:
            proc.__exit__()


def _process_tree(pid: int) -> set[int]:
    """``pid`` and its descendants (a runner with worker processes of its own)."""
    tree, todo = set(), [pid]
    while todo:
        p = todo.pop()
        tree.add(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return tree


def _leased_by(url: str, pids: set[int]) -> set[int]:
    """Outbox rows leased (committed, `sending`) by a worker of these processes: a worker
    name is ``host:pid:…``."""
    host = socket.gethostname()
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, leased_by FROM gov.outbox WHERE state = 'sending'").fetchall()
    held = set()
    for oid, name in rows:
        parts = (name or "").split(":")
        if len(parts) >= 2 and parts[0] == host and parts[1].isdigit() and int(parts[1]) in pids:
            held.add(oid)
    return held


def _victim_busy(url: str) -> bool:
    """The stopped victim still has a statement running in the database (a claim or a
    record that may yet commit)."""
    return bool(scalar(
        url, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND state = 'active'", (VICTIM_APP,)
    ))


def _freeze_holding(url: str, victim: GovProcess, wanted: Callable[[set[int]], bool]) -> set[int]:
    """Stop the victim (SIGSTOP) at a moment it holds rows; return those rows.

    Once it is frozen, a statement it already sent (a claim or a record) is let finish: one
    that commits is seen here, one left open rolls back at the kill. Caught between a record
    and its next claim, holding nothing, it is let go on and frozen again; so it is, a few
    times, while what it holds is not ``wanted`` and half the outbox is still to do (then
    the rows it holds will do: it must be killed mid-run).
    """
    tries = 0
    while True:
        tries += 1
        wait_for(lambda: _leased_by(url, _process_tree(victim.pid)), 60, "the victim to hold rows", interval=0.01)
        pids = _process_tree(victim.pid)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(0.2)  # a statement sent just before the stop is picked up by its backend, then:
        wait_for(lambda: not _victim_busy(url), 30, "the stopped victim's statements to end")
        held = _leased_by(url, pids)
        if held and (wanted(held) or tries >= WANT_TRIES or _to_do(url) < ROWS // 2):
            return held
        assert tries < 10 * WANT_TRIES, "never caught the victim holding rows"
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.01 * (tries % 7))


def _queue(url: str, push: PushService) -> dict[int, tuple[Key, str]]:
    """The 5,000 outbox rows, queued; returns them (outbox id → ((endpoint, message id), state))."""
    with Governor(url, allow_loopback_http=True, pool_size=1) as gov:
        _outbox_rows(push, gov)
    rows = _rows(url)
    assert len(rows) == ROWS
    assert len({key for key, _ in rows.values()}) == ROWS
    return rows


def _each_delivered_once_but(url: str, push: PushService, rows: dict[int, tuple[Key, str]], held: set[int],
                             since: datetime) -> dict[Key, int]:
    """The end of every test: every row delivered and accepted by the push service (none
    lost); a row sent more than once only if it is in ``held`` (the rows the faulty runner
    held), and then twice at most; one accepted attempt recorded per row, nothing else;
    conservation. Returns the rows sent twice."""
    expected = {key for key, _ in rows.values()}
    held_keys = {rows[oid][0] for oid in held}
    # a request a runner was writing when it was killed reaches the push service cut short (400)
    refused = _refused(push)
    assert {e for e, _, _ in refused} <= {e for e, _ in held_keys}, refused
    requests = _requests(push)
    lost = expected - set(requests)
    assert not lost, f"lost: {len(lost)} rows, e.g. {sorted(lost)[:5]}"
    assert set(requests) == expected
    twice = {key: n for key, n in requests.items() if n > 1}
    attempts = _attempts(url)
    wrong = {oid: dict(c) for oid, c in attempts.items() if c != Counter(accepted=1)}
    not_held = {key: n for key, n in twice.items() if key not in held_keys}
    assert not not_held, (
        f"{len(not_held)} rows sent more than once though no faulty runner held them, e.g. "
        f"{sorted(not_held.items())[:5]}; attempts other than one accepted: {sorted(wrong.items())[:5]}"
    )
    assert all(n == 2 for n in twice.values()), twice
    assert {state for _, state in _rows(url).values()} == {"delivered"}, "none lost"
    # what a faulty runner sent it never recorded: one accepted attempt per row all the same
    assert set(attempts) == set(rows)
    assert not wrong, f"rows without exactly one (accepted) attempt: {sorted(wrong.items())[:5]}"
    assert scalar(url, "SELECT count(*) FROM gov.message_states_v1(%s, clock_timestamp() + interval '1 day')"
                       " WHERE state LIKE 'INCONSISTENT%%'", (since,)) == 0
    assert assert_integrity(url, since) == {"delivered": USERS * len(MESSAGES)}
    return twice


def test_four_runners_deliver_every_row_exactly_once(
    db_url: str, key_path: Path, make_push: Any, tmp_path: Path
) -> None:
    push = make_push()
    since = db_now(db_url)
    rows = _queue(db_url, push)

    procs = _runners(db_url, key_path, tmp_path, lease=30, timeout=10)
    try:
        _drain(db_url, procs, "the four runners")
    finally:
        _stop_all(procs)  # before counting: whatever a runner still sent is counted

    assert not _refused(push)
    twice = _each_delivered_once_but(db_url, push, rows, set(), since)
    assert not twice
    assert sum(_requests(push).values()) == ROWS
    # all four took part (SKIP LOCKED claims side by side rather than one runner taking all)
    workers = scalar(db_url, "SELECT count(DISTINCT split_part(worker, ':', 2)) FROM gov.delivery_attempts")
    assert workers == RUNNERS, workers


def test_one_of_four_runners_killed_mid_run(db_url: str, key_path: Path, make_push: Any, tmp_path: Path) -> None:
    push = make_push()
    since = db_now(db_url)
    rows = _queue(db_url, push)

    # a short lease, so the killed runner's rows come back to the others soon; a whole
    # attempt (the total deadline) fits in it
    procs = _runners(db_url, key_path, tmp_path, lease=5, timeout=3, victim=True)
    victim = procs[0]
    try:
        # mid-run: a fifth of the rows delivered, and the victim holds rows
        wait_for(lambda: len(push.received) >= ROWS // 5, DRAIN_TIMEOUT_S, "a fifth of the rows to be delivered")
        # best, inside the at-least-once window: some rows the push service accepted, unrecorded
        held = _freeze_holding(db_url, victim, lambda held: any(rows[oid][0] in _requests(push) for oid in held))
        for pid in _process_tree(victim.pid):
            os.kill(pid, signal.SIGKILL)
        victim.proc.wait(timeout=10)
        left = _to_do(db_url)
        assert left > 0, "the victim was killed after the outbox drained: not mid-run"
        _drain(db_url, procs[1:], "the three survivors (the victim's rows after their lease)")
    finally:
        _stop_all(procs[1:])
        victim.__exit__()

    twice = _each_delivered_once_but(db_url, push, rows, held, since)
    print(f"\n{ROWS} rows, {left} still to do at the kill; the killed runner held rows {sorted(held)}; "
          f"sent twice: {sorted(oid for oid, (key, _) in rows.items() if key in twice)}")


def test_runner_paused_past_its_lease_records_nothing(
    db_url: str, key_path: Path, make_push: Any, tmp_path: Path
) -> None:
    """A runner frozen (SIGSTOP: a VM or GC pause) while it holds rows, until the others have
    reclaimed and delivered them, then let go on: its late outcomes are fenced off (nothing
    recorded for rows it lost; the fencing token), and it goes on draining with the others.
    As with the kill, only rows it held may reach the push service twice (an answer it had
    already had, or a request it was writing when frozen)."""
    push = make_push()
    since = db_now(db_url)
    rows = _queue(db_url, push)

    procs = _runners(db_url, key_path, tmp_path, lease=5, timeout=3, victim=True)
    victim = procs[0]
    try:
        wait_for(lambda: len(push.received) >= ROWS // 5, DRAIN_TIMEOUT_S, "a fifth of the rows to be delivered")
        held = _freeze_holding(db_url, victim, lambda held: any(rows[oid][0] in _requests(push) for oid in held))
        victim_names = set(scalar(db_url, "SELECT array_agg(DISTINCT leased_by) FROM gov.outbox WHERE id = ANY(%s)",
                                  (sorted(held),)))
        # the others take its rows when the lease runs out, and deliver them
        wait_for(lambda: scalar(db_url, "SELECT bool_and(state = 'delivered') FROM gov.outbox WHERE id = ANY(%s)",
                                (sorted(held),)), 120, "the paused runner's rows to be delivered by the others")
        for pid in _process_tree(victim.pid):
            os.kill(pid, signal.SIGCONT)
        _drain(db_url, procs, "the four runners, the paused one let go on")
    finally:
        for pid in _process_tree(victim.pid):
            os.kill(pid, signal.SIGCONT)
        _stop_all(procs)

    twice = _each_delivered_once_but(db_url, push, rows, held, since)
    # fenced: the paused runner recorded nothing for the rows it had lost
    late = scalar(db_url, "SELECT count(*) FROM gov.delivery_attempts WHERE outbox_id = ANY(%s) AND worker = ANY(%s)",
                  (sorted(held), sorted(victim_names)))
    assert late == 0, f"the paused runner recorded {late} outcomes for rows it no longer held"
    print(f"\npaused runner held rows {sorted(held)}; sent twice: "
          f"{sorted(oid for oid, (key, _) in rows.items() if key in twice)}")
