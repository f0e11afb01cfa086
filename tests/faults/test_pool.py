"""A connection pool exhausted by slow callers: a send fails fast, clearly, and records nothing.

``Governor(pool_size=N, pool_timeout=T)``: when every connection is held (slow callers,
a stuck transaction), a decision waits at most T for one and then raises
``gov.PoolTimeout`` — it does not hang, and nothing of it is written. When a connection
frees, the same message goes through, once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import gov
from gov import DatabaseError, Governor, Message, PoolTimeout
from tests.faults import assert_integrity, db_now

POOL_SIZE = 2
POOL_TIMEOUT = 0.5  # seconds


class SlowCallers:
    """Threads that each hold one of the governor's pooled connections until released."""

    def __init__(self, governor: Governor, n: int) -> None:
        self.release = threading.Event()
        self.holding = threading.Semaphore(0)
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._hold, args=(governor,), daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()
        for _ in range(n):
            assert self.holding.acquire(timeout=10), "a slow caller did not get its connection"

    def _hold(self, governor: Governor) -> None:
        try:
            with governor.source.connection() as conn:
                conn.execute("SELECT 1")  # a real, open connection, busy with its caller
                self.holding.release()
                self.release.wait(timeout=60)
        except BaseException as exc:  # reported by close()
            self.errors.append(exc)

    def close(self) -> None:
        self.release.set()
        for t in self.threads:
            t.join(timeout=10)
        assert not self.errors, self.errors


@pytest.fixture
def governor(db_url: str) -> Iterator[Governor]:
    with Governor(db_url, pool_size=POOL_SIZE, pool_timeout=POOL_TIMEOUT) as g:
        yield g


def _rows_for(conn: psycopg.Connection[Any], user: str) -> dict[str, int]:
    counts = {}
    for table in ("messages", "sends", "push_suppressions", "message_content", "outbox", "deferred"):
        row = conn.execute(f"SELECT count(*) FROM gov.{table} WHERE user_id = %s", (user,)).fetchone()
        counts[table] = row[0] if row else -1
    return counts


@pytest.mark.parametrize("run", range(3))
def test_exhausted_pool_fails_fast_and_records_nothing(
    db_url: str, governor: Governor, conn: psycopg.Connection[Any], run: int
) -> None:
    since = db_now(db_url)
    message = Message(user_id="u", id=f"m{run}", tier="P2", title="hello")
    slow = SlowCallers(governor, POOL_SIZE)
    try:
        for call in (lambda: governor.send(message, deliver=False), lambda: governor.decide(message)):
            began = time.monotonic()
            with pytest.raises(PoolTimeout) as raised:
                call()
            took = time.monotonic() - began
            assert took >= POOL_TIMEOUT * 0.9, f"refused after {took:.2f} s, before its pool_timeout"
            print(f"refused after {took:.2f} s (pool_timeout {POOL_TIMEOUT:g} s)")
            # clear, one line, and catchable as the package's database error
            assert str(raised.value).startswith("no database connection free within the pool timeout"), raised.value
            assert "\n" not in str(raised.value)
            assert isinstance(raised.value, DatabaseError) and isinstance(raised.value, gov.GovError)
        assert _rows_for(conn, "u") == dict.fromkeys(_rows_for(conn, "u"), 0), "a refused call wrote something"
    finally:
        slow.close()

    # a connection is free again: the same message goes through, and spends once
    result = governor.send(message, deliver=False)
    assert result.sent and not result.decision.repeated
    again = governor.send(message, deliver=False)
    assert again.decision.repeated
    counts = _rows_for(conn, "u")
    # one P2 spends P2 and P1 (no global cap in the default policy: no global row)
    assert counts["messages"] == 1 and counts["sends"] == 2 and counts["message_content"] == 1, counts
    assert_integrity(db_url, since)
