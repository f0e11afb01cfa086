"""Subscribe tokens: the app's word that a browser may subscribe for one of its users.

A browser never names the user it subscribes for: anyone could name anyone and receive
their notifications. The app, which knows who is logged in, signs a short-lived token
for that user (:func:`mint_subscribe_token`) and hands it to its page; ``gov serve``'s
``POST /subscriptions`` stores the subscription for the user in the token, and for no
other (:func:`verify_subscribe_token`).

The token is ``v1.<user id, base64url>.<expiry, unix seconds>.<HMAC-SHA256, base64url>``,
the HMAC taken under the server secret over ``gov-subscribe-v1``, the user id and the
expiry, each followed by a newline. Any language can mint one; this module is the
reference. The secret comes from ``GOV_SUBSCRIBE_SECRET`` or the file named by
``GOV_SUBSCRIBE_SECRET_FILE`` (:func:`secret_from_env`), never from source.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Mapping

from gov.delivery.beacon import read_secret
from gov.delivery.subscription import b64url_decode, b64url_encode
from gov.errors import ConfigurationError, InvalidInput
from gov.message import MAX_ID_LENGTH, Message

ENV_SECRET = "GOV_SUBSCRIBE_SECRET"
ENV_SECRET_FILE = "GOV_SUBSCRIBE_SECRET_FILE"
MIN_SECRET_BYTES = 32  # a shorter secret could be searched for
DEFAULT_TTL_S = 600  # ten minutes: the page uses it at once, on a click
MAX_TTL_S = 86_400  # a day: a token is not a session
MAX_TOKEN_LENGTH = 32 + 4 * MAX_ID_LENGTH  # the longest user id's base64url, with room to spare
_VERSION = "v1"
_LABEL = b"gov-subscribe-v1\n"


class InvalidToken(InvalidInput):
    """A subscribe token was refused: malformed, tampered with, expired or for another user."""


def _check_secret(secret: bytes) -> bytes:
    if not isinstance(secret, bytes) or len(secret) < MIN_SECRET_BYTES:
        raise ConfigurationError(f"the subscribe secret must be at least {MIN_SECRET_BYTES} bytes")
    return secret


def secret_from_env(environ: Mapping[str, str] = os.environ) -> bytes | None:
    """The subscribe secret from ``GOV_SUBSCRIBE_SECRET`` or ``GOV_SUBSCRIBE_SECRET_FILE``; None if neither.

    Raises :class:`~gov.errors.ConfigurationError` when both are set, when the file
    cannot be read, or when the secret is shorter than :data:`MIN_SECRET_BYTES`.
    Surrounding whitespace (a file's trailing newline) is not part of it.
    """
    return read_secret(environ, ENV_SECRET, ENV_SECRET_FILE)


def _mac(secret: bytes, user_b64: str, expiry: str) -> str:
    signed = _LABEL + user_b64.encode("ascii") + b"\n" + expiry.encode("ascii") + b"\n"
    return b64url_encode(hmac.new(secret, signed, hashlib.sha256).digest())


def mint_subscribe_token(secret: bytes, user_id: str, *, ttl_s: int = DEFAULT_TTL_S, now: float | None = None) -> str:
    """A token that lets one browser subscribe for ``user_id`` for the next ``ttl_s`` seconds.

    Mint it in your backend for the logged-in user, when the page asks; never for a user
    id the browser chose.
    """
    _check_secret(secret)
    Message(user_id=user_id, id="-", tier="P0")  # the user id rules of every message
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int) or not 1 <= ttl_s <= MAX_TTL_S:
        raise InvalidInput(f"ttl_s must be whole seconds from 1 to {MAX_TTL_S}, got {ttl_s!r}")
    expiry = str(int(time.time() if now is None else now) + ttl_s)
    user_b64 = b64url_encode(user_id.encode("utf-8"))
    return f"{_VERSION}.{user_b64}.{expiry}.{_mac(secret, user_b64, expiry)}"


def verify_subscribe_token(secret: bytes, token: object, *, user_id: str | None = None,
                           now: float | None = None) -> str:
    """The user id ``token`` was minted for; raises :class:`InvalidToken` otherwise.

    Refuses a malformed token, a wrong signature (compared in constant time, before the
    expiry or the user is looked at), an expired one, and, when ``user_id`` is given,
    one minted for another user.
    """
    _check_secret(secret)
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_LENGTH or not token.isascii():
        raise InvalidToken("subscribe token: malformed")
    parts = token.split(".")
    if len(parts) != 4 or parts[0] != _VERSION or not parts[2].isdigit() or len(parts[2]) > 12:
        raise InvalidToken("subscribe token: malformed")
    _, user_b64, expiry, mac = parts
    try:
        expected = _mac(secret, user_b64, expiry)
    except UnicodeEncodeError:  # pragma: no cover - isascii above
        raise InvalidToken("subscribe token: malformed") from None
    if not hmac.compare_digest(expected.encode("ascii"), mac.encode("ascii")):
        raise InvalidToken("subscribe token: bad signature")
    if int(expiry) <= (time.time() if now is None else now):
        raise InvalidToken("subscribe token: expired; mint a new one")
    try:
        owner = b64url_decode(user_b64).decode("utf-8")
    except (ValueError, UnicodeDecodeError):  # pragma: no cover - only a signed token gets here
        raise InvalidToken("subscribe token: malformed") from None
    if user_id is not None and not hmac.compare_digest(owner.encode("utf-8"), user_id.encode("utf-8")):
        raise InvalidToken("subscribe token: minted for another user")
    return owner
