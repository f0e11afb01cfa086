"""One Web Push delivery attempt, and the helpers that shape what is sent.

No database here: :func:`deliver` takes a validated request and returns a
:class:`PushOutcome` classified by HTTP status (WEBPUSH.md rule 14); deciding
what to do with the outcome (retire, retry, alarm) is the caller's job.

Every attempt has a *total* deadline (connect, send and read together), not
only a per-read timeout: a push service that trickles its answer one byte at a
time would otherwise hold an attempt for as long as it likes. The runner's
:class:`gov.delivery.pushclient.PushClient` gives every blocking step only the time left;
for a ``requests`` session a watchdog thread shuts the attempt's socket down
when its deadline passes (:func:`attempt_deadline`). The runner keeps the
deadline shorter than its lease (invariant 12). Name resolution is the one step
neither can cut short.
"""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import functools
import hashlib
import heapq
import hmac
import http.client
import itertools
import json
import math
import os
import re
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import requests
from urllib3.connection import HTTPConnection

from gov.delivery.beacon import MAX_SUBSCRIPTION_ID, PLACEHOLDER_TOKEN
from gov.delivery.netguard import EndpointRefused
from gov.delivery.pushclient import BadRequestTarget, PushClient, PushConnectionError, PushTimeout
from gov.delivery.subscription import Subscription, b64url_encode
from gov.errors import ConfigurationError, InvalidMessage

#: Largest plaintext that fits one aes128gcm record of 4096 bytes (rule 4):
#: 86 bytes of header + plaintext + 1 delimiter byte + 16 bytes of tag.
MAX_PAYLOAD_BYTES = 3993
#: What the beacon fields add to a payload at most: ``,"sub":<19 digits>,"token":"<22>"``
#: (a subscription id of 2**63-1 and a token of 22 base64url characters). Every message is
#: checked with them (:meth:`gov.message.Message.content`), so the budget left for title,
#: body, tag and URL is ``MAX_PAYLOAD_BYTES - BEACON_FIELDS_BYTES`` whether a beacon secret
#: is configured or not: a message recorded by one process fits whichever process delivers it.
BEACON_FIELDS_BYTES = len(f',"sub":{MAX_SUBSCRIPTION_ID},"token":"{PLACEHOLDER_TOKEN}"')
URGENCIES = frozenset({"very-low", "low", "normal", "high"})
MAX_BODY_CHARS = 1000

_TOPIC = re.compile(r"[A-Za-z0-9_-]{1,32}")
# Enough to fill MAX_BODY_CHARS even with multi-byte UTF-8; a hostile endpoint
# cannot make us buffer more than this.
_BODY_READ_LIMIT = 4 * MAX_BODY_CHARS

OutcomeKind = Literal["accepted", "gone", "throttled", "transient", "rejected", "unauthorized"]


class Authorizer(Protocol):
    """What :func:`deliver` needs from a signer (:class:`gov.delivery.vapid.VapidSigner`)."""

    def authorization(self, endpoint_or_origin: str, now: float | None = None) -> str:
        """Return the ``Authorization`` header value for this endpoint."""
        ...


def check_push_fields(payload: bytes, ttl: int, urgency: str, topic: str | None) -> None:
    """Validate what goes on the wire; raise :class:`~gov.errors.InvalidMessage`.

    pywebpush checks none of these; a push service answers 400 or 413, or
    (for a payload over one record) produces a body RFC 8291 forbids.
    """
    if not isinstance(payload, bytes):
        raise InvalidMessage("payload: must be bytes")
    if not payload:
        # Every push must end in a visible notification (see WEBPUSH.md), and an
        # empty push cannot carry one; pywebpush would also drop Content-Encoding.
        raise InvalidMessage("payload: empty")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise InvalidMessage(f"payload: {len(payload)} bytes, more than the {MAX_PAYLOAD_BYTES} allowed")
    if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 0:
        raise InvalidMessage(f"ttl: must be an integer >= 0 (got {ttl!r})")
    if urgency not in URGENCIES:
        raise InvalidMessage(f"urgency: must be one of {sorted(URGENCIES)} (got {urgency!r})")
    if topic is not None and not (isinstance(topic, str) and _TOPIC.fullmatch(topic)):
        raise InvalidMessage("topic: must be 1-32 characters of [A-Za-z0-9_-]")


