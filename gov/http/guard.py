"""What one client may hold of `gov serve`: time, header bytes and connections, each bounded.

uvicorn bounds none of them on its httptools protocol: an outside probe held connections
open for good with partial headers, an unfinished body or nothing at all, had 100 MB of one
header line buffered, and ran the process out of file descriptors (then asyncio logged a
traceback per failed ``accept``, 139 MB in 15 s). Here, on top of
:class:`gov.http.wire.JoinedHttpToolsProtocol`:

* **Header timeout.** A request's headers must be complete within ``header_timeout``
  seconds of the connection (for its first request) or of the request's first byte (for
  the next ones; between requests uvicorn's keep-alive timeout closes an idle
  connection). Past it the connection is closed.
* **Body timeout.** A request's whole body must arrive within ``body_timeout`` seconds of
  its headers: past it the answer is 408 (when none has begun) and the connection is
  closed. The app sees the client as gone (no traceback, as for a client that leaves).
* **Header block.** At most :data:`MAX_HEAD_BYTES` bytes (request line and headers) and
  :data:`MAX_HEADERS` headers: past either, 431 and the connection is closed. Counted on
  the bytes as they arrive, before the parser buffers them.
* **Connections.** At most ``max_connections`` at once per process (below the open-file
  limit, :func:`connection_cap`): one more is closed as soon as it is accepted.
* **No log storms.** Accept errors (``EMFILE`` and its kin) and refused connections are
  logged at most once per :data:`LOG_INTERVAL_S`, with how many there were.

Deadlines are plain numbers checked by one sweep a fraction of a second apart (per
process), not a timer per request: a request costs two clock reads. The settings are here
(imported without uvicorn); the protocol and the server that apply them are in
:mod:`gov.http.wire` (:class:`~gov.http.wire.GuardedHttpToolsProtocol`, :class:`~gov.http.wire.GovServer`).
"""

from __future__ import annotations

import errno
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

from gov.errors import ConfigurationError

DEFAULT_HEADER_TIMEOUT_S = 10.0  # a client sends its headers in one write; ten seconds is a slow network
DEFAULT_BODY_TIMEOUT_S = 15.0  # bodies are at most 64 KiB: a few seconds even on a poor mobile link
MAX_HEAD_BYTES = 16 * 1024  # request line and headers: a send's are a few hundred bytes
MAX_HEADERS = 100  # a browser sends about 20
DEFAULT_MAX_CONNECTIONS = 4096  # per process; browsers keep a beacon's connection a few seconds
#: Open files kept out of the connection cap: the database pools, the log, the loop's own.
FD_RESERVE = 128
LOG_INTERVAL_S = 60.0
#: The accept errors asyncio reports once per waiting connection (it removes the listening
#: socket for a second, then tries again).
ACCEPT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


@dataclass(frozen=True)
class Limits:
    """What one connection may hold; see the module's docstring."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout: float = DEFAULT_BODY_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    @property
    def tick(self) -> float:
        """Seconds between two sweeps: a deadline is kept to within a quarter of the shorter timeout."""
        return min(1.0, self.header_timeout / 4, self.body_timeout / 4)


def open_file_limit() -> int:
    """This process's soft limit on open files (``ulimit -n``)."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def connection_cap(requested: int | None, reserve: int = FD_RESERVE) -> int:
    """The connection cap: ``requested``, or by default :data:`DEFAULT_MAX_CONNECTIONS`, kept
    ``reserve`` below the open-file limit. A cap that would reach the limit is refused
    (ConfigurationError): past it ``accept`` fails, and nothing would answer, /healthz included."""
    limit = open_file_limit()
    room = limit - reserve if limit != resource.RLIM_INFINITY else DEFAULT_MAX_CONNECTIONS
    if requested is None:
        if room < 16:
            raise ConfigurationError(f"the open-file limit ({limit}, ulimit -n) leaves no room for connections: "
                                     f"raise it to at least {reserve + 16}")
        return min(DEFAULT_MAX_CONNECTIONS, room)
    if requested < 1:
        raise ConfigurationError(f"--max-connections must be at least 1, got {requested}")
    if requested > room:
        raise ConfigurationError(
            f"--max-connections {requested} is above what the open-file limit allows "
            f"(ulimit -n {limit}, less {reserve} kept for the database and logs: at most {max(room, 0)})"
        )
    return requested


class EveryInterval:
    """One log line per ``interval`` seconds at most for a recurring event, with the count since the last."""

    def __init__(self, interval: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self.count = 0
        self._last: float | None = None

    def __call__(self, emit: Callable[[int], None]) -> None:
        """Count one event; call ``emit(count)`` when a line is due (the first at once)."""
        self.count += 1
        now = self.clock()
        if self._last is None or now - self._last >= self.interval:
            self._last = now
            count, self.count = self.count, 0
            emit(count)
