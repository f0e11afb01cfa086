"""PostgreSQL restarts (fast and immediate shutdown) while senders, runner and releaser are busy.

What "they reconnect on their own" means, and what is asserted:

* a **sender** (``Governor.send``) retries a statement whose connection was lost until its
  ``pool_timeout`` has passed (``gov.db.Source.execute``). A sender whose pool_timeout
  outlasts the restart never sees an error, and no call takes much longer than its
  pool_timeout. A sender with a shorter pool_timeout may see a ``gov.DatabaseError``
  (``ConnectionLost`` or ``PoolTimeout``) within about its pool_timeout: its caller
  retries the *same* message id, and the message is decided once and spends once;
* the **runner** (``gov dispatch``) and the **releaser** (``gov release``) are loops that
  log a failed round and go on: they are still running after the restart, and deliver
  and release messages decided after it;
* nothing is half-applied or lost: every message is in exactly one state
  (conservation), every allowed message spent exactly one row per consumed budget, no
  user is over any cap in any window, and everything due is delivered.

The server restarted is one of the module's own (``own_pg``), never the configured one.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from gov import DatabaseError, Governor, GovError, Message, SendResult
from gov.delivery.vapid import VapidSigner
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
from tests.faults.conftest import OwnPostgres

USERS = [f"r{i:02d}" for i in range(12)]
PATIENT_POOL_TIMEOUT = 15.0  # seconds: far longer than a restart (about 1 s here)
IMPATIENT_POOL_TIMEOUT = 0.3  # seconds: shorter than an outage, so its caller sees the error
RETRY_GIVE_UP_S = 30.0  # seconds the test's own retry of one message may take, at most


@dataclass
class Sent:
    message: Message
    result: SendResult
    attempts: int
    at: float  # time.monotonic() when the verdict came back


class Sender(threading.Thread):
    """A thread sending messages through its own Governor until told to stop.

    A call that raises gov's error is retried with the same message (the caller's retry
    of one logical message); anything else is a crash and fails the test.
    """

    def __init__(self, url: str, name: str, pool_timeout: float, stop: threading.Event, seed: int) -> None:
        super().__init__(name=name, daemon=True)
        self.url = url
        self.name_ = name
        self.pool_timeout = pool_timeout
        self.stop = stop
        self.seed = seed
        self.sent: list[Sent] = []
        self.errors: list[tuple[str, str, float]] = []  # (message id, error, seconds the call took)
        self.crashes: list[str] = []
        self.slowest = 0.0

    def message(self, rng: random.Random, i: int) -> Message:
        tier = rng.choices(["P0", "P1", "P2", "P3"], weights=[1, 4, 4, 3])[0]
        return Message(
            user_id=rng.choice(USERS),
            id=f"{self.name_}-{i}",
            tier=tier,
            topic=rng.choice(["sale", "news", None]) if tier == "P2" else None,
            collapse_key="digest" if tier == "P3" else None,
            title=f"{tier} {i}",
            ttl=3600,
        )

    def run(self) -> None:
        rng = random.Random(self.seed)
        try:
            with Governor(self.url, pool_size=1, pool_timeout=self.pool_timeout) as gov:
                i = 0
                while not self.stop.is_set():
                    self.send(gov, self.message(rng, i))
                    i += 1
        except Exception as exc:  # a crash of the sender itself
            self.crashes.append(f"{type(exc).__name__}: {exc}")

    def send(self, gov: Governor, message: Message) -> None:
        give_up = time.monotonic() + RETRY_GIVE_UP_S
        attempts = 0
        while True:
            attempts += 1
            began = time.monotonic()
            try:
                result = gov.send(message, deliver=False)
            except GovError as exc:
                took = time.monotonic() - began
                self.errors.append((message.id, f"{type(exc).__name__}: {exc}", took))
                if time.monotonic() > give_up:
                    self.crashes.append(f"{message.id}: still failing after {RETRY_GIVE_UP_S:g} s: {exc}")
                    self.stop.set()
                    return
                time.sleep(0.05)  # the real server is coming back: retry the same message
                continue
            except Exception as exc:
                self.crashes.append(f"{message.id}: {type(exc).__name__}: {exc}")
                self.stop.set()
                return
            self.slowest = max(self.slowest, time.monotonic() - began)
            self.sent.append(Sent(message, result, attempts, time.monotonic()))
            return

    def decided_since(self, moment: float) -> int:
        return sum(1 for s in self.sent if s.at > moment)


@pytest.fixture
def restart_db(own_pg: OwnPostgres) -> Iterator[str]:
    url = own_pg.databases.clone()
    use_fault_policy(url)
    yield url
    own_pg.databases.drop(url)


def _delivered(push: PushService) -> Counter[tuple[str, str]]:
    """(endpoint, message id) → how many times the push service accepted it."""
    return Counter((r.endpoint, json.loads(r.payload or b"{}")["data"]["id"]) for r in push.delivered())


@pytest.mark.parametrize("mode", ["fast", "immediate"])
@pytest.mark.parametrize("run", range(3))
def test_restart_while_busy(
    own_pg: OwnPostgres, restart_db: str, signer: VapidSigner, key_path: Path, make_push: Any, tmp_path: Path,
    mode: str, run: int,
) -> None:
    url = restart_db
    push = make_push()
    since = db_now(url)
    env = gov_env(url, key_path)
    stop = threading.Event()
    senders = [
        Sender(url, f"p{k}-{run}", PATIENT_POOL_TIMEOUT, stop, seed=run * 10 + k) for k in range(3)
    ] + [Sender(url, f"i0-{run}", IMPATIENT_POOL_TIMEOUT, stop, seed=run * 10 + 9)]
    with (
        GovProcess(["dispatch", "--workers", "4", "--lease", "2", "--timeout", "1", "--idle", "0.05"], env, tmp_path,
                   "runner") as runner,
        GovProcess(["release", "--idle", "0.1", "--batch", "50"], env, tmp_path, "releaser") as releaser,
    ):
        try:
            # while the processes start: endpoints, and held messages already due (decided
            # on a clock 30 s back), so the releaser has work from its first round
            past = Clock(since - timedelta(seconds=30))
            with Governor(url, allow_loopback_http=True, pool_size=1, clock=past) as setup:
                for user in USERS:
                    setup.subscribe(user, push.subscribe(user).info)
                    for i in range(3):
                        setup.send(Message(user_id=user, id=f"seed-{user}-{i}", tier="P1", title="seed", ttl=3600),
                                   deliver=False)
            for s in senders:
                s.start()
            # busy: messages decided, delivered, held and released
            wait_for(lambda: len(push.delivered()) >= 10, 30, "deliveries before the restart")
            # 'released' is written only by the releaser (a sender's collapse writes 'collapsed'):
            # the releaser is up and past its start-up checks before the server goes down
            wait_for(lambda: scalar(url, "SELECT count(*) FROM gov.deferred WHERE state = 'released'"),
                     30, "a release by the releaser before the restart")
            took = own_pg.restart(mode)
            print(f"restart ({mode}) took {took:.2f} s")  # a figure, not a check: the machine may be loaded
            after, after_db = time.monotonic(), db_now(url)
            delivered_before = len(push.delivered())

            # every loop goes on by itself
            wait_for(lambda: all(s.decided_since(after) >= 5 for s in senders) or stop.is_set(), 30,
                     "every sender deciding again after the restart")
            wait_for(lambda: len(push.delivered()) >= delivered_before + 5, 30, "deliveries after the restart")
            wait_for(
                lambda: scalar(
                    url,
                    "SELECT count(*) FROM gov.deferred WHERE state IN ('released', 'collapsed') AND finished_at > %s",
                    (after_db,),
                ),
                30, "a release after the restart",
            )
            assert runner.alive(), f"the runner died on the restart:\n{runner.stderr()[-3000:]}"
            assert releaser.alive(), f"the releaser died on the restart:\n{releaser.stderr()[-3000:]}"

            # an outage longer than the impatient sender's pool_timeout: it fails fast and
            # clearly, and its retry of the same message decides it once
            outage_msg = Message(user_id=USERS[0], id=f"outage-{run}", tier="P1", title="during the outage",
                                 ttl=3600)
            with Governor(url, pool_size=1, pool_timeout=IMPATIENT_POOL_TIMEOUT) as impatient:
                with own_pg.down(mode):
                    # raised while the server is still down: it gave up rather than wait for it
                    began = time.monotonic()
                    with pytest.raises(DatabaseError, match=r"connection|pool timeout") as failed:
                        impatient.send(outage_msg, deliver=False)
                    print(f"the impatient sender failed after {time.monotonic() - began:.2f} s")
                    assert "\n" not in str(failed.value)
                retried = wait_for(lambda: _try_send(impatient, outage_msg), 30, "the retried message")
            assert not retried.decision.repeated  # nothing was recorded by the failed call
            again = send_again(url, outage_msg)
            assert again.decision.repeated and again.outbox_ids == ()

            stop.set()
            for s in senders:
                s.join(timeout=RETRY_GIVE_UP_S + 10)
            assert not [c for s in senders for c in s.crashes], [c for s in senders for c in s.crashes]
            for s in senders[:3]:
                assert not s.errors, f"a patient sender saw errors: {s.errors[:5]} (restart took {took:.2f} s)"
            print(f"slowest patient call {max(s.slowest for s in senders[:3]):.2f} s")
            # the impatient sender's errors are the retryable kinds
            for _mid, error, _seconds in senders[3].errors:
                assert error.split(":")[0] in ("ConnectionLost", "PoolTimeout"), error
            slowest_error = max((seconds for _, _, seconds in senders[3].errors), default=0.0)
            print(f"slowest failed impatient call {slowest_error:.2f} s")

            # drain: nothing held, nothing left to deliver
            wait_for(
                lambda: scalar(
                    url,
                    "SELECT (SELECT count(*) FROM gov.outbox WHERE state IN ('pending', 'sending'))"
                    " + (SELECT count(*) FROM gov.deferred WHERE state = 'waiting') = 0",
                ),
                60, "the outbox and the queue to drain",
            )
            assert runner.alive() and releaser.alive()
        finally:
            stop.set()
        assert runner.stop() == 0, runner.stderr()[-3000:]
        assert releaser.stop() == 0, releaser.stderr()[-3000:]

    # nothing lost: every message a sender got a verdict for is recorded, once
    sent = {s.message.id: s for sender in senders for s in sender.sent}
    recorded = dict(
        _rows(
            url,
            "SELECT message_id, allowed FROM gov.messages WHERE message_id <> %s AND left(message_id, 5) <> 'seed-'",
            (f"outage-{run}",),
        )
    )
    assert set(sent) == set(recorded), (set(sent) ^ set(recorded))
    for mid, one in sent.items():
        if one.result.decision.allowed:
            assert recorded[mid], f"{mid} was allowed, but is recorded as suppressed"
        elif one.result.decision.action == "drop":
            assert not recorded[mid], f"{mid} was dropped, but is recorded as allowed"

    # everything due was delivered, at least once, and only what was allowed
    states = assert_integrity(url, since)
    assert not {"in_flight", "held", "failed"} & set(states), states
    rows = _rows(
        url,
        "SELECT s.endpoint, o.message_id, o.state, o.attempts FROM gov.outbox o"
        " JOIN gov.subscriptions s ON s.id = o.subscription_id",
    )
    got = _delivered(push)
    assert {(e, m) for e, m, _, _ in rows} == set(got), "delivered other than what the outbox holds"
    for endpoint, mid, state, attempts in rows:
        assert state == "delivered", (mid, state)
        # at least once: a second send only after a claim whose outcome was lost with the server
        assert got[(endpoint, mid)] <= attempts, (mid, got[(endpoint, mid)], attempts)


def _try_send(gov: Governor, message: Message) -> SendResult | None:
    try:
        return gov.send(message, deliver=False)
    except DatabaseError:
        return None


def send_again(url: str, message: Message) -> SendResult:
    """The same message once more, from a fresh governor: the first verdict, nothing spent."""
    with Governor(url, pool_size=1) as gov:
        return gov.send(message, deliver=False)


def _rows(url: str, query: Any, params: Any = None) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(query, params).fetchall()]
