"""One Web Push delivery attempt, and the helpers that shape what is sent.

No database here: :func:`deliver` takes a validated request and returns a
:class:`PushOutcome` classified by HTTP status (WEBPUSH.md rule 14); deciding
what to do with the outcome (retire, retry, alarm) is the caller's job.
"""

from __future__ import annotations

import datetime
import email.utils
import hashlib
import hmac
import http.client
import json
import math
import re
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, Protocol

import requests
from pywebpush import WebPusher

from gov.errors import ConfigurationError, InvalidMessage
from gov.subscription import Subscription, b64url_encode

#: Largest plaintext that fits one aes128gcm record of 4096 bytes (rule 4):
#: 86 bytes of header + plaintext + 1 delimiter byte + 16 bytes of tag.
MAX_PAYLOAD_BYTES = 3993
URGENCIES = frozenset({"very-low", "low", "normal", "high"})
MAX_BODY_CHARS = 1000

_TOPIC = re.compile(r"[A-Za-z0-9_-]{1,32}")
# Enough to fill MAX_BODY_CHARS even with multi-byte UTF-8; a hostile endpoint
# cannot make us buffer more than this.
_BODY_READ_LIMIT = 4 * MAX_BODY_CHARS

OutcomeKind = Literal["accepted", "gone", "throttled", "transient", "rejected", "unauthorized"]


class Authorizer(Protocol):
    """What :func:`deliver` needs from a signer (:class:`gov.vapid.VapidSigner`)."""

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


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delay-seconds or HTTP-date).

    A date in the past gives 0.0; an unreadable value gives ``None``.
    """
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(int(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # a "-0000" zone gives a naive datetime; HTTP dates are UTC
        when = when.replace(tzinfo=datetime.UTC)
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


def deliver(
    request: PushRequest,
    signer: Authorizer,
    session: requests.Session,
    timeout: float = 10.0,
) -> PushOutcome:
    """Encrypt ``request`` and POST it once to its endpoint; never raises for HTTP.

    ``timeout`` (seconds) bounds the connect and each read; it must be finite
    (rule 11). ``session`` carries reused connections (rule 12) and must not be
    shared between threads. pywebpush does the aes128gcm encryption; the POST
    is made here so every header is explicit (rules 1, 5, 6, 7) and a redirect
    is never followed (a 301 turned into a GET answered 200 would look accepted).
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
    body = WebPusher(subscription.as_info()).encode(request.payload, "aes128gcm")["body"]
    try:
        response = session.post(
            subscription.endpoint,
            data=body,
            headers=headers,
            timeout=(timeout, timeout),
            allow_redirects=False,
            stream=True,  # so that a huge answer body is never buffered whole
        )
    except requests.Timeout:
        return PushOutcome("transient", error="timeout")
    except requests.ConnectionError as exc:
        return PushOutcome("transient", error=describe_network_error(exc))
    except requests.RequestException as exc:
        # Invalid URL, header or schema: sending again would fail the same way.
        return PushOutcome("rejected", error=f"request error: {type(exc).__name__}")

    with response:
        status = response.status_code
        error = None
        try:
            text = _read_body(response)
        except (requests.RequestException, OSError) as exc:
            # The status line arrived; it still decides the outcome.
            text, error = "", f"body unreadable: {describe_network_error(exc)}"
        return PushOutcome(
            classify_status(status),
            status=status,
            retry_after_s=parse_retry_after(response.headers.get("Retry-After")),
            body=text,
            error=error,
        )


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


def build_payload(
    title: str,
    body: str,
    tag: str | None,
    url: str | None,
    tier: str,
    message_id: str | int,
    count: int | None = None,
) -> bytes:
    """Compact UTF-8 JSON for the service worker.

    Shape: ``{"title","body","tag","data":{"url","tier","id"}}``. Keys are
    always present (``null`` when ``None``) so the service worker sees one
    fixed shape. ``id`` is always a string: a 64-bit database id as a JSON
    number would lose precision in JavaScript, and the id is what makes a
    duplicate delivery recognisable. Raises
    :class:`~gov.errors.InvalidMessage` when the title is empty or the
    result exceeds :data:`MAX_PAYLOAD_BYTES`.
    """
    if not isinstance(title, str) or not title.strip():
        # Every push must show a notification, and it needs a title.
        raise InvalidMessage("title: must be a non-empty string")
    if isinstance(message_id, bool) or not isinstance(message_id, str | int) or message_id == "":
        raise InvalidMessage("message id: must be a non-empty string or an integer")
    document = {
        "title": title,
        "body": body,
        "tag": tag,
        "data": {"url": url, "tier": tier, "id": str(message_id)},
    }
    if count is not None:
        # a collapsed summary: how many held messages it stands for
        document["data"]["count"] = count  # type: ignore[index]
    # ensure_ascii=False: UTF-8 is smaller than \u escapes, and the budget is in bytes.
    encoded = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(encoded) > MAX_PAYLOAD_BYTES:
        raise InvalidMessage(f"payload: {len(encoded)} bytes, more than the {MAX_PAYLOAD_BYTES} allowed")
    return encoded
