"""uvicorn's httptools protocol as gov serve runs it: one write per answer, and bounded.

uvicorn writes an answer in two parts, its head when the app sends ``http.response.start``
and its body with ``http.response.body``: two ``send()`` calls, and with ``TCP_NODELAY``
(which gov serve's socket sets on purpose, docs/performance.md) two TCP segments, each
going through the kernel's network stack on both sides and waking the client twice. Under
``gov bench --http`` those writes were the largest single item of gov serve's own CPU
(py-spy: 14 % of its samples in ``transport.write``). Here the writes made during one turn
of the event loop are joined and sent once, at the end of that turn: the head and body of
an answer go out together, and nothing waits longer than the callbacks already queued.

:class:`GuardedHttpToolsProtocol` and :class:`GovServer` add the bounds of
:mod:`gov.http.guard`: header and body timeouts, the header block's size and count, the
connections at once, and accept errors logged once a minute, not once a connection.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gov.http.door import FastSend
from gov.http.guard import ACCEPT_ERRNOS, LOG_INTERVAL_S, MAX_HEAD_BYTES, MAX_HEADERS, EveryInterval, Limits

log = logging.getLogger("gov.http.wire")


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


_HEAD_TOO_LARGE = (f'{{"error":"the request line and headers are over {MAX_HEAD_BYTES} bytes '
                   f'or {MAX_HEADERS} headers"}}').encode()
_BODY_TOO_SLOW = b'{"error":"the request body did not arrive in time"}'


#: Chunk framing a body may carry per byte of its own: a chunk of one byte takes six
#: ("1\r\nx\r\n"); beyond that (and a head's worth of trailers) a client sends the parser
#: bytes it only buffers.
FRAMING_PER_BYTE = 8


def _refusal(status: bytes, body: bytes) -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)


class _HeadTooLarge(Exception):
    """Raised from a parser callback: stops the parser at once (httptools re-raises it wrapped)."""


class _FastEvent:
    """uvicorn sets a cycle's message event when the client leaves; a fast send reads no more."""

    __slots__ = ()

    def set(self) -> None:
        pass


class _FastCycle:
    """A send the door answers below ASGI, in the connection's ``cycle`` slot, with what
    uvicorn reads there: whether the answer has begun or ended (a request that arrives
    meanwhile is queued as pipelined, and a graceful shutdown waits for it), whether the
    client left, whether to keep the connection."""

    __slots__ = ("disconnected", "keep_alive", "response_complete", "response_started")
    message_event = _FastEvent()

    def __init__(self, keep_alive: bool) -> None:
        self.keep_alive = keep_alive
        self.disconnected = self.response_started = self.response_complete = False


