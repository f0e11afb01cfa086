"""VAPID (RFC 8292) key handling and per-origin token signing.

The key is loaded once at start and checked (WEBPUSH.md rule 9); loading never
creates a key as a side effect, unlike py_vapid's ``Vapid.from_file``. Tokens
are ES256 JWTs signed here with ``cryptography``, with claims built fresh for
each origin, because pywebpush writes ``aud``/``exp`` into the claims dict it is
given and a shared dict sends one push service's ``aud`` to another (rule 8).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from gov.delivery.subscription import b64url_decode, b64url_encode, origin_of
from gov.errors import ConfigurationError, InvalidSubscription

ENV_PRIVATE_KEY = "GOV_VAPID_PRIVATE_KEY"
ENV_SUBJECT = "GOV_VAPID_SUBJECT"
ENV_PUBLIC_KEY = "GOV_VAPID_PUBLIC_KEY"

#: Lifetime of a token. RFC 8292 allows at most 24 h; 12 h absorbs clock skew.
TOKEN_LIFETIME_S = 12 * 3600
#: A cached token is re-signed once less than this much validity remains.
RESIGN_MARGIN_S = 3600

# Origins are few (one per push service); the bound only stops a flood of
# subscriptions on made-up hosts from growing the cache without limit.
_MAX_CACHED_ORIGINS = 1024
_MAX_KEY_FILE_BYTES = 64 * 1024
_RAW_SCALAR = re.compile(r"[A-Za-z0-9_-]{43}=?")
_LOOKS_ENCODED = re.compile(r"[A-Za-z0-9+/_=-]{40,}")
_DNS_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_JWT_HEADER = b64url_encode(b'{"typ":"JWT","alg":"ES256"}')


def public_key_of(private_key: ec.EllipticCurvePrivateKey) -> str:
    """The browser's ``applicationServerKey``: unpadded base64url uncompressed point."""
    return b64url_encode(
        private_key.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    )


def generate_keypair(path: Path | str) -> str:
    """Create a new P-256 key, write it as PEM to ``path`` (mode 0600), return its public key.

    Refuses to overwrite an existing file: replacing a VAPID key silently
    invalidates every subscription created with the old one.
    """
    path = Path(path)
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    try:
        # O_EXCL makes "refuse to overwrite" atomic; 0600 is set at creation so
        # the key is never readable by others, not even for a moment.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigurationError(f"refusing to overwrite existing VAPID key file {path}") from None
    except OSError as exc:
        raise ConfigurationError(f"cannot create VAPID key file {path}: {exc.strerror}") from None
    try:
        os.fchmod(fd, 0o600)  # the umask may have narrowed it; make it exact
        with os.fdopen(fd, "wb") as handle:
            handle.write(pem)
    except OSError as exc:
        path.unlink(missing_ok=True)  # never leave a truncated key behind
        raise ConfigurationError(f"cannot write VAPID key file {path}: {exc.strerror}") from None
    return public_key_of(key)


def load_private_key(value: str) -> ec.EllipticCurvePrivateKey:
    """Load a VAPID private key from a PEM file path, PEM text, or raw scalar.

    The raw form is the unpadded base64url 32-byte scalar printed by
    ``web-push generate-vapid-keys``. Raises
    :class:`~gov.errors.ConfigurationError`; messages never quote key material.
    """
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError("VAPID private key: empty value")
    text = value.strip()
    if "-----BEGIN" in text:
        return _from_pem(text.encode("ascii", "replace"), "PEM text")
    if _RAW_SCALAR.fullmatch(text):
        return _from_raw(text, "value")
    return _from_file(text)


