"""The runner: claims outbox rows, delivers them through Web Push, records every outcome.

Claim model: a *committed lease* (gov.claim_outbox_v3). A worker marks rows
``sending`` until ``lease_until`` and commits before any HTTP call, so no transaction
stays open during network I/O. A worker that dies leaves its rows leased; when the
lease runs out another runner reclaims them.

One runner per row at a time (invariant 12):

* every attempt has a *total* deadline (connect, send and read: ``timeout_s``; each
  blocking step gets only the time left, see :mod:`gov.delivery.pushclient`), and a runner refuses
  a timeout that is not shorter than its lease;
* a batch starts an attempt only while a whole ``timeout_s`` still fits in its lease
  (less a margin kept for recording); the rows it has no time left for are handed back
  unsent (``released``), so no attempt outlives the lease it was made under;
* every claim increments the row's ``claim_token`` (a fencing token), and an outcome is
  recorded only with the token of the claim that still holds the row: a runner whose
  lease ran out and whose row was claimed again records nothing (``stale``), so it can
  never overwrite or duplicate the new holder's work.

What remains is the at-least-once window: a runner killed (or cut off from the
database) after the push service accepted a message (201) but before its record
committed leaves the row leased; when the lease runs out another runner sends it
again. Nothing else sends a row twice. Duplicates are made harmless by a stable Topic
and notification tag and the message id in the payload.

Failure stays with its row (invariant 10): whatever goes wrong building, encrypting or
sending one row ends that row (``failed``, with the reason) and never the batch. A 404
or 410 retires the endpoint at once: its other rows in the batch are not sent, and its
rows still to do elsewhere end ``gone`` (gov.record_attempt_v3).

A push service that answers 401/403 to every request is a configuration alarm, not a
fault of the rows (WEBPUSH.md: "stop that origin"): after ``ORIGIN_STOP_AFTER`` such
answers in a row from an origin that accepted nothing in the last ``ORIGIN_OK_MEMORY_S``,
this runner sends it nothing for ``ORIGIN_STOP_S``; the rows are handed back unsent, due
again then, until their deadline. An origin that accepted a request lately is working:
a refusal there is one subscription's (made for another VAPID key), and its row backs off
alone; at the ``SUBSCRIPTION_RETIRE_AFTER``-th such refusal in this runner's life the
subscription is retired as a 404/410 would retire it (recorded ``gone`` with its status).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from psycopg.rows import class_row

from gov.db import Source
from gov.delivery.beacon import BeaconKeys, keys_from_env
from gov.delivery.deadlines import DEFAULT_LEASE_S, DEFAULT_TIMEOUT_S, LEASE_MARGIN_S, check_deadlines
from gov.delivery.netguard import EndpointGuard, EndpointRefused
from gov.delivery.push import PushOutcome, PushRequest, build_payload, deliver, topic_for
from gov.delivery.pushclient import PushClient
from gov.delivery.subscription import Subscription, origin_of
from gov.delivery.vapid import VapidSigner
from gov.errors import ConnectionLost, DatabaseError, GovError, InvalidMessage, PoolTimeout
from gov.ops import metrics
from gov.queries import q

log = logging.getLogger("gov.delivery.runner")

DEFAULT_WORKERS = 8  # concurrent HTTP requests per runner: throughput comes from concurrency
DEFAULT_MAX_ATTEMPTS = 8
DEFAULT_BACKOFF_MS = 1000  # first retry after about a second, doubling
DEFAULT_BACKOFF_CAP_MS = 300_000  # never wait more than five minutes between retries
ORIGIN_STOP_AFTER = 3  # 401/403 answers in a row from an origin that accepted nothing lately
ORIGIN_STOP_S = 60.0  # then nothing is sent to it for this long: a probe a minute, not a flood
ORIGIN_OK_MEMORY_S = 300.0  # an origin that accepted a request this recently is not stopped
SUBSCRIPTION_RETIRE_AFTER = 3  # 401/403 answers to one subscription while its origin accepts others


@dataclass(frozen=True)
class RowState:
    """A given row after its attempt: the state its record wrote ('released': pending again, unsent)."""

    outbox_id: int
    user_id: str
    message_id: str
    subscription_id: int
    state: str


@dataclass
class DispatchStats:
    """What one drain did, by final outcome of each attempt.

    ``rows``: for a drain of given rows (``run_once(ids=...)``), each row it claimed, with
    the state its record wrote, in outbox id order; a given row not among them was not
    claimed (not due, or no longer to do). Empty for a drain of whatever is due: a backlog
    is not kept in memory.
    """

    attempts: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    rows: list[RowState] = field(default_factory=list)

    def add(self, outcome: str) -> None:
        self.attempts += 1
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


@dataclass(frozen=True)
class _Claimed:
    outbox_id: int
    claim_token: int  # the fencing token of this claim: required to record its outcome
    user_id: str
    message_id: str
    tier: str | None
    attempts: int
    subscription_id: int
    endpoint: str
    p256dh: str
    auth: str
    content: dict[str, Any] | None
    collapse_key: str | None
    ttl_s: int
    urgency: str | None


class Dispatcher:
    """Drains the outbox: ``run_once()`` for what is due now, ``run_forever()`` to keep going.

    ``clock`` (a callable returning an aware datetime) replaces the database clock for
    deciding what is due and when to retry: the simulation clock of tests and
    ``gov simulate``. Several dispatchers, in one process or many, may drain one outbox.

    ``timeout_s`` is the total deadline of one attempt and must be shorter than
    ``lease_s`` (:class:`~gov.errors.ConfigurationError` otherwise). ``batch`` defaults
    to as many rows as ``workers`` can attempt within one lease (at most 4 each).

    ``beacon_keys`` (:class:`gov.delivery.beacon.BeaconKeys`; by default read from
    ``GOV_BEACON_SECRET``) makes each payload carry its delivery's beacon token, which
    ``gov serve``'s ``POST /events`` requires.
    """

    def __init__(
        self,
        source: Any,
        signer: VapidSigner,
        *,
        workers: int = DEFAULT_WORKERS,
        batch: int | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff_ms: int = DEFAULT_BACKOFF_MS,
        backoff_cap_ms: int = DEFAULT_BACKOFF_CAP_MS,
        clock: Callable[[], datetime] | None = None,
        name: str | None = None,
        allow_loopback_http: bool | None = None,
        beacon_keys: BeaconKeys | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        check_deadlines(lease_s, timeout_s)
        self.source = source if isinstance(source, Source) else Source(source, pool_size=workers + 1)
        self.signer = signer
        self.workers = workers
        self.lease_s = lease_s
        self.lease_ms = int(lease_s * 1000)
        self.timeout_s = timeout_s
        # kept back at the end of each lease for recording: between the two, every attempt fits
        self.margin_s = min(LEASE_MARGIN_S, (lease_s - timeout_s) / 2)
        self.batch = batch or workers * max(1, min(4, int((lease_s - self.margin_s) // timeout_s)))
        self.max_attempts = max_attempts
        self.backoff_ms = backoff_ms
        self.backoff_cap_ms = backoff_cap_ms
        self.clock = clock
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self.topic_secret = signer.derived_secret(b"gov topic")
        # invariant 15: each payload carries its delivery's beacon token, made here, where the
        # user, the message and the subscription are known. Without a secret (given or in
        # GOV_BEACON_SECRET) payloads carry none, and gov serve refuses their beacons.
        self.beacon_keys = beacon_keys if beacon_keys is not None else keys_from_env()
        # invariant 13: test mode (loopback, http) only when asked for, else GOV_ALLOW_LOOPBACK_HTTP=1
        self.guard = EndpointGuard.from_env(allow_loopback_http)
        # keep-alive connection pools per push-service origin, shared by the worker threads
        self.client = PushClient(self.guard)
        self._checked: dict[str, float] = {}  # scheme://host:port -> until when its check holds
        # (subscription id, endpoint) -> its 404/410, during one drain
        self._gone_now: dict[tuple[int, str], dict[str, Any]] = {}
        # origin -> [401/403 answers since its last acceptance, monotonic time of that
        # acceptance or None, monotonic time until which it is stopped]; for this runner's life
        self._origins: dict[str, list[Any]] = {}
        self._origins_lock = threading.Lock()
        self._stops_until = 0.0  # the latest end of any origin's stop: a row pays the check only then
        # subscription id -> its 401/403 answers while its origin accepted others, for this runner's life
        self._refused_subscriptions: dict[int, int] = {}
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gov-dispatch") if workers > 1 else None
        # the shards this runner walks (one, None, on a single server; sql/schema/70_scale_out.sql)
        self._shard_keys: list[str | None] | None = None
        self._shard_at = random.randrange(1 << 16)  # runners start their walks at different shards

    def close(self) -> None:
        self.stop_sending()
        self.source.close()

    def stop_sending(self) -> None:
        """End the worker threads and close the idle connections; the database source stays."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self.client.close()

    def __enter__(self) -> Dispatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ claiming

    def _now(self) -> datetime | None:
        return self.clock() if self.clock is not None else None

    def shard_keys(self, refresh: bool = False) -> list[str | None]:
        """One key per shard of the outbox: ``[None]`` on one server, one per shard on Citus."""
        if self._shard_keys is None or refresh:
            ((keys,),) = self.source.execute(q("shard_keys"), {})
            self._shard_keys = list(keys)
        return self._shard_keys

    def claim(self, limit: int, ids: list[int] | None = None, shard_keys: list[str] | None = None) -> list[_Claimed]:
        """Claim up to ``limit`` due rows, shard after shard in this runner's walk until there
        are ``limit`` or every shard was asked once (``shard_keys``: only those shards, e.g.
        a user's own id; one server has one). Empty when no shard has a row due.

        Each shard's claim is its own statement (SKIP LOCKED holds within a shard only); a
        batch gathers them so that its rows are sent together, as one server's are: a batch
        of one shard at a time sent a cluster's shards one after another, each waiting out
        its slowest endpoint, and retried in one ``--once`` what fell due meanwhile (an
        outside probe: 97 s and six attempts an endpoint where one server took 2.4 s and one)."""
        keys: list[str | None] = self.shard_keys()
        if shard_keys is not None and keys != [None]:
            # only the shards of these keys; one server has one shard, whatever the keys name
            # (a key per user there cost a statement per user: gov serve's batches of eight)
            keys = list(shard_keys)
        claimed: list[_Claimed] = []
        for step in range(len(keys)):
            at = (self._shard_at + step) % len(keys)
            claimed += self.source.execute(
                q("claim_outbox"),
                {"shard_key": keys[at], "worker": self.name, "limit": limit - len(claimed),
                 "lease_ms": self.lease_ms, "now": self._now(), "ids": ids},
                row_factory=class_row(_Claimed),
            )
            if len(claimed) >= limit:
                self._shard_at = at + 1  # the next claim starts at the next shard: all are served
                break
        return claimed

    def run_once(
        self, ids: list[int] | None = None, stop: threading.Event | None = None, shard_keys: list[str] | None = None
    ) -> DispatchStats:
        """Deliver everything due now (or only the rows ``ids``); return what happened.

        With ``stop``, a set event ends the drain after the batch in hand (recorded).
        With worker threads, draining is pipelined: while the workers send one batch, this
        thread records the previous batch's outcomes and claims the next (see
        :meth:`_run_pipelined`).
        """
        self._gone_now = {}
        if ids is None:
            self.shard_keys(refresh=True)  # a cluster may have split or moved shards since the last drain
        if ids is None and self._pool is not None:
            return self._run_pipelined(stop)
        stats = DispatchStats()
        remaining = None if ids is None else set(ids)
        while (remaining is None or remaining) and not (stop is not None and stop.is_set()):
            began = time.monotonic()  # the lease starts after this, at the claim
            claimed = self.claim(self.batch, None if remaining is None else sorted(remaining), shard_keys)
            if not claimed:
                break
            lease_ends = began + self.lease_s - self.margin_s  # by then every attempt has ended
            attempts = self._deliver_batch(_by_subscription(claimed), lease_ends)
            states = self._record(attempts)
            for state in states:
                stats.add(state)
            if remaining is not None:
                by_id = {row.outbox_id: row for row in claimed}
                recorded = zip(sorted(int(a["outbox_id"]) for a in attempts), states, strict=True)  # _record's order
                stats.rows += [RowState(i, by_id[i].user_id, by_id[i].message_id, by_id[i].subscription_id, state)
                               for i, state in recorded]
                # each given row is attempted once here; what failed waits for its retry time
                remaining -= {row.outbox_id for row in claimed}
            elif all(state == "released" for state in states):
                log.warning("no attempt fitted in the lease; leaving the rows to the next round",
                            extra={"action": "lease_too_short"})
                break
        return stats

    def _claim_batch(self) -> tuple[list[_Claimed], float]:
        began = time.monotonic()  # the lease starts after this, at the claim
        claimed = self.claim(self.batch)
        return claimed, began + self.lease_s - self.margin_s  # by then every attempt of it has ended

    def _run_pipelined(self, stop: threading.Event | None) -> DispatchStats:
        """Drain with the database round trips overlapping the sending.

        While the workers send batch *k*, this thread records batch *k-1* and claims batch
        *k+1*; batch *k+1* is sent once *k* is done (an endpoint's rows stay in order), each
        attempt still only while a whole timeout fits in its own batch's lease. An endpoint
        that answered 404/410 is remembered for the drain, so that its rows in a batch
        claimed before that answer was recorded are not sent either. Should a database call
        fail, the batch in flight is still awaited and its record tried before the error
        goes up (what cannot be recorded is the at-least-once window of docs/states.md).
        """
        stats = DispatchStats()
        unrecorded: list[dict[str, Any]] | None = None
        waited_out = False  # the batch in unrecorded started with no whole timeout left in its lease
        claimed, lease_ends = self._claim_batch()
        more = True
        ahead = True  # claim the next batch while this one is sent
        while claimed:
            started_late = lease_ends - time.monotonic() < self.timeout_s
            waiter = self._start_batch(_by_subscription(claimed), lease_ends)
            try:
                if unrecorded is not None:
                    states = self._record(unrecorded)
                    unrecorded = None
                    for state in states:
                        stats.add(state)
                    if states and all(state == "released" for state in states):
                        if waited_out and ahead:
                            # claimed ahead, it waited its lease away behind slow answers (an
                            # outside probe: --once exited 0 with 24 of 40 rows due): from now
                            # on each batch is claimed once the one before is done
                            ahead = False
                        else:
                            log.warning("no attempt fitted in the lease; leaving the rows to the next round",
                                        extra={"action": "lease_too_short"})
                            more = False
                if stop is not None and stop.is_set():
                    more = False
                next_claimed, next_ends = self._claim_batch() if more and ahead else ([], 0.0)
            except BaseException:
                with contextlib.suppress(Exception):
                    self._record(waiter())
                raise
            unrecorded, waited_out = waiter(), started_late
            if more and not ahead and not (stop is not None and stop.is_set()):
                next_claimed, next_ends = self._claim_batch()
            claimed, lease_ends = next_claimed, next_ends
        if unrecorded is not None:
            for state in self._record(unrecorded):
                stats.add(state)
        return stats

    def run_forever(self, stop: threading.Event, idle_s: float = 1.0) -> None:
        """Drain, then poll every ``idle_s`` seconds until ``stop`` is set."""
        while not stop.is_set():
            try:
                stats = self.run_once(stop=stop)
            except Exception:  # a restart of the database must not end the runner
                log.exception("dispatch round failed; retrying", extra={"action": "dispatch_error"})
                stats = DispatchStats()
            if not stats.attempts:
                stop.wait(idle_s)

    # ------------------------------------------------------------ delivering

    def _deliver_batch(self, groups: list[list[_Claimed]], lease_ends: float) -> list[dict[str, Any]]:
        """Send a batch's endpoint groups on up to ``workers`` threads; return every attempt."""
        return self._start_batch(groups, lease_ends)()

    def _start_batch(
        self, groups: list[list[_Claimed]], lease_ends: float
    ) -> Callable[[], list[dict[str, Any]]]:
        """Start sending a batch's endpoint groups on up to ``workers`` threads; return a
        function that waits for the batch and returns every attempt.

        Each worker takes the next group when it is done with one (one task per worker per
        batch, not per message: the hand-over costs CPU the interpreter lock makes dear).
        """
        if self._pool is None or len(groups) <= 1:
            done = [a for group in groups for a in self._deliver_group(group, lease_ends)]
            return lambda: done
        todo = iter(groups)
        lock = threading.Lock()

        def work() -> list[dict[str, Any]]:
            done: list[dict[str, Any]] = []
            while True:
                with lock:
                    group = next(todo, None)
                if group is None:
                    return done
                done.extend(self._deliver_group(group, lease_ends))

        futures = [self._pool.submit(work) for _ in range(min(self.workers, len(groups)))]
        return lambda: [a for future in futures for a in future.result()]

    def _deliver_group(self, rows: list[_Claimed], lease_ends: float) -> list[dict[str, Any]]:
        """Send one endpoint's rows of a batch, in order; return their attempts.

        An attempt starts only while a whole timeout still fits before ``lease_ends``
        (monotonic seconds); a row with no time left is handed back unsent. After a
        404/410 the endpoint's other rows are not sent: they end ``gone`` with it. After
        the endpoint failed to answer (a timeout, a refused or reset connection) or asked
        to wait (429), its other rows are handed back unsent, due again after that wait
        (or one timeout): a hanging endpoint costs its worker one timeout a batch, not one
        per row, while the batch's other endpoints wait for it.
        """
        attempts: list[dict[str, Any]] = []
        gone = self._gone_now.get((rows[0].subscription_id, rows[0].endpoint)) if rows else None
        held: dict[str, Any] | None = None
        for row in rows:
            if gone is not None:
                error = f"not sent: the endpoint answered {gone['status']} to message {gone['message_id']}"
                attempts.append(_attempt(row, gone["origin"], PushOutcome("gone", status=gone["status"], error=error)))
            elif held is not None:
                attempts.append({**_attempt(row, held["origin"], PushOutcome("transient"), "released"),
                                 "retry_after_ms": held["wait_ms"], "error": held["error"]})
            elif lease_ends - time.monotonic() < self.timeout_s:
                attempts.append(_attempt(row, "", PushOutcome("transient"), "released"))
            elif self._stops_until > time.monotonic() and (stopped := self._origin_stopped(row.endpoint)):
                attempts.append({**_attempt(row, stopped[0], PushOutcome("transient"), "released"),
                                 "retry_after_ms": stopped[1], "error": stopped[2]})
            else:
                attempt = self._deliver_one(row)
                attempts.append(attempt)
                if attempt["outcome"] in ("accepted", "unauthorized"):
                    own = self._note_origin(attempt["origin"], attempt["outcome"] == "accepted", attempt["status"])
                    if own and self._subscription_refused(row.subscription_id):
                        attempt = {**attempt, "outcome": "gone", "error": (
                            f"retired: the push service answered {attempt['status']} to this subscription"
                            f" {SUBSCRIPTION_RETIRE_AFTER} times while accepting others at {attempt['origin']}"
                            " (made for another VAPID key?)")}
                        attempts[-1] = attempt
                if attempt["outcome"] == "gone":
                    gone = {**attempt, "message_id": row.message_id}
                    self._gone_now[(row.subscription_id, row.endpoint)] = gone  # for a batch claimed before
                elif attempt["outcome"] == "throttled" or (attempt["outcome"] == "transient"
                                                           and attempt["status"] is None):
                    waited = attempt["retry_after_ms"]
                    why = (f"asked to wait (HTTP {attempt['status']})" if attempt["outcome"] == "throttled"
                           else f"did not answer ({attempt['error'] or 'no answer'})")
                    held = {
                        "origin": attempt["origin"],
                        "wait_ms": waited if waited is not None else int(self.timeout_s * 1000),
                        "error": f"not sent: the endpoint {why} at message {row.message_id}",
                    }
        return attempts

    def _origin_stopped(self, endpoint: str) -> tuple[str, int, str] | None:
        """(origin, ms left, why) while ``endpoint``'s origin is stopped, else None."""
        origin = _origin(endpoint)
        with self._origins_lock:
            refused, _, until = self._origins.get(origin, (0, None, 0.0))
        left = until - time.monotonic()
        if left <= 0:
            return None
        why = (f"not sent: {origin} answered 401/403 to {refused} requests in a row and accepted none lately;"
               " check the VAPID key and subject")
        return origin, max(1, int(left * 1000)), why

    def _note_origin(self, origin: str, accepted: bool, status: int | None) -> bool:
        """Count an origin's 401/403 answers since its last acceptance; stop it when they say
        the key or subject is refused across the origin. True for a 401/403 from an origin
        that accepted a request lately: the subscription's own refusal."""
        now = time.monotonic()
        with self._origins_lock:
            state = self._origins.setdefault(origin, [0, None, 0.0])
            if accepted:
                state[0], state[1] = 0, now
                return False
            state[0] += 1
            if state[1] is not None and now - state[1] < ORIGIN_OK_MEMORY_S:
                return True
            if state[0] < ORIGIN_STOP_AFTER or state[2] > now:
                return False
            state[2] = now + ORIGIN_STOP_S
            self._stops_until = max(self._stops_until, state[2])
            refused = state[0]
        log.error(
            "push service %s answered %s: %d refusals in a row and no request accepted lately; nothing is sent"
            " to it for %d s (check GOV_VAPID_PRIVATE_KEY and GOV_VAPID_SUBJECT)",
            origin, status, refused, ORIGIN_STOP_S, extra={"action": "origin_stopped"},
        )
        return False

    def _subscription_refused(self, subscription_id: int) -> bool:
        """One more 401/403 for a subscription while its origin accepts others (WEBPUSH.md: "on one
        subscription only while others succeed: retire after repeats"); True at the last repeat."""
        with self._origins_lock:
            count = self._refused_subscriptions.get(subscription_id, 0) + 1
            if len(self._refused_subscriptions) > 100_000:  # bounded, for a runner that runs for months
                self._refused_subscriptions.clear()
            self._refused_subscriptions[subscription_id] = count
        return count >= SUBSCRIPTION_RETIRE_AFTER

    def _deliver_one(self, row: _Claimed) -> dict[str, Any]:
        """Send one claimed row; return its attempt, recorded with the batch's.

        Never raises: whatever goes wrong with this row (content that cannot be built,
        a payload that does not fit, a key that does not encrypt, a bug) ends this row
        ``failed`` with the reason, and the batch goes on (invariant 10).
        """
        started = time.monotonic()
        try:
            attempt = self._send(row)
        except Exception as exc:
            reason = str(exc) if isinstance(exc, GovError) else f"{type(exc).__name__}: {exc}"
            log.error(
                "message %s for user %s cannot be sent: %s",
                row.message_id,
                row.user_id,
                reason,
                exc_info=not isinstance(exc, GovError),
                extra={"action": "delivery_failed"},
            )
            attempt = _attempt(row, _origin(row.endpoint), PushOutcome("rejected", error=reason))
        _observe(attempt, time.monotonic() - started)
        return attempt

    def _send(self, row: _Claimed) -> dict[str, Any]:
        if row.content is None or row.tier is None:
            raise InvalidMessage("no content stored for this message")
        origin = origin_of(row.endpoint)
        if row.ttl_s <= 0:
            return _attempt(row, origin, PushOutcome("rejected", error="deadline passed before sending"), "expired")
        try:  # a stored endpoint that may not be reached ends its row; the connection checks again
            self._check_endpoint(row.endpoint)
        except EndpointRefused as exc:
            return _attempt(row, origin, PushOutcome("rejected", error=f"endpoint refused: {exc.reason}"))
        payload = build_payload(
            row.content.get("title"),  # type: ignore[arg-type]  # checked there
            row.content.get("body") or "",
            row.collapse_key or row.message_id,
            row.content.get("url"),
            row.tier,
            row.message_id,
            count=row.content.get("count"),
            # a summary's row carries the summary's message id: its token covers that id
            subscription_id=row.subscription_id if self.beacon_keys is not None else None,
            token=(self.beacon_keys.mint(row.user_id, row.message_id, row.subscription_id)
                   if self.beacon_keys is not None else None),
        )
        request = PushRequest(
            subscription=Subscription(row.endpoint, row.p256dh, row.auth),
            payload=payload,
            ttl=row.ttl_s,
            urgency=row.urgency or "normal",
            topic=topic_for(row.collapse_key, self.topic_secret) if row.collapse_key else None,
        )
        outcome = deliver(request, self.signer, self.client, timeout=self.timeout_s)  # the total deadline
        if outcome.kind == "rejected":
            log.error(
                "push service refused message %s for user %s: %s %s",
                row.message_id,
                row.user_id,
                outcome.status,
                outcome.body,
                extra={"action": "delivery_rejected"},
            )
        elif outcome.kind == "unauthorized":
            log.error(
                "push service %s answered %s: check the VAPID key and subject",
                origin,
                outcome.status,
                extra={"action": "vapid_alarm"},
            )
        return _attempt(row, origin, outcome)

    def _check_endpoint(self, endpoint: str) -> None:
        """The guard's check of ``endpoint``; a pass is remembered per ``scheme://host:port``
        for as long as the guard keeps a resolution (what the check depends on)."""
        prefix = endpoint.split("/", 3)[:3]
        key = "/".join(prefix) if len(prefix) == 3 and prefix[1] == "" else None
        now = time.monotonic()
        if key is not None and self._checked.get(key, 0.0) > now:
            return
        self.guard.check_url(endpoint)
        if key is not None and self.guard.cache_s > 0:
            if len(self._checked) > 10_000:
                self._checked.clear()
            self._checked[key] = now + self.guard.cache_s

    def _record(self, attempts: list[dict[str, Any]]) -> list[str]:
        """Record a batch's attempts in one call and one commit; return each row's new state,
        in outbox id order.

        Fenced by each claim's token: a row this runner no longer holds is ``stale`` (its
        attempt is not recorded; reported here). Should the batch's call fail on one row's
        data, each attempt is recorded alone, and a row that cannot be recorded even so
        is failed with the reason: one row never keeps the others' outcomes unrecorded.
        """
        if not attempts:
            return []
        attempts = sorted(attempts, key=lambda a: int(a["outbox_id"]))  # the order the database records in
        try:
            rows = self.source.execute(q("record_attempts"), self._record_params(attempts))
            states = [str(state) for _, state in rows]
        except (ConnectionLost, PoolTimeout):
            raise
        except DatabaseError:
            log.exception("recording a batch failed; recording its attempts one by one",
                          extra={"action": "record_batch_error"})
            states = [self._record_alone(attempt) for attempt in attempts]
        for attempt, state in zip(attempts, states, strict=True):
            if state == "stale":
                log.warning(
                    "outbox row %s: lease lost to another runner; outcome %s not recorded",
                    attempt["outbox_id"],
                    attempt["outcome"],
                    extra={"action": "stale_record"},
                )
        return states

    def _record_alone(self, attempt: dict[str, Any]) -> str:
        try:
            ((_, state),) = self.source.execute(q("record_attempts"), self._record_params([attempt]))
        except (ConnectionLost, PoolTimeout):
            raise
        except DatabaseError as exc:
            failed = {**attempt, "outcome": "rejected", "status": None, "retry_after_ms": None,
                      "error": f"outcome {attempt['outcome']!r} could not be recorded: {exc}"[:2000]}
            ((_, state),) = self.source.execute(q("record_attempts"), self._record_params([failed]))
        return str(state)

    def _record_params(self, attempts: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "worker": self.name,
            "attempts": json.dumps(attempts),
            "max_attempts": self.max_attempts,
            "backoff_ms": self.backoff_ms,
            "backoff_cap_ms": self.backoff_cap_ms,
            "now": self._now(),
        }


