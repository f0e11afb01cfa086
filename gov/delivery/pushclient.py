"""A small keep-alive HTTP/1.1 client for push services: one connection pool per origin.

Why not ``requests``: a push request is one POST of a small body to a handful of origins,
and ``requests`` spends most of a delivery's CPU building sessions, prepared requests,
adapters and header dictionaries (PERFORMANCE.md: about 75-80 % of a ``webpush()`` call).
This client writes the request bytes itself, keeps idle connections per origin
(``scheme, host, port``), and reads the answer with a bounded parser. It does only what
:func:`gov.delivery.push.deliver` needs: no redirects (never followed), no proxies, no cookies.

Two guarantees it keeps, the same as the ``requests`` path it replaces:

* **The total deadline** of an attempt (invariant 12): every blocking step (connect, TLS
  handshake, send, each read) is given only the time left until the attempt's deadline,
  so a push service that trickles its answer byte by byte is cut off at the deadline, not
  at a per-read timeout. Name resolution is the one step it cannot cut short.
* **Only push services are reachable** (invariant 13): a new connection asks the
  :class:`~gov.delivery.netguard.EndpointGuard` for the addresses of the host (every one checked)
  and connects to one of *those*, so DNS rebinding cannot switch it; TLS (SNI and the
  certificate check) is against the host name. A reused connection was checked when it
  was made. Proxy settings are never read.

Thread-safe: any number of threads may share one client; a connection is used by one
attempt at a time.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from gov.delivery.netguard import EndpointGuard

_MAX_HEAD_BYTES = 64 * 1024  # status line and headers; a hostile server gets no more
_RECV = 65536
_MAX_IDLE_PER_ORIGIN = 256
# Idle connections over all origins: subscriptions on many hosts that keep connections open
# could otherwise hold one file descriptor per origin until the runner could open no more
# (an outside probe: 400 origins under `ulimit -n 256` left 150 of them undeliverable).
# The least recently used origin's idle connection goes first.
_MAX_IDLE_TOTAL = 128


class PushTimeout(Exception):
    """The attempt's deadline passed."""


