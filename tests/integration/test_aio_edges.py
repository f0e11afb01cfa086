"""Edges an outside probe of the Python API found: an engine's errors reach the caller as
gov's own, the async record_event keeps the sync one's promises, a closed pool is not a
lost connection, and a batcher closed mid-batch leaves no caller waiting."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import psycopg_pool
import pytest
import sqlalchemy
from sqlalchemy.ext.asyncio import create_async_engine

from gov import DatabaseError, Governor, GovernorClosed, Message, PoolTimeout
from gov.aio import AsyncGovernor, SendBatcher
from gov.db import sqlalchemy_url
from gov.errors import ConnectionLost
from tests.aio import run_async

NOWHERE = "postgresql+psycopg://gov@127.0.0.1:1/gov?connect_timeout=1"


def p2(user: str, mid: str) -> Message:
    return Message(user_id=user, id=mid, tier="P2", title=f"t {mid}")


def _drop_connections(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                 " WHERE datname = current_database() AND pid <> pg_backend_pid()")


def test_an_engines_full_pool_is_gov_pool_timeout(db_url: str) -> None:
    engine = sqlalchemy.create_engine(sqlalchemy_url(db_url), pool_size=1, max_overflow=0, pool_timeout=0.5)
    try:
        with engine.connect(), Governor(engine) as governor, pytest.raises(PoolTimeout):
            governor.decide(p2("u", "m"))
    finally:
        engine.dispose()

    async def go() -> None:
        engine = create_async_engine(sqlalchemy_url(db_url), pool_size=1, max_overflow=0, pool_timeout=0.5)
        try:
            async with engine.connect(), AsyncGovernor(engine) as governor:
                with pytest.raises(PoolTimeout):
                    await governor.decide(p2("u", "m"))
        finally:
            await engine.dispose()

    run_async(go())


def test_an_async_engine_that_cannot_connect_raises_gov_s_error_and_is_retried() -> None:
    async def go() -> None:
        engine = create_async_engine(NOWHERE)
        try:
            async with AsyncGovernor(engine, pool_timeout=1.5) as governor:
                started = time.monotonic()
                with pytest.raises(ConnectionLost):  # gov's, not sqlalchemy.exc.OperationalError
                    await governor.decide(p2("u", "m"))
                assert time.monotonic() - started >= 0.5  # it was sent again until the pool timeout
        finally:
            await engine.dispose()

    run_async(go())


def test_the_async_record_event_checks_its_moment_and_survives_a_dropped_connection(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async def go() -> None:
        async with AsyncGovernor(db_url) as governor:
            assert (await governor.decide(p2("u", "m"))).allowed
            for at in ("yesterday", 0):
                with pytest.raises(TypeError, match="datetime"):
                    await governor.record_event("u", "m", "display", at=at)  # type: ignore[arg-type]
            _drop_connections(conn)
            assert await governor.record_event("u", "m", "display") is True
            assert await governor.record_event("u", "m", "display") is False

    run_async(go())
    assert conn.execute("SELECT count(*) FROM gov.push_events").fetchone() == (1,)


def test_a_pool_its_owner_closed_is_not_a_lost_connection(db_url: str) -> None:
    pool = psycopg_pool.ConnectionPool(db_url, min_size=1, max_size=1, open=True)
    with Governor(pool) as governor:
        pool.close()
        started = time.monotonic()
        with pytest.raises(GovernorClosed, match="pool"):
            governor.decide(p2("u", "m"))
        assert time.monotonic() - started < 1.0  # not retried as if the server had gone


def test_a_batcher_closed_mid_batch_answers_its_callers(db_url: str, conn: psycopg.Connection[Any]) -> None:
    """gov serve's shutdown: a batch under way (here, waiting on a user lock an app's
    transaction holds) ends and answers before the workers stop; one that cannot end
    within the pool timeout is told so, and the same id sent again gets its verdict."""

    async def go() -> None:
        async with AsyncGovernor(db_url, pool_timeout=1.0) as governor:
            for lock_held_s, user in ((0.3, "a"), (3.0, "b")):
                batcher = SendBatcher(governor)
                holder = await psycopg.AsyncConnection.connect(db_url)
                await holder.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (user,))
                client = asyncio.create_task(batcher.send(p2(user, "m1")))
                await asyncio.sleep(0.2)
                closing = asyncio.create_task(batcher.close())
                await asyncio.sleep(lock_held_s)
                await holder.rollback()
                await holder.close()
                await closing
                if user == "a":  # the batch ended within the pool timeout: its verdict
                    assert (await asyncio.wait_for(client, 5)).sent
                else:
                    with pytest.raises(DatabaseError, match="send the same id again"):
                        await asyncio.wait_for(client, 5)
                    assert (await governor.send(p2(user, "m1"))).decision.allowed

    run_async(go())
