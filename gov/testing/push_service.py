"""A real, strict Web Push service on 127.0.0.1, for tests.

It checks every rule of WEBPUSH.md a push service can see (TTL, encoding,
Content-Type, Urgency, Topic, body size, the VAPID token and its claims) and
decrypts each message with the subscriber's keys, as a browser would. Answers
can be scripted per endpoint to exercise throttling, errors and dead sockets::

    with PushService() as service:
        browser = service.subscribe()
        service.script(browser, [201, (429, {"Retry-After": "2"}), 500, "hang", 410])
        ...  # send to browser.info["endpoint"]
        assert service.delivered(browser)[0].payload == b"..."
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import re
import secrets
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from urllib.parse import urlsplit

import http_ece
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from gov.delivery.vapid import validate_subject
from gov.errors import ConfigurationError

MAX_BODY_BYTES = 4096
#: Largest ``exp`` a token may carry, counted from now (RFC 8292 section 2).
MAX_TOKEN_AHEAD_S = 24 * 3600
_MAX_VERIFIED_TOKENS = 1024
_URGENCIES = frozenset({"very-low", "low", "normal", "high"})
_TOPIC = re.compile(r"[A-Za-z0-9_-]{1,32}")
_TTL = re.compile(r"[0-9]{1,10}")
_PATH = re.compile(r"/push/([A-Za-z0-9_-]+)")
# Bodies larger than this are refused without being read at all.
_READ_CAP = 64 * 1024
_AES128GCM_HEADER = 21  # salt(16) + rs(4) + idlen(1), then the key id

#: A scripted answer: a status, ``(status, headers)``, ``(status, headers, body)``,
#: ``"hang"`` or ``"reset"``.
Answer = int | tuple[int, Mapping[str, str]] | tuple[int, Mapping[str, str], str | bytes] | str


class _Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64url(text: str) -> bytes:
    # Deliberately independent of gov.delivery.subscription: this service is the oracle.
    if not re.fullmatch(r"[A-Za-z0-9_-]*={0,2}", text):
        raise ValueError("not base64url")
    body = text.rstrip("=")
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))


@dataclass(frozen=True)
class BrowserSubscription:
    """A subscription as a browser creates it: its own key pair and auth secret."""

    endpoint: str
    p256dh: str
    auth: str
    private_key: ec.EllipticCurvePrivateKey = field(repr=False, compare=False)
    auth_secret: bytes = field(repr=False)
    name: str | None = None
    application_server_key: str | None = None

    @property
    def info(self) -> dict[str, Any]:
        """The PushSubscription JSON (``subscription.toJSON()`` in a browser)."""
        return {
            "endpoint": self.endpoint,
            "expirationTime": None,
            "keys": {"p256dh": self.p256dh, "auth": self.auth},
        }

    def decrypt(self, body: bytes) -> bytes:
        """Decrypt an aes128gcm message body addressed to this subscription."""
        return http_ece.decrypt(body, private_key=self.private_key, auth_secret=self.auth_secret, version="aes128gcm")


@dataclass(frozen=True)
class Received:
    """One request the service received and how it answered.

    ``headers`` has lower-case names. ``status`` is ``None`` for a scripted
    ``"hang"`` or ``"reset"``. ``payload`` (decrypted) and ``claims`` (the
    verified VAPID claims) are ``None`` when the request failed before them;
    ``reason`` says why a request was refused. ``client_port`` tells
    connections apart (equal ports: a reused connection).
    """

    endpoint: str
    status: int | None
    headers: dict[str, str]
    payload: bytes | None
    claims: dict[str, Any] | None
    at: float
    reason: str | None = None
    client_port: int | None = None
    body_length: int | None = None


@dataclass
class _Endpoint:
    subscription: BrowserSubscription
    answers: deque[_Scripted] = field(default_factory=deque)
    gone: bool = False


#: Anything naming an endpoint: its URL, a BrowserSubscription, a PushSubscription
#: dict, or any object with an ``endpoint`` attribute (such as gov's Subscription).
Target = str | BrowserSubscription | Mapping[str, Any] | Any


def _endpoint_of(target: Target) -> str:
    if isinstance(target, str):
        return target
    if isinstance(target, Mapping):
        return str(target["endpoint"])
    return str(target.endpoint)


def _is_status(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 200 <= value <= 599


@dataclass(frozen=True)
class _Scripted:
    action: str  # "answer", "hang" or "reset"
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None  # None: the default body for the status


def _check_answer(answer: Answer) -> _Scripted:
    if answer in ("hang", "reset"):
        return _Scripted(str(answer))
    if _is_status(answer):
        return _Scripted("answer", answer)  # type: ignore[arg-type]
    if isinstance(answer, tuple) and len(answer) in (2, 3):
        status, headers, *rest = answer
        body = rest[0] if rest else None
        if isinstance(body, str):
            body = body.encode()
        if _is_status(status) and isinstance(headers, Mapping) and (body is None or isinstance(body, bytes)):
            return _Scripted("answer", status, dict(headers), body)
    raise ValueError(f"unknown scripted answer {answer!r}")


class PushService:
    """A push service for tests; a context manager that starts and stops it.

    ``expected_public_key`` (base64url applicationServerKey) makes requests
    signed with any other VAPID key fail with 403, as a browser-bound
    subscription would. ``hang_s`` bounds how long a scripted ``"hang"``
    holds the socket. ``clock`` is used for ``exp`` checks and timestamps.
    """

    def __init__(
        self,
        *,
        expected_public_key: str | None = None,
        hang_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Configure the service; call :meth:`start` or use ``with``."""
        self.expected_public_key = expected_public_key
        self.hang_s = hang_s
        self.clock = clock
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._endpoints: dict[str, _Endpoint] = {}
        self._received: list[Received] = []
        self._connections: set[socket.socket] = set()
        # tokens whose ES256 signature verified, by (k, t): a runner reuses one token per
        # origin for hours, and the signature of the same bytes verifies the same way every
        # time; aud, exp, sub and the subscription's key are still checked on every request
        self._verified: dict[tuple[str, str], tuple[bytes, dict[str, Any]]] = {}
        self._message_ids = itertools.count(1)  # a delivered message's Location
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> PushService:
        """Listen on an ephemeral port of 127.0.0.1 and serve in a daemon thread."""
        if self._server is not None:
            return self
        self._stopping.clear()
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.daemon_threads = True
        server.push_service = self  # type: ignore[attr-defined]
        self._port = int(server.server_address[1])
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},  # quick stop(): tests start many services
            name=f"push-service-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port; open connections are closed too.

        Without closing them, a client's kept-alive connection would still be
        answered by its handler thread after the service "stopped".
        """
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        server.server_close()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> PushService:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The TCP port the service listens (or, once stopped, listened) on."""
        if self._port is None:
            raise RuntimeError("PushService was never started")
        return self._port

    @property
    def origin(self) -> str:
        """``http://127.0.0.1:<port>``: the ``aud`` a VAPID token must carry."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The service's base URL (the same as :attr:`origin`)."""
        return self.origin

    # -- subscriptions and scripts ----------------------------------------

    def subscribe(self, name: str | None = None, *, application_server_key: str | None = None) -> BrowserSubscription:
        """Create a subscription as a browser does (fresh P-256 keys, 16-byte secret).

        ``application_server_key`` binds this subscription to a VAPID key
        (403 for others); it defaults to the service's ``expected_public_key``.
        """
        private_key = ec.generate_private_key(ec.SECP256R1())
        public = private_key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        auth_secret = os.urandom(16)
        token = secrets.token_urlsafe(16)
        subscription = BrowserSubscription(
            endpoint=f"{self.origin}/push/{token}",
            p256dh=_b64url(public),
            auth=_b64url(auth_secret),
            name=name,
            private_key=private_key,
            auth_secret=auth_secret,
            application_server_key=application_server_key or self.expected_public_key,
        )
        with self._lock:
            self._endpoints[token] = _Endpoint(subscription)
        return subscription

    def script(self, target: Target, answers: Iterable[Answer]) -> None:
        """Queue answers for an endpoint, consumed one per valid request.

        Each answer is a status (``201``, ``429``, ``500``, ``410``...), a
        ``(status, headers)`` or ``(status, headers, body)`` tuple, ``"hang"``
        (hold the socket, never answer) or ``"reset"`` (close with a TCP RST).
        Once the queue is empty the answer is 201. A 404 or 410 also marks the
        subscription gone. Refused requests do not consume answers.
        """
        checked = [_check_answer(answer) for answer in answers]
        with self._lock:
            self._entry(_endpoint_of(target)).answers.extend(checked)

    def expire(self, target: Target) -> None:
        """Mark a subscription gone (the user unsubscribed): later requests get 410."""
        with self._lock:
            self._entry(_endpoint_of(target)).gone = True

    def _entry(self, endpoint: str) -> _Endpoint:
        match = _PATH.fullmatch(urlsplit(endpoint).path)
        entry = self._endpoints.get(match.group(1)) if match else None
        if entry is None or entry.subscription.endpoint != endpoint:
            raise KeyError(f"not an endpoint of this push service: {endpoint}")
        return entry

    # -- what was received -------------------------------------------------

    @property
    def received(self) -> list[Received]:
        """Every request received so far, in order of arrival (a copy)."""
        with self._lock:
            return list(self._received)

    def requests_for(self, target: Target) -> list[Received]:
        """The requests received for one endpoint."""
        endpoint = _endpoint_of(target)
        return [r for r in self.received if r.endpoint == endpoint]

    def delivered(self, target: Target | None = None) -> list[Received]:
        """Requests answered 2xx (their ``payload`` is the decrypted message)."""
        records = self.received if target is None else self.requests_for(target)
        return [r for r in records if r.status is not None and 200 <= r.status <= 299]

    def delivered_payloads(self, target: Target | None = None) -> list[bytes]:
        """The decrypted payloads of :meth:`delivered`, in order."""
        return [r.payload for r in self.delivered(target) if r.payload is not None]

    # -- request handling (called from handler threads) --------------------

    def _record(self, record: Received) -> None:
        with self._lock:
            self._received.append(record)

    def _next_answer(self, entry: _Endpoint) -> _Scripted:
        with self._lock:
            answer = entry.answers.popleft() if entry.answers else _Scripted("answer", 201)
            if answer.status in (404, 410):
                entry.gone = True
            return answer

    def _lookup(self, path: str) -> _Endpoint:
        match = _PATH.fullmatch(path)
        with self._lock:
            entry = self._endpoints.get(match.group(1)) if match else None
            if entry is None:
                raise _Refused(404, "no such subscription")
            if entry.gone:
                raise _Refused(410, "subscription expired")
            return entry

    def _verify_vapid(self, header: str | None, entry: _Endpoint) -> dict[str, Any]:
        if not header:
            raise _Refused(401, "Authorization header missing")
        scheme, _, params = header.partition(" ")
        if scheme.lower() != "vapid":
            raise _Refused(401, "Authorization scheme is not vapid")
        fields: dict[str, str] = {}
        for part in params.split(","):
            name, eq, value = part.strip().partition("=")
            if not eq or name in fields:
                raise _Refused(401, "Authorization parameters malformed")
            fields[name] = value
        if set(fields) != {"t", "k"}:
            raise _Refused(401, "Authorization needs exactly t= and k=")
        known = self._verified.get((fields["k"], fields["t"]))
        if known is not None:
            key_bytes, claims = known
        else:
            key_bytes, claims = _verify_token(fields["k"], fields["t"])
            with self._lock:
                if len(self._verified) >= _MAX_VERIFIED_TOKENS:
                    self._verified.clear()  # bounded: a client minting tokens only costs checks
                self._verified[(fields["k"], fields["t"])] = (key_bytes, claims)
        now = self.clock()
        if claims.get("aud") != self.origin:
            raise _Refused(401, f"aud {claims.get('aud')!r} is not {self.origin!r}")
        exp = claims.get("exp")
        if isinstance(exp, bool) or not isinstance(exp, int):
            raise _Refused(401, "exp missing or not an integer")
        if exp <= now:
            raise _Refused(401, "token expired")
        if exp > now + MAX_TOKEN_AHEAD_S:
            raise _Refused(401, "exp more than 24 h ahead")
        try:
            validate_subject(claims.get("sub"))  # type: ignore[arg-type]
        except ConfigurationError as exc:
            raise _Refused(401, f"sub refused: {exc}") from None
        expected = entry.subscription.application_server_key
        if expected is not None and key_bytes != _unb64url(expected):
            raise _Refused(403, "k is not the key this subscription was created with")
        return dict(claims)  # a copy: the cached claims are shared by every request with the token


