"""Run a coroutine from a synchronous test, on a thread of its own.

Not ``asyncio.run`` on the test's thread: a session-wide Playwright (tests/browser) keeps an
event loop running on the main thread for the rest of the run, and ``asyncio.run`` refuses
to start inside a running loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    with ThreadPoolExecutor(1, thread_name_prefix="test-asyncio") as pool:
        return pool.submit(asyncio.run, coro).result()
