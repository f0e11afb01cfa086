"""uvicorn's httptools protocol with one write per answer.

uvicorn writes an answer in two parts, its head when the app sends ``http.response.start``
and its body with ``http.response.body``: two ``send()`` calls, and with ``TCP_NODELAY``
(which gov serve's socket sets on purpose, docs/performance.md) two TCP segments, each
going through the kernel's network stack on both sides and waking the client twice. Under
``gov bench --http`` those writes were the largest single item of gov serve's own CPU
(py-spy: 14 % of its samples in ``transport.write``). Here the writes made during one turn
of the event loop are joined and sent once, at the end of that turn: the head and body of
an answer go out together, and nothing waits longer than the callbacks already queued.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class JoinedWrites:
    """A transport whose writes within one turn of the loop leave as one ``write``.

    Everything else is the wrapped transport's; ``close`` sends what is pending first (as
    a transport's own close sends its buffer), ``abort`` drops it (as its own abort does).
    """

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] | None = None

    def write(self, data: bytes) -> None:
        if not data:
            return
        if self._pending is None:
            self._pending = [data]
            self._loop.call_soon(self.flush)
        else:
            self._pending.append(data)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        """Send what the turn wrote (a no-op when it is already sent)."""
        pending, self._pending = self._pending, None
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending or ()))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._pending = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, pause_reading…
        return getattr(self._transport, name)


class JoinedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through :class:`JoinedWrites`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # every request cycle of this connection is given self.transport (flow control keeps
        # the real one: it pauses and resumes reading, which needs no joining)
        self.transport = JoinedWrites(transport, self.loop)  # type: ignore[assignment]
