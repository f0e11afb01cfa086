"""A caller's connection or pool that makes dicts (psycopg's dict_row, common in apps) gets
the same verdicts for the same users: gov reads its own rows as tuples. An outside probe
found a campaign decided for the users "u", "s", "e", "r", "_", "i", "d" (a dict's keys
unpacked as the audience) and subscribe failing with KeyError: 0."""

from __future__ import annotations

from typing import Any

import psycopg
import psycopg_pool
from psycopg.rows import dict_row

from gov import Governor, Message
from gov.aio import AsyncGovernor
from gov.analytics.events import record_event
from gov.testing import PushService
from tests.aio import run_async

TEMPLATE = Message(user_id="-", id="camp", tier="P2", title="Sale", campaign_id="c")


def decided(conn: psycopg.Connection[Any], message_id: str) -> list[str]:
    return [r[0] for r in conn.execute("SELECT user_id FROM gov.messages WHERE message_id = %s ORDER BY 1",
                                       (message_id,)).fetchall()]


def test_a_dict_row_connection_and_pool_decide_for_the_audience_given(
    db_url: str, conn: psycopg.Connection[Any], push: PushService
) -> None:
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as app_conn:
        governor = Governor(app_conn, allow_loopback_http=True)
        assert governor.subscribe("alice", push.subscribe().info) > 0
        sent = dict(governor.send_many(TEMPLATE, ["alice", "bob"]))
        assert sorted(sent) == ["alice", "bob"] and all(r.sent for r in sent.values())
        assert sent["alice"].outbox_ids and not sent["bob"].outbox_ids
        assert record_event(governor, "alice", "camp", "display") is True
    with psycopg_pool.ConnectionPool(db_url, kwargs={"autocommit": True, "row_factory": dict_row},
                                     min_size=1, open=True) as pool:
        pooled = Message(user_id="-", id="pooled", tier="P2", title="Sale")
        assert sorted(u for u, _ in Governor(pool).decide_many(pooled, ["carol", "dave"])) == ["carol", "dave"]
    assert decided(conn, "camp") == ["alice", "bob"]
    assert decided(conn, "pooled") == ["carol", "dave"]


def test_a_dict_row_async_connection_decides_for_the_audience_given(
    db_url: str, conn: psycopg.Connection[Any], push: PushService
) -> None:
    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True, row_factory=dict_row) as app_conn:
            governor = AsyncGovernor(app_conn, allow_loopback_http=True)
            sub = await governor.subscribe("erin", push.subscribe().info)
            assert sub > 0
            users = sorted(u for u, _ in await governor.decide_many(TEMPLATE, ["erin", "frank"]))
            assert users == ["erin", "frank"]
            batch = await governor.send_batch([Message(user_id="gina", id="b1", tier="P2", title="t"),
                                               Message(user_id="hal", id="b1", tier="P2", title="t")])
            assert [r.sent for r in batch] == [True, True]
            assert await governor.record_event("erin", "camp", "display") is True

    run_async(go())
    assert decided(conn, "camp") == ["erin", "frank"]
    assert decided(conn, "b1") == ["gina", "hal"]
