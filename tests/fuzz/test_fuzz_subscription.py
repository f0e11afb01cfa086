"""PushSubscription JSON: random JSON, and real subscriptions with one part made wrong.

Property: ``parse_subscription`` returns a Subscription that obeys every rule (https on 443
to no internal address, or http(s) on loopback in test mode only; a 65-byte P-256 point;
a 16-byte auth secret) or raises ``gov.InvalidSubscription`` naming the field — nothing else. Through
``Governor.subscribe`` against a real database: stored, or refused with nothing written.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import event, given
from hypothesis import strategies as st

from gov import Governor, InvalidInput, InvalidSubscription
from gov.delivery.subscription import Subscription, b64url_decode, is_loopback_host, parse_subscription
from gov.testing.postgres import TemplateDatabases
from tests.fuzz import FUZZ, NASTY, UNICODE


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def real_keys() -> tuple[str, str]:
    point = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    return b64(point), b64(os.urandom(16))


P256DH, AUTH = real_keys()
GOOD = {"endpoint": "https://push.example.com/send/abc123", "expirationTime": None,
        "keys": {"p256dh": P256DH, "auth": AUTH}}

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(UNICODE, max_size=20)),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(UNICODE, max_size=10),
                                                                                children, max_size=4)),
    max_leaves=12,
)
endpoints = st.one_of(
    st.sampled_from([
        "https://push.example.com/x", "http://push.example.com/x", "http://127.0.0.1:8080/x", "http://[::1]/x",
        "http://localhost/x", "http://127.0.0.1.evil.com/x", "http://169.254.169.254/latest/meta-data",
        "http://10.0.0.1/admin", "https://user:pw@push.example.com/x", "https://push.example.com/x#frag",
        "https://[::1/x", "https://push.example.com:99999/x", "https://push.example.com:-1/x", "https:///x",
        "ftp://push.example.com/x", "javascript:alert(1)", "file:///etc/passwd", "//push.example.com/x",
        "https://push.example.com/x y", "https://push.example.com/\r\nX-Injected: 1", "https://pūsh.example.com/x",
        "HTTPS://PUSH.EXAMPLE.COM/x", "https://push.example.com/" + "a" * 2100, "", " ",
    ]),
    st.builds(lambda s: "https://push.example.com/" + s, st.text(UNICODE, max_size=30)),
    st.builds(lambda s: "https://" + s + "/x", st.text(UNICODE, max_size=20)),
    st.text(UNICODE, max_size=40),
    st.integers(), st.none(),
)
key_texts = st.one_of(
    st.just(P256DH), st.just(AUTH), st.sampled_from(NASTY),
    st.builds(b64, st.binary(max_size=80)),
    st.builds(lambda k: "B" + k[1:], st.just(P256DH)),  # a point off the curve, or with a wrong prefix
    st.builds(lambda k: k + "=", st.just(AUTH)), st.builds(lambda k: k + "==", st.just(AUTH)),
    st.builds(lambda k: k.replace("-", "+").replace("_", "/"), st.just(P256DH)),
    st.text(UNICODE, max_size=100), st.integers(), st.none(),
)


@st.composite
def mutated(draw: st.DrawFn) -> Any:
    """A real subscription with one part replaced (or removed), as JSON text, bytes or a dict."""
    sub = json.loads(json.dumps(GOOD))
    part = draw(st.sampled_from(["endpoint", "p256dh", "auth", "keys", "extra", "none"]))
    if part == "endpoint":
        sub["endpoint"] = draw(endpoints)
    elif part in ("p256dh", "auth"):
        sub["keys"][part] = draw(key_texts)
    elif part == "keys":
        sub["keys"] = draw(json_values)
    elif part == "extra":
        sub[draw(st.text(UNICODE, max_size=10))] = draw(json_values)
    if draw(st.booleans()) and part != "endpoint":
        del sub[draw(st.sampled_from(sorted(sub)))]
    form = draw(st.sampled_from(["dict", "text", "bytes"]))
    if form == "dict":
        return sub
    text = json.dumps(sub)
    return text if form == "text" else text.encode()


def check_parse(data: Any, allow_loopback_http: bool) -> Subscription | None:
    try:
        sub = parse_subscription(data, allow_loopback_http=allow_loopback_http)
    except InvalidSubscription as exc:
        assert str(exc).strip() and len(str(exc)) < 500, str(exc)
        event(f"refused: {str(exc).split(':')[0]}")
        return None
    event("accepted")
    parts = urlsplit(sub.endpoint)
    assert parts.scheme.lower() == "https" or (
        allow_loopback_http and parts.scheme.lower() == "http" and is_loopback_host(parts.hostname or "")
    ), sub.endpoint
    loopback_test_mode = allow_loopback_http and is_loopback_host(parts.hostname or "")
    assert parts.port in (None, 443) or loopback_test_mode, sub.endpoint
    assert sub.endpoint.isascii() and not any(c <= " " for c in sub.endpoint)
    assert not parts.username and not parts.fragment
    point = b64url_decode(sub.p256dh)
    assert len(point) == 65 and point[0] == 4
    ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), point)
    assert len(b64url_decode(sub.auth)) == 16
    return sub


@FUZZ
@given(json_values, st.booleans())
def test_random_json(value: Any, loopback: bool) -> None:
    check_parse(value, loopback)
    check_parse(json.dumps(value), loopback)


@FUZZ
@given(st.one_of(st.binary(max_size=200), st.text(UNICODE, max_size=200)), st.booleans())
def test_random_bytes_and_text(data: Any, loopback: bool) -> None:
    check_parse(data, loopback)


@pytest.fixture(scope="module")
def sub_url(databases: TemplateDatabases) -> Iterator[str]:
    url = databases.clone()
    yield url
    databases.drop(url)


@pytest.fixture(scope="module")
def sub_gov(sub_url: str) -> Iterator[Governor]:
    with Governor(sub_url, pool_size=1, allow_loopback_http=True) as g:
        yield g


@pytest.fixture(scope="module")
def sub_conn(sub_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(sub_url, autocommit=True) as c:
        yield c


users = st.one_of(st.sampled_from(["u1", "u2", "'; DROP TABLE gov.subscriptions; --"]), st.text(UNICODE, max_size=30))


@FUZZ
@given(mutated(), users)
def test_mutated_subscriptions_are_stored_or_refused(
    sub_gov: Governor, sub_conn: psycopg.Connection[Any], data: Any, user: str
) -> None:
    before = sub_conn.execute("SELECT count(*), coalesce(max(id), 0) FROM gov.subscriptions").fetchone()
    expected = check_parse(data, True)
    try:
        sub_id = sub_gov.subscribe(user, data)
    except InvalidInput as exc:  # a bad subscription, or a bad user id
        assert expected is None or "user_id" in str(exc), exc
        assert sub_conn.execute("SELECT count(*), coalesce(max(id), 0) FROM gov.subscriptions").fetchone() == before
        return
    assert expected is not None, "stored a subscription the parser refuses"
    row = sub_conn.execute(
        "SELECT user_id, endpoint, p256dh, auth FROM gov.subscriptions WHERE id = %s AND retired_at IS NULL", (sub_id,)
    ).fetchone()
    assert row == (user, expected.endpoint, expected.p256dh, expected.auth)


# ---------------------------------------------------------------- what "https only" does and does not stop


@pytest.mark.parametrize(
    "endpoint",
    ["http://169.254.169.254/latest/meta-data/", "http://10.0.0.5:8080/admin", "http://localhost.evil.com/x",
     "http://127.0.0.1.nip.io/x"],
)
def test_plain_http_to_any_non_loopback_host_is_refused_even_in_test_mode(endpoint: str) -> None:
    with pytest.raises(InvalidSubscription, match="http"):
        parse_subscription({**GOOD, "endpoint": endpoint}, allow_loopback_http=True)


def test_plain_http_to_loopback_is_refused_outside_test_mode() -> None:
    with pytest.raises(InvalidSubscription, match="https"):
        parse_subscription({**GOOD, "endpoint": "http://127.0.0.1:8080/push/x"})


@pytest.mark.parametrize("endpoint", ["https://169.254.169.254/latest/meta-data/", "https://10.0.0.5/admin",
                                      "https://localhost/x", "https://127.0.0.1:8443/x", "https://[::1]/x",
                                      "https://192.168.1.1/x", "https://0.0.0.0/x", "https://0x7f000001/x"])
def test_https_to_an_internal_address_is_refused(endpoint: str) -> None:
    """Only push services are reachable (invariant 13, SECURITY.md): an https endpoint on an
    internal address is refused when parsed; a name that resolves to one is refused where
    the subscription is stored (Governor.subscribe) and again by the runner at connect time."""
    with pytest.raises(InvalidSubscription, match="endpoint: "):
        parse_subscription({**GOOD, "endpoint": endpoint})
