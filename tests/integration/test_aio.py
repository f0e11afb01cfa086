"""gov.aio: the AsyncGovernor over every kind of source, exact under concurrency, and in
the caller's own transaction; the SendBatcher's grouping exact as one-by-one sends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
import psycopg_pool
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from gov import Governor, InvalidMessage, Message
from gov.aio import AsyncGovernor, SendBatcher
from gov.analytics.events import InvalidEvent
from gov.db import sqlalchemy_url
from gov.delivery.vapid import VapidSigner
from gov.testing import PushService
from tests.aio import run_async

T = TypeVar("T")
RACERS = 20
ROUNDS = 20


def run(coro: Callable[[], Awaitable[T]]) -> T:
    return run_async(coro())  # type: ignore[arg-type]


def p2(user: str, mid: str, **kw: Any) -> Message:
    return Message(user_id=user, id=mid, tier="P2", title=f"t {mid}", **kw)


def test_the_seeds_verification(db_url: str) -> None:
    async def go() -> list[dict[str, Any]]:
        async with AsyncGovernor(db_url) as governor:
            out = [(await governor.send(p2("u42", f"m{i}"))).as_json() for i in (1, 2, 3)]
            out.append((await governor.send(Message(user_id="u42", id="otp-1", tier="P0", title="code"))).as_json())
            return out

    assert run(go) == [{"sent": True}, {"sent": True},
                       {"sent": False, "action": "drop", "reason": "cap_86400000ms"}, {"sent": True}]


def test_twenty_concurrent_tasks_for_a_fresh_user_are_exact(db_url: str, conn: psycopg.Connection[Any]) -> None:
    async def go() -> list[int]:
        counts = []
        async with AsyncGovernor(db_url, pool_size=RACERS) as governor:
            for round_no in range(ROUNDS):
                user = f"race-{round_no}"
                results = await asyncio.gather(*(governor.send(p2(user, f"m{i}")) for i in range(RACERS)))
                counts.append(sum(r.sent for r in results))
        return counts

    assert run(go) == [2] * ROUNDS
    assert conn.execute("SELECT count(*) FROM gov.sends WHERE budget = 'P2'").fetchone() == (2 * ROUNDS,)


def test_twenty_concurrent_sends_grouped_by_the_batcher_are_exact(db_url: str, conn: psycopg.Connection[Any]) -> None:
    """All 20 land in one or a few batches: the same user's messages go one after the
    other in one transaction, so exactly 2 are allowed, as one by one."""
    async def go() -> tuple[list[int], list[int]]:
        counts, sizes = [], []
        async with AsyncGovernor(db_url, pool_size=4) as governor:
            batcher = SendBatcher(governor, window_ms=2, concurrency=2, on_batch=lambda n, _w: sizes.append(n))
            for round_no in range(ROUNDS):
                user = f"group-{round_no}"
                results = await asyncio.gather(*(batcher.send(p2(user, f"m{i}")) for i in range(RACERS)))
                counts.append(sum(r.sent for r in results))
            await batcher.close()
        return counts, sizes

    counts, sizes = run(go)
    assert counts == [2] * ROUNDS
    assert max(sizes) > 1  # grouping happened
    assert conn.execute("SELECT count(*) FROM gov.push_suppressions").fetchone() == ((RACERS - 2) * ROUNDS,)


def test_clients_that_send_again_once_answered_are_grouped_whole(db_url: str) -> None:
    """16 clients, each sending its next message once answered (wrk's load, gov bench --http):
    on an idle database a batch waits for the clients the last one answered, so after the
    first batches every batch holds all 16, with two batches allowed in flight, not two
    alternating halves. (A window far longer than any batch: only the grouping is asserted.)"""
    clients, turns = 16, 12

    async def go() -> list[int]:
        sizes: list[int] = []
        async with AsyncGovernor(db_url, pool_size=3) as governor:
            batcher = SendBatcher(governor, window_ms=5000, concurrency=2, on_batch=lambda n, _w: sizes.append(n))

            async def client(c: int) -> None:
                for t in range(turns):
                    await batcher.send(p2(f"loop-{c}-{t}", f"m{t}"))
                    # the network between an answer and the next request: clients come back
                    # in their own time, not all in the turn that answered them
                    await asyncio.sleep(0.0002 * (c + 1))

            await asyncio.gather(*(client(c) for c in range(clients)))
            await batcher.close()
        return sizes

    sizes = run(go)
    assert sum(sizes) == clients * turns
    assert sizes[-(turns // 2):] == [clients] * (turns // 2), sizes


def test_a_lone_client_is_not_held_for_company(db_url: str) -> None:
    """One client sending one message after the other: each batch expects it alone and goes
    at once (a window of a minute would time the test out otherwise)."""
    async def go() -> list[int]:
        sizes: list[int] = []
        async with AsyncGovernor(db_url, pool_size=3) as governor:
            batcher = SendBatcher(governor, window_ms=60_000, concurrency=2, on_batch=lambda n, _w: sizes.append(n))
            for t in range(5):
                await asyncio.wait_for(batcher.send(p2("alone", f"m{t}")), 30)
            await batcher.close()
        return sizes

    assert run(go) == [1] * 5


def test_a_failing_message_in_a_batch_leaves_the_others_their_verdicts(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async def go() -> list[Any]:
        async with AsyncGovernor(db_url) as governor:
            return await governor.send_batch([
                p2("ok-1", "a"), Message(user_id="bad", id="b", tier="P9", title="no such tier"),
                p2("ok-2", "c"), Message(user_id="untitled", id="d", tier="P2"), p2("ok-1", "e"), p2("ok-1", "f"),
            ])

    ok1, bad, ok2, untitled, e, f = run(go)
    assert isinstance(bad, InvalidMessage) and "unknown tier P9" in str(bad)
    assert isinstance(untitled, InvalidMessage) and "title is required" in str(untitled)
    assert [r.as_json() for r in (ok1, ok2, e, f)] == [
        {"sent": True}, {"sent": True}, {"sent": True}, {"sent": False, "action": "drop", "reason": "cap_86400000ms"}]
    assert conn.execute("SELECT count(*) FROM gov.messages WHERE user_id IN ('bad', 'untitled')").fetchone() == (0,)


def test_a_retried_id_in_a_batch_gets_its_first_verdict(db_url: str, conn: psycopg.Connection[Any]) -> None:
    async def go() -> list[Any]:
        async with AsyncGovernor(db_url) as governor:
            first = await governor.send_batch([p2("u", "m1"), p2("u", "m2"), p2("v", "m1")])
            again = await governor.send_batch([p2("u", "m1"), p2("v", "m1"), p2("u", "m3"), p2("u", "m1")])
            return [*first, *again]

    results = run(go)
    assert [(r.sent, r.decision.repeated) for r in results] == [
        (True, False), (True, False), (True, False),  # the first batch
        (True, True), (True, True), (False, False), (True, True),  # repeats spend nothing; m3 is over the cap
    ]
    assert conn.execute("SELECT count(*) FROM gov.sends WHERE user_id = 'u' AND budget = 'P2'").fetchone() == (2,)


def test_inside_a_sqlalchemy_async_connection_rollback_and_commit_take_the_decision_with_them(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("CREATE TABLE public.orders (id text PRIMARY KEY)")
    engine = create_async_engine(sqlalchemy_url(db_url))

    async def go() -> None:
        async with engine.connect() as sa:
            governor = AsyncGovernor(sa)
            await sa.execute(text("INSERT INTO public.orders VALUES ('o1')"))
            assert (await governor.send(p2("buyer", "shipped-o1"))).sent
            await sa.rollback()
            await sa.execute(text("INSERT INTO public.orders VALUES ('o2')"))
            assert (await governor.send(p2("buyer", "shipped-o2"))).sent
            await sa.commit()
        await engine.dispose()

    run(go)
    assert conn.execute("SELECT id FROM public.orders").fetchall() == [("o2",)]
    assert conn.execute("SELECT message_id FROM gov.messages").fetchall() == [("shipped-o2",)]
    assert conn.execute("SELECT count(*) FROM gov.sends WHERE user_id = 'buyer'").fetchone() == (2,)  # P1 and P2


def test_inside_a_psycopg_async_connection_the_decision_waits_for_the_callers_commit(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(db_url) as app_conn:
            governor = AsyncGovernor(app_conn)
            assert governor.source.external_transaction
            await governor.send(p2("w", "m1"))
            assert conn.execute("SELECT count(*) FROM gov.messages").fetchone() == (0,)  # not yet committed
            await app_conn.commit()
            assert conn.execute("SELECT count(*) FROM gov.messages").fetchone() == (1,)
            await governor.send(p2("w", "m2"))
            await app_conn.rollback()
        # gov never commits a connection it was given, nor closes it

    run(go)
    assert conn.execute("SELECT message_id FROM gov.messages").fetchall() == [("m1",)]


def test_every_async_source_gives_the_same_verdicts(db_url: str) -> None:
    async def verdicts(governor: AsyncGovernor, user: str) -> list[bool]:
        return [(await governor.decide(Message(user_id=user, id=f"m{i}", tier="P2"))).allowed for i in range(3)]

    async def go() -> list[list[bool]]:
        out = []
        pool = psycopg_pool.AsyncConnectionPool(db_url, min_size=1, max_size=2, open=False,
                                                kwargs={"autocommit": True})
        await pool.open()
        async with AsyncGovernor(pool) as governor:
            out.append(await verdicts(governor, "by-pool"))
        assert not pool.closed  # a pool it was given stays open
        await pool.close()
        engine = create_async_engine(sqlalchemy_url(db_url))
        async with AsyncGovernor(engine) as governor:
            out.append(await verdicts(governor, "by-engine"))
        await engine.dispose()
        async with AsyncGovernor(db_url) as governor:
            out.append(await verdicts(governor, "by-dsn"))
        return out

    assert run(go) == [[True, True, False]] * 3
    with pytest.raises(TypeError, match="AsyncConnection"):
        AsyncGovernor(object())


def test_campaigns_decide_as_the_sync_governor_does(db_url: str, governor: Governor) -> None:
    users = [f"c{i:03d}" for i in range(60)]
    for u in users[::3]:  # some with a send already today
        governor.decide(Message(user_id=u, id="earlier", tier="P2"))
    sync = governor.decide_many(Message(user_id="-", id="camp-1", tier="P2"), users, batch=7)

    async def go() -> tuple[list[Any], list[Any]]:
        async with AsyncGovernor(db_url, pool_size=3) as aio:
            again = await aio.decide_many(Message(user_id="-", id="camp-1", tier="P2"), users, batch=7, connections=3)
            sent = await aio.send_many(p2("-", "camp-2"), users, batch=11, connections=2)
            return again, sent

    again, sent = run(go)
    assert [(u, d.allowed, d.reason) for u, d in again] == [(u, d.allowed, d.reason) for u, d in sync]
    assert all(d.repeated for _, d in again)  # the same id: the first verdicts, nothing spent twice
    assert [u for u, _ in sent] == sorted(users)
    # camp-2 is a second P2 today for most, a third (over the cap) for those with "earlier"
    assert sum(r.sent for _, r in sent) == len(users) - len(users[::3])


def test_record_event_and_subscribe(db_url: str, push: PushService, signer: VapidSigner) -> None:
    async def go() -> tuple[bool, bool, int]:
        async with AsyncGovernor(db_url, signer=signer, allow_loopback_http=True) as governor:
            sub = await governor.subscribe("fan", push.subscribe().info)
            result = await governor.send(p2("fan", "hello"))
            assert result.delivered == 1  # delivered at once, after the decision committed
            first = await governor.record_event("fan", "hello", "click", sub)
            repeat = await governor.record_event("fan", "hello", "click", sub)
            with pytest.raises(InvalidEvent):
                await governor.record_event("fan", "never-sent", "click", sub)
            return first, repeat, sub

    first, repeat, _sub = run(go)
    assert (first, repeat) == (True, False)
    assert [json.loads(p)["data"]["id"] for p in push.delivered_payloads()] == ["hello"]