@dataclass(frozen=True)
class PushRequest:
    """One message for one subscription, checked when built.

    ``ttl`` is counted from the moment of sending: a caller releasing a held
    message must build the request with the TTL that remains.
    """

    subscription: Subscription
    payload: bytes
    ttl: int
    urgency: str = "normal"
    topic: str | None = None

    def __post_init__(self) -> None:
        check_push_fields(self.payload, self.ttl, self.urgency, self.topic)


@dataclass(frozen=True)
class PushOutcome:
    """How one attempt ended.

    ``kind`` is ``accepted`` (200/201/202), ``gone`` (404/410), ``throttled``
    (429, and 406 from Edge/WNS), ``unauthorized`` (401/403), ``transient``
    (5xx, timeouts, connection errors) or ``rejected`` (other answers: the
    request itself is wrong and must not be retried).
    """

    kind: OutcomeKind
    status: int | None = None
    retry_after_s: float | None = None
    body: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the push service accepted the message."""
        return self.kind == "accepted"


def classify_status(status: int) -> OutcomeKind:
    """Map an HTTP status from a push service to an outcome kind."""
    if status in (200, 201, 202):
        return "accepted"
    if status in (404, 410):
        return "gone"
    if status in (429, 406):
        return "throttled"
    if status in (401, 403):
        return "unauthorized"
    if 500 <= status <= 599:
        return "transient"
    # 400, 413, other 4xx, and also 1xx/3xx and unexpected 2xx such as 204:
    # nothing says the message was stored, and repeating it will not help.
    return "rejected"


def redirect_error(status: int, location: str | None) -> str | None:
    """Why a 3xx failed, for ``last_error``: push services answer, they do not redirect,
    and gov never follows one (the next hop would be a host no subscription named)."""
    if not 300 <= status <= 399:
        return None
    where = (location or "").strip()[:200] or "none given"
    return f"redirect not followed (HTTP {status}, Location: {where})"


#: The longest wait a Retry-After can ask for: a message's TTL is at most 28 days, so a
#: longer wait expires it all the same; bounded, a push service cannot overflow the record.
MAX_RETRY_AFTER_S = 28 * 86_400.0


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delay-seconds or HTTP-date), at most
    :data:`MAX_RETRY_AFTER_S`.

    A date in the past gives 0.0; an unreadable value gives ``None``. Never raises: the
    value is the push service's, and a 201 with a strange header is still delivered.
    """
    if value is None:
        return None
    value = value.strip()
    # ASCII digits only: str.isdigit() is true for "²" too, which int() refuses
    if value.isascii() and value.isdigit():
        return MAX_RETRY_AFTER_S if len(value) > 9 else min(float(value), MAX_RETRY_AFTER_S)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # a "-0000" zone gives a naive datetime; HTTP dates are UTC
        when = when.replace(tzinfo=datetime.UTC)
    now = time.time() if now is None else now
    return min(max(0.0, when.timestamp() - now), MAX_RETRY_AFTER_S)


def preload() -> None:
    """Import what the first message needs (pywebpush and its dependencies) now: before
    forking runner processes, so that each does not import it again."""
    import pywebpush  # noqa: F401


@functools.lru_cache(maxsize=4096)
def _pusher(subscription: Subscription) -> Any:
    """pywebpush's encoder for one subscription, its keys decoded once (about a fifth of
    a message's CPU on a runner); encode() itself keeps no state between messages."""
    # Imported at the first message, not at start: pywebpush brings aiohttp along, and a
    # `gov dispatch --once` that finds nothing to send should not pay for it.
    from cryptography.hazmat.primitives.asymmetric import ec
    from pywebpush import WebPusher

    pusher = WebPusher(subscription.as_info())
    # http_ece takes the receiver's key as a key object as well as its bytes: parsed (and
    # checked to be on the curve) here once, rather than on every encode.
    pusher.receiver_key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), pusher.receiver_key)
    return pusher


