"""The governor: one decision per message, one SQL call per decision."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from psycopg.rows import dict_row

from gov.db import Source
from gov.delivery.netguard import EndpointGuard
from gov.delivery.subscription import parse_subscription
from gov.message import Decision, Message, check_user_id
from gov.queries import q

log = logging.getLogger("gov")

ENV_ALLOW_LOOPBACK_HTTP = "GOV_ALLOW_LOOPBACK_HTTP"  # tests only: also admit http(s) to loopback, any port


@dataclass(frozen=True)
class SendResult:
    """A send's verdict and the outbox rows it fanned out to (one per live endpoint)."""

    decision: Decision
    outbox_ids: tuple[int, ...] = ()
    delivered: int = 0
    # a campaign at each user's best hour (send_many's best_within): when the delivery is
    # due, and 'best' or 'explore' (None: at once)
    deliver_at: datetime | None = None
    timing: str | None = None

    @property
    def sent(self) -> bool:
        return self.decision.allowed

    def as_json(self) -> dict[str, Any]:
        """The seeds' shape: ``{"sent": true}`` or ``{"sent": false, "action": …, "reason": …}``."""
        return self.decision.as_send_json()


class Governor:
    """Decides allow or suppress for messages, against the policy stored in PostgreSQL.

    ``source`` is a DSN, a psycopg ``Connection`` or ``ConnectionPool``, or a SQLAlchemy
    ``Engine`` or ``Connection``. Given a connection, every decision happens in *your*
    transaction: it commits or rolls back with your own work, and gov never commits it
    (the user's lock is held until you do). Otherwise each decision commits on its own.

    ``signer`` (a :class:`gov.delivery.vapid.VapidSigner`) lets :meth:`send` attempt delivery at
    once in this process; without one, allowed messages wait in the outbox for
    ``gov dispatch``.

    ``clock``, when given, is called for the decision time instead of the database's
    clock: the simulation clock of tests and ``gov simulate``. Hosts' clocks never enter
    a window otherwise (invariant 2).
    """

    def __init__(
        self,
        source: Any,
        *,
        signer: Any = None,
        pool_size: int = 4,
        pool_timeout: float = 5.0,
        clock: Callable[[], datetime] | None = None,
        allow_loopback_http: bool | None = None,
        delivery_timeout_s: float = 10.0,
    ) -> None:
        self.source = Source(source, pool_size=pool_size, pool_timeout=pool_timeout)
        self.clock = clock
        self.signer = signer
        self.delivery_timeout_s = delivery_timeout_s
        if allow_loopback_http is None:
            allow_loopback_http = os.environ.get(ENV_ALLOW_LOOPBACK_HTTP) == "1"
        self.allow_loopback_http = allow_loopback_http
        self._dispatcher: Any = None
        self._dispatcher_lock = threading.Lock()

    def _now(self, at: datetime | None) -> datetime | None:
        return moment(at) if at is not None else (self.clock() if self.clock is not None else None)

    def decide(self, message: Message, *, at: datetime | None = None) -> Decision:
        """Allow or suppress ``message``; record the spend or the suppression atomically."""
        (row,) = self.source.execute(q("decide"), decide_params(message, self._now(at)), row_factory=dict_row)
        return Decision.from_row(row)

    def send(self, message: Message, *, at: datetime | None = None, deliver: bool = True) -> SendResult:
        """Decide and, when allowed, queue one outbox row per live endpoint: one call, atomic.

        Then, with ``deliver`` and a signer, attempt delivery at once in this process
        (what fails is retried by ``gov dispatch``). A message without a title or whose
        payload cannot fit a single 4096-byte record is refused before anything is
        recorded. With your own connection, delivery waits for the runner: the rows are
        not visible to anyone until you commit.
        """
        (row,) = self.source.execute(q("send"), send_params(message, self._now(at)), row_factory=dict_row)
        decision = Decision.from_row(row)
        ids = tuple(row["outbox_ids"])
        delivered = 0
        if deliver and ids and self.signer is not None and not self.source.external_transaction:
            try:
                stats = self.dispatcher().run_once(ids=list(ids), shard_keys=[message.user_id])
                delivered = stats.outcomes.get("delivered", 0)
            except Exception:  # the rows are safe in the outbox; the runner retries them
                log.exception("immediate delivery failed; left to gov dispatch", extra={"action": "send_deferred"})
        return SendResult(decision, ids, delivered)

    def decide_many(
        self,
        template: Message,
        user_ids: Iterable[str],
        *,
        at: datetime | None = None,
        batch: int = 500,
        connections: int = 1,
    ) -> list[tuple[str, Decision]]:
        """Decide ``template`` (its id, tier, topic, campaign) for every user, in batches.

        Each batch of ``batch`` users is one SQL call and one transaction, with the same
        verdicts and suppression rows one-by-one decisions would give; a campaign pays
        one commit per batch instead of one per user. A user listed twice is decided once.
        With ``connections`` above 1 (and a pool: a DSN or a pool as the source), the
        audience, in user order, is cut into that many slices decided at once, each on a
        connection of its own. The slices share no user and every batch locks its users
        in user order, so they never wait on each other in a cycle. Results come in user
        order.
        """
        rows = self._many("decide_many", template, user_ids, at, batch, connections)
        return [(r["user_id"], Decision.from_row(r)) for r in rows]

    def send_many(
        self,
        template: Message,
        user_ids: Iterable[str],
        *,
        at: datetime | None = None,
        batch: int = 500,
        connections: int = 1,
        best_within: timedelta | None = None,
    ) -> list[tuple[str, SendResult]]:
        """:meth:`send` for a whole audience, in batches (delivery is left to ``gov dispatch``).

        ``connections``: as for :meth:`decide_many`. ``best_within``: every user is still
        decided now (the budget is spent now), and each allowed user's delivery waits for
        the best hour of their estimate within that long (``gov.send_many_best_v1``;
        ``SendResult.deliver_at`` says when).
        """
        query, extra = many_send_query(template, best_within)
        return send_results(self._many(query, template, user_ids, at, batch, connections, **extra))

    def _many(
        self,
        query: str,
        template: Message,
        user_ids: Iterable[str],
        at: datetime | None,
        batch: int,
        connections: int,
        **extra: Any,
    ) -> list[dict[str, Any]]:
        users, params = many_params(template, user_ids, self._now(at), batch, connections, **extra)
        if not users:
            return []

        def decide_slice(key: str | None, part: list[str]) -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            for start in range(0, len(part), batch):
                ids = part[start : start + batch]
                rows = self.source.execute(q(query), {"shard_key": key, "user_ids": ids, **params},
                                           row_factory=dict_row)
                out += in_user_order(rows, ids)
            return out

        if self.source.external_transaction:
            connections = 1  # the caller's one connection and transaction
        groups = [(key, list(ids)) for key, ids in self.source.execute(q("shard_groups"), {"user_ids": users})]
        units = campaign_units(groups, connections, batch)
        if connections == 1 or len(units) == 1:
            return [row for key, part in units for row in decide_slice(key, part)]
        results: list[list[dict[str, Any]]] = [[] for _ in units]
        errors: list[BaseException] = []
        todo = iter(range(len(units)))
        todo_lock = threading.Lock()

        def run() -> None:
            while not errors:
                with todo_lock:
                    i = next(todo, None)
                if i is None:
                    return
                try:
                    results[i] = decide_slice(*units[i])
                except BaseException as exc:  # re-raised in the caller's thread below
                    errors.append(exc)

        threads = [threading.Thread(target=run, name=f"gov-campaign-{i}") for i in range(min(connections, len(units)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return [row for part in results for row in part]

    def dispatcher(self) -> Any:
        """The in-process dispatcher :meth:`send` uses (shares this governor's connections)."""
        from gov.delivery.runner import Dispatcher

        with self._dispatcher_lock:
            if self._dispatcher is None:
                if self.signer is None:
                    raise ValueError("delivery needs a VAPID signer: Governor(..., signer=VapidSigner.from_env())")
                self._dispatcher = Dispatcher(
                    self.source, self.signer, workers=2, clock=self.clock, timeout_s=self.delivery_timeout_s,
                    allow_loopback_http=self.allow_loopback_http,
                )
            return self._dispatcher

    def record_event(
        self, user_id: str, message_id: str, event: str, subscription_id: int | None = None,
        at: datetime | None = None,
    ) -> bool:
        """:func:`gov.analytics.events.record_event` on this governor's connections (as
        :meth:`gov.aio.AsyncGovernor.record_event`): True when recorded now."""
        from gov.analytics.events import record_event

        return record_event(self, user_id, message_id, event, subscription_id, moment(at) if at is not None else None)

    def subscribe(self, user_id: str, subscription: str | bytes | Mapping[str, Any]) -> int:
        """Store a browser's PushSubscription JSON for ``user_id``; return its id.

        Validated first (https endpoint, a P-256 point, a 16-byte auth secret): a bad
        one raises :class:`gov.InvalidSubscription` and nothing is stored. Subscribing
        again never resets the user's budget: budgets belong to the user.
        """
        (row,) = self.source.execute(q("subscribe"), self.subscription_params(user_id, subscription))
        return int(row[0])

    def subscription_params(self, user_id: str, subscription: str | bytes | Mapping[str, Any]) -> dict[str, str]:
        """The parameters of ``q("subscribe")``, every check of :meth:`subscribe` made first
        (raises :class:`gov.InvalidSubscription`); for a caller that subscribes in a transaction of its own."""
        Message(user_id=user_id, id="-", tier="P0")  # the same rules for the user id
        sub = parse_subscription(subscription, allow_loopback_http=self.allow_loopback_http)
        # every address the host resolves to must be public (invariant 13); the runner checks again
        EndpointGuard.from_env(self.allow_loopback_http, cache_s=0).check_url(sub.endpoint)
        return {"user_id": user_id, "endpoint": sub.endpoint, "p256dh": sub.p256dh, "auth": sub.auth}

    def close(self) -> None:
        """Close what gov opened; a pool or connection you gave stays open."""
        if self._dispatcher is not None:
            self._dispatcher.stop_sending()
        self.source.close()

    def __enter__(self) -> Governor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------- shared with gov.aio
# The parameters and the planning of every call, so the async governor sends exactly the
# same statements with exactly the same values: no rule is written twice.


def decide_params(message: Message, now: datetime | None, what: str = "decide") -> dict[str, Any]:
    """The parameters of ``q("decide")`` for ``message``."""
    if not isinstance(message, Message):
        raise TypeError(f"{what}() takes a gov.Message, got {type(message).__name__}")
    return {
        "user_id": message.user_id,
        "message_id": message.id,
        "tier": message.tier,
        "topic": message.topic,
        "campaign_id": message.campaign_id,
        "now": now,
    }


def send_params(message: Message, now: datetime | None) -> dict[str, Any]:
    """The parameters of ``q("send")``: the decision's, and what is stored for delivery
    (an untitled or oversize payload is refused here, before anything is recorded)."""
    params = decide_params(message, now, "send")
    params.update(content=json.dumps(message.content()), collapse_key=message.collapse_key, ttl=message.ttl)
    return params


def send_row(message: Message) -> list[Any]:
    """One message of a batch (:func:`batch_doc_params`, :func:`batch_params`): what
    :func:`send_params` holds, in the order of ``gov.send_batch_v1``'s arrays (an untitled
    or oversize payload is refused here, before anything is recorded)."""
    if not isinstance(message, Message):
        raise TypeError(f"send() takes a gov.Message, got {type(message).__name__}")
    return [message.user_id, message.id, message.tier, message.topic, message.campaign_id, message.content(),
            message.collapse_key, message.ttl]


def batch_doc_params(rows: Sequence[Sequence[Any]], now: datetime | None) -> dict[str, Any]:
    """The parameters of ``q("send_batch_doc")``: the batch's :func:`send_row` rows as one
    JSON document. One json.dumps in C instead of psycopg writing nine arrays element by
    element in Python: 200 µs less of the door's CPU a batch of 16 (docs/performance.md)."""
    return {"batch": json.dumps(rows, separators=(",", ":")), "now": now}


def batch_params(rows: Sequence[Sequence[Any]], now: datetime | None, shard_key: str | None) -> dict[str, Any]:
    """The parameters of ``q("send_batch")`` (one shard's messages on a Citus cluster, which
    delegates only a bare function call) from each message's :func:`send_row`, in order."""
    return {
        "shard_key": shard_key,
        "user_ids": [r[0] for r in rows],
        "message_ids": [r[1] for r in rows],
        "tiers": [r[2] for r in rows],
        "topics": [r[3] for r in rows],
        "campaign_ids": [r[4] for r in rows],
        "contents": [json.dumps(r[5]) for r in rows],
        "collapse_keys": [r[6] for r in rows],
        "ttls": [r[7] for r in rows],
        "now": now,
    }


def moment(at: Any) -> datetime:
    """``at=``: a datetime, the decision's moment (a simulation or replay clock). Anything
    else went to the database as text and was read there: "infinity", "yesterday"."""
    if not isinstance(at, datetime):
        raise TypeError(f"at: expected a datetime, got {type(at).__name__}")
    if at.tzinfo is None or at.utcoffset() is None:
        # PostgreSQL would read it in the session's time zone: one naive 12:00 was stored
        # as 12:00 UTC on one connection and 22:00 the day before on another
        raise TypeError(f"at: expected a timezone-aware datetime (e.g. tzinfo=UTC), got naive {at.isoformat()}")
    return at


def many_params(
    template: Message, user_ids: Iterable[str], now: datetime | None, batch: int, connections: int, **extra: Any
) -> tuple[list[str], dict[str, Any]]:
    """A campaign's audience (checked, distinct, in user order) and the parameters of its batches."""
    if not isinstance(template, Message):
        raise TypeError(f"expected a gov.Message template, got {type(template).__name__}")
    if batch < 1:
        raise ValueError("batch must be at least 1")
    if connections < 1:
        raise ValueError("connections must be at least 1")
    if isinstance(user_ids, (str, bytes)):  # one id is an iterable too: of its characters
        raise TypeError("user_ids: expected a collection of user ids, got a single "
                        f"{type(user_ids).__name__} (wrap it: [{user_ids!r}])")
    # each id checked like a Message; distinct and in order, so the slices share no user
    users = sorted({check_user_id(u) for u in user_ids})
    params = {
        "message_id": template.id,
        "tier": template.tier,
        "topic": template.topic,
        "campaign_id": template.campaign_id,
        "collapse_key": template.collapse_key,
        "ttl": template.ttl,
        "now": now,
        **extra,
    }
    return users, params


def many_send_query(template: Message, best_within: timedelta | None) -> tuple[str, dict[str, Any]]:
    """The named statement of a campaign's sends and its parameters beyond ``many_params``."""
    extra: dict[str, Any] = {"content": json.dumps(template.content())}
    if best_within is None:
        return "send_many", extra
    if not isinstance(best_within, timedelta) or not timedelta(0) <= best_within <= timedelta(days=7):
        raise ValueError(f"best_within must be a timedelta from 0 to 7 days, got {best_within!r}")
    return "send_many_best", {**extra, "within": best_within}


def send_results(rows: list[dict[str, Any]]) -> list[tuple[str, SendResult]]:
    """A campaign's rows as (user id, SendResult) pairs."""
    return [
        (r["user_id"], SendResult(Decision.from_row(r), tuple(r["outbox_ids"]),
                                  deliver_at=r.get("deliver_at"), timing=r.get("timing")))
        for r in rows
    ]


def campaign_units(
    groups: list[tuple[str | None, list[str]]], connections: int, batch: int
) -> list[tuple[str | None, list[str]]]:
    """The units a campaign is decided in, each on a connection of its own.

    One group on one server, cut into up to ``connections`` user-ordered slices; on a
    Citus cluster one group per shard, each decided whole on the worker that holds it
    (sql/schema/70_scale_out.sql), ``connections`` groups at a time.
    """
    if len(groups) != 1:
        return groups
    key, group = groups[0]
    n = max(1, min(connections, -(-len(group) // batch)))  # no more slices than batches
    size = -(-len(group) // n)
    return [(key, group[i : i + size]) for i in range(0, len(group), size)]


def in_user_order(rows: list[dict[str, Any]], ids: list[str]) -> list[dict[str, Any]]:
    """A batch's rows in the batch's order, the user order: the SQL promises none (plain
    users are decided together)."""
    rank = {u: i for i, u in enumerate(ids)}
    return sorted(rows, key=lambda r: rank[r["user_id"]])


_default: Governor | None = None
_default_lock = threading.Lock()


def send(message: Message, *, at: datetime | None = None) -> dict[str, Any]:
    """The one send path: decide, queue, deliver. Returns the seeds' JSON shape.

    Uses a process-wide governor built on first use from ``GOV_DATABASE_URL`` and the
    VAPID key (``GOV_VAPID_PRIVATE_KEY``, ``GOV_VAPID_SUBJECT``); it refuses to start
    with a clear :class:`gov.ConfigurationError` when either is missing or wrong.
    """
    global _default
    with _default_lock:
        if _default is None:
            from gov.delivery.vapid import VapidSigner
            from gov.errors import ConfigurationError

            # The library never falls back to the CLI's embedded server: an app that forgot
            # its database URL must hear so, not write to a scratch database.
            url = os.environ.get("GOV_DATABASE_URL", "").strip()
            if not url:
                raise ConfigurationError(
                    "gov.send() needs GOV_DATABASE_URL (a postgresql:// URL); "
                    "or build gov.Governor(url, signer=...) yourself"
                )
            signer = VapidSigner.from_env()
            _default = Governor(url, signer=signer)
    return _default.send(message, at=at).as_json()
