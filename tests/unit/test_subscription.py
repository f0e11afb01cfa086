"""Validation of PushSubscription JSON (WEBPUSH.md rule 10)."""

from __future__ import annotations

import base64
import json
import os

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gov.delivery.subscription import (
    Subscription,
    b64url_decode,
    b64url_encode,
    origin_of,
    parse_subscription,
)
from gov.errors import InvalidSubscription

ENDPOINT = "https://fcm.googleapis.com/fcm/send/abc123:def"


def _point() -> bytes:
    # a fixed key: the parameters below are test ids, the same in every process (pytest-xdist)
    key = ec.derive_private_key(0x5EED_0F_7E57, ec.SECP256R1())
    return key.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)


POINT = _point()
AUTH = bytes(range(16))


def _padded(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode()


def _info(endpoint: str = ENDPOINT, p256dh: object = None, auth: object = None) -> dict:
    return {
        "endpoint": endpoint,
        "expirationTime": None,
        "keys": {
            "p256dh": b64url_encode(POINT) if p256dh is None else p256dh,
            "auth": b64url_encode(AUTH) if auth is None else auth,
        },
    }


def _refusal(data: object, **kwargs: bool) -> str:
    with pytest.raises(InvalidSubscription) as caught:
        parse_subscription(data, **kwargs)  # type: ignore[arg-type]
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_parses_a_browser_subscription_from_dict_text_and_bytes() -> None:
    info = _info()
    expected = Subscription(ENDPOINT, b64url_encode(POINT), b64url_encode(AUTH))
    assert parse_subscription(info) == expected
    assert parse_subscription(json.dumps(info)) == expected
    assert parse_subscription(json.dumps(info).encode()) == expected


def test_keys_are_normalised_to_unpadded_base64url() -> None:
    sub = parse_subscription(_info(p256dh=_padded(POINT), auth=_padded(AUTH)))
    assert "=" not in sub.p256dh and "=" not in sub.auth
    assert b64url_decode(sub.p256dh) == POINT
    assert b64url_decode(sub.auth) == AUTH


def test_as_info_is_what_pywebpush_wants_and_a_fresh_copy() -> None:
    sub = parse_subscription(_info())
    info = sub.as_info()
    assert info == {"endpoint": ENDPOINT, "keys": {"p256dh": sub.p256dh, "auth": sub.auth}}
    info["keys"]["auth"] = "changed"
    assert sub.as_info()["keys"]["auth"] == sub.auth


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("https://fcm.googleapis.com/fcm/send/x", "https://fcm.googleapis.com"),
        ("HTTPS://Push.Example.COM:443/a?b=c", "https://push.example.com"),
        ("https://push.example.com:8443/a", "https://push.example.com:8443"),
        ("http://127.0.0.1:5000/push/x", "http://127.0.0.1:5000"),
        ("http://[::1]:80/push/x", "http://[::1]"),
    ],
)
def test_origin_is_scheme_host_and_non_default_port(url: str, origin: str) -> None:
    assert origin_of(url) == origin


def test_subscription_origin_property() -> None:
    sub = parse_subscription(_info("https://updates.push.services.mozilla.com/wpush/v2/gAAA"))
    assert sub.origin == "https://updates.push.services.mozilla.com"


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://127.0.0.1:8080/push/x",
        "http://127.8.9.10/push/x",
        "http://[::1]:8080/push/x",
        "http://localhost:8080/push/x",
    ],
)
def test_loopback_http_only_when_allowed(endpoint: str) -> None:
    assert parse_subscription(_info(endpoint), allow_loopback_http=True).endpoint == endpoint
    assert "https://" in _refusal(_info(endpoint))


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://10.0.0.1/push/x",
        "http://push.example.com/x",
        "http://localhost.evil.example/x",
        "http://128.0.0.1/x",
    ],
)
def test_http_to_other_hosts_refused_even_when_loopback_allowed(endpoint: str) -> None:
    assert "loopback" in _refusal(_info(endpoint), allow_loopback_http=True)