class GuardedHttpToolsProtocol(JoinedHttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds of the module's docstring.

    ``_deadline`` is when the current phase (waiting for headers, reading a body) must
    end, or None while the app works on a complete request; ``_head_room`` is how many
    more bytes the head being read may take (None while a body is read).
    """

    limits = Limits()
    #: The fast door (gov.http.door.FastSend) this protocol answers sends through, below
    #: ASGI (see _FastCycle); None: every request goes to the app.
    door: FastSend | None = None
    #: The sweep's clock (loop.time() at its last tick): a request reads it, and never the clock
    #: itself. It may be a tick old, so every deadline from it gets one tick more: never early
    #: (an outside probe saw a 408 at 14.1 s of a 15 s body timeout), at most two ticks late.
    now = 0.0
    refused = EveryInterval()  # connections over the cap
    refused_requests = EveryInterval()  # requests uvicorn cannot parse or upgrade

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: float | None = None
        self._head_room: int | None = MAX_HEAD_BYTES
        self._headers_left = MAX_HEADERS
        self._head_bytes_left = MAX_HEAD_BYTES
        # a body's bytes as read and as the parser hands them over: the rest is chunk framing
        # and trailers, which the parser buffers whole (an endless trailer line held 110 MB)
        self._body_read = self._body_given = 0
        self._fast_body: list[bytes] | None = None  # a fast send's body, while it is read

    def _from_now(self, seconds: float) -> float:
        return self.now + seconds + self.limits.tick

    @classmethod
    def with_limits(cls, limits: Limits, door: FastSend | None = None) -> type[GuardedHttpToolsProtocol]:
        """This protocol with ``limits``, answering sends through ``door`` (uvicorn takes a
        class, and makes one instance per connection)."""
        return type(cls.__name__, (cls,), {"limits": limits, "door": door, "refused": EveryInterval(),
                                           "refused_requests": EveryInterval()})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            # closed at once, before it holds anything but the descriptor accept gave it
            transport.abort()
            self.refused(lambda n: log.warning(
                "gov serve: %d connection(s) refused: %d open, the cap (--max-connections)", n,
                self.limits.max_connections, extra={"action": "serve_connections_refused"}))
            return
        self._deadline = self.loop.time() + self.limits.header_timeout

    # -------------------------------------------------- the bytes, counted before the parser buffers them

    def data_received(self, data: bytes) -> None:
        if self.timeout_keep_alive_task is not None:
            self._unset_keepalive_if_required()
        if self._deadline is None:
            # the first bytes after a complete request: the next one's head, timed from here (the
            # first request's from the connection; one that begins in the same read as the body
            # before it ends is timed from the next read, or closed idle by uvicorn's keep-alive)
            self._deadline = self._from_now(self.limits.header_timeout)
        room = self._head_room
        if room is None or len(data) <= room:  # a body, or a head with room for all of it: as uvicorn does
            if room is not None:
                self._head_room = room - len(data)
            else:
                self._body_read += len(data)
            try:
                self.parser.feed_data(data)
            except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
                self._parser_stopped(exc)
                return
            if (self._head_room is None  # still the same body: framing and trailers within a head's bound
                    and self._body_read - self._body_given > MAX_HEAD_BYTES + FRAMING_PER_BYTE * self._body_given):
                if self.cycle is not None and self.cycle.response_started:
                    self.transport.close()  # answered already (a 401 before the body): nothing more to say
                else:
                    self._refuse_head()
            return
        # more than the head may still take: feed what it may, and see whether the head ended there
        self._head_room = 0
        try:
            self.parser.feed_data(data[:room])
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._parser_stopped(exc)
            return
        if self._head_room == 0:  # still the same head, and it is full
            self._refuse_head()
        elif not self.transport.is_closing():
            self.data_received(data[room:])

    def _parser_stopped(self, exc: Exception) -> None:
        """What uvicorn does when the parser stops, but for a head over the limit (431) and one log line a minute."""
        if isinstance(exc, httptools.HttpParserUpgrade):
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        elif isinstance(exc.__context__, _HeadTooLarge):
            self._refuse_head()
        else:
            msg = "Invalid HTTP request received."
            # anyone can send one: a line a minute at most, not one a request
            self.refused_requests(lambda n: self.logger.warning("%s (%d since the last line)", msg, n))
            self.send_400_response(msg)

    def _unsupported_upgrade_warning(self) -> None:
        self.refused_requests(lambda n: self.logger.warning(
            "Unsupported upgrade request (%d since the last line).", n))

    def _refuse_head(self) -> None:
        self._deadline = None
        self.transport.write(_refusal(b"431 Request Header Fields Too Large", _HEAD_TOO_LARGE))
        self.transport.close()

    # -------------------------------------------------- the parser's callbacks: phases and counts

    # (The bytes were counted as they came; counted again here as the parser hands them over,
    # for the head that begins in the same read as the body before it ends.)

    def on_url(self, url: bytes) -> None:
        self._head_bytes_left -= len(url)
        if self._head_bytes_left < 0:
            raise _HeadTooLarge
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers_left -= 1
        self._head_bytes_left -= len(name) + len(value)
        if self._headers_left < 0 or self._head_bytes_left < 0:
            raise _HeadTooLarge
        # uvicorn's own, inline (a call less per header)
        value = value.rstrip(b" \t")
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._head_room = None
        self._body_read = self._body_given = 0
        self._deadline = self._from_now(self.limits.body_timeout)
        door = self.door
        if (door is not None and self.url == door.path and self.parser.get_method() == b"POST"
                and (self.cycle is None or self.cycle.response_complete) and not self.pipeline
                and not self.expect_100_continue and not self.parser.should_upgrade()
                and door.accepts(self.headers)):
            # a send the door answers: no ASGI cycle, no task (the door's own test of the head)
            version = self.parser.get_http_version()
            self.cycle = _FastCycle(keep_alive=version != "1.0" and self.parser.should_keep_alive())  # type: ignore[assignment]
            self._fast_body = []
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body_given += len(body)
        if self._fast_body is not None:
            self._fast_body.append(body)  # (within the Content-Length the door accepted)
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        # While the app works on the request, no deadline. But one answered before its body
        # had all come (a 401 before the body, /healthz with a Content-Length) has no
        # keep-alive timer either (uvicorn starts it at the answer, and the body's bytes
        # stopped it): the next head is timed from here, or an idle client held the
        # connection for good (an outside probe filled --max-connections that way).
        answered = self.cycle is not None and self.cycle.response_complete
        self._deadline = self._from_now(self.limits.header_timeout) if answered else None
        self._head_room = self._head_bytes_left = MAX_HEAD_BYTES
        self._headers_left = MAX_HEADERS
        if self._fast_body is not None:
            body, self._fast_body = b"".join(self._fast_body), None
            self._fast_send(body)
            return
        super().on_message_complete()

    # -------------------------------------------------- a send answered below ASGI

    def _fast_send(self, body: bytes) -> None:
        cycle = self.cycle
        assert self.door is not None and isinstance(cycle, _FastCycle)
        outcome = self.door.start(body)
        if outcome is None:
            # the route refuses it, in its own words: the ASGI cycle the head skipped, with the body
            self.cycle = None  # type: ignore[assignment]
            HttpToolsProtocol.on_headers_complete(self)
            HttpToolsProtocol.on_body(self, body)
            HttpToolsProtocol.on_message_complete(self)
            return
        outcome.add_done_callback(lambda done: self._fast_answer(cycle, done))

    def _fast_answer(self, cycle: _FastCycle, outcome: asyncio.Future[Any]) -> None:
        """Write the verdict as uvicorn would (its default headers, keep-alive or close),
        then what uvicorn does after an answer (the next pipelined request, or the
        keep-alive timer)."""
        assert self.door is not None
        try:
            status, payload = self.door.verdict(outcome)
            content_type = b"application/json"
        except Exception:  # what the ASGI app would have raised: uvicorn's 500
            log.exception("Exception in ASGI application")
            status, payload, content_type = 500, b"Internal Server Error", b"text/plain; charset=utf-8"
            cycle.keep_alive = False
        cycle.response_started = cycle.response_complete = True
        if cycle.disconnected or self.transport.is_closing():
            return  # the client left: its verdict is committed, a retry of its id returns it
        head = [STATUS_LINE[status]]
        head.extend(b"%s: %s\r\n" % pair for pair in self.server_state.default_headers)
        head.append(b"content-type: %s\r\ncontent-length: %d\r\n" % (content_type, len(payload)))
        if not cycle.keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        head.append(payload)
        self.transport.write(b"".join(head))
        if not cycle.keep_alive:
            self.transport.close()
        self.on_response_complete()

    # -------------------------------------------------- the sweep's verdict

    def expire(self) -> None:
        """The current phase ran past its deadline: 408 for a body (when no answer has begun), then close."""
        self._deadline = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if self._head_room is None and cycle is not None and not cycle.response_started and not self.pipeline:
            # the app, if it waits for the body, sees the client gone: no answer of its own, no traceback
            cycle.disconnected = True
            cycle.message_event.set()
            self.transport.write(_refusal(b"408 Request Timeout", _BODY_TOO_SLOW))
        self.transport.close()


def sweep(connections: set[Any], now: float) -> int:
    """Expire every connection past its deadline; how many were."""
    late = [c for c in connections if getattr(c, "_deadline", None) is not None and c._deadline <= now]
    for connection in late:
        connection.expire()
    return len(late)


class AcceptErrors:
    """The loop's exception handler: accept errors (out of descriptors) logged once per interval,
    without a traceback; everything else as asyncio logs it.

    asyncio reports a failed ``accept`` once per connection waiting (up to the backlog each
    time the socket is ready) and schedules as many retries of the listening socket a second
    later; once the socket is closed (at shutdown) each retry fails again, on a closed
    descriptor. All of it is one condition: counted, and a line a minute at most.
    """

    def __init__(self, interval: float = LOG_INTERVAL_S) -> None:
        self.every = EveryInterval(interval)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        retry = getattr(getattr(context.get("handle"), "_callback", None), "__name__", "") == "_start_serving"
        if (isinstance(exc, OSError) and exc.errno in ACCEPT_ERRNOS) or (retry and exc is not None):
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self.every(lambda n: log.error(
                "gov serve: cannot accept connections: %s (%d time(s) since the last line; "
                "at most one line a minute)", reason, n, extra={"action": "serve_accept_error"}))
            return
        loop.default_exception_handler(context)


class GovServer(uvicorn.Server):
    """uvicorn's server with the sweep of deadlines and the quiet accept errors."""

    def __init__(self, config: uvicorn.Config, limits: Limits) -> None:
        super().__init__(config)
        self.limits = limits

    async def serve(self, sockets: Any = None) -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(AcceptErrors())
        sweeper = loop.create_task(self._sweep())
        try:
            await super().serve(sockets)
        finally:
            sweeper.cancel()

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            GuardedHttpToolsProtocol.now = now = loop.time()
            sweep(self.server_state.connections, now)
            await asyncio.sleep(self.limits.tick)
