"""The runner under abuse: a poison row, a trickling push service,
a runner whose lease ran out, and a 410 in the middle of a batch.

Everything is real: PostgreSQL, the loopback push service that verifies VAPID and
decrypts, a socket server of our own that trickles its answer, and ``gov dispatch`` as a
subprocess. Simulated time is moved, never slept.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gov import ConfigurationError, Governor, Message
from gov.delivery.push import MAX_PAYLOAD_BYTES, PushOutcome, build_payload
from gov.delivery.runner import Dispatcher, _attempt
from gov.delivery.vapid import VapidSigner
from gov.hold.release import Releaser
from gov.testing import Clock, PushService

SUBJECT = "mailto:push-ops@example.com"
WEEK = 7 * 86400


@pytest.fixture(autouse=True)
def loopback_test_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The push services here are http on 127.0.0.1: the explicit test mode, for every runner."""
    monkeypatch.setenv("GOV_ALLOW_LOOPBACK_HTTP", "1")


@pytest.fixture
def push(signer: VapidSigner) -> Iterator[PushService]:
    with PushService(expected_public_key=signer.public_key, hang_s=5.0) as service:
        yield service


@pytest.fixture
def clock() -> Clock:
    # near the real time: the push service checks the VAPID token's exp against its clock
    return Clock(datetime.now(UTC).replace(microsecond=0))


@pytest.fixture
def gov(db_url: str, clock: Clock) -> Iterator[Governor]:
    # no signer: messages wait in the outbox for the runner under test
    with Governor(db_url, clock=clock, allow_loopback_http=True, pool_size=2) as g:
        yield g


def outbox(conn: psycopg.Connection[Any], message_id: str) -> dict[str, Any]:
    row = conn.execute(
        "SELECT state, attempts, leased_by, last_status, last_error FROM gov.outbox WHERE message_id = %s",
        (message_id,),
    ).fetchone()
    assert row is not None, message_id
    return dict(zip(("state", "attempts", "leased_by", "last_status", "last_error"), row, strict=True))


def attempts(conn: psycopg.Connection[Any], message_id: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT worker, outcome, status, error FROM gov.delivery_attempts WHERE message_id = %s ORDER BY id",
        (message_id,),
    ).fetchall()


def ids_delivered(push: PushService) -> Counter[str]:
    return Counter(json.loads(p)["data"]["id"] for p in push.delivered_payloads())


def _sized(size: int, *, title: str | None = None, body: str = "", message_id: str) -> tuple[str, str]:
    """A (title, body) whose payload, as the runner builds it for ``message_id`` (tag
    "digest", tier P3), is exactly ``size`` bytes: the long part is the title when
    ``title`` is None, else the body."""
    def length(t: str, b: str) -> int:
        return len(build_payload(t, b, "digest", None, "P3", message_id))

    if title is None:
        return "T" * (size - length("T", body) + 1), body
    return title, "B" * (size - length(title, ""))


# ---------------------------------------------------------------- 1. failure stays with its row


def _content_checked_without_beacon_fields(message: Message) -> dict[str, Any]:
    """Message.content as gov checked it before beacon tokens: the payload without them."""
    build_payload(message.title or "", message.body or "", message.tag, message.url, message.tier, message.id)
    return {"title": message.title, "body": message.body or "", "url": message.url}