def deliver(
    request: PushRequest,
    signer: Authorizer,
    session: PushClient | requests.Session,
    timeout: float = 10.0,
) -> PushOutcome:
    """Encrypt ``request`` and POST it once to its endpoint; never raises for HTTP.

    ``timeout`` (seconds, finite, rule 11) is the attempt's *total* deadline:
    connecting, sending and reading the answer all end by then, whatever the
    server does (a watchdog shuts the socket down; see :func:`attempt_deadline`).
    An answer cut off by the deadline is a ``transient`` outcome with error
    ``"timeout"``; a status line that arrived in time still decides the outcome.
    ``session`` carries reused connections (rule 12): the runner's
    :class:`gov.delivery.pushclient.PushClient` (keep-alive pools per origin, shared by
    threads, the deadline kept by giving each blocking step only the time left),
    or a ``requests.Session``, which must not be shared between threads and whose
    transport is made deadline-aware on first use (:func:`enforce_deadlines`).
    pywebpush does the aes128gcm encryption; the
    POST is made here so every header is explicit (rules 1, 5, 6, 7) and a
    redirect is never followed (a 301 turned into a GET answered 200 would look
    accepted).
    """
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise ConfigurationError(f"timeout: must be finite seconds > 0 (got {timeout!r})")
    check_push_fields(request.payload, request.ttl, request.urgency, request.topic)
    subscription = request.subscription
    headers = {
        "Authorization": signer.authorization(subscription.endpoint),
        "TTL": str(request.ttl),
        "Content-Encoding": "aes128gcm",
        "Content-Type": "application/octet-stream",
        "Urgency": request.urgency,
    }
    if request.topic is not None:
        headers["Topic"] = request.topic
    # encode() makes a fresh salt and ephemeral key for every message (rule 5).
    body = _pusher(subscription).encode(request.payload, "aes128gcm")["body"]
    if isinstance(session, PushClient):
        return _deliver_with_client(session, subscription.endpoint, headers, body, timeout)
    enforce_deadlines(session, subscription.endpoint)
    with attempt_deadline(timeout) as deadline:
        try:
            response = session.post(
                subscription.endpoint,
                data=body,
                headers=headers,
                # per-read as well: the watchdog is the backstop, not the only guard
                timeout=(timeout, timeout),
                allow_redirects=False,
                stream=True,  # so that a huge answer body is never buffered whole
            )
        except requests.Timeout:
            return PushOutcome("transient", error="timeout")
        except requests.ConnectionError as exc:
            return PushOutcome("transient", error="timeout" if deadline.expired else describe_network_error(exc))
        except requests.RequestException as exc:
            if deadline.expired:
                return PushOutcome("transient", error="timeout")
            # Invalid URL, header or schema: sending again would fail the same way.
            return PushOutcome("rejected", error=f"request error: {type(exc).__name__}")

        with response:
            status = response.status_code
            error = None
            try:
                text = _read_body(response)
            except (requests.RequestException, OSError, http.client.HTTPException) as exc:
                # The status line arrived; it still decides the outcome.
                reason = "timeout" if deadline.expired else describe_network_error(exc)
                text, error = "", f"body unreadable: {reason}"
            error = redirect_error(status, response.headers.get("Location")) or error
            return PushOutcome(
                classify_status(status),
                status=status,
                retry_after_s=parse_retry_after(response.headers.get("Retry-After")),
                body=text,
                error=error,
            )


