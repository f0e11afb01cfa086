"""gov.delivery.pushclient: the runner's keep-alive HTTP/1.1 client, on real loopback sockets.

What it must keep from the ``requests`` transport it replaced: only what the guard admits
is reached, at the address the guard checked (TLS against the name); the total deadline of
an attempt, whatever the server trickles; connections reused per origin, never a broken
one. The resolver is the only thing faked (tests.unit.test_netguard.FakeDNS).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gov.delivery.netguard import EndpointGuard, EndpointRefused
from gov.delivery.pushclient import BadRequestTarget, PushClient, PushConnectionError, PushTimeout
from tests.unit.test_netguard import HOSTILE, FakeDNS, tls_push  # noqa: F401  # tls_push: a fixture

HEADERS = [("TTL", "60"), ("Content-Type", "application/octet-stream")]


def _deadline(seconds: float = 5.0) -> float:
    return time.monotonic() + seconds


class RawServer:
    """A loopback server that runs ``script(conn, n)`` for its n-th connection, and counts them."""

    def __init__(self, script: Callable[[socket.socket, int], None]) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self._script = script
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._accept = threading.Thread(target=self._run, daemon=True)
        self._accept.start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            self._conns.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn, self.connections), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn: socket.socket, n: int) -> None:
        with conn, contextlib.suppress(OSError):
            self._script(conn, n)

    def url(self, path: str = "/push/x") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for conn in self._conns:  # wakes a script blocked on an idle keep-alive connection
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=10)


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[socket.socket, int], None]], RawServer]]:
    servers: list[RawServer] = []

    def start(script: Callable[[socket.socket, int], None]) -> RawServer:
        servers.append(RawServer(script))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _read_request(conn: socket.socket, buffer: bytearray) -> bytes | None:
    """One request (headers and a Content-Length body) from ``conn``; None at EOF."""
    while b"\r\n\r\n" not in buffer:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buffer += chunk
    end = buffer.index(b"\r\n\r\n") + 4
    head = bytes(buffer[:end])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    while len(buffer) < end + length:
        buffer += conn.recv(65536)
    request = bytes(buffer[: end + length])
    del buffer[: end + length]
    return request


def answering(*answers: bytes, close: bool = False) -> Callable[[socket.socket, int], None]:
    """Answer each request on a connection with the next of ``answers`` (the last repeats)."""

    def script(conn: socket.socket, _n: int) -> None:
        buffer = bytearray()
        i = 0
        while _read_request(conn, buffer) is not None:
            conn.sendall(answers[min(i, len(answers) - 1)])
            i += 1
            if close:
                return

    return script


CREATED = b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n"


@pytest.fixture
def client() -> Iterator[PushClient]:
    with PushClient(EndpointGuard(allow_loopback=True)) as c:
        yield c


# ---------------------------------------------------------------- keep-alive, per origin


def test_one_connection_per_origin_is_kept_alive(client: PushClient, serve: Any) -> None:
    a, b = serve(answering(CREATED)), serve(answering(CREATED))
    for _ in range(3):
        assert client.post(a.url(), HEADERS, b"x", _deadline()).status == 201
        assert client.post(b.url("/other"), HEADERS, b"y", _deadline()).status == 201
    assert (a.connections, b.connections, client.connections_opened) == (1, 1, 2)


def test_idle_connections_over_all_origins_are_bounded_the_least_recently_used_first(serve: Any) -> None:
    """Subscriptions on many hosts cannot hold one idle socket each until the runner has
    no file descriptor left: over the bound, the least recently used origin's goes."""
    servers = [serve(answering(CREATED, CREATED)) for _ in range(4)]
    with PushClient(EndpointGuard(allow_loopback=True), max_idle_total=2) as c:
        for server in servers:
            assert c.post(server.url(), HEADERS, b"x", _deadline()).status == 201
        assert c.connections_opened == 4
        # the two most recent origins kept theirs; the two oldest must connect again
        assert c.post(servers[3].url(), HEADERS, b"x", _deadline()).status == 201
        assert c.connections_opened == 4
        assert c.post(servers[0].url(), HEADERS, b"x", _deadline()).status == 201
        assert c.connections_opened == 5


def test_a_connection_the_server_closed_while_idle_is_not_reused(client: PushClient, serve: Any) -> None:
    closed = threading.Semaphore(0)

    def answer_then_close(conn: socket.socket, _n: int) -> None:
        _read_request(conn, bytearray())
        conn.sendall(CREATED)
        conn.close()  # without a word, while the client keeps the connection idle
        closed.release()

    server = serve(answer_then_close)
    for _ in range(3):
        assert client.post(server.url(), HEADERS, b"x", _deadline()).status == 201
        assert closed.acquire(timeout=5)
    assert server.connections == 3


