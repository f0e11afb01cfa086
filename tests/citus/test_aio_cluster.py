"""gov.aio on the cluster: the AsyncGovernor's verdicts, its races and the grouped sends of
`gov serve` (gov.send_batch_v1, split per shard and delegated to each shard's worker)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from gov import Governor, Message
from gov.aio import AsyncGovernor, SendBatcher
from tests.aio import run_async
from tests.citus.test_cluster import _users_on, _workers

RACERS = 20
ROUNDS = 5  # per worker


def p2(user: str, mid: str) -> Message:
    return Message(user_id=user, id=mid, tier="P2", title="hi")


def test_the_seeds_verification_through_the_async_governor(db_url: str) -> None:
    async def go() -> list[dict[str, Any]]:
        async with AsyncGovernor(db_url) as governor:
            out = [(await governor.send(p2("u42", f"m{i}"))).as_json() for i in (1, 2, 3)]
            out.append((await governor.send(Message(user_id="u42", id="otp", tier="P0", title="code"))).as_json())
            return out

    assert run_async(go()) == [{"sent": True}, {"sent": True},
                                 {"sent": False, "action": "drop", "reason": "cap_86400000ms"}, {"sent": True}]


def test_concurrent_tasks_and_grouped_sends_are_exact_on_each_worker(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async def go(users: list[str], grouped: list[str]) -> list[int]:
        counts = []
        async with AsyncGovernor(db_url, pool_size=RACERS) as governor:
            for user in users:  # every task its own delegated call
                results = await asyncio.gather(*(governor.send(p2(user, f"m{i}")) for i in range(RACERS)))
                counts.append(sum(r.sent for r in results))
            batcher = SendBatcher(governor, window_ms=2, concurrency=2)
            for user in grouped:  # grouped: one user's sends in one batch, on its worker
                results = await asyncio.gather(*(batcher.send(p2(user, f"g{i}")) for i in range(RACERS)))
                counts.append(sum(r.sent for r in results))
            await batcher.close()
        return counts

    for port in _workers(conn):
        users = _users_on(conn, port, f"arace-{port}-", 2 * ROUNDS)
        assert run_async(go(users[:ROUNDS], users[ROUNDS:])) == [2] * (2 * ROUNDS), port


def test_a_batch_across_shards_gives_what_one_by_one_sends_give(db_url: str, conn: psycopg.Connection[Any]) -> None:
    users = [f"{i:02d}" for i in range(40)]
    picks = [(u, k) for k in range(3) for u in users[: 10 * k + 10]]  # users of both workers, some thrice
    with Governor(db_url) as governor:
        alone = [governor.send(p2("a" + u, f"m{k}"), deliver=False).as_json() for u, k in picks]

    async def go() -> list[Any]:
        async with AsyncGovernor(db_url) as governor:
            return await governor.send_batch([p2("b" + u, f"m{k}") for u, k in picks])

    together = run_async(go())
    assert [r.as_json() for r in together] == alone
    assert {r["sent"] for r in alone} == {True, False}
    # the batch ran on the workers, one delegated call per shard it touched
    rows = conn.execute("SELECT count(*) FROM gov.messages WHERE user_id LIKE 'b%%'").fetchone()
    assert rows == (len(picks),)