def _verify_token(k: str, token: str) -> tuple[bytes, dict[str, Any]]:
    """The public key ``k`` (raw bytes) and the claims of ``token``, whose signature it verifies."""
    try:
        key_bytes = _unb64url(k)
        if len(key_bytes) != 65 or key_bytes[0] != 4:
            raise ValueError("not an uncompressed point")
        key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), key_bytes)
    except ValueError:
        raise _Refused(401, "k is not a P-256 public key") from None
    return key_bytes, _verify_jwt(token, key)


def _verify_jwt(token: str, key: ec.EllipticCurvePublicKey) -> dict[str, Any]:
    parts = token.split(".")
    if len(parts) != 3:
        raise _Refused(401, "token is not a JWS compact serialisation")
    try:
        header = json.loads(_unb64url(parts[0]))
        claims = json.loads(_unb64url(parts[1]))
        signature = _unb64url(parts[2])
    except (ValueError, UnicodeDecodeError):
        raise _Refused(401, "token parts are not base64url JSON") from None
    if not isinstance(header, dict) or header.get("alg") != "ES256":
        raise _Refused(401, "token alg is not ES256")
    if header.get("typ", "JWT") != "JWT":
        raise _Refused(401, "token typ is not JWT")
    if len(signature) != 64:
        raise _Refused(401, "signature is not 64 bytes r||s")
    der = encode_dss_signature(int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big"))
    try:
        key.verify(der, f"{parts[0]}.{parts[1]}".encode("ascii"), ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise _Refused(401, "token signature does not verify") from None
    if not isinstance(claims, dict):
        raise _Refused(401, "token claims are not an object")
    return claims


def _error_body(reason: str) -> bytes:
    return json.dumps({"error": reason}).encode()


def _single(handler: BaseHTTPRequestHandler, name: str) -> str | None:
    values = handler.headers.get_all(name) or []
    if len(values) > 1:
        raise _Refused(400, f"{name} header repeated")
    return values[0].strip() if values else None


def _check_headers(handler: BaseHTTPRequestHandler) -> None:
    ttl = _single(handler, "TTL")
    if ttl is None or not _TTL.fullmatch(ttl):
        raise _Refused(400, "TTL header missing or not an integer >= 0")
    encoding = _single(handler, "Content-Encoding")
    if (encoding or "").lower() != "aes128gcm":
        raise _Refused(400, "Content-Encoding must be aes128gcm")
    content_type = _single(handler, "Content-Type")
    if (content_type or "").split(";")[0].strip().lower() != "application/octet-stream":
        raise _Refused(400, "Content-Type must be application/octet-stream")
    urgency = _single(handler, "Urgency")
    if urgency is not None and urgency not in _URGENCIES:
        raise _Refused(400, "Urgency invalid")
    topic = _single(handler, "Topic")
    if topic is not None and not _TOPIC.fullmatch(topic):
        raise _Refused(400, "Topic must be 1-32 characters of [A-Za-z0-9_-]")


def _decrypt(body: bytes, subscription: BrowserSubscription) -> bytes:
    if len(body) < _AES128GCM_HEADER or body[20] != 65:
        raise _Refused(400, "aes128gcm header missing or key id is not a P-256 key")
    record_size = struct.unpack("!L", body[16:20])[0]
    if len(body) - _AES128GCM_HEADER - 65 > record_size:
        raise _Refused(400, "body has more than one aes128gcm record")
    try:
        return subscription.decrypt(body)
    except Exception:  # http_ece raises several types for a bad body
        raise _Refused(400, "body does not decrypt with the subscription's keys") from None


class _Head:
    """A request's header fields as http.server's parser gives them (names as sent, a
    value without its leading blanks and line end), for the three reads made of them."""

    __slots__ = ("_fields",)

    def __init__(self, fields: list[tuple[str, str]]) -> None:
        self._fields = fields

    def get(self, name: str, default: str | None = None) -> str | None:
        name = name.lower()
        return next((value for field, value in self._fields if field.lower() == name), default)

    def get_all(self, name: str) -> list[str] | None:
        name = name.lower()
        return [value for field, value in self._fields if field.lower() == name] or None

    def items(self) -> list[tuple[str, str]]:
        return list(self._fields)


_MAX_HEADER_LINE = 65536  # http.client's limits, kept
_MAX_HEADERS = 100
_FIELD_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so connection reuse is observable
    server_version = "gov-test-push/1"

    _date: tuple[int, str] = (0, "")  # the Date header's text, made once a second

    def date_time_string(self, timestamp: float | None = None) -> str:
        """http.server's Date value, formatted once a second (email.utils takes 5 µs each time)."""
        if timestamp is not None:
            return super().date_time_string(timestamp)
        second = int(time.time())
        if _Handler._date[0] != second:
            _Handler._date = (second, super().date_time_string(second))
        return _Handler._date[1]

    def parse_request(self) -> bool:
        """The request line and header fields, read here rather than by http.server.

        http.server hands the header block to the email package's parser, about 55 µs a
        request: a tenth of this service's CPU under a simulation's load, where this reads
        it in a few. Stricter, not looser: only ``METHOD target HTTP/1.x``, field names as
        RFC 9110 spells them, no folded lines (RFC 9112 section 5.2 lets a server refuse
        them), http.client's limits (65,536 bytes a line, 100 fields); 400 or 431 otherwise.
        """
        self.command = None  # type: ignore[assignment]  # http.server's own "not parsed yet"
        self.request_version = self.default_request_version
        self.close_connection = True
        self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")  # type: ignore[attr-defined]
        words = self.requestline.split()
        if not words:
            return False
        if len(words) != 3 or words[2] not in ("HTTP/1.0", "HTTP/1.1"):
            self.send_error(400, f"Bad request line ({self.requestline!r})")
            return False
        self.command, self.path, self.request_version = words
        self.close_connection = self.request_version == "HTTP/1.0"
        fields: list[tuple[str, str]] = []
        while True:
            line = self.rfile.readline(_MAX_HEADER_LINE + 1)
            if len(line) > _MAX_HEADER_LINE:
                self.send_error(431, "Line too long")
                return False
            if line in (b"\r\n", b"\n", b""):
                break
            if len(fields) == _MAX_HEADERS:
                self.send_error(431, "Too many headers")
                return False
            name, colon, value = str(line, "iso-8859-1").partition(":")
            if not colon or not _FIELD_NAME.fullmatch(name):
                self.send_error(400, "Bad header line")
                return False
            fields.append((name, value.lstrip(" \t").rstrip("\r\n")))
        self.headers = _Head(fields)  # type: ignore[assignment]
        connection = (self.headers.get("Connection") or "").lower()
        if connection == "close":
            self.close_connection = True
        elif connection == "keep-alive":
            self.close_connection = False
        if (self.headers.get("Expect") or "").lower() == "100-continue" and self.request_version == "HTTP/1.1":
            return self.handle_expect_100()
        return True

    # A buffered writer: the status line, headers and body of an answer leave in one
    # write when handle_one_request flushes (one loopback segment, not two sends).
    wbufsize = -1

    def setup(self) -> None:
        super().setup()
        # Without NODELAY, Nagle plus the client's delayed ACK would hold back any
        # answer written in more than one piece by ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        service: PushService = self.server.push_service  # type: ignore[attr-defined]
        with service._lock:
            service._connections.add(self.connection)

    def finish(self) -> None:
        service: PushService = self.server.push_service  # type: ignore[attr-defined]
        with service._lock:
            service._connections.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests read service.received, not stderr

    def do_POST(self) -> None:  # name fixed by BaseHTTPRequestHandler
        service: PushService = self.server.push_service  # type: ignore[attr-defined]
        at = service.clock()
        path = urlsplit(self.path).path
        endpoint = f"{service.origin}{path}"
        headers = {name.lower(): value for name, value in self.headers.items()}

        body: bytes | None = None
        claims: dict[str, Any] | None = None
        payload: bytes | None = None

        def record(status: int | None, reason: str | None = None) -> None:
            service._record(
                Received(
                    endpoint=endpoint,
                    status=status,
                    headers=headers,
                    payload=payload,
                    claims=claims,
                    at=at,
                    reason=reason,
                    client_port=self.client_address[1],
                    body_length=None if body is None else len(body),
                )
            )

        try:
            body = self._read_body()
            entry = service._lookup(path)
            _check_headers(self)
            if len(body) > MAX_BODY_BYTES:
                raise _Refused(413, f"body of {len(body)} bytes exceeds {MAX_BODY_BYTES}")
            claims = service._verify_vapid(_single(self, "Authorization"), entry)
            payload = _decrypt(body, entry.subscription)
        except _Refused as refusal:
            record(refusal.status, refusal.reason)
            self._answer(refusal.status, {}, _error_body(refusal.reason))
            return

        answer = service._next_answer(entry)
        if answer.action == "hang":
            record(None, "scripted hang")
            self._hang(service)
        elif answer.action == "reset":
            record(None, "scripted reset")
            self._reset()
        else:
            status = cast(int, answer.status)
            record(status)
            reply_headers = dict(answer.headers)
            if 200 <= status <= 299:
                location = f"{service.origin}/message/{next(service._message_ids)}"
                reply_headers = {"Location": location, **reply_headers}
            reply = answer.body
            if reply is None:
                reply = _error_body("scripted answer") if status >= 300 else b""
            self._answer(status, reply_headers, reply)

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True
            raise _Refused(411, "Content-Length required")
        size = int(length)
        if size > _READ_CAP:
            self.close_connection = True  # the unread body would poison the connection
            raise _Refused(413, f"body of {size} bytes exceeds {MAX_BODY_BYTES}")
        return self.rfile.read(size)

    def _answer(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.send_response(status)
        if body and "content-type" not in {name.lower() for name in headers}:
            headers = {"Content-Type": "application/json", **headers}
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _hang(self, service: PushService) -> None:
        # Hold the socket without answering until the client gives up (it
        # closes: recv returns b""), the service stops, or hang_s passes.
        self.close_connection = True
        deadline = time.monotonic() + service.hang_s
        self.connection.settimeout(0.05)
        while time.monotonic() < deadline and not service._stopping.is_set():
            try:
                if not self.connection.recv(1024):
                    return
            except TimeoutError:
                continue
            except OSError:
                return

    def _reset(self) -> None:
        # SO_LINGER with a zero timeout turns close() into a TCP RST.
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.rfile.close()  # the file holds a reference that would delay the close
        self.connection.close()