def validate_subject(subject: str) -> None:
    """Check a VAPID ``sub``: ``mailto:`` with a real domain, or an ``https:`` URL.

    Apple's push service rejects ``@localhost``; a domain without a dot or an
    IP address is no way to reach the sender's operator either.
    Raises :class:`~gov.errors.ConfigurationError`.
    """
    if not isinstance(subject, str) or not subject:
        raise ConfigurationError("VAPID subject: empty")
    if subject.lower().startswith("mailto:"):
        address = subject[len("mailto:") :]
        local, at, domain = address.rpartition("@")
        if not at or not local or any(ch.isspace() or ch in "<>" for ch in local):
            raise ConfigurationError("VAPID subject: mailto: needs an address user@domain")
        _check_domain(domain)
        return
    parts = urlsplit(subject)
    if parts.scheme.lower() == "https":
        if "@" in parts.netloc or not parts.hostname:
            raise ConfigurationError("VAPID subject: https: URL needs a host and no user@")
        _check_domain(parts.hostname)
        return
    raise ConfigurationError("VAPID subject: must start with mailto: or https:")


def _check_domain(domain: str) -> None:
    labels = domain.lower().split(".")
    if len(labels) < 2 or not all(_DNS_LABEL.fullmatch(label) for label in labels):
        raise ConfigurationError(f"VAPID subject: {domain!r} is not a full domain name")
    if labels[-1] == "localhost":
        raise ConfigurationError("VAPID subject: localhost is refused by push services")
    if labels[-1].isdigit():
        raise ConfigurationError("VAPID subject: use a domain name, not an IP address")


def _check_p256(key: object) -> ec.EllipticCurvePrivateKey:
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ConfigurationError("VAPID private key: not a P-256 (prime256v1) EC key")
    return key


def _from_pem(data: bytes, source: str) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise ConfigurationError(f"VAPID private key ({source}): encrypted; a password-less key is required") from None
    except (ValueError, UnsupportedAlgorithm):
        # cryptography's message is dropped on purpose: it might echo input.
        raise ConfigurationError(f"VAPID private key ({source}): malformed PEM") from None
    return _check_p256(key)


def _from_raw(text: str, source: str) -> ec.EllipticCurvePrivateKey:
    scalar = int.from_bytes(b64url_decode(text), "big")
    try:
        return ec.derive_private_key(scalar, ec.SECP256R1())
    except ValueError:
        raise ConfigurationError(f"VAPID private key ({source}): 32-byte value is not a valid P-256 scalar") from None


def _from_file(text: str) -> ec.EllipticCurvePrivateKey:
    # A mistyped raw key would otherwise be quoted back as a "file name";
    # only echo values that look like paths rather than encoded keys.
    shown = text if not _LOOKS_ENCODED.fullmatch(text) and "\n" not in text else "<value>"
    path = Path(text).expanduser()
    try:
        exists = path.is_file()
    except (OSError, ValueError):  # e.g. an embedded NUL byte or a name too long
        exists = False
    if not exists:
        raise ConfigurationError(
            f"VAPID private key: {shown} is neither an existing file, PEM text, nor a base64url 32-byte scalar"
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"VAPID private key file {shown} could not be read: {exc.strerror}") from None
    if len(data) > _MAX_KEY_FILE_BYTES:
        raise ConfigurationError(f"VAPID private key file {shown} is too large to be a key")
    if b"-----BEGIN" in data:
        return _from_pem(data, f"file {shown}")
    content = data.decode("ascii", "replace").strip()
    if _RAW_SCALAR.fullmatch(content):
        return _from_raw(content, f"file {shown}")
    raise ConfigurationError(f"VAPID private key file {shown}: neither PEM nor a base64url 32-byte scalar")


