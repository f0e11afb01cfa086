"""An AsyncGovernor over a DSN opens its pool on first use; a first use that is cancelled
(a request's timeout) or fails (the database not up yet) must not leave it unusable. An
outside probe found every later call failing (an AssertionError inside psycopg_pool, or
"pool has already been opened/closed and cannot be reused") until the process restarted;
and a closed governor spent seconds retrying as if its connection were lost."""

from __future__ import annotations

import asyncio

import pytest

from gov import Message
from gov.aio import AsyncGovernor
from gov.errors import DatabaseError, GovernorClosed
from gov.testing.postgres import TemplateDatabases, admin, dbname_of
from tests.aio import run_async


def m(i: int) -> Message:
    return Message(user_id="u", id=f"m{i}", tier="P0")


def test_a_first_use_cancelled_while_the_pool_opens_leaves_the_governor_usable(db_url: str) -> None:
    async def go() -> None:
        governor = AsyncGovernor(db_url, pool_timeout=5)
        try:
            first = asyncio.create_task(governor.decide(m(1)))
            await asyncio.sleep(0)  # the task is now inside the pool's opening
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            assert (await governor.decide(m(2))).allowed
        finally:
            await governor.close()

    run_async(go())


def test_a_first_use_that_failed_is_tried_afresh_once_the_database_is_up(databases: TemplateDatabases) -> None:
    url = databases.clone()
    name = dbname_of(url)
    databases.drop(url)  # not up yet

    async def go() -> None:
        governor = AsyncGovernor(url, pool_timeout=1)
        try:
            with pytest.raises(DatabaseError) as caught:
                await governor.decide(m(1))
            assert "does not exist" in str(caught.value), caught.value  # the cause, not the pool's timeout
            await asyncio.to_thread(admin, databases.admin_url, "scratch_create_from_template", name,
                                    databases.template)
            assert (await governor.decide(m(2))).allowed
        finally:
            await governor.close()

    try:
        run_async(go())
    finally:
        databases.drop(url)


def test_a_closed_governor_says_so_at_once(db_url: str) -> None:
    async def go() -> None:
        governor = AsyncGovernor(db_url)
        assert (await governor.decide(m(1))).allowed
        await governor.close()
        with pytest.raises(GovernorClosed, match="closed"):
            await governor.decide(m(2))

    run_async(go())


def test_a_closed_sync_governor_says_so_at_once(db_url: str) -> None:
    from gov import Governor

    governor = Governor(db_url)
    assert governor.decide(m(1)).allowed
    governor.close()
    with pytest.raises(GovernorClosed, match="closed"):
        governor.decide(m(2))
