"""The simulation's deliver stage: what became of a tick's rows, and reactions in tick order."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from gov.lab.simulate.engine import Engine, Fate, Row, what_became


def _reader(table: dict[int, Fate], asked: list[list[Row]]):  # type: ignore[no-untyped-def]
    def read_back(keys: list[Row]) -> list[Fate]:
        asked.append(keys)
        return [table[i] for _, i in keys if i in table]
    return read_back


def test_reported_rows_are_not_read_back_and_a_released_row_is_pending() -> None:
    asked: list[list[Row]] = []
    reported: list[Fate] = [(1, "u1", "m", 10, "delivered"), (2, "u2", "m", 20, "released")]
    rows = what_became(reported, [("u1", 1), ("u2", 2)], _reader({}, asked))
    assert rows == [(1, "u1", "m", 10, "delivered"), (2, "u2", "m", 20, "pending")]
    assert asked == []


def test_rows_not_claimed_stale_or_unvouched_for_are_read_back() -> None:
    table: dict[int, Fate] = {2: (2, "u2", "m", 20, "pending"), 3: (3, "u3", "m", 30, "gone"),
                              1: (1, "u1", "m", 10, "delivered")}
    asked: list[list[Row]] = []
    keys: list[Row] = [("u1", 1), ("u2", 2), ("u3", 3)]
    rows = what_became([(1, "u1", "m", 10, "delivered"), (3, "u3", "m", 30, "stale")], keys, _reader(table, asked))
    assert asked == [[("u2", 2), ("u3", 3)]]
    assert rows == [table[1], table[2], table[3]]
    asked.clear()
    assert what_became(None, keys, _reader(table, asked)) == [table[1], table[2], table[3]]
    assert asked == [keys]


def test_the_order_is_user_message_subscription_by_code_point() -> None:
    """The engagement draws follow this order, so it must not depend on who delivered
    first, nor on the server's collation ('U' sorts before 'a' by code point only)."""
    reported: list[Fate] = [(2, "u2", "b", 1, "delivered"), (3, "u2", "a", 2, "delivered"),
                            (1, "u2", "a", 1, "delivered"), (4, "a1", "z", 9, "delivered"),
                            (5, "U9", "z", 9, "delivered")]
    rows = what_became(reported, [(r[1], r[0]) for r in reported], _reader({}, []))
    assert [r[0] for r in rows] == [5, 4, 1, 3, 2]


def test_a_later_tick_reacts_after_the_earlier_one_even_when_its_runners_finish_first() -> None:
    """Two ticks' deliver stages overlap, but users react in tick order: here the first
    tick's runners give the second every chance to react first (they wait for it, up to
    a second), and the second still reacts after the first."""
    first, second = datetime(2026, 6, 1, 9, 0, tzinfo=UTC), datetime(2026, 6, 1, 9, 5, tzinfo=UTC)
    reacted: list[datetime] = []
    second_reacted = threading.Event()

    def react(items: list[tuple[str, str, int]], now: datetime) -> list[Any]:
        reacted.append(now)
        if now == second:
            second_reacted.set()
        return []

    class Stub:
        def run(self, now: datetime, ids: list[int]) -> list[Fate]:
            if now == first:
                second_reacted.wait(1.0)
            return [(i, "u", f"m{i}", 1, "delivered") for i in ids]

    engine = Engine.__new__(Engine)
    engine.unsubscribed = set()
    engine._telemetry = None
    engine._react = react  # type: ignore[method-assign]
    with ThreadPoolExecutor(2) as pool:
        earlier = pool.submit(engine._deliver, None, Stub(), [("u", 1)], first, None)  # type: ignore[arg-type]
        later = pool.submit(engine._deliver, None, Stub(), [("u", 2)], second, earlier)  # type: ignore[arg-type]
        later.result()
    assert reacted == [first, second]