class VapidSigner:
    """Signs VAPID ``Authorization`` headers with one key, one token per origin.

    Thread-safe: one signer is meant to be shared by every sending worker.
    """

    def __init__(self, private_key: ec.EllipticCurvePrivateKey, subject: str) -> None:
        """Wrap a P-256 ``private_key`` and a ``subject`` checked by :func:`validate_subject`."""
        self._key = _check_p256(private_key)
        validate_subject(subject)
        self._subject = subject
        self._public_key = public_key_of(private_key)
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[int, str]] = {}  # origin -> (exp, header)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> VapidSigner:
        """Build a signer from ``GOV_VAPID_PRIVATE_KEY`` and ``GOV_VAPID_SUBJECT``.

        When ``GOV_VAPID_PUBLIC_KEY`` is set it must be the public key of the
        private one: a mismatch means browsers subscribed with another key and
        every push would be refused, so it is better to fail at start.
        """
        raw_key = environ.get(ENV_PRIVATE_KEY, "").strip()
        if not raw_key:
            raise ConfigurationError(f"{ENV_PRIVATE_KEY} is not set (a PEM file path, PEM text or raw key)")
        subject = environ.get(ENV_SUBJECT, "").strip()
        if not subject:
            raise ConfigurationError(f"{ENV_SUBJECT} is not set (mailto:you@example.com or an https: URL)")
        signer = cls(load_private_key(raw_key), subject)
        expected = environ.get(ENV_PUBLIC_KEY, "").strip()
        if expected:
            try:
                expected_bytes = b64url_decode(expected)
            except ValueError:
                raise ConfigurationError(f"{ENV_PUBLIC_KEY} is not base64url") from None
            if expected_bytes != b64url_decode(signer.public_key):
                raise ConfigurationError(
                    f"{ENV_PUBLIC_KEY} mismatch: the private key's public key is {signer.public_key}, not {expected}"
                )
        return signer

    def __repr__(self) -> str:
        return f"VapidSigner(public_key={self._public_key!r}, subject={self._subject!r})"

    @property
    def public_key(self) -> str:
        """The ``applicationServerKey`` browsers must subscribe with (base64url)."""
        return self._public_key

    @property
    def subject(self) -> str:
        """The ``sub`` claim: how the push service can reach the operator."""
        return self._subject

    def derived_secret(self, label: bytes) -> bytes:
        """A 32-byte secret derived from the private key for ``label`` (HKDF-SHA256).

        Lets a process key other things (such as Topic HMACs) without a second
        secret to configure. Deterministic for one key and label; different
        labels give independent secrets, and none reveals the private key.
        Rotating the VAPID key changes every derived secret.
        """
        if not isinstance(label, bytes) or not label:
            raise ValueError("label must be non-empty bytes")
        scalar = self._key.private_numbers().private_value.to_bytes(32, "big")
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"gov-vapid-derived:" + label).derive(scalar)

    def authorization(self, endpoint_or_origin: str, now: float | None = None) -> str:
        """Return the ``Authorization`` header value ``vapid t=<jwt>,k=<key>``.

        ``aud`` is the origin of ``endpoint_or_origin``; the token is reused
        for that origin until less than :data:`RESIGN_MARGIN_S` of its
        :data:`TOKEN_LIFETIME_S` remains. ``now`` (Unix seconds) is for tests.
        """
        try:
            origin = origin_of(endpoint_or_origin)
        except ValueError:
            raise InvalidSubscription("endpoint: has no scheme or host") from None
        now = time.time() if now is None else now
        with self._lock:
            cached = self._cache.get(origin)
            # The upper bound re-signs after the clock stepped backwards, which
            # would otherwise leave exp more than 24 h ahead (refused).
            if cached and RESIGN_MARGIN_S <= cached[0] - now <= TOKEN_LIFETIME_S:
                return cached[1]
            exp = int(now) + TOKEN_LIFETIME_S
            header = f"vapid t={self._sign(origin, exp)},k={self._public_key}"
            if len(self._cache) >= _MAX_CACHED_ORIGINS:
                self._evict(now)
            self._cache[origin] = (exp, header)
            return header

    def _sign(self, origin: str, exp: int) -> str:
        # A fresh dict per token; sorted keys because Chrome was seen to want them.
        claims = {"aud": origin, "exp": exp, "sub": self._subject}
        payload = b64url_encode(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode())
        signing_input = f"{_JWT_HEADER}.{payload}"
        der = self._key.sign(signing_input.encode("ascii"), ec.ECDSA(hashes.SHA256()))
        r, s = decode_dss_signature(der)
        # JWS (RFC 7518) wants the raw fixed-width r||s, not the DER cryptography returns.
        signature = b64url_encode(r.to_bytes(32, "big") + s.to_bytes(32, "big"))
        return f"{signing_input}.{signature}"

    def _evict(self, now: float) -> None:
        stale = [o for o, (exp, _) in self._cache.items() if exp - now < RESIGN_MARGIN_S]
        for origin in stale:
            del self._cache[origin]
        if len(self._cache) >= _MAX_CACHED_ORIGINS:
            self._cache.clear()