def _deliver_with_client(
    client: PushClient, endpoint: str, headers: dict[str, str], body: bytes, timeout: float
) -> PushOutcome:
    """The POST through a :class:`~gov.delivery.pushclient.PushClient`, classified as :func:`deliver` says."""
    deadline = time.monotonic() + timeout
    try:
        response = client.post(endpoint, headers.items(), body, deadline, body_limit=_BODY_READ_LIMIT)
    except PushTimeout:
        return PushOutcome("transient", error="timeout")
    except PushConnectionError as exc:
        return PushOutcome("transient", error=exc.reason)
    except socket.gaierror:
        return PushOutcome("transient", error="name resolution failed")
    except EndpointRefused as exc:
        # checked again at connect time: nothing was sent, and nothing about it is transient
        return PushOutcome("rejected", error=f"endpoint refused: {exc.reason}")
    except BadRequestTarget as exc:
        return PushOutcome("rejected", error=f"request error: {exc}")
    status = response.status
    error = f"body unreadable: {response.body_error}" if response.body_error else None
    error = redirect_error(status, response.headers.get("location")) or error
    return PushOutcome(
        classify_status(status),
        status=status,
        retry_after_s=parse_retry_after(response.headers.get("retry-after")),
        body=response.body.decode("utf-8", "replace")[:MAX_BODY_CHARS] if response.body else "",
        error=error,
    )


# ---------------------------------------------------------------- the total deadline


class AttemptDeadline:
    """The deadline of one attempt and the sockets it uses.

    Each watched socket is held as a duplicate file descriptor, so the number
    cannot be reused for another connection while the watchdog may still act
    on it; at the deadline the watchdog shuts the connection down, which wakes
    any read or write blocked on it. Closed (and its duplicates released) when
    the attempt ends.
    """

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.expired = False
        self._done = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def remaining(self) -> float:
        """Seconds left (0.0 once past)."""
        return max(0.0, self.deadline - time.monotonic())

    def watch(self, sock: socket.socket) -> None:
        """Shut ``sock`` down at this deadline (at once if it has passed)."""
        try:
            dup = socket.fromfd(sock.fileno(), sock.family, sock.type)
        except (OSError, ValueError):
            return  # already closed: nothing left to cut
        with self._lock:
            if self._done:
                dup.close()
                return
            self._sockets.append(dup)
            if self.expired:
                _shutdown(dup)

    def expire(self) -> None:
        """Called by the watchdog at the deadline."""
        with self._lock:
            if self._done:
                return
            self.expired = True
            for dup in self._sockets:
                _shutdown(dup)

    def close(self) -> None:
        with self._lock:
            self._done = True
            sockets, self._sockets = self._sockets, []
        for dup in sockets:
            dup.close()

    @property
    def done(self) -> bool:
        return self._done


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _Watchdog:
    """One daemon thread per process: expires attempts whose deadline has passed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, AttemptDeadline]] = []
        self._order = itertools.count()
        self._pid = -1

    def reset(self) -> None:
        """In a forked child: the parent's thread (and maybe its lock) did not come along."""
        self._cond = threading.Condition()
        self._heap = []
        self._pid = -1

    def add(self, attempt: AttemptDeadline) -> None:
        with self._cond:
            if self._pid != os.getpid():  # first use: start the thread
                self._pid = os.getpid()
                threading.Thread(target=self._run, args=(self._cond,), name="gov-push-watchdog", daemon=True).start()
            heapq.heappush(self._heap, (attempt.deadline, next(self._order), attempt))
            if self._heap[0][2] is attempt:  # the thread sleeps until the earliest deadline: wake it only for a new one
                self._cond.notify()

    def _run(self, cond: threading.Condition) -> None:
        with cond:
            while True:
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                if not self._heap:
                    cond.wait()
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    cond.wait(wait)
                    continue
                _, _, attempt = heapq.heappop(self._heap)
                attempt.expire()


_watchdog = _Watchdog()
os.register_at_fork(after_in_child=_watchdog.reset)
_current = threading.local()


@contextlib.contextmanager
def attempt_deadline(seconds: float) -> Iterator[AttemptDeadline]:
    """Run one attempt under a total deadline of ``seconds``.

    Connections made or reused inside the block by a deadline-aware transport
    (:func:`enforce_deadlines`) in this thread are shut down when it passes.
    """
    attempt = AttemptDeadline(seconds)
    previous = getattr(_current, "attempt", None)
    _current.attempt = attempt
    _watchdog.add(attempt)
    try:
        yield attempt
    finally:
        _current.attempt = previous
        attempt.close()