class PushConnectionError(Exception):
    """The connection failed; ``reason`` is short and stable (``"connection reset"``, …)."""

    def __init__(self, reason: str, *, unsent: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        #: the request could not be sent, or the server closed the connection without a word
        #: (no answer, no reset): what a kept-alive connection closed under us looks like
        self.unsent = unsent


class BadRequestTarget(ValueError):
    """The URL cannot be written into a request (no host, a control character, …)."""


@dataclass
class Response:
    """An answer: ``status``, headers by lower-case name, at most ``body_limit`` bytes of body.

    ``body_error`` says why the body could not be read whole (``"timeout"``, …); the
    status line arrived, so it still decides the outcome.
    """

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    body_error: str | None = None


@dataclass(frozen=True)
class _Target:
    key: tuple[str, str, int]  # scheme, host (as in the URL, lower case), port
    host_header: bytes
    path: bytes


class _Connection:
    __slots__ = ("answered", "buffer", "key", "sock")

    def __init__(self, sock: socket.socket, key: tuple[str, str, int]) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.key = key
        self.answered = False  # some byte of an answer to the current request arrived

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class PushClient:
    """Keep-alive HTTP/1.1 POSTs, idle connections pooled per push-service origin.

    ``guard`` decides what may be reached (see the module doc). ``ssl_context`` defaults
    to certificate and host name verification against certifi's bundle (what ``requests``
    used), or the system's when certifi is absent.
    """

    def __init__(
        self, guard: EndpointGuard, *, ssl_context: ssl.SSLContext | None = None,
        max_idle_per_origin: int = _MAX_IDLE_PER_ORIGIN, max_idle_total: int = _MAX_IDLE_TOTAL,
    ) -> None:
        self.guard = guard
        self._ssl_context = ssl_context
        self._max_idle = max_idle_per_origin
        self._max_idle_total = max_idle_total
        self._idle_count = 0
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._targets: dict[str, _Target] = {}
        self._lock = threading.Lock()
        self._closed = False
        #: connections opened so far (for tests and figures)
        self.connections_opened = 0

    # ------------------------------------------------------------ the pool

    def close(self) -> None:
        """Close every idle connection; connections in use close when their attempt ends."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
            self._idle_count = 0
        for conns in idle.values():
            for conn in conns:
                conn.close()

    def __enter__(self) -> PushClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _take(self, key: tuple[str, str, int]) -> _Connection | None:
        while True:
            with self._lock:
                conns = self._idle.get(key)
                if not conns:
                    return None
                conn = conns.pop()
                self._idle_count -= 1
            if not _dropped(conn.sock):
                return conn
            conn.close()  # closed by the server while idle (or it sent something unasked)

    def _give_back(self, conn: _Connection) -> None:
        kept = False
        evicted: list[_Connection] = []
        with self._lock:
            if not self._closed and not conn.buffer:
                conns = self._idle.pop(conn.key, [])
                self._idle[conn.key] = conns  # the most recently used origin last
                if len(conns) < self._max_idle:
                    conns.append(conn)
                    self._idle_count += 1
                    kept = True
                while self._idle_count > self._max_idle_total:
                    oldest = next(k for k, v in self._idle.items() if v)
                    evicted.append(self._idle[oldest].pop(0))
                    self._idle_count -= 1
        for old in evicted:
            old.close()
        if not kept:
            conn.close()

    def _target(self, url: str) -> _Target:
        target = self._targets.get(url)
        if target is not None:
            return target
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise BadRequestTarget("not a valid URL") from None
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise BadRequestTarget("needs http(s) and a host")
        if port is None:
            port = 443 if scheme == "https" else 80
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        netloc = parts.netloc.rpartition("@")[2]
        if any(ord(ch) <= 0x20 or ord(ch) == 0x7F for ch in path + netloc) or not path.startswith("/"):
            raise BadRequestTarget("a control character, space or relative path in the URL")
        try:
            target = _Target((scheme, parts.hostname.lower(), port), netloc.encode("ascii"), path.encode("ascii"))
        except UnicodeEncodeError:
            raise BadRequestTarget("a non-ASCII character in the URL") from None
        if len(self._targets) > 100_000:  # endpoints are many but bounded; never grow without limit
            self._targets.clear()
        self._targets[url] = target
        return target

    # ------------------------------------------------------------ one request

    def post(self, url: str, headers: Iterable[tuple[str, str]], body: bytes, deadline: float,
             body_limit: int = 4096) -> Response:
        """POST ``body`` to ``url`` and read the answer, all before ``deadline`` (monotonic).

        Raises :class:`PushTimeout`, :class:`PushConnectionError`,
        :class:`~gov.delivery.netguard.EndpointRefused` (nothing was sent), ``socket.gaierror``
        (the name did not resolve) or :class:`BadRequestTarget`.
        """
        target = self._target(url)
        lines = [b"POST ", target.path, b" HTTP/1.1\r\nHost: ", target.host_header,
                 b"\r\nContent-Length: ", str(len(body)).encode(), b"\r\n"]
        for name, value in headers:
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise BadRequestTarget("a line break inside a header")
            lines.append(f"{name}: {value}\r\n".encode("latin-1"))
        lines.append(b"\r\n")
        head = b"".join(lines)
        conn = self._take(target.key)
        if conn is not None:
            try:
                return self._exchange(conn, head + body, deadline, body_limit)
            except PushConnectionError as exc:
                if conn.answered or not exc.unsent:
                    raise
                # A kept-alive connection the server closed as we reused it (the race every
                # keep-alive client has): the request could not be written, or the connection
                # ended cleanly with no answer. Once more, on a new connection; at worst a
                # duplicate, which delivery is built to bear (at least once). A reset or a
                # partial answer is not retried here: the row's retry policy decides.
        return self._exchange(self._connect(target.key, deadline), head + body, deadline, body_limit)

    def _exchange(self, conn: _Connection, request: bytes, deadline: float, body_limit: int) -> Response:
        reusable = False
        conn.answered = False
        try:
            _send(conn.sock, request, deadline)
            response, reusable = _read_response(conn, deadline, body_limit)
            return response
        finally:
            if reusable:
                self._give_back(conn)
            else:
                conn.close()

    def _connect(self, key: tuple[str, str, int], deadline: float) -> _Connection:
        scheme, host, port = key
        addresses = self.guard.addresses(scheme, host, port)  # every one checked, or EndpointRefused
        reason = "connection error"
        for address in addresses:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PushTimeout()
            try:
                sock = socket.create_connection((address, port), timeout=remaining)
            except TimeoutError:
                raise PushTimeout() from None
            except ConnectionRefusedError:
                reason = "connection refused"
                continue
            except OSError:
                continue
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if scheme == "https":
                    sock = self._wrap(sock, host.strip("[]"), deadline)
            except BaseException:
                sock.close()
                raise
            self.connections_opened += 1
            return _Connection(sock, key)
        raise PushConnectionError(reason)

    def _wrap(self, sock: socket.socket, host: str, deadline: float) -> socket.socket:
        context = self._ssl_context
        if context is None:
            context = self._ssl_context = _default_context()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PushTimeout()
        sock.settimeout(remaining)  # the handshake as a whole: CPython's ssl keeps one deadline
        try:
            # SNI and the certificate check are against the name, whatever address we reached
            return context.wrap_socket(sock, server_hostname=host)
        except TimeoutError:
            raise PushTimeout() from None
        except ssl.SSLError:
            raise PushConnectionError("TLS error") from None
        except OSError as exc:
            raise PushConnectionError(_describe(exc)) from None


def _default_context() -> ssl.SSLContext:
    try:
        import certifi
    except ImportError:  # pragma: no cover
        context = ssl.create_default_context()
    else:
        context = ssl.create_default_context(cafile=certifi.where())
    context.set_alpn_protocols(["http/1.1"])
    return context


def _dropped(sock: socket.socket) -> bool:
    """True when an idle connection is readable: the server closed it (or sent junk)."""
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


def _remaining(deadline: float) -> float:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise PushTimeout()
    return remaining


def _send(sock: socket.socket, data: bytes, deadline: float) -> None:
    sock.settimeout(_remaining(deadline))  # sendall keeps one deadline for the whole call
    try:
        sock.sendall(data)
    except TimeoutError:
        raise PushTimeout() from None
    except OSError as exc:
        raise PushConnectionError(_describe(exc), unsent=True) from None


def _recv(conn: _Connection, deadline: float) -> bytes:
    conn.sock.settimeout(_remaining(deadline))
    try:
        data = conn.sock.recv(_RECV)
        if data:
            conn.answered = True
        return data
    except TimeoutError:
        raise PushTimeout() from None
    except ssl.SSLError:
        raise PushConnectionError("TLS error") from None
    except OSError as exc:
        raise PushConnectionError(_describe(exc)) from None


def _describe(exc: OSError) -> str:
    if isinstance(exc, ConnectionResetError | BrokenPipeError):
        return "connection reset"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ssl.SSLError):
        return "TLS error"
    return "connection error"


def _read_response(conn: _Connection, deadline: float, body_limit: int) -> tuple[Response, bool]:
    """Read one answer from ``conn``; return it and whether the connection may be reused."""
    buffer = conn.buffer
    while True:  # 1xx answers (100 Continue, 103 Early Hints) come before the real one
        end = buffer.find(b"\r\n\r\n")
        while end < 0:
            if len(buffer) > _MAX_HEAD_BYTES:
                raise PushConnectionError("answer headers too large")
            chunk = _recv(conn, deadline)
            if not chunk:
                if not buffer:
                    raise PushConnectionError("connection closed without response", unsent=True)
                raise PushConnectionError("connection closed mid-answer")
            buffer += chunk
            end = buffer.find(b"\r\n\r\n", max(0, len(buffer) - len(chunk) - 3))
        head = bytes(buffer[:end]).decode("latin-1")
        del buffer[: end + 4]
        lines = head.split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code = rest[:3]
        if not (version.startswith("HTTP/1.") and code.isascii() and code.isdigit()):  # "²01" is no status
            raise PushConnectionError("not an HTTP answer")
        status = int(code)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if 100 <= status < 200 and status != 101:
            continue
        break

    reusable = version == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
    response = Response(status, headers)
    try:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            complete = _read_chunked(conn, deadline, body_limit, response)
        elif "content-length" in headers:
            try:
                length = int(headers["content-length"])
            except ValueError:
                return response, False
            complete = _read_exactly(conn, deadline, length, body_limit, response)
        elif status in (204, 304):
            complete = True
        else:  # the body runs to the end of the connection
            _read_exactly(conn, deadline, body_limit, body_limit, response, until_close=True)
            return response, False
    except PushTimeout:
        response.body_error = "timeout"
        return response, False
    except PushConnectionError as exc:
        response.body_error = exc.reason
        return response, False
    return response, reusable and complete and not conn.buffer


def _read_exactly(conn: _Connection, deadline: float, length: int, limit: int, response: Response,
                  *, until_close: bool = False) -> bool:
    """Read a body of ``length`` bytes, keeping ``limit``; False when it was cut short on purpose."""
    buffer = conn.buffer
    wanted = min(length, limit) if not until_close else limit
    while len(buffer) < wanted:
        chunk = _recv(conn, deadline)
        if not chunk:
            if until_close:
                break
            raise PushConnectionError("connection closed mid-answer")
        buffer += chunk
    response.body = bytes(buffer[:wanted])
    if length > limit:  # the rest is not read: the connection is dropped instead
        del buffer[:]
        return False
    del buffer[:wanted]
    return True


def _read_chunked(conn: _Connection, deadline: float, limit: int, response: Response) -> bool:
    buffer = conn.buffer
    body = bytearray()
    while True:
        end = buffer.find(b"\r\n")
        while end < 0:
            if len(buffer) > 1024:
                raise PushConnectionError("bad chunked encoding")
            chunk = _recv(conn, deadline)
            if not chunk:
                raise PushConnectionError("connection closed mid-answer")
            buffer += chunk
            end = buffer.find(b"\r\n")
        size_text = bytes(buffer[:end]).split(b";")[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise PushConnectionError("bad chunked encoding") from None
        del buffer[: end + 2]
        if size == 0:
            # trailers, then an empty line
            while True:
                end = buffer.find(b"\r\n")
                while end < 0:
                    if len(buffer) > 8192:
                        raise PushConnectionError("bad chunked encoding")
                    chunk = _recv(conn, deadline)
                    if not chunk:
                        raise PushConnectionError("connection closed mid-answer")
                    buffer += chunk
                    end = buffer.find(b"\r\n")
                line = bytes(buffer[:end])
                del buffer[: end + 2]
                if not line:
                    response.body = bytes(body[:limit])
                    return True
        if len(body) + size > limit:
            response.body = bytes(body[:limit]) + bytes(buffer[: limit - len(body)])
            response.body = response.body[:limit]
            del buffer[:]
            return False
        while len(buffer) < size + 2:
            chunk = _recv(conn, deadline)
            if not chunk:
                raise PushConnectionError("connection closed mid-answer")
            buffer += chunk
        body += buffer[:size]
        del buffer[: size + 2]
