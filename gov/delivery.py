"""The runner: claims outbox rows, delivers them through Web Push, records every outcome.

Claim model: a *committed lease* (gov.claim_outbox_v1). A worker marks rows
``sending`` until ``lease_until`` and commits before any HTTP call, so no transaction
stays open during network I/O. A worker that dies leaves its rows leased; when the
lease runs out another runner reclaims them. Delivery is therefore at least once: a
worker killed after the push service accepted a message but before it recorded so
will have that message sent again. Duplicates are made harmless by a stable Topic and
notification tag and the message id in the payload.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import requests

from gov.db import Source
from gov.netguard import EndpointGuard, EndpointRefused, guarded_session
from gov.push import PushOutcome, PushRequest, build_payload, deliver, topic_for
from gov.queries import q
from gov.subscription import Subscription, origin_of
from gov.vapid import VapidSigner

log = logging.getLogger("gov.delivery")

DEFAULT_LEASE_S = 60.0  # seconds a claimed row stays ours before another runner may take it
DEFAULT_TIMEOUT_S = 10.0  # seconds for connect and for each read: never infinite (WEBPUSH.md 11)
DEFAULT_WORKERS = 8  # concurrent HTTP requests per runner: throughput comes from concurrency
DEFAULT_MAX_ATTEMPTS = 8
DEFAULT_BACKOFF_MS = 1000  # first retry after about a second, doubling
DEFAULT_BACKOFF_CAP_MS = 300_000  # never wait more than five minutes between retries


@dataclass
class DispatchStats:
    """What one drain did, by final outcome of each attempt."""

    attempts: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def add(self, outcome: str) -> None:
        self.attempts += 1
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


@dataclass(frozen=True)
class _Claimed:
    outbox_id: int
    user_id: str
    message_id: str
    tier: str
    attempts: int
    subscription_id: int
    endpoint: str
    p256dh: str
    auth: str
    content: dict[str, Any]
    collapse_key: str | None
    ttl_s: int
    urgency: str


class Dispatcher:
    """Drains the outbox: ``run_once()`` for what is due now, ``run_forever()`` to keep going.

    ``clock`` (a callable returning an aware datetime) replaces the database clock for
    deciding what is due and when to retry: the simulation clock of tests and
    ``gov simulate``. Several dispatchers, in one process or many, may drain one outbox.
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
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.source = source if isinstance(source, Source) else Source(source, pool_size=workers + 1)
        self.signer = signer
        self.workers = workers
        self.batch = batch or workers * 4
        self.lease_ms = int(lease_s * 1000)
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.backoff_ms = backoff_ms
        self.backoff_cap_ms = backoff_cap_ms
        self.clock = clock
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self.topic_secret = signer.derived_secret(b"gov topic")
        self._local = threading.local()
        # invariant 13: test mode (loopback, http) only when asked for, else GOV_ALLOW_LOOPBACK_HTTP=1
        self.guard = EndpointGuard.from_env(allow_loopback_http)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gov-dispatch")

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.source.close()

    def __enter__(self) -> Dispatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ claiming

    def _now(self) -> datetime | None:
        return self.clock() if self.clock is not None else None

    def claim(self, limit: int, ids: list[int] | None = None) -> list[_Claimed]:
        rows = self.source.execute(
            q("claim_outbox"),
            {"worker": self.name, "limit": limit, "lease_ms": self.lease_ms, "now": self._now(), "ids": ids},
        )
        return [_Claimed(*row) for row in rows]

    def run_once(self, ids: list[int] | None = None) -> DispatchStats:
        """Deliver everything due now (or only the rows ``ids``); return what happened."""
        stats = DispatchStats()
        remaining = None if ids is None else set(ids)
        while remaining is None or remaining:
            claimed = self.claim(self.batch, None if remaining is None else sorted(remaining))
            if not claimed:
                break
            attempts = list(self._pool.map(self._deliver_one, claimed))
            for state in self._record(attempts):
                stats.add(state)
            if remaining is not None:
                # each given row is attempted once here; what failed waits for its retry time
                remaining -= {row.outbox_id for row in claimed}
        return stats

    def run_forever(self, stop: threading.Event, idle_s: float = 1.0) -> None:
        """Drain, then poll every ``idle_s`` seconds until ``stop`` is set."""
        while not stop.is_set():
            try:
                stats = self.run_once()
            except Exception:  # a restart of the database must not end the runner
                log.exception("dispatch round failed; retrying", extra={"action": "dispatch_error"})
                stats = DispatchStats()
            if not stats.attempts:
                stop.wait(idle_s)

    # ------------------------------------------------------------ delivering

    def _session(self) -> requests.Session:
        # one HTTP session per worker thread: reused connections, never shared (WEBPUSH.md 12)
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = guarded_session(guard=self.guard)
        return session

    def _deliver_one(self, row: _Claimed) -> dict[str, Any]:
        """Send one claimed row; return its attempt, recorded with the batch's."""
        origin = origin_of(row.endpoint)
        if row.ttl_s <= 0:
            return _attempt(row, origin, PushOutcome("rejected", error="deadline passed before sending"), "expired")
        try:  # a stored endpoint that may not be reached ends its row; the connection checks again
            self.guard.check_url(row.endpoint)
        except EndpointRefused as exc:
            return _attempt(row, origin, PushOutcome("rejected", error=f"endpoint refused: {exc.reason}"))
        payload = build_payload(
            row.content["title"],
            row.content.get("body", ""),
            row.collapse_key or row.message_id,
            row.content.get("url"),
            row.tier,
            row.message_id,
            count=row.content.get("count"),
        )
        request = PushRequest(
            subscription=Subscription(row.endpoint, row.p256dh, row.auth),
            payload=payload,
            ttl=row.ttl_s,
            urgency=row.urgency or "normal",
            topic=topic_for(row.collapse_key, self.topic_secret) if row.collapse_key else None,
        )
        outcome = deliver(request, self.signer, self._session(), timeout=self.timeout_s)
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

    def _record(self, attempts: list[dict[str, Any]]) -> list[str]:
        """Record a batch's attempts in one call and one commit; return each row's new state."""
        rows = self.source.execute(
            q("record_attempts"),
            {
                "worker": self.name,
                "attempts": json.dumps(attempts),
                "max_attempts": self.max_attempts,
                "backoff_ms": self.backoff_ms,
                "backoff_cap_ms": self.backoff_cap_ms,
                "now": self._now(),
            },
        )
        return [str(state) for _, state in rows]


def _attempt(row: _Claimed, origin: str, outcome: PushOutcome, kind: str | None = None) -> dict[str, Any]:
    retry_ms = int(outcome.retry_after_s * 1000) if outcome.retry_after_s is not None else None
    # the answer's body is kept only for refusals, where it says what to fix
    error = outcome.error or (outcome.body if outcome.kind in ("rejected", "unauthorized") else None)
    return {
        "outbox_id": row.outbox_id,
        "origin": origin,
        "outcome": kind or outcome.kind,
        "status": outcome.status,
        "retry_after_ms": retry_ms,
        "error": error,
    }