def _by_subscription(rows: list[_Claimed]) -> list[list[_Claimed]]:
    """A batch's rows by endpoint, each in claim order: one worker sends one endpoint's rows."""
    groups: dict[int, list[_Claimed]] = {}
    for row in rows:
        groups.setdefault(row.subscription_id, []).append(row)
    return list(groups.values())


def _observe(attempt: dict[str, Any], seconds: float) -> None:
    # one line per attempt for whoever debugs delivery: the row, the origin and the answer;
    # never the endpoint's path, the keys or the Authorization header
    log.debug(
        "attempt: outbox row %s to %s: %s %s in %.1f ms", attempt["outbox_id"], attempt["origin"],
        attempt["outcome"], attempt["status"], seconds * 1000, extra={"action": "attempt"},
    )
    try:  # metrics never end a row
        metrics.observe_attempt(attempt["outcome"], attempt["status"], seconds)
    except Exception:
        log.exception("metrics: observe_attempt failed", extra={"action": "metrics_error"})


def _origin(endpoint: str) -> str:
    try:
        return origin_of(endpoint)
    except Exception:  # an endpoint that is not even a URL still gets its row ended
        return ""


def _attempt(row: _Claimed, origin: str, outcome: PushOutcome, kind: str | None = None) -> dict[str, Any]:
    retry_ms = int(outcome.retry_after_s * 1000) if outcome.retry_after_s is not None else None
    # the answer's body is kept only for refusals, where it says what to fix
    error = outcome.error or (outcome.body if outcome.kind in ("rejected", "unauthorized") else None)
    if error is not None:
        error = error.replace("\x00", "\ufffd")[:2000]  # a NUL cannot be stored: it must not sink the batch
    return {
        "user_id": row.user_id,
        "outbox_id": row.outbox_id,
        "claim_token": row.claim_token,
        "origin": origin,
        "outcome": kind or outcome.kind,
        "status": outcome.status,
        "retry_after_ms": retry_ms,
        "error": error,
    }
