"""Beacon tokens: proof that a display, click, close or unsubscribe comes from the browser
that received the push (invariant 15).

User ids and message ids are rarely secret (campaign ids are often guessable), so a beacon
that names them proves nothing. The push payload, though, is encrypted end to end to the
subscriber's browser (RFC 8291): a value in it is known to that browser and to gov only.
The runner puts in each delivery's payload a token, an HMAC-SHA-256 under a server secret
over the user id, the message id and the subscription id the payload goes to, cut to 128
bits and written in base64url (22 characters); ``gov serve``'s ``POST /events`` recomputes it
and compares in constant time (:meth:`BeaconKeys.verify`). A token is worth one event of each
kind for one delivery (events are idempotent per user, message, subscription and kind), and
nothing else.

The signed bytes are ``gov-beacon-v1`` and then, for the user id and the message id, their
UTF-8 length as 4 bytes big-endian followed by the bytes, then the subscription id as 8
bytes big-endian: no two different triples sign the same bytes, whatever the ids contain.

The secret comes from ``GOV_BEACON_SECRET`` or the file ``GOV_BEACON_SECRET_FILE`` names (at
least 32 bytes); on rotation the one before stays in ``GOV_BEACON_SECRET_PREVIOUS`` (or
``_PREVIOUS_FILE``) and is still accepted, while new tokens are always made with the current
one. Every process that delivers (``gov dispatch``, ``gov release``, ``gov send``, the app's
:class:`gov.Governor`) and ``gov serve`` read the same variables.

This module has no dependency beyond the standard library: the runner and the message
checks import it without FastAPI.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gov.errors import ConfigurationError

ENV_SECRET = "GOV_BEACON_SECRET"
ENV_SECRET_FILE = "GOV_BEACON_SECRET_FILE"
ENV_PREVIOUS = "GOV_BEACON_SECRET_PREVIOUS"
ENV_PREVIOUS_FILE = "GOV_BEACON_SECRET_PREVIOUS_FILE"
MIN_SECRET_BYTES = 32  # a shorter secret could be searched for
TOKEN_BYTES = 16  # 128 bits of the HMAC: forging one is guessing 2**128 values, one request each
TOKEN_CHARS = 22  # base64url of 16 bytes, unpadded
MAX_SUBSCRIPTION_ID = 2**63 - 1  # gov.subscriptions.id is a bigint
_LABEL = b"gov-beacon-v1"
_B64URL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def read_secret(environ: Mapping[str, str], name: str, file_name: str, *,
                minimum: int = MIN_SECRET_BYTES) -> bytes | None:
    """A secret from the variable ``name`` or the file ``file_name`` names; None if neither is set.

    Raises :class:`~gov.errors.ConfigurationError` (one line, never quoting the value) when
    both are set, when the file cannot be read, or when the secret is shorter than
    ``minimum`` bytes. Surrounding whitespace (a file's trailing newline) is not part of it.
    """
    value, path = environ.get(name, "").strip(), environ.get(file_name, "").strip()
    if value and path:
        raise ConfigurationError(f"set {name} or {file_name}, not both")
    if path:
        try:
            value = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"{file_name}: cannot read {path}: {exc}") from None
    if not value:
        return None
    secret = value.encode("utf-8")
    if len(secret) < minimum:
        raise ConfigurationError(
            f"{file_name if path else name} must be at least {minimum} bytes "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return secret


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def signed_bytes(user_id: str, message_id: str, subscription_id: int) -> bytes:
    """What a beacon token signs: the label, then each id length-prefixed (never ambiguous)."""
    if isinstance(subscription_id, bool) or not isinstance(subscription_id, int) or not (
        0 < subscription_id <= MAX_SUBSCRIPTION_ID
    ):
        raise ValueError(f"subscription id must be a positive 64-bit integer, got {subscription_id!r}")
    user, message = user_id.encode("utf-8"), message_id.encode("utf-8")  # UnicodeEncodeError: not text
    return (_LABEL + len(user).to_bytes(4, "big") + user + len(message).to_bytes(4, "big") + message
            + subscription_id.to_bytes(8, "big"))


def beacon_token(secret: bytes, user_id: str, message_id: str, subscription_id: int) -> str:
    """The token of one delivery: HMAC-SHA-256 under ``secret``, its first 16 bytes, base64url."""
    digest = hmac.new(secret, signed_bytes(user_id, message_id, subscription_id), hashlib.sha256).digest()
    return _b64url(digest[:TOKEN_BYTES])


@dataclass(frozen=True)
class BeaconKeys:
    """The current beacon secret, and the previous one during a rotation.

    Tokens are made with ``current`` only; :meth:`verify` accepts either.
    """

    current: bytes
    previous: bytes | None = None
    _all: tuple[bytes, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, secret in (("current", self.current), ("previous", self.previous)):
            if secret is None and name == "previous":
                continue
            if not isinstance(secret, bytes) or len(secret) < MIN_SECRET_BYTES:
                raise ConfigurationError(f"the {name} beacon secret must be at least {MIN_SECRET_BYTES} bytes")
        keys = (self.current,) if self.previous is None else (self.current, self.previous)
        object.__setattr__(self, "_all", keys)

    def __repr__(self) -> str:  # never the secrets
        return f"BeaconKeys(previous={'set' if self.previous is not None else 'none'})"

    def mint(self, user_id: str, message_id: str, subscription_id: int) -> str:
        """The token for one delivery, under the current secret."""
        return beacon_token(self.current, user_id, message_id, subscription_id)

    def verify(self, token: object, user_id: str, message_id: str, subscription_id: object) -> bool:
        """True when ``token`` was made by a configured secret for exactly these three ids.

        Compared in constant time against every configured secret (all of them, whichever
        matches), so the time taken says nothing about the token or about which secret made it.
        """
        if not isinstance(token, str) or len(token) != TOKEN_CHARS or not set(token) <= _B64URL:
            return False
        if isinstance(subscription_id, bool) or not isinstance(subscription_id, int):
            return False
        try:
            expected = [beacon_token(key, user_id, message_id, subscription_id) for key in self._all]
        except (ValueError, UnicodeEncodeError):
            return False
        given = token.encode("ascii")
        matches = [hmac.compare_digest(e.encode("ascii"), given) for e in expected]
        return any(matches)


def keys_from_env(environ: Mapping[str, str] = os.environ) -> BeaconKeys | None:
    """The beacon keys from ``GOV_BEACON_SECRET[_FILE]`` and ``GOV_BEACON_SECRET_PREVIOUS[_FILE]``.

    None when no current secret is set. Raises :class:`~gov.errors.ConfigurationError` for a
    weak or unreadable secret, and for a previous secret without a current one (it would
    accept old tokens while no new one could be made).
    """
    current = read_secret(environ, ENV_SECRET, ENV_SECRET_FILE)
    previous = read_secret(environ, ENV_PREVIOUS, ENV_PREVIOUS_FILE)
    if current is None:
        if previous is not None:
            raise ConfigurationError(f"{ENV_PREVIOUS} is set without {ENV_SECRET}: set the current secret too")
        return None
    return BeaconKeys(current, previous)


#: A placeholder of the longest beacon fields a payload carries (the size check's worst case).
PLACEHOLDER_TOKEN = "A" * TOKEN_CHARS