def watch_socket(sock: socket.socket) -> None:
    """Put ``sock`` under the current thread's attempt deadline, if there is one.

    For transports of one's own: call it on every connection an attempt uses.
    """
    attempt = getattr(_current, "attempt", None)
    if attempt is not None:
        attempt.watch(sock)


class _DeadlineConnection:
    """Mixed into urllib3 connection classes: every socket they use is watched."""

    sock: Any

    def _new_conn(self) -> socket.socket:
        sock: socket.socket = super()._new_conn()  # type: ignore[misc]
        watch_socket(sock)  # before TLS: a trickled handshake is cut short too
        return sock

    def request(self, *args: Any, **kwargs: Any) -> Any:
        if self.sock is not None:  # a reused connection
            watch_socket(self.sock)
        return super().request(*args, **kwargs)  # type: ignore[misc]


def _with_deadlines(pool_class: Any) -> Any:
    if getattr(pool_class, "_gov_deadlines", False):
        return pool_class
    connection = pool_class.ConnectionCls
    watched = type(f"Deadline{connection.__name__}", (_DeadlineConnection, connection), {})
    return type(f"Deadline{pool_class.__name__}", (pool_class,), {"ConnectionCls": watched, "_gov_deadlines": True})


def enforce_deadlines(session: requests.Session, url: str) -> None:
    """Make the transport ``session`` uses for ``url`` honour :func:`attempt_deadline`.

    Wraps the connection classes of that ``requests`` adapter's pool manager
    (whatever they are: a guarded transport keeps its own connect logic), once.
    A transport that is not a urllib3 pool manager is left as it is.
    """
    adapter = session.get_adapter(url)
    if getattr(adapter, "_gov_deadlines", False):
        return
    manager = getattr(adapter, "poolmanager", None)
    classes = getattr(manager, "pool_classes_by_scheme", None)
    if not isinstance(classes, dict):
        return
    if not all(isinstance(getattr(c, "ConnectionCls", None), type) and issubclass(c.ConnectionCls, HTTPConnection)
               for c in classes.values()):
        return
    manager.pool_classes_by_scheme = {scheme: _with_deadlines(c) for scheme, c in classes.items()}  # type: ignore[union-attr]
    manager.clear()  # type: ignore[union-attr]  # pools made before now would keep the old classes
    adapter._gov_deadlines = True  # type: ignore[attr-defined]


def _read_body(response: requests.Response) -> str:
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_content(1024):
        chunks.append(chunk)
        size += len(chunk)
        if size >= _BODY_READ_LIMIT:
            break  # the rest is dropped with the connection when the response closes
    return b"".join(chunks).decode("utf-8", "replace")[:MAX_BODY_CHARS]


def describe_network_error(exc: BaseException) -> str:
    """A short, stable description of a network failure, from the exception types."""
    for cause in _causes(exc):
        if isinstance(cause, requests.Timeout | socket.timeout):
            return "timeout"
        # RemoteDisconnected subclasses ConnectionResetError: test it first.
        if isinstance(cause, http.client.RemoteDisconnected):
            return "connection closed without response"
        if isinstance(cause, ConnectionResetError):
            return "connection reset"
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, socket.gaierror):
            return "name resolution failed"
        if isinstance(cause, ssl.SSLError):
            return "TLS error"
    return "connection error"


def _causes(exc: BaseException) -> Iterator[BaseException]:
    # requests wraps urllib3 errors, which wrap socket errors in args, .reason,
    # __cause__ or __context__ depending on the path taken.
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        linked = [current.__cause__, current.__context__, getattr(current, "reason", None)]
        linked.extend(arg for arg in current.args if isinstance(arg, BaseException))
        pending.extend(e for e in linked if isinstance(e, BaseException))


