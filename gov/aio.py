"""The governor for asyncio: :class:`AsyncGovernor`, and :class:`SendBatcher`, which groups
concurrent sends into one statement.

``AsyncGovernor`` has :class:`gov.Governor`'s methods and verdicts, awaited. It sends the
same named statements with the same parameters (built by the same functions of
:mod:`gov.governor`), so no rule exists twice::

    async with gov.aio.AsyncGovernor("postgresql://app@db/app") as governor:
        result = await governor.send(gov.Message(user_id="u42", id="m1", tier="P2", title="Hello"))

Given a psycopg ``AsyncConnection`` or a SQLAlchemy ``AsyncConnection``, the decision is
part of *your* transaction, as with ``Governor``: it commits or rolls back with your own
work and gov never commits it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from psycopg.rows import dict_row

from gov.db import AsyncSource, Source
from gov.errors import ConfigurationError, ConnectionLost, DatabaseError, InvalidInput, PoolTimeout
from gov.governor import (
    ENV_ALLOW_LOOPBACK_HTTP,
    SendResult,
    batch_doc_params,
    batch_params,
    campaign_units,
    decide_params,
    in_user_order,
    many_params,
    many_send_query,
    moment,
    send_params,
    send_results,
    send_row,
)
from gov.message import Decision, Message
from gov.queries import q

log = logging.getLogger("gov.aio")

DEFAULT_BATCH_WINDOW_MS = 1.0  # milliseconds a batch waits for company once its first send is in
DEFAULT_BATCH_MAX = 64  # sends per statement: every user lock of a batch is held until it commits
# A batch that has run this many windows is stalled (a user lock an app's transaction holds):
# the next one starts beside it instead of waiting for it to end.
STALL_WINDOWS = 10


class AsyncGovernor:
    """:class:`gov.Governor` for asyncio; see the module's docstring.

    ``source`` is a DSN, a psycopg ``AsyncConnection`` or ``AsyncConnectionPool``, or a
    SQLAlchemy ``AsyncEngine`` or ``AsyncConnection`` (``postgresql+psycopg://``).

    With a ``signer``, :meth:`send` attempts delivery at once, as ``Governor.send`` does,
    through the synchronous runner in a worker thread (delivery is HTTP to push services,
    after the decision has committed); with your own connection it waits for
    ``gov dispatch``, since nothing is visible before you commit.
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
        self.source = AsyncSource(source, pool_size=pool_size, pool_timeout=pool_timeout)
        self.clock = clock
        self.signer = signer
        self.delivery_timeout_s = delivery_timeout_s
        if allow_loopback_http is None:
            allow_loopback_http = os.environ.get(ENV_ALLOW_LOOPBACK_HTTP) == "1"
        self.allow_loopback_http = allow_loopback_http
        self._delivery: Any = None  # a Governor over its own small pool, for its runner
        self._distributed: bool | None = None

    def _now(self, at: datetime | None) -> datetime | None:
        return moment(at) if at is not None else (self.clock() if self.clock is not None else None)

    async def open(self) -> None:
        """Open gov's own pool now (otherwise it opens on first use)."""
        await self.source.open()

    async def decide(self, message: Message, *, at: datetime | None = None) -> Decision:
        """Allow or suppress ``message``; record the spend or the suppression atomically."""
        (row,) = await self.source.execute(q("decide"), decide_params(message, self._now(at)), row_factory=dict_row)
        return Decision.from_row(row)

    async def send(self, message: Message, *, at: datetime | None = None, deliver: bool = True) -> SendResult:
        """:meth:`gov.Governor.send`: decide and, when allowed, queue one outbox row per live
        endpoint, in one call; then, with ``deliver`` and a signer, attempt delivery."""
        (row,) = await self.source.execute(q("send"), send_params(message, self._now(at)), row_factory=dict_row)
        result = SendResult(Decision.from_row(row), tuple(row["outbox_ids"]))
        if deliver:
            return (await self.deliver([result], [message.user_id]))[0]
        return result

    async def send_batch(
        self, messages: Sequence[Message], *, at: datetime | None = None
    ) -> list[SendResult | Exception]:
        """Send unrelated messages together: one statement and one commit (per shard on a
        Citus cluster) for all of them, each with the verdict it would get alone.

        Returns one entry per message, in order: its :class:`SendResult`, or the exception
        that message alone raised (:class:`gov.InvalidMessage`, say). Nothing is answered
        before its batch has committed. When the grouped statement fails, nothing of it
        was written, and each message is sent again alone, so an error stays with its
        message and the others get their verdicts. Delivery is the caller's
        (:meth:`deliver`): the decision path never waits for a push service.
        """
        now = self._now(at)
        results: list[SendResult | Exception | None] = [None] * len(messages)
        rows: dict[int, list[Any]] = {}
        for i, message in enumerate(messages):
            try:
                rows[i] = send_row(message)  # an untitled or oversize one is refused alone
            except (InvalidInput, TypeError) as exc:
                results[i] = exc
        for key, members in await self._by_shard(list(rows), messages):
            mine = [rows[i] for i in members]
            try:
                if key is None:  # one server: the batch as one JSON document
                    query, params = q("send_batch_doc"), batch_doc_params(mine, now)
                else:
                    query, params = q("send_batch"), batch_params(mine, now, key)
                # (ordinal, allowed, action, reason, used, cap, retry_after_ms, repeated, outbox_ids):
                # both queries' columns, which are Decision's fields in order; by position, since
                # a dict per row and Decision.from_row were 5 µs of the door's CPU a send
                for row in await self.source.execute(query, params):
                    results[members[row[0] - 1]] = SendResult(Decision(*row[1:8]), tuple(row[8]))
            except (ConnectionLost, PoolTimeout):
                raise  # no database to send them to, alone or together
            except Exception as exc:  # nothing of the batch was written: each alone now
                if self.source.external_transaction:
                    raise  # the caller's transaction is aborted: nothing to retry in it
                log.warning("a grouped send failed (%s); sending its %d messages alone", exc, len(members),
                            extra={"action": "batch_split"})
                for i in members:
                    try:
                        results[i] = await self.send(messages[i], at=now, deliver=False)
                    except Exception as alone:
                        results[i] = alone
        return [r if r is not None else RuntimeError("no verdict") for r in results]

    async def _by_shard(self, members: list[int], messages: Sequence[Message]) -> list[tuple[str | None, list[int]]]:
        """The messages per shard key: one group on one server (no round trip to ask)."""
        if not members:
            return []
        if self._distributed is None:
            (row,) = await self.source.execute(q("distributed"), {})
            self._distributed = bool(row[0])
        if not self._distributed:
            return [(None, members)]
        groups = await self.source.execute(q("shard_groups"), {"user_ids": [messages[i].user_id for i in members]})
        key_of = {u: key for key, ids in groups for u in ids}
        parts: dict[str | None, list[int]] = {}
        for i in members:
            parts.setdefault(key_of[messages[i].user_id], []).append(i)
        return list(parts.items())

    async def deliver(self, results: list[SendResult], user_ids: list[str]) -> list[SendResult]:
        """Attempt delivery of these sends' outbox rows now (with a signer; else as they are).

        The runner is synchronous HTTP: it runs in a worker thread, after the decisions
        have committed. What fails stays in the outbox for ``gov dispatch``.
        """
        ids = [i for r in results for i in r.outbox_ids]
        if not ids or self.signer is None or self.source.external_transaction:
            return results
        try:
            dispatcher = self._dispatcher()
            stats = await asyncio.to_thread(dispatcher.run_once, ids=ids, shard_keys=sorted(set(user_ids)))
        except Exception:  # the rows are safe in the outbox; the runner retries them
            log.exception("immediate delivery failed; left to gov dispatch", extra={"action": "send_deferred"})
            return results
        delivered = stats.outcomes.get("delivered", 0)
        if len(results) == 1:
            return [SendResult(results[0].decision, results[0].outbox_ids, delivered)]
        return results

    def _dispatcher(self) -> Any:
        from gov.delivery.runner import Dispatcher

        if self._delivery is None:
            if self.source.dsn is None:
                raise ConfigurationError(
                    "immediate delivery from an AsyncGovernor needs a DSN, a pool or an engine "
                    "(a connection's sends wait for gov dispatch)"
                )
            source = Source(self.source.dsn, pool_size=2, pool_timeout=self.source.pool_timeout)
            self._delivery = Dispatcher(
                source, self.signer, workers=2, clock=self.clock, timeout_s=self.delivery_timeout_s,
                allow_loopback_http=self.allow_loopback_http,
            )
            self._delivery_source = source
        return self._delivery

    async def decide_many(
        self, template: Message, user_ids: Iterable[str], *, at: datetime | None = None, batch: int = 500,
        connections: int = 1,
    ) -> list[tuple[str, Decision]]:
        """:meth:`gov.Governor.decide_many`, awaited: slices decided at once on ``connections``."""
        rows = await self._many("decide_many", template, user_ids, at, batch, connections)
        return [(r["user_id"], Decision.from_row(r)) for r in rows]

    async def send_many(
        self, template: Message, user_ids: Iterable[str], *, at: datetime | None = None, batch: int = 500,
        connections: int = 1, best_within: timedelta | None = None,
    ) -> list[tuple[str, SendResult]]:
        """:meth:`gov.Governor.send_many`, awaited (delivery is left to ``gov dispatch``)."""
        query, extra = many_send_query(template, best_within)
        return send_results(await self._many(query, template, user_ids, at, batch, connections, **extra))

    async def _many(
        self, query: str, template: Message, user_ids: Iterable[str], at: datetime | None, batch: int,
        connections: int, **extra: Any,
    ) -> list[dict[str, Any]]:
        users, params = many_params(template, user_ids, self._now(at), batch, connections, **extra)
        if not users:
            return []
        if self.source.external_transaction:
            connections = 1  # the caller's one connection and transaction

        async def decide_slice(key: str | None, part: list[str]) -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            for start in range(0, len(part), batch):
                ids = part[start : start + batch]
                rows = await self.source.execute(q(query), {"shard_key": key, "user_ids": ids, **params},
                                                 row_factory=dict_row)
                out += in_user_order(rows, ids)
            return out

        groups = [(key, list(ids)) for key, ids in await self.source.execute(q("shard_groups"), {"user_ids": users})]
        units = campaign_units(groups, connections, batch)
        if connections == 1 or len(units) == 1:
            return [row for key, part in units for row in await decide_slice(key, part)]
        # `connections` slices at a time; each batch locks its users in user order, and
        # the slices share no user, so they never wait on each other in a cycle
        gate = asyncio.Semaphore(connections)

        async def gated(key: str | None, part: list[str]) -> list[dict[str, Any]]:
            async with gate:
                return await decide_slice(key, part)

        parts = await asyncio.gather(*(gated(key, part) for key, part in units))
        return [row for part in parts for row in part]

    async def record_event(
        self, user_id: str, message_id: str, event: str, subscription_id: int | None = None,
        at: datetime | None = None,
    ) -> bool:
        """:func:`gov.analytics.events.record_event`, awaited: True when recorded now (the
        same checks, and sent again on a fresh connection when gov owns a lost one, as the
        sync :meth:`gov.Governor.record_event`)."""
        from gov.analytics.events import InvalidEvent, check_event

        check_event(user_id, message_id, event, subscription_id)
        params = {"user_id": user_id, "message_id": message_id, "event": event,
                  "subscription_id": subscription_id, "at": moment(at) if at is not None else None}
        try:  # safe to repeat: an event is recorded once (its key)
            ((recorded,),) = await self.source.execute(q("record_event"), params)
        except InvalidInput as exc:  # gov.record_event_v1's refusal (GV003)
            raise InvalidEvent(str(exc)) from exc
        return bool(recorded)

    async def subscribe(self, user_id: str, subscription: str | bytes | Mapping[str, Any]) -> int:
        """:meth:`gov.Governor.subscribe`, awaited: validated, every address checked public."""
        from gov.delivery.netguard import EndpointGuard
        from gov.delivery.subscription import parse_subscription

        Message(user_id=user_id, id="-", tier="P0")  # the same rules for the user id
        sub = parse_subscription(subscription, allow_loopback_http=self.allow_loopback_http)
        guard = EndpointGuard.from_env(self.allow_loopback_http, cache_s=0)
        await asyncio.to_thread(guard.check_url, sub.endpoint)  # DNS: off the event loop
        (row,) = await self.source.execute(
            q("subscribe"), {"user_id": user_id, "endpoint": sub.endpoint, "p256dh": sub.p256dh, "auth": sub.auth}
        )
        return int(row[0])

    async def close(self) -> None:
        """Close what gov opened; a pool, engine or connection you gave stays open."""
        if self._delivery is not None:
            self._delivery.stop_sending()
            await asyncio.to_thread(self._delivery_source.close)
            self._delivery = None
        await self.source.close()

    async def __aenter__(self) -> AsyncGovernor:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# ---------------------------------------------------------------- grouping concurrent sends


class SendBatcher:
    """Concurrent :meth:`send` calls grouped into one statement each (group commit).

    A send waits until a batch starts: at once when no batch is running (the database
    is idle: waiting would only add latency), else up to ``window_ms`` for company
    while the running batches commit, and never for more than ``max_batch`` messages.
    Up to ``concurrency`` batches run at once (one connection each), so while one
    commits the next fills. Each send is answered with its own
    verdict once its batch has committed (:meth:`AsyncGovernor.send_batch`).
    """

    def __init__(
        self,
        governor: AsyncGovernor,
        *,
        window_ms: float = DEFAULT_BATCH_WINDOW_MS,
        max_batch: int = DEFAULT_BATCH_MAX,
        concurrency: int = 4,
        on_batch: Callable[[int, list[float]], None] | None = None,
    ) -> None:
        if window_ms < 0:
            raise ConfigurationError(f"the batch window must be 0 ms or more, got {window_ms}")
        if max_batch < 1:
            raise ConfigurationError(f"a batch holds at least 1 send, got {max_batch}")
        if concurrency < 1:
            raise ConfigurationError(f"at least 1 batch must run at a time, got {concurrency}")
        self.governor = governor
        self.window_s = window_ms / 1000
        self.max_batch = max_batch
        self.concurrency = concurrency
        self.on_batch = on_batch
        self._queue: asyncio.Queue[tuple[Message, asyncio.Future[SendResult], float]] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._running = 0  # batches being decided now
        self._expected = 1  # sends the next batch on an idle database waits for (see _work)
        self._gathering = asyncio.Lock()
        self._idle = asyncio.Event()
        self._idle.set()
        self._deliveries: set[asyncio.Task[list[SendResult]]] = set()

    def _start(self) -> asyncio.Queue[tuple[Message, asyncio.Future[SendResult], float]]:
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._workers = [asyncio.create_task(self._work(), name=f"gov-batch-{i}")
                             for i in range(self.concurrency)]
        return self._queue

    async def send(self, message: Message) -> SendResult:
        """The verdict of ``message``, decided in a batch with whatever arrived with it.

        Raises what the message alone would raise (:class:`gov.InvalidMessage`, a database error)."""
        return await self.submit(message)

    def submit(self, message: Message) -> asyncio.Future[SendResult]:
        """:meth:`send` without a coroutine: the future of its verdict (gov serve's protocol
        answers from a callback on it, without a task per request)."""
        queue = self._start()
        future: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        queue.put_nowait((message, future, time.monotonic()))
        return future

    async def _gather(self, queue: asyncio.Queue[tuple[Message, asyncio.Future[SendResult], float]],
                      batch: list[tuple[Message, asyncio.Future[SendResult], float]]) -> None:
        """Fill ``batch`` with the next batch's sends (see _work) and count it as running."""
        # One worker gathers a batch at a time; the others wait their turn here, so a batch
        # that ends finds the next one gathering, not two half batches.
        async with self._gathering:
            batch.append(await queue.get())
            if self._running:
                # Another batch holds the database: the next starts when it ends (the
                # sends that queued meanwhile, and its answered clients, go together), or
                # when it has run for STALL_WINDOWS windows (it waits on a user lock an
                # app's transaction holds, say): the door keeps moving past it.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._idle.wait(), self.window_s * STALL_WINDOWS)
            if self._running:
                enough, deadline = self.max_batch, time.monotonic()
            else:
                # Group commit on an idle database: only the company on its way, for up
                # to the window: the sends that queued while the last batch ran and the
                # clients it answered, which under load send again at once. Without it,
                # 16 connections settle into two alternating batches of about 8, and each
                # statement's fixed cost (about a millisecond of PostgreSQL's CPU,
                # docs/performance.md) is shared by 8 instead of 16. A lone client is
                # expected alone: it goes at once.
                enough = min(self.max_batch, self._expected)
                deadline = time.monotonic() + (self.window_s if enough > 1 else 0.0)
            while len(batch) < self.max_batch:
                if not queue.empty():
                    batch.append(queue.get_nowait())
                    continue
                left = deadline - time.monotonic()
                if len(batch) >= enough or left <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(queue.get(), left))
                except TimeoutError:
                    break
            self._running += 1
            self._idle.clear()

    async def _work(self) -> None:
        assert self._queue is not None
        queue = self._queue
        while True:
            batch: list[tuple[Message, asyncio.Future[SendResult], float]] = []
            try:
                await self._gather(queue, batch)
            except asyncio.CancelledError:  # closing: the sends gathered hear it, as the queued ones do
                for _, future, _ in batch:
                    if not future.done():
                        future.set_exception(ConfigurationError("gov serve is shutting down"))
                raise
            started = time.monotonic()
            live = [(m, f) for m, f, _ in batch if not f.cancelled()]
            try:
                results = await self.governor.send_batch([m for m, _ in live])
            except Exception as exc:  # e.g. the database is down: every send of the batch hears it
                results = [exc] * len(live)
            except asyncio.CancelledError:  # closed mid-batch: its callers must not wait for ever
                for _, future in live:
                    if not future.done():
                        future.set_exception(DatabaseError(
                            "gov serve is shutting down during this send's batch: its verdict may or may not be"
                            " committed; send the same id again for it"))
                raise
            finally:
                self._running -= 1
                if not self._running:
                    self._idle.set()
            # (before any answer is given: no client of this batch can be queued yet)
            self._expected = queue.qsize() + len(live)
            for (_, future), result in zip(live, results, strict=True):
                if future.cancelled():
                    continue  # its client left; its verdict is committed and a retry returns it
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)
            if self.on_batch is not None:
                self.on_batch(len(live), [started - t for _, _, t in batch])
            if self.governor.signer is not None:
                allowed = [r for r in results if isinstance(r, SendResult) and r.outbox_ids]
                if allowed:  # after the answers: delivery never holds up a verdict
                    users = [m.user_id for (m, _), r in zip(live, results, strict=True)
                             if isinstance(r, SendResult) and r.outbox_ids]
                    task = asyncio.create_task(self.governor.deliver(allowed, users))
                    self._deliveries.add(task)  # held until done: the loop keeps only weak references
                    task.add_done_callback(self._deliveries.discard)

    async def close(self) -> None:
        """Stop the batch workers (sends still queued are refused with a ConfigurationError),
        after the deliveries already under way have ended (what they leave stays in the
        outbox for ``gov dispatch``, but a row they claimed would wait out its lease)."""
        if self._deliveries:
            await asyncio.wait(set(self._deliveries), timeout=self.governor.delivery_timeout_s + 5)
        if self._running:  # the batches under way end and answer first (one may wait on a lock: bounded)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), self.governor.source.pool_timeout)
        for task in self._workers:
            task.cancel()
        for task in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._workers = []
        if self._queue is not None:
            while not self._queue.empty():
                _, future, _ = self._queue.get_nowait()
                if not future.done():
                    future.set_exception(ConfigurationError("gov serve is shutting down"))
            self._queue = None
