"""Validation of a browser's PushSubscription JSON.

A subscription is checked once, when it is stored (WEBPUSH.md rule 10), so the
sender can trust it later: pywebpush's own check of ``p256dh`` is broken (it
accepts a key with a wrong prefix) and it checks nothing about the endpoint.
"""

from __future__ import annotations

import base64
import binascii
import functools
import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from cryptography.hazmat.primitives.asymmetric import ec

from gov.errors import InvalidSubscription

MAX_ENDPOINT_LENGTH = 2048
P256DH_BYTES = 65
AUTH_BYTES = 16

_B64URL_BODY = re.compile(r"[A-Za-z0-9_-]*")
_DEFAULT_PORTS = {"https": 443, "http": 80}


def b64url_encode(data: bytes) -> str:
    """Encode ``data`` as unpadded base64url, the form browsers and VAPID use."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Decode base64url with optional padding; raise ``ValueError`` on anything else.

    Stricter than :func:`base64.urlsafe_b64decode`, which silently drops
    characters outside the alphabet: a key with a stray ``+`` or space is a
    corrupted key, not a slightly different one.
    """
    if not isinstance(text, str):
        raise ValueError("not a string")
    body = text.rstrip("=")
    padding = len(text) - len(body)
    if not _B64URL_BODY.fullmatch(body):
        raise ValueError("characters outside the base64url alphabet")
    if len(body) % 4 == 1:
        raise ValueError("impossible length")
    if padding and padding != -len(body) % 4:
        raise ValueError("wrong padding")
    try:
        return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except binascii.Error as exc:  # pragma: no cover - excluded by the checks above
        raise ValueError("not base64url") from exc


def is_loopback_host(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ``::1`` (``host`` without brackets)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@functools.lru_cache(maxsize=4096)
def origin_of(url: str) -> str:
    """Return the origin ``scheme://host[:port]`` of ``url`` (RFC 6454 form).

    Scheme and host are lower-cased and a default port is dropped, so that two
    spellings of one push service share one VAPID ``aud`` and one cached token.
    Raises ``ValueError`` when ``url`` has no scheme or host.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = parts.hostname  # lower-cased, brackets of an IPv6 literal removed
    if not scheme or not host:
        raise ValueError("URL has no scheme or host")
    port = parts.port  # raises ValueError on a non-numeric or out-of-range port
    if ":" in host:
        host = f"[{host}]"
    if port is None or port == _DEFAULT_PORTS.get(scheme):
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


@dataclass(frozen=True)
class Subscription:
    """A validated push subscription; keys are stored as unpadded base64url."""

    endpoint: str
    p256dh: str
    auth: str

    @property
    def origin(self) -> str:
        """The push service's origin, i.e. the VAPID ``aud`` for this endpoint."""
        return origin_of(self.endpoint)

    def as_info(self) -> dict[str, Any]:
        """The ``subscription_info`` dict pywebpush expects (a fresh copy each call)."""
        return {"endpoint": self.endpoint, "keys": {"p256dh": self.p256dh, "auth": self.auth}}


def parse_subscription(data: str | bytes | Mapping[str, Any], *, allow_loopback_http: bool = False) -> Subscription:
    """Validate a PushSubscription (JSON text or already-decoded mapping).

    The endpoint must be https on port 443 to a host that is not an internal address
    (see :mod:`gov.delivery.netguard`; a host name is resolved by :meth:`gov.Governor.subscribe`,
    not here), and under a ``GOV_PUSH_HOSTS`` suffix when that is set.
    ``allow_loopback_http`` (test mode) also admits ``http://`` or ``https://`` on any
    port to a loopback host, for tests against a local push service; never another host.
    Raises :class:`~gov.errors.InvalidSubscription` naming the field at fault.
    """
    if isinstance(data, (str, bytes, bytearray)):
        try:
            data = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise InvalidSubscription("subscription: not valid JSON") from None
    if not isinstance(data, Mapping):
        raise InvalidSubscription("subscription: must be a JSON object")

    endpoint = _check_endpoint(data.get("endpoint"), allow_loopback_http)
    keys = data.get("keys")
    if not isinstance(keys, Mapping):
        raise InvalidSubscription("subscription keys: missing or not an object")
    p256dh = _decode_key("keys.p256dh", keys.get("p256dh"))
    auth = _decode_key("keys.auth", keys.get("auth"))

    if len(p256dh) != P256DH_BYTES or p256dh[0] != 0x04:
        raise InvalidSubscription(
            f"keys.p256dh: must be a {P256DH_BYTES}-byte uncompressed P-256 point "
            f"starting 0x04 (got {len(p256dh)} bytes)"
        )
    try:
        ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), p256dh)
    except ValueError:
        raise InvalidSubscription("keys.p256dh: point is not on the P-256 curve") from None
    if len(auth) != AUTH_BYTES:
        raise InvalidSubscription(f"keys.auth: must be {AUTH_BYTES} bytes (got {len(auth)} bytes)")
    return Subscription(endpoint=endpoint, p256dh=b64url_encode(p256dh), auth=b64url_encode(auth))


def _check_endpoint(endpoint: object, allow_loopback_http: bool) -> str:
    if not isinstance(endpoint, str) or not endpoint:
        raise InvalidSubscription("endpoint: missing or not a string")
    if len(endpoint) > MAX_ENDPOINT_LENGTH:
        raise InvalidSubscription(f"endpoint: longer than {MAX_ENDPOINT_LENGTH} characters ({len(endpoint)})")
    # The endpoint goes into an HTTP request line: whitespace, control or
    # non-ASCII characters there are either corruption or header smuggling.
    if not endpoint.isascii() or any(ch <= " " or ch == "\x7f" for ch in endpoint):
        raise InvalidSubscription("endpoint: contains whitespace, control or non-ASCII characters")
    try:
        parts = urlsplit(endpoint)
    except ValueError:  # e.g. an unclosed IPv6 bracket
        raise InvalidSubscription("endpoint: not a valid URL") from None
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http"):
        raise InvalidSubscription(f"endpoint: must use https:// (got {scheme[:16] or 'no'} scheme)")
    if "@" in parts.netloc:
        raise InvalidSubscription("endpoint: must not contain user information (user@host)")
    host = parts.hostname
    if not host:
        raise InvalidSubscription("endpoint: has no host")
    try:
        _ = parts.port  # urlsplit parses the port lazily; this validates it
    except ValueError:
        raise InvalidSubscription("endpoint: invalid port") from None
    if parts.fragment:
        raise InvalidSubscription("endpoint: must not contain a fragment (#...)")
    # Where it may point (invariant 13): https on 443 to a public address, from the text
    # alone here; a host name is resolved and checked where the subscription is stored
    # (Governor.subscribe) and again by the runner when it connects. Imported here: the
    # guard brings requests and urllib3, which a command that only loads the VAPID key
    # (gov.delivery.vapid uses this module's base64 helpers) should not pay for.
    from gov.delivery.netguard import EndpointGuard

    EndpointGuard.from_env(allow_loopback_http).check_url(endpoint, resolve=False)
    return endpoint


def _decode_key(field: str, value: object) -> bytes:
    if not isinstance(value, str) or not value:
        raise InvalidSubscription(f"{field}: missing or not a string")
    try:
        return b64url_decode(value)
    except ValueError as exc:
        raise InvalidSubscription(f"{field}: not base64url ({exc})") from None