def topic_for(collapse_key: str, secret: bytes) -> str:
    """A deterministic, opaque Topic for ``collapse_key`` (rule 3).

    HMAC-SHA256 under ``secret``, base64url, cut to 32 characters: stable
    across retries and restarts (so a re-send replaces the stored message),
    and it tells the push service nothing about the key.
    """
    if not isinstance(secret, bytes) or not secret:
        raise ConfigurationError("topic secret: must be non-empty bytes")
    if not isinstance(collapse_key, str) or not collapse_key:
        raise InvalidMessage("collapse key: must be a non-empty string")
    digest = hmac.new(secret, collapse_key.encode("utf-8"), hashlib.sha256).digest()
    return b64url_encode(digest)[:32]


# The longest payload build_payload can make of empty strings (``null`` where a value may
# be absent, the longest beacon fields): every character of a field adds at most 6 bytes
# (a control character's \u escape; UTF-8 takes at most 4).
_EMPTY_PAYLOAD_BYTES = (len('{"title":"","body":"","tag":null,"data":{"url":null,"tier":"","id":""}}')
                        + BEACON_FIELDS_BYTES)


def surely_fits(*fields: str | None) -> bool:
    """True when a payload of these fields (title, body, tag, url, tier, id) fits whatever
    they hold; False means only that :func:`build_payload` must be asked (it measures)."""
    return _EMPTY_PAYLOAD_BYTES + 6 * sum(len(f) for f in fields if f is not None) <= MAX_PAYLOAD_BYTES


def build_payload(
    title: str,
    body: str,
    tag: str | None,
    url: str | None,
    tier: str,
    message_id: str | int,
    count: int | None = None,
    *,
    subscription_id: int | None = None,
    token: str | None = None,
) -> bytes:
    """Compact UTF-8 JSON for the service worker.

    Shape: ``{"title","body","tag","data":{"url","tier","id"}}``. Keys are
    always present (``null`` when ``None``) so the service worker sees one
    fixed shape. ``id`` is always a string: a 64-bit database id as a JSON
    number would lose precision in JavaScript, and the id is what makes a
    duplicate delivery recognisable.

    With ``token`` (the delivery's beacon token, :mod:`gov.delivery.beacon`) the
    data also carries ``sub`` (the subscription id the token covers: the worker
    echoes it, rather than the one it stored, so a push received before a renewal
    still beacons for the subscription it came to) and ``token``: at most
    :data:`BEACON_FIELDS_BYTES` bytes more.

    ``count`` marks a collapsed summary (``data.count``: how many held
    messages it stands for). The size is checked here, where the payload is
    final: a summary that would not fit with its count goes without its body
    text (title, tag and data are kept) rather than not at all. Raises
    :class:`~gov.errors.InvalidMessage` when the title is empty or the
    result still exceeds :data:`MAX_PAYLOAD_BYTES`.
    """
    if not isinstance(title, str) or not title.strip():
        # Every push must show a notification, and it needs a title.
        raise InvalidMessage("title: must be a non-empty string")
    if isinstance(message_id, bool) or not isinstance(message_id, str | int) or message_id == "":
        raise InvalidMessage("message id: must be a non-empty string or an integer")
    data: dict[str, Any] = {"url": url, "tier": tier, "id": str(message_id)}
    document: dict[str, Any] = {"title": title, "body": body, "tag": tag, "data": data}
    if count is not None:
        # a collapsed summary: how many held messages it stands for
        data["count"] = count
    if token is not None:
        if subscription_id is None:
            raise InvalidMessage("a beacon token needs the subscription id it covers")
        data["sub"] = subscription_id
        data["token"] = token
    # ensure_ascii=False: UTF-8 is smaller than \u escapes, and the budget is in bytes.
    encoded = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(encoded) > MAX_PAYLOAD_BYTES and count is not None and body:
        # a summary grew past the budget with its count: the count and the title carry it
        document["body"] = ""
        encoded = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(encoded) > MAX_PAYLOAD_BYTES:
        raise InvalidMessage(f"payload: {len(encoded)} bytes, more than the {MAX_PAYLOAD_BYTES} allowed")
    return encoded