def test_a_poison_summary_fails_alone_and_bystanders_go_out_once(
    db_url: str, gov: Governor, push: PushService, signer: VapidSigner, clock: Clock, conn: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A collapsed summary too large once its count is added: the trimmed one goes out
    without its body, the one that cannot fit even so fails with its reason, and the P0
    messages claimed in the same batch are delivered exactly once, however often the
    runner comes round."""
    # Today a message must fit with the longest beacon fields (59 bytes), which leaves room
    # for a summary's count; messages queued by an older gov, checked without them, may not.
    monkeypatch.setattr(Message, "content", _content_checked_without_beacon_fields)
    near_full = MAX_PAYLOAD_BYTES - 3  # each message fits alone; with `,"count":2` it does not
    browsers = {user: push.subscribe(user) for user in ("poison", "trim", "b0", "b1", "b2")}
    for user, browser in browsers.items():
        gov.subscribe(user, browser.info)
    for i in range(3):  # the first goes out, the next two collapse into a summary with a count
        title, _ = _sized(near_full, message_id=f"p{i}")
        assert len(title.encode()) > 3900  # a title alone overflows: no trimming can save it
        gov.send(Message(user_id="poison", id=f"p{i}", tier="P3", title=title, collapse_key="digest", ttl=2 * WEEK),
                 deliver=False)
        _, body = _sized(near_full, title="Digest", message_id=f"t{i}")
        gov.send(Message(user_id="trim", id=f"t{i}", tier="P3", title="Digest", body=body, collapse_key="digest",
                         ttl=2 * WEEK), deliver=False)
    clock.advance(days=7, hours=1)  # past the window and its jitter
    released = Releaser(db_url, clock=clock).run_once()  # the summaries join the outbox
    assert released.outcomes.get("summary") == 2, released.outcomes
    for i in range(3):
        gov.send(Message(user_id=f"b{i}", id=f"b{i}", tier="P0", title="Your code"), deliver=False)

    with Dispatcher(db_url, signer, workers=2, batch=32, clock=clock) as runner:
        first = runner.run_once()  # one batch holds the poison, the trimmed summary and the bystanders
        for _ in range(3):  # the runner comes round again, each time past any lease
            clock.advance(minutes=10)
            runner.run_once()

    delivered = ids_delivered(push)
    assert {f"b{i}": 1 for i in range(3)}.items() <= delivered.items(), delivered
    assert all(n == 1 for n in delivered.values()), f"a message went out twice: {delivered}"
    assert first.outcomes.get("failed") == 1, first.outcomes

    poison = outbox(conn, "p2")
    assert poison["state"] == "failed"
    assert "payload" in poison["last_error"] and "bytes" in poison["last_error"], poison
    assert "p2" not in delivered and [a[1] for a in attempts(conn, "p2")] == ["rejected"]

    # the summary that fits without its body went out: title, tag and count kept
    assert delivered["t2"] == 1 and outbox(conn, "t2")["state"] == "delivered"
    (summary,) = [json.loads(p) for p in push.delivered_payloads(browsers["trim"]) if b'"t2"' in p]
    assert summary["title"] == "Digest" and summary["body"] == "" and summary["tag"] == "digest"
    assert summary["data"]["count"] == 2 and summary["data"]["id"] == "t2"
    states = dict(conn.execute("SELECT state, count(*) FROM gov.outbox GROUP BY 1").fetchall())
    assert states == {"delivered": 6, "failed": 1}, states


def test_a_row_whose_content_cannot_be_built_fails_alone(
    db_url: str, gov: Governor, push: PushService, signer: VapidSigner, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    """Anything wrong with one row (here content that lost its title) ends that row."""
    for user in ("broken", "ok"):
        gov.subscribe(user, push.subscribe(user).info)
        gov.send(Message(user_id=user, id=user, tier="P0", title="hi"), deliver=False)
    conn.execute("UPDATE gov.message_content SET content = content - 'title' WHERE message_id = 'broken'")
    with Dispatcher(db_url, signer, workers=2, clock=clock) as runner:
        stats = runner.run_once()
    assert stats.outcomes == {"failed": 1, "delivered": 1}, stats.outcomes
    assert ids_delivered(push) == Counter({"ok": 1})
    broken = outbox(conn, "broken")
    assert broken["state"] == "failed" and "title" in broken["last_error"], broken


# ---------------------------------------------------------------- 2. a total deadline


class TricklingService:
    """A push service that reads the request, then answers one byte every ``every_s``
    seconds, forever or until the client closes. It counts the bytes it got out."""

    ANSWER = b"HTTP/1.1 201 Created\r\nLocation: /m/1\r\nX-Pad: " + b"." * 20 + b"\r\nContent-Length: 0\r\n\r\n"

    def __init__(self, every_s: float = 0.5) -> None:
        self.every_s = every_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests = 0
        self.bytes_written = 0
        self.closed_by_client = threading.Event()
        self.finished = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/push/trickle"

    def _serve(self) -> None:
        self.listener.settimeout(0.1)
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            with client:
                self._answer(client)

    def _answer(self, client: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = client.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        while len(body) < length:
            body += client.recv(65536)
        self.requests += 1
        for byte in self.ANSWER:
            if self._stop.wait(self.every_s):
                return
            readable, _, _ = select.select([client], [], [], 0)
            if readable and not client.recv(1):  # EOF: the client gave up
                self.closed_by_client.set()
                return
            try:
                client.sendall(bytes([byte]))
            except OSError:
                self.closed_by_client.set()
                return
            self.bytes_written += 1
        self.finished.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.listener.close()


@pytest.fixture
def trickling() -> Iterator[TricklingService]:
    service = TricklingService()
    yield service
    service.close()


def _gov_env(db_url: str, key_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOV_")}
    env.update({"GOV_DATABASE_URL": db_url, "GOV_VAPID_PRIVATE_KEY": str(key_path), "GOV_VAPID_SUBJECT": SUBJECT,
                "GOV_ALLOW_LOOPBACK_HTTP": "1"})
    return env


@pytest.mark.timeout(120)
def test_a_trickling_push_service_cannot_hold_an_attempt_past_its_deadline(
    db_url: str, push: PushService, key_path: Path, trickling: TricklingService, conn: psycopg.Connection[Any]
) -> None:
    keys = push.subscribe().info["keys"]  # a browser's real keys, at the trickling endpoint
    with Governor(db_url, allow_loopback_http=True, pool_size=1) as g:
        g.subscribe("slow", {"endpoint": trickling.endpoint, "keys": keys})
        g.send(Message(user_id="slow", id="slow", tier="P0", title="hi"), deliver=False)

    runner = subprocess.run(
        [sys.executable, "-m", "gov.cli", "dispatch", "--once", "--timeout", "2", "--workers", "1"],
        env=_gov_env(db_url, key_path), capture_output=True, text=True, timeout=100,
    )
    assert runner.returncode == 0, runner.stderr[-3000:]
    assert json.loads(runner.stdout) == {"attempts": 1, "outcomes": {"pending": 1}}
    assert trickling.requests == 1
    # the runner hung up mid-answer: the server saw it close long before the answer was out
    assert trickling.closed_by_client.wait(5), f"the client never closed ({trickling.bytes_written} bytes out)"
    assert not trickling.finished.is_set()
    assert trickling.bytes_written < len(TricklingService.ANSWER) // 2, trickling.bytes_written
    assert [a[1:] for a in attempts(conn, "slow")] == [("transient", None, "timeout")]
    assert outbox(conn, "slow")["state"] == "pending"  # to be retried later, by whoever claims it


@pytest.mark.parametrize(("lease", "timeout"), [(5.0, 5.0), (2.0, 10.0)])
def test_a_timeout_not_shorter_than_the_lease_is_refused(
    db_url: str, signer: VapidSigner, key_path: Path, lease: float, timeout: float
) -> None:
    with pytest.raises(ConfigurationError, match="lease"):
        Dispatcher(db_url, signer, lease_s=lease, timeout_s=timeout)
    runner = subprocess.run(
        [sys.executable, "-m", "gov.cli", "dispatch", "--once", "--lease", str(lease), "--timeout", str(timeout)],
        env=_gov_env(db_url, key_path), capture_output=True, text=True, timeout=60,
    )
    assert runner.returncode != 0 and "lease" in runner.stderr, runner.stderr


# ---------------------------------------------------------------- 2. only the lease holder records


def test_a_batch_records_each_row_as_it_would_alone(
    db_url: str, gov: Governor, push: PushService, signer: VapidSigner, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    """A batch's accepted attempts are recorded in one statement: each element still gets,
    in outbox order, the state gov.record_attempt_v3 would give it alone."""
    browser = push.subscribe()
    gov.subscribe("u", browser.info)
    for message_id in ("m1", "m2", "m3", "m4"):
        gov.send(Message(user_id="u", id=message_id, tier="P0", title="hi"), deliver=False)
    with Dispatcher(db_url, signer, workers=1, lease_s=5, timeout_s=1, clock=clock, name="A") as a:
        rows = a.claim(10)
        done = {row.message_id: a._deliver_one(row) for row in rows}
        assert {d["outcome"] for d in done.values()} == {"accepted"}
        stale = {**done["m2"], "claim_token": done["m2"]["claim_token"] - 1}  # an earlier claim's
        throttled = {**done["m3"], "outcome": "throttled", "status": 429, "retry_after_ms": 60_000}
        foreign = {**done["m4"], "user_id": "someone-else"}  # not this user's row
        states = a._record([foreign, throttled, done["m1"], stale, done["m1"]])
    # in outbox id order (m1 twice: the repeat finds the row already ended)
    assert states == ["delivered", "stale", "stale", "pending", "stale"]
    assert outbox(conn, "m1")["state"] == "delivered"
    assert outbox(conn, "m2") == {"state": "sending", "attempts": 1, "leased_by": "A", "last_status": None,
                                  "last_error": None}
    assert outbox(conn, "m3")["state"] == "pending" and outbox(conn, "m3")["last_status"] == 429
    assert outbox(conn, "m4")["state"] == "sending"
    assert [a[1:] for a in attempts(conn, "m1")] == [("accepted", 201, None)]
    assert [a[1:] for a in attempts(conn, "m3")] == [("throttled", 429, None)]
    assert attempts(conn, "m2") == attempts(conn, "m4") == []
    events = conn.execute("SELECT message_id FROM gov.push_events WHERE event = 'accepted'").fetchall()
    assert events == [("m1",)]


def test_a_stale_runner_cannot_record_over_the_lease_holder(
    db_url: str, gov: Governor, push: PushService, signer: VapidSigner, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    browser = push.subscribe()
    gov.subscribe("u", browser.info)
    gov.send(Message(user_id="u", id="m", tier="P0", title="hi"), deliver=False)
    with (
        Dispatcher(db_url, signer, workers=1, lease_s=5, timeout_s=1, clock=clock, name="A") as a,
        Dispatcher(db_url, signer, workers=1, lease_s=5, timeout_s=1, clock=clock, name="B") as b,
    ):
        (row_a,) = a.claim(10)
        clock.advance(seconds=6)  # A's lease runs out (A is stuck somewhere)
        (row_b,) = b.claim(10)
        assert outbox(conn, "m") == {"state": "sending", "attempts": 2, "leased_by": "B", "last_status": None,
                                     "last_error": None}
        # A's attempt finally completes and A tries to record it: refused, nothing changes
        late = a._deliver_one(row_a)
        assert late["outcome"] == "accepted"
        assert a._record([late]) == ["stale"]
        assert outbox(conn, "m") == {"state": "sending", "attempts": 2, "leased_by": "B", "last_status": None,
                                     "last_error": None}
        assert attempts(conn, "m") == []
        # B, the lease holder, records its own attempt
        assert b._record([b._deliver_one(row_b)]) == ["delivered"]
        assert a._record([late]) == ["stale"]  # and a repeat of A's record changes nothing either
    assert [a[:2] for a in attempts(conn, "m")] == [("B", "accepted")]
    assert outbox(conn, "m")["state"] == "delivered"


def test_a_runner_whose_lease_lapsed_unclaimed_still_records(
    db_url: str, gov: Governor, push: PushService, signer: VapidSigner, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    """No one took the row over: the token still matches and the outcome counts."""
    gov.subscribe("u", push.subscribe().info)
    gov.send(Message(user_id="u", id="m", tier="P0", title="hi"), deliver=False)
    with Dispatcher(db_url, signer, workers=1, lease_s=5, timeout_s=1, clock=clock, name="A") as a:
        (row,) = a.claim(10)
        clock.advance(seconds=60)
        assert a._record([a._deliver_one(row)]) == ["delivered"]
    assert outbox(conn, "m")["state"] == "delivered"


# ---------------------------------------------------------------- 3. 410 inside a batch


def test_a_410_ends_the_endpoints_other_rows_without_a_request(
    db_url: str, gov: Governor, push: PushService, signer: VapidSigner, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    dead, alive = push.subscribe("dead"), push.subscribe("alive")
    gov.subscribe("u", dead.info)
    gov.subscribe("v", alive.info)
    push.script(dead, [410])
    for mid in ("m1", "m2", "m3"):
        gov.send(Message(user_id="u", id=mid, tier="P0", title=mid), deliver=False)
    gov.send(Message(user_id="v", id="v1", tier="P0", title="v1"), deliver=False)
    with (
        Dispatcher(db_url, signer, workers=4, clock=clock, name="other") as other,
        Dispatcher(db_url, signer, workers=4, clock=clock, name="runner") as runner,
    ):
        # another runner holds m3 (claimed, not yet sent); this runner claims m1, m2 and v1
        (held,) = other.claim(1, ids=[_outbox_id(conn, "m3")])
        stats = runner.run_once()
        assert stats.outcomes == {"gone": 2, "delivered": 1}, stats.outcomes
        assert [r.status for r in push.requests_for(dead)] == [410], "a row was sent after the 410"
        # the other runner's row ended too, without a request; its late record changes nothing
        assert outbox(conn, "m3")["state"] == "gone"
        late = _attempt(held, push.origin, PushOutcome("accepted", status=201))
        assert other._record([late]) == ["gone"]
    assert [r.status for r in push.requests_for(dead)] == [410]
    for mid in ("m1", "m2", "m3"):
        assert outbox(conn, mid)["state"] == "gone", mid
    assert outbox(conn, "v1")["state"] == "delivered"
    assert conn.execute("SELECT retired_reason FROM gov.subscriptions WHERE user_id = 'u'").fetchone() == (
        "push service answered 410",
    )


def test_a_410_ends_the_endpoints_rows_in_a_batch_claimed_before_it_was_recorded(
    db_url: str, gov: Governor, push: PushService, signer: VapidSigner, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    """The runner claims batch k+1 while batch k is being sent (pipelined): a 410 in batch
    k still keeps the endpoint's rows of batch k+1 from being sent."""
    dead = push.subscribe("dead")
    gov.subscribe("u", dead.info)
    push.script(dead, [410])
    for mid in ("m1", "m2", "m3", "m4"):
        gov.send(Message(user_id="u", id=mid, tier="P0", title=mid), deliver=False)
    with Dispatcher(db_url, signer, workers=2, batch=1, clock=clock) as runner:
        stats = runner.run_once()  # one row per batch: m2 is claimed while m1 is sent
    assert [r.status for r in push.requests_for(dead)] == [410], "a row was sent after the 410"
    assert stats.outcomes.get("gone", 0) >= 2 and set(stats.outcomes) <= {"gone"}, stats.outcomes
    for mid in ("m1", "m2", "m3", "m4"):
        assert outbox(conn, mid)["state"] == "gone", mid


def test_a_row_queued_for_an_already_retired_endpoint_is_not_sent(
    db_url: str, gov: Governor, push: PushService, signer: VapidSigner, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    """A row fanned out just as its endpoint was retired (a race with the 410) ends gone
    at the claim, without a request."""
    browser = push.subscribe()
    gov.subscribe("u", browser.info)
    gov.send(Message(user_id="u", id="m", tier="P0", title="hi"), deliver=False)
    conn.execute("UPDATE gov.subscriptions SET retired_at = now(), retired_reason = 'push service answered 410'")
    with Dispatcher(db_url, signer, workers=1, clock=clock) as runner:
        runner.run_once()
    assert push.received == []
    assert outbox(conn, "m")["state"] == "gone"


def _outbox_id(conn: psycopg.Connection[Any], message_id: str) -> int:
    row = conn.execute("SELECT id FROM gov.outbox WHERE message_id = %s", (message_id,)).fetchone()
    assert row is not None
    return int(row[0])


def test_the_dispatcher_keeps_to_its_lease(
    db_url: str, gov: Governor, push: PushService, signer: VapidSigner, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    """Rows a batch has no time left for (their lease would run out before a whole
    attempt) are handed back unsent, not sent late: here every request hangs, so each
    attempt takes its whole timeout, and a lease (less its margin) fits two per worker."""
    browsers = [push.subscribe(f"h{i}") for i in range(6)]
    for i, browser in enumerate(browsers):
        gov.subscribe(f"h{i}", browser.info)
        push.script(browser, ["hang"])
        gov.send(Message(user_id=f"h{i}", id=f"h{i}", tier="P0", title="hi"), deliver=False)
    with Dispatcher(db_url, signer, workers=1, batch=6, lease_s=2.5, timeout_s=0.8, clock=clock) as runner:
        stats = runner.run_once(ids=[_outbox_id(conn, f"h{i}") for i in range(6)])
    sent = len(push.received)
    assert sent in (1, 2), sent
    assert stats.attempts == 6 and stats.outcomes.get("released") == 6 - sent, stats.outcomes
    rows = conn.execute("SELECT state, attempts, count(*) FROM gov.outbox GROUP BY 1, 2 ORDER BY 1, 2").fetchall()
    # sent and timed out: pending with one attempt; handed back unsent: pending, no attempt counted
    assert rows == sorted([("pending", 0, 6 - sent), ("pending", 1, sent)]), rows


def test_an_endpoint_that_does_not_answer_costs_one_timeout_not_one_per_row(
    db_url: str, gov: Governor, push: PushService, signer: VapidSigner, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    """An outside probe: one hanging endpoint with 64 rows held the batch's other endpoints
    back a whole timeout per row. After the endpoint fails to answer one row, its other rows
    of the batch go back unsent (their attempt not counted), due again a timeout later,
    saying why; the healthy endpoint is delivered in the same drain."""
    hanging, alive = push.subscribe("hanging"), push.subscribe("alive")
    gov.subscribe("u", hanging.info)
    gov.subscribe("v", alive.info)
    push.script(hanging, ["hang", "hang", "hang", "hang"])
    for mid in ("m1", "m2", "m3", "m4"):
        gov.send(Message(user_id="u", id=mid, tier="P0", title=mid), deliver=False)
    gov.send(Message(user_id="v", id="v1", tier="P0", title="v1"), deliver=False)
    with Dispatcher(db_url, signer, workers=2, batch=10, lease_s=10, timeout_s=0.8, clock=clock) as runner:
        stats = runner.run_once()
    assert len(push.requests_for(hanging)) == 1, "a row was sent to an endpoint that had just not answered"
    assert outbox(conn, "v1")["state"] == "delivered"
    assert stats.outcomes.get("released") == 3, stats.outcomes
    first = outbox(conn, "m1")
    assert (first["state"], first["attempts"]) == ("pending", 1)
    for mid in ("m2", "m3", "m4"):
        row = outbox(conn, mid)
        assert (row["state"], row["attempts"]) == ("pending", 0), (mid, row)
        assert row["last_error"].startswith("not sent: the endpoint did not answer (timeout) at message m1"), row
    waits = conn.execute("SELECT min(next_attempt_at - %s) FROM gov.outbox WHERE message_id IN ('m2', 'm3', 'm4')",
                         (clock.now,)).fetchone()
    assert waits is not None and waits[0].total_seconds() >= 0.8, waits  # not due before a timeout has passed


def test_a_drain_goes_on_when_a_batch_claimed_ahead_waited_its_lease_away(
    db_url: str, gov: Governor, push: PushService, signer: VapidSigner, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    """An outside probe: with slow answers the batch claimed while the one before was sent
    waited its lease away, came back all handed back, and `gov dispatch --once` ended with
    24 of 40 rows due and unsent. Here every answer takes a whole timeout: the second batch
    starts with no timeout left, and the drain must go on, claiming each batch once the one
    before is done, until every row has been attempted."""
    browsers = [push.subscribe(f"s{i}") for i in range(12)]
    for i, browser in enumerate(browsers):
        gov.subscribe(f"s{i}", browser.info)
        push.script(browser, ["hang"])
        gov.send(Message(user_id=f"s{i}", id=f"s{i}", tier="P0", title="hi"), deliver=False)
    with Dispatcher(db_url, signer, workers=2, lease_s=3, timeout_s=1, clock=clock) as runner:
        assert runner.batch == 4  # two workers, two whole timeouts each in a lease less its margin
        stats = runner.run_once()
    assert len(push.received) == 12, stats.outcomes
    untouched = conn.execute("SELECT count(*) FROM gov.outbox WHERE attempts = 0").fetchone()
    assert untouched == (0,), stats.outcomes


def test_given_rows_of_several_users_are_claimed_in_one_statement_on_one_server(
    db_url: str, gov: Governor, push: PushService, signer: VapidSigner, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    """gov serve's and AsyncGovernor's delivery hand the runner a batch's rows with their
    users as shard keys (a cluster's claim runs on each user's shard). One server has one
    shard: the batch is one claim, not one per user."""
    for i in range(5):
        gov.subscribe(f"k{i}", push.subscribe(f"k{i}").info)
        gov.send(Message(user_id=f"k{i}", id=f"k{i}", tier="P0", title="hi"), deliver=False)
    with Dispatcher(db_url, signer, workers=2, clock=clock) as runner:
        claims: list[object] = []
        execute = runner.source.execute

        def counted(query: Any, params: Any, **kwargs: Any) -> Any:
            if "claim_outbox_v3" in str(query):
                claims.append(params["shard_key"])
            return execute(query, params, **kwargs)

        runner.source.execute = counted  # type: ignore[method-assign]
        stats = runner.run_once(ids=[_outbox_id(conn, f"k{i}") for i in range(5)],
                                shard_keys=[f"k{i}" for i in range(5)])
    assert stats.outcomes.get("delivered") == 5
    assert claims == [None]
    assert len(push.delivered()) == 5


def test_a_drain_of_given_rows_reports_what_became_of_each(
    db_url: str, gov: Governor, push: PushService, signer: VapidSigner, clock: Clock, conn: psycopg.Connection[Any]
) -> None:
    """run_once(ids=...) reports each row it claimed with the state its record wrote, the
    state the row then has (the simulation reads outcomes from it instead of the table); a
    given row it did not claim (not due yet) is not reported, and a drain of whatever is
    due reports no rows."""
    answers = {"ok": 201, "gone": 410, "busy": 503}
    for user, status in answers.items():
        browser = push.subscribe(user)
        gov.subscribe(user, browser.info)
        push.script(browser, [status])
        gov.send(Message(user_id=user, id=f"{user}-1", tier="P0", title="hi"), deliver=False)
    gov.send(Message(user_id="ok", id="later", tier="P0", title="hi"), deliver=False)
    conn.execute("UPDATE gov.outbox SET next_attempt_at = next_attempt_at + interval '1 hour'"
                 " WHERE message_id = 'later'")
    given = [_outbox_id(conn, m) for m in ("ok-1", "gone-1", "busy-1", "later")]
    with Dispatcher(db_url, signer, workers=2, clock=clock) as runner:
        stats = runner.run_once(ids=given)
        assert runner.run_once().rows == []
    table = {(r[0], r[1], r[2], r[3]): r[4] for r in conn.execute(
        "SELECT id, user_id, message_id, subscription_id, state FROM gov.outbox").fetchall()}
    reported = {(r.outbox_id, r.user_id, r.message_id, r.subscription_id): r.state for r in stats.rows}
    assert [r.outbox_id for r in stats.rows] == sorted(given[:3])
    assert reported == {key: state for key, state in table.items() if key[2] != "later"}
    assert sorted(reported.values()) == ["delivered", "gone", "pending"]