def test_a_reused_connection_closed_without_an_answer_is_tried_once_more_on_a_new_one(
    client: PushClient, serve: Any
) -> None:
    def once_then_drop(conn: socket.socket, n: int) -> None:
        buffer = bytearray()
        _read_request(conn, buffer)
        conn.sendall(CREATED)
        _read_request(conn, buffer)  # the second request on this connection: read, never answered

    server = serve(once_then_drop)
    assert client.post(server.url(), HEADERS, b"x", _deadline()).status == 201
    assert client.post(server.url(), HEADERS, b"y", _deadline()).status == 201
    assert server.connections == 2


def test_connection_close_and_http_1_0_are_not_reused(client: PushClient, serve: Any) -> None:
    server = serve(answering(b"HTTP/1.1 201 Created\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
                             b"HTTP/1.0 201 Created\r\nContent-Length: 0\r\n\r\n"))
    for _ in range(2):
        assert client.post(server.url(), HEADERS, b"x", _deadline()).status == 201
    assert server.connections == 2


def test_answers_are_read_whole_chunked_after_a_100_continue(client: PushClient, serve: Any) -> None:
    answer = (b"HTTP/1.1 100 Continue\r\n\r\n"
              b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\nRetry-After: 7\r\n\r\n"
              b"5\r\nhello\r\n6;x=y\r\n world\r\n0\r\nTrailer: z\r\n\r\n")
    server = serve(answering(answer))
    first = client.post(server.url(), HEADERS, b"x", _deadline())
    assert (first.status, first.body, first.body_error) == (400, b"hello world", None)
    assert first.headers["retry-after"] == "7"
    assert client.post(server.url(), HEADERS, b"x", _deadline()).body == b"hello world"
    assert server.connections == 1  # read to its end: the connection stays usable