@pytest.mark.parametrize(
    ("endpoint", "words"),
    [
        ("ftp://push.example.com/x", "https"),
        ("push.example.com/x", "https"),
        ("https:///no-host", "host"),
        ("https://user:pw@push.example.com/x", "user"),
        ("https://push.example.com@evil.example/x", "user"),
        ("https://push.example.com:99999/x", "port"),
        ("https://push.example.com/x y", "whitespace"),
        ("https://push.example.com/x\r\nX-Evil: 1", "control"),
        ("https://push.example.com/x#frag", "fragment"),
        ("https://push.example.com/" + "a" * 2030, "2048"),
        ("https://[::1/x", "not a valid URL"),
        ("", "missing"),
    ],
)
def test_bad_endpoints_refused_with_a_reason(endpoint: str, words: str) -> None:
    message = _refusal(_info(endpoint))
    assert message.startswith("endpoint:")
    assert words in message


def test_endpoint_of_exactly_2048_characters_accepted() -> None:
    endpoint = "https://push.example.com/" + "a" * (2048 - len("https://push.example.com/"))
    assert parse_subscription(_info(endpoint)).endpoint == endpoint


def _off_curve() -> bytes:
    # Same x, y nudged by one: no longer satisfies y^2 = x^3 - 3x + b.
    y = int.from_bytes(POINT[33:], "big") ^ 1
    return POINT[:33] + y.to_bytes(32, "big")


def _compressed() -> bytes:
    key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), POINT)
    return key.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint)


@pytest.mark.parametrize(
    ("p256dh", "words"),
    [
        (b64url_encode(b"\x05" + POINT[1:]), "0x04"),  # pywebpush accepts this one
        (b64url_encode(POINT[:64]), "64 bytes"),
        (b64url_encode(POINT + b"\x00"), "66 bytes"),
        (b64url_encode(_compressed()), "33 bytes"),
        (b64url_encode(_off_curve()), "curve"),
        (base64.b64encode(b"\xfb\xff" + POINT[2:]).decode(), "base64url"),  # '+' and '/'
        (b64url_encode(POINT)[:-1] + "!", "base64url"),
        (b64url_encode(POINT) + "=====", "base64url"),
        (12345, "not a string"),
        ("", "missing"),
    ],
)
def test_bad_p256dh_refused(p256dh: object, words: str) -> None:
    message = _refusal(_info(p256dh=p256dh))
    assert message.startswith("keys.p256dh:")
    assert words in message


@pytest.mark.parametrize(
    ("auth", "words"),
    [
        (b64url_encode(bytes(range(15))), "15 bytes"),
        (b64url_encode(bytes(range(17))), "17 bytes"),
        ("a", "base64url"),
        (None, "missing"),
    ],
)
def test_bad_auth_refused(auth: object, words: str) -> None:
    info = _info()
    info["keys"]["auth"] = auth
    message = _refusal(info)
    assert message.startswith("keys.auth:")
    assert words in message


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ("{not json", "JSON"),
        (b"\xff\xfe", "JSON"),
        ("[1, 2]", "object"),
        ({"endpoint": ENDPOINT}, "keys"),
        ({"endpoint": ENDPOINT, "keys": "x"}, "keys"),
        ({"keys": {}}, "endpoint"),
    ],
)
def test_malformed_documents_refused(data: object, words: str) -> None:
    assert words in _refusal(data)


def test_invalid_subscription_is_a_value_error() -> None:
    # Callers that only know ValueError still catch it.
    with pytest.raises(ValueError):
        parse_subscription("{}")


@pytest.mark.parametrize("length", range(0, 40))
def test_b64url_round_trip(length: int) -> None:
    data = os.urandom(length)
    assert b64url_decode(b64url_encode(data)) == data
    assert b64url_decode(_padded(data)) == data
