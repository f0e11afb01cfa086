"""The push service misbehaves: it hangs, resets connections, answers 500s for a while,
throttles, then recovers.

Asserted: a hung request is abandoned after the runner's finite timeout (not after the
service's hang); retries back off exponentially (with jitter, capped), a 429 waits its
Retry-After; everything due is delivered, once, when the service is back; and nothing is
sent past its TTL. Retry times come from the database clock unless a clock is given: the
in-process runner here runs on a simulation clock that the test moves (no sleeping), and
a real ``gov dispatch`` process shows the same timeout and recovery on real time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gov import Governor, Message
from gov.delivery.runner import Dispatcher
from gov.delivery.vapid import VapidSigner
from gov.testing import Clock, PushService
from tests.faults import GovProcess, assert_integrity, db_now, gov_env, wait_for

TIMEOUT_S = 0.5  # the runner's HTTP timeout here
HANG_S = 30.0  # how long the push service would hold a hung request: far longer than the timeout


def _attempts(url: str, message_id: str) -> list[tuple[str, int | None, str | None, datetime]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT outcome, status, error, attempted_at FROM gov.delivery_attempts WHERE message_id = %s ORDER BY id",
            (message_id,),
        ).fetchall()
    return [tuple(r) for r in rows]  # type: ignore[misc]


def _outbox_state(url: str, message_id: str) -> tuple[str, datetime]:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT o.state, mc.expires_at FROM gov.outbox o JOIN gov.message_content mc"
            " ON mc.user_id = o.user_id AND mc.message_id = o.message_id WHERE o.message_id = %s",
            (message_id,),
        ).fetchone()
    assert row is not None
    return row[0], row[1]


def _next_due(url: str) -> datetime | None:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT min(next_attempt_at) FROM gov.outbox WHERE state = 'pending'").fetchone()
    return None if row is None else row[0]


def _ids(push: PushService, browser: Any) -> list[str]:
    return [json.loads(p)["data"]["id"] for p in push.delivered_payloads(browser)]


@pytest.fixture
def clock() -> Clock:
    # near the real time: the push service checks each VAPID token's exp against its own clock
    return Clock(datetime.now(UTC).replace(microsecond=0))


@pytest.fixture
def runner(db_url: str, signer: VapidSigner, clock: Clock) -> Iterator[Dispatcher]:
    with Dispatcher(
        db_url, signer, workers=4, timeout_s=TIMEOUT_S, clock=clock, backoff_ms=1000, backoff_cap_ms=8000,
        max_attempts=20, allow_loopback_http=True,
    ) as dispatcher:
        yield dispatcher


@pytest.mark.parametrize("run", range(3))
def test_faults_then_recovery_on_a_simulation_clock(
    db_url: str, make_push: Any, clock: Clock, runner: Dispatcher, run: int
) -> None:
    push = make_push(hang_s=HANG_S)
    since = clock.now - timedelta(minutes=1)
    with Governor(db_url, clock=clock, allow_loopback_http=True, pool_size=1) as gov:
        browsers = {name: push.subscribe(name) for name in ("flaky", "down", "recovers", "stale", "h1", "h2", "h3")}
        for name, browser in browsers.items():
            gov.subscribe(name, browser.info)
        push.script(browsers["flaky"], ["hang", "reset", 500, 503, (429, {"Retry-After": "1"})])
        push.script(browsers["down"], [500] * 30)  # down for longer than its message lives
        push.script(browsers["recovers"], [502, 500, 503])

        # its TTL passes while nothing is sent (the runner is behind): never sent at all
        gov.send(Message(user_id="stale", id="stale", tier="P1", title="stale", ttl=5), deliver=False)
        clock.advance(seconds=10)
        ttl = {"flaky": 3600, "down": 40, "recovers": 3600, "h1": 3600, "h2": 3600, "h3": 3600}
        for name, seconds in ttl.items():
            gov.send(Message(user_id=name, id=name, tier="P1", title=name, ttl=seconds), deliver=False)

    # the first round: the hang is abandoned after the timeout, not after the service's hang
    began = time.monotonic()
    first = runner.run_once()
    print(f"the first round took {time.monotonic() - began:.2f} s (the service hangs {HANG_S:g} s)")
    assert first.outcomes.get("delivered") == 3  # the healthy ones, not held up by the faulty
    rounds = 1
    while (due := _next_due(db_url)) is not None:
        assert due > clock.now, "a retry was due at once: no back-off"
        clock.now = due  # move simulated time to the next retry; nothing sleeps
        runner.run_once()
        rounds += 1
        assert rounds < 60, "the retries never end"

    # everything due was delivered, once, when the service came back
    for name in ("flaky", "recovers", "h1", "h2", "h3"):
        assert _ids(push, browsers[name]) == [name], name
        assert _outbox_state(db_url, name)[0] == "delivered", name

    flaky = _attempts(db_url, "flaky")
    assert [(o, s) for o, s, _, _ in flaky] == [
        ("transient", None), ("transient", None), ("transient", 500), ("transient", 503), ("throttled", 429),
        ("accepted", 201),
    ]
    assert flaky[0][2] == "timeout" and flaky[1][2], flaky
    assert flaky[5][3] - flaky[4][3] == timedelta(seconds=1), "Retry-After was not honoured"
    # capped exponential back-off with jitter: the n-th wait is between half and all of
    # min(cap, base * 2^(n-1))
    for attempts in (flaky[:5], _attempts(db_url, "down"), _attempts(db_url, "recovers")):
        waits = [(b[3] - a[3]).total_seconds() for a, b in pairwise(attempts)
                 if a[0] == "transient"]
        for n, wait in enumerate(waits, start=1):
            full = min(8.0, 1.0 * 2 ** (n - 1))
            assert full / 2 <= wait <= full, (n, wait, waits)

    # nothing past its TTL: the down endpoint's message expired, every attempt before its deadline
    state, expires = _outbox_state(db_url, "down")
    down = _attempts(db_url, "down")
    assert state == "expired" and "accepted" not in {o for o, *_ in down}
    assert all(at < expires for *_, at in down), down
    sent = [a for a in down if a[0] != "expired"]  # "expired": its last second had passed, not sent
    assert len(push.requests_for(browsers["down"])) == len(sent) >= 4
    assert _outbox_state(db_url, "stale")[0] == "expired"
    assert push.requests_for(browsers["stale"]) == [], "a message past its TTL was sent"
    assert [o for o, *_ in _attempts(db_url, "stale")] == ["expired"]

    states = assert_integrity(db_url, since)
    assert states == {"delivered": 5, "failed": 2}, states  # failed: the expired outbox rows


@pytest.mark.parametrize("run", range(3))
def test_real_runner_times_out_and_recovers(
    db_url: str, key_path: Path, make_push: Any, tmp_path: Path, run: int
) -> None:
    push = make_push(hang_s=HANG_S)
    since = db_now(db_url)
    with Governor(db_url, allow_loopback_http=True, pool_size=1) as gov:
        hanging = push.subscribe("hanging")
        gov.subscribe("hanging", hanging.info)
        push.script(hanging, ["hang", "reset"])
        healthy = [push.subscribe(f"ok{i}") for i in range(3)]
        for i, browser in enumerate(healthy):
            gov.subscribe(f"ok{i}", browser.info)
        for user in ["hanging", *[f"ok{i}" for i in range(3)]]:
            gov.send(Message(user_id=user, id=f"m-{user}", tier="P0", title="hi"), deliver=False)

    began = time.monotonic()
    with GovProcess(["dispatch", "--workers", "2", "--timeout", "2", "--idle", "0.05"], gov_env(db_url, key_path),
                    tmp_path, "runner") as proc:
        wait_for(lambda: len(push.delivered()) == 4, HANG_S / 2, "every message delivered")
        took = time.monotonic() - began
        assert proc.alive()
        assert proc.stop() == 0, proc.stderr()[-3000:]
    print(f"every message delivered after {took:.2f} s (the endpoint hangs {HANG_S:g} s)")
    attempts = _attempts(db_url, "m-hanging")
    assert [(o, s) for o, s, _, _ in attempts] == [("transient", None), ("transient", None), ("accepted", 201)]
    assert attempts[0][2] == "timeout"
    # the healthy endpoints were not held up behind the hanging one: delivered by the other
    # worker before the hung request was given up (the host's clock, as the push service's)
    gave_up = attempts[0][3].timestamp()
    assert all(r.at < gave_up for b in healthy for r in push.delivered(b)), gave_up
    assert_integrity(db_url, since)