def test_a_huge_answer_is_cut_at_the_limit_and_its_connection_dropped(client: PushClient, serve: Any) -> None:
    body = b"z" * 100_000
    server = serve(answering(b"HTTP/1.1 413 Too Large\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)))
    answer = client.post(server.url(), HEADERS, b"x", _deadline(), body_limit=4000)
    assert (answer.status, len(answer.body)) == (413, 4000)
    client.post(server.url(), HEADERS, b"x", _deadline())
    assert server.connections == 2


def test_what_goes_on_the_wire(client: PushClient, serve: Any) -> None:
    seen: list[bytes] = []

    def script(conn: socket.socket, _n: int) -> None:
        buffer = bytearray()
        request = _read_request(conn, buffer)
        assert request is not None
        seen.append(request)
        conn.sendall(CREATED)

    server = serve(script)
    client.post(server.url("/push/abc?q=1"), HEADERS, b"body!", _deadline())
    assert seen == [b"POST /push/abc?q=1 HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: 5\r\n"
                    b"TTL: 60\r\nContent-Type: application/octet-stream\r\n\r\nbody!" % server.port]


@pytest.mark.parametrize("url", ["http://127.0.0.1:1/a b", "http://127.0.0.1:1/a\r\nX: y", "http:///x"])
def test_a_url_that_cannot_be_written_is_refused(client: PushClient, url: str) -> None:
    with pytest.raises(BadRequestTarget):
        client.post(url, HEADERS, b"x", _deadline())


def test_a_header_with_a_line_break_is_refused(client: PushClient) -> None:
    with pytest.raises(BadRequestTarget):
        client.post("http://127.0.0.1:1/x", [("TTL", "60\r\nEvil: 1")], b"x", _deadline())


# ---------------------------------------------------------------- the total deadline


def test_a_trickled_answer_is_cut_off_at_the_total_deadline(client: PushClient, serve: Any) -> None:
    """One byte every 0.2 s never trips a per-read timeout; the attempt's deadline does."""
    written: list[int] = []

    def trickle(conn: socket.socket, _n: int) -> None:
        _read_request(conn, bytearray())
        for byte in CREATED:
            time.sleep(0.2)
            conn.sendall(bytes([byte]))
            written.append(byte)

    server = serve(trickle)
    with pytest.raises(PushTimeout):
        client.post(server.url(), HEADERS, b"x", time.monotonic() + 1.0)
    assert len(written) < len(CREATED) // 2  # cut off at the deadline, not read to the end


def test_a_status_line_in_time_decides_though_the_body_trickles(client: PushClient, serve: Any) -> None:
    def stall(conn: socket.socket, _n: int) -> None:
        _read_request(conn, bytearray())
        conn.sendall(b"HTTP/1.1 410 Gone\r\nContent-Length: 50\r\n\r\nsome")
        time.sleep(3)

    server = serve(stall)
    answer = client.post(server.url(), HEADERS, b"x", time.monotonic() + 1.0)
    assert (answer.status, answer.body_error) == (410, "timeout")


def test_connection_errors_are_named(client: PushClient, serve: Any) -> None:
    silent = serve(lambda conn, _n: _read_request(conn, bytearray()))  # reads, then closes
    with pytest.raises(PushConnectionError, match="closed without response"):
        client.post(silent.url(), HEADERS, b"x", _deadline())
    unused = socket.socket()
    unused.bind(("127.0.0.1", 0))  # bound, never listening: a connection is refused
    try:
        with pytest.raises(PushConnectionError, match="refused"):
            client.post(f"http://127.0.0.1:{unused.getsockname()[1]}/x", HEADERS, b"x", _deadline())
    finally:
        unused.close()


def test_a_status_that_is_not_three_ascii_digits_is_not_an_answer(client: PushClient, serve: Any) -> None:
    """"²01" passed str.isdigit() and failed in int(): the runner recorded a failure of its
    own instead of the transient "not an HTTP answer" it is."""
    odd = serve(answering("HTTP/1.1 \u00b201 Created\r\nContent-Length: 0\r\n\r\n".encode("latin-1")))
    with pytest.raises(PushConnectionError, match="not an HTTP answer"):
        client.post(odd.url(), HEADERS, b"x", _deadline())


# ---------------------------------------------------------------- only push services (invariant 13)


class Connects:
    """Records where sockets would be opened; opens none."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.targets: list[tuple[str, int]] = []
        monkeypatch.setattr(socket, "create_connection", self)

    def __call__(self, address: tuple[str, int], *args: Any, **kwargs: Any) -> Any:
        self.targets.append(address)
        raise ConnectionRefusedError(111, "Connection refused (recorded by the test)")


@pytest.mark.parametrize(("endpoint", "word"), [h for h in HOSTILE if not h[0].startswith("http://")])
def test_hostile_endpoints_are_refused_without_connecting(
    endpoint: str, word: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    connects = Connects(monkeypatch)
    with PushClient(EndpointGuard(allow_loopback=False)) as c:
        try:
            c.post(endpoint, HEADERS, b"x", _deadline())
        except EndpointRefused as refused:
            assert word in str(refused)
        except BadRequestTarget:
            pass  # not even a URL a request can be written to
        else:
            pytest.fail("posted")
    assert connects.targets == []


def test_plain_http_only_in_test_mode(serve: Any) -> None:
    server = serve(answering(CREATED))
    with PushClient(EndpointGuard(allow_loopback=False)) as c, pytest.raises(EndpointRefused, match="https"):
        c.post(server.url(), HEADERS, b"x", _deadline())
    assert server.connections == 0


def test_dns_rebinding_connects_to_the_checked_address(monkeypatch: pytest.MonkeyPatch) -> None:
    dns = FakeDNS(monkeypatch, {"push.rebind.example": [["93.184.216.34"], ["10.0.0.5"]]})
    connects = Connects(monkeypatch)
    with PushClient(EndpointGuard(allow_loopback=False, cache_s=0)) as c:
        with pytest.raises(PushConnectionError):
            c.post("https://push.rebind.example/x", HEADERS, b"x", _deadline())
        assert connects.targets == [("93.184.216.34", 443)]  # the address checked, not a name
        with pytest.raises(EndpointRefused, match="private"):
            c.post("https://push.rebind.example/x", HEADERS, b"x", _deadline())
    assert connects.targets == [("93.184.216.34", 443)] and dns.calls["push.rebind.example"] == 2


def test_tls_goes_to_the_checked_address_with_the_name_for_sni_and_certificate(
    tls_push: tuple[int, Path, list[str | None], list[int]], monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    port, ca, sni, posts = tls_push
    dns = FakeDNS(monkeypatch, {"push.rebind.test": [["127.0.0.1"], ["10.0.0.5"]]})
    context = ssl.create_default_context(cafile=str(ca))
    url = f"https://push.rebind.test:{port}/push/x"
    with PushClient(EndpointGuard(allow_loopback=True, cache_s=0), ssl_context=context) as c:
        assert c.post(url, HEADERS, b"x", _deadline()).status == 201
        assert c.post(url, HEADERS, b"y", _deadline()).status == 201  # the same connection, kept alive
    assert sni == ["push.rebind.test"] and posts == [1, 1] and dns.calls["push.rebind.test"] == 1
    # a new connection: the name now points at a private address, and nothing is sent
    with PushClient(EndpointGuard(allow_loopback=True, cache_s=0), ssl_context=context) as c, \
            pytest.raises(EndpointRefused, match="private"):
        c.post(url, HEADERS, b"z", _deadline())
    assert posts == [1, 1]


def test_tls_certificate_is_verified(
    tls_push: tuple[int, Path, list[str | None], list[int]], monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    port, _ca, _sni, posts = tls_push
    FakeDNS(monkeypatch, {"push.rebind.test": [["127.0.0.1"]]})
    with PushClient(EndpointGuard(allow_loopback=True)) as c, pytest.raises(PushConnectionError, match="TLS"):
        c.post(f"https://push.rebind.test:{port}/push/x", HEADERS, b"x", _deadline())  # not trusted
    assert posts == []
