"""A small in-memory rate limit for gov serve's public doors that no token can guard.

``POST /events/errors`` is where the worker reports a push it could not read, and a push
it could not read rarely carries a beacon token: the route cannot require one. It is
bounded instead (invariant 15: public doors are bounded): a token bucket per client
address (``per_client`` reports a minute, as a burst too) and one shared by everyone
(``overall`` a minute), so many addresses together cannot go past the overall figure
either. The table of addresses holds at most ``max_clients`` buckets, the least recently
seen dropped first: memory is bounded whatever the number of addresses (an address whose
bucket was dropped starts again with a full one, and the overall bucket still holds).

Per process: with ``gov serve --workers N`` each process has its own buckets.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

DEFAULT_PER_CLIENT = 10  # reports a minute from one address: a worker sends one per unreadable push
DEFAULT_OVERALL = 600  # reports a minute from everyone together, per process
DEFAULT_MAX_CLIENTS = 4096  # addresses remembered at once: a few hundred kilobytes at most


class _Bucket:
    __slots__ = ("at", "tokens")

    def __init__(self, tokens: float, at: float) -> None:
        self.tokens = tokens
        self.at = at


class RateLimit:
    """Token buckets per key and overall; :meth:`allow` takes one token from both or refuses."""

    def __init__(self, per_client: int = DEFAULT_PER_CLIENT, overall: int = DEFAULT_OVERALL, *,
                 max_clients: int = DEFAULT_MAX_CLIENTS, clock: Callable[[], float] = time.monotonic) -> None:
        if per_client < 1 or overall < 1 or max_clients < 1:
            raise ValueError("a rate limit needs at least 1 a minute and room for 1 client")
        self.per_client = per_client
        self.overall = overall
        self.max_clients = max_clients
        self.clock = clock
        self._clients: OrderedDict[str, _Bucket] = OrderedDict()
        self._overall = _Bucket(float(overall), clock())

    @staticmethod
    def _refill(bucket: _Bucket, capacity: int, now: float) -> None:
        bucket.tokens = min(float(capacity), bucket.tokens + (now - bucket.at) * capacity / 60.0)
        bucket.at = now

    def allow(self, client: str) -> float | None:
        """None when ``client`` may go on (a token taken), else the seconds until it may.

        Called from the event loop only (the route is async), so no lock is needed.
        """
        now = self.clock()
        bucket = self._clients.pop(client, None)
        if bucket is None:
            bucket = _Bucket(float(self.per_client), now)
            while len(self._clients) >= self.max_clients:
                self._clients.popitem(last=False)  # the least recently seen
        self._clients[client] = bucket  # now the most recently seen
        self._refill(bucket, self.per_client, now)
        self._refill(self._overall, self.overall, now)
        if bucket.tokens < 1:
            return (1 - bucket.tokens) * 60.0 / self.per_client
        if self._overall.tokens < 1:
            return (1 - self._overall.tokens) * 60.0 / self.overall
        bucket.tokens -= 1
        self._overall.tokens -= 1
        return None

    def __len__(self) -> int:
        """How many clients' buckets are held now (at most ``max_clients``)."""
        return len(self._clients)
