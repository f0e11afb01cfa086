"""Beacon tokens (gov.delivery.beacon): what they sign, how long they are, how they are checked,
and where their secret comes from."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from pathlib import Path

import pytest

from gov.delivery.beacon import (
    ENV_PREVIOUS,
    ENV_PREVIOUS_FILE,
    ENV_SECRET,
    ENV_SECRET_FILE,
    MAX_SUBSCRIPTION_ID,
    TOKEN_BYTES,
    TOKEN_CHARS,
    BeaconKeys,
    beacon_token,
    keys_from_env,
    signed_bytes,
)
from gov.delivery.push import BEACON_FIELDS_BYTES, MAX_PAYLOAD_BYTES, build_payload
from gov.errors import ConfigurationError, InvalidMessage
from gov.message import Message

SECRET = b"s" * 32
OTHER = b"o" * 32


def test_a_token_is_deterministic_and_128_bits_of_base64url() -> None:
    token = beacon_token(SECRET, "victim", "m1", 7)
    assert token == beacon_token(SECRET, "victim", "m1", 7)
    assert TOKEN_BYTES * 8 >= 128 and len(token) == TOKEN_CHARS == 22
    raw = base64.urlsafe_b64decode(token + "==")
    assert len(raw) == TOKEN_BYTES
    # the first 16 bytes of HMAC-SHA-256 over the documented bytes: any language can check it
    expected = hmac.new(SECRET, b"gov-beacon-v1" + b"\x00\x00\x00\x06victim" + b"\x00\x00\x00\x02m1"
                        + (7).to_bytes(8, "big"), hashlib.sha256).digest()[:16]
    assert raw == expected
    assert beacon_token(OTHER, "victim", "m1", 7) != token


@pytest.mark.parametrize(("a", "b"), [
    (("ab", "c", 1), ("a", "bc", 1)),          # where one id ends and the next begins
    (("a\n", "b", 1), ("a", "\nb", 1)),        # a separator inside an id
    (("a", "b", 256), ("a", "b\x00", 1)),      # the subscription id's bytes against the message's
    (("a", "b" + "\x00" * 8, 1), ("a", "b", 1)),
    (("é", "m", 1), ("e\u0301", "m", 1)),      # the same-looking text, different code points
])
def test_the_encoding_is_not_ambiguous(a: tuple[str, str, int], b: tuple[str, str, int]) -> None:
    assert signed_bytes(*a) != signed_bytes(*b)
    assert beacon_token(SECRET, *a) != beacon_token(SECRET, *b)


def test_verify_takes_exactly_the_three_ids_and_a_configured_secret() -> None:
    keys = BeaconKeys(SECRET)
    token = keys.mint("victim", "m1", 7)
    assert keys.verify(token, "victim", "m1", 7)
    assert not keys.verify(token, "other", "m1", 7)
    assert not keys.verify(token, "victim", "m2", 7)
    assert not keys.verify(token, "victim", "m1", 8)
    assert not keys.verify(beacon_token(OTHER, "victim", "m1", 7), "victim", "m1", 7)
    # a prefix, a longer token, another alphabet, not a string, a bad subscription id: refused
    for bad in (token[:16], token + "A", token[:-1] + "+", token.encode(), None, ""):
        assert not keys.verify(bad, "victim", "m1", 7), bad
    for sub in (None, True, 0, -1, MAX_SUBSCRIPTION_ID + 1, "7"):
        assert not keys.verify(token, "victim", "m1", sub)
    assert not keys.verify(token, "\ud800", "m1", 7)  # not text: refused, not raised


def test_rotation_accepts_the_previous_secret_and_mints_with_the_current() -> None:
    old = BeaconKeys(OTHER)
    old_token = old.mint("u", "m", 1)
    rotated = BeaconKeys(SECRET, previous=OTHER)
    assert rotated.verify(old_token, "u", "m", 1)
    assert rotated.mint("u", "m", 1) == BeaconKeys(SECRET).mint("u", "m", 1)
    # once the previous secret is dropped, its tokens are refused
    assert not BeaconKeys(SECRET).verify(old_token, "u", "m", 1)
    assert "s" * 32 not in repr(rotated) and "o" * 32 not in repr(rotated)


def test_a_weak_secret_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="at least 32 bytes"):
        BeaconKeys(b"short")
    with pytest.raises(ConfigurationError, match="previous"):
        BeaconKeys(SECRET, previous=b"short")


def test_keys_from_the_environment_or_files(tmp_path: Path) -> None:
    current, previous = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    assert keys_from_env({}) is None
    keys = keys_from_env({ENV_SECRET: current})
    assert keys is not None and keys.current == current.encode() and keys.previous is None
    (tmp_path / "now").write_text(current + "\n")
    (tmp_path / "before").write_text(previous + "\n")
    keys = keys_from_env({ENV_SECRET_FILE: str(tmp_path / "now"), ENV_PREVIOUS_FILE: str(tmp_path / "before")})
    assert keys == BeaconKeys(current.encode(), previous.encode())
    for environ, match in (
        ({ENV_SECRET: "too short"}, f"^{ENV_SECRET} must be at least 32 bytes"),
        ({ENV_SECRET: current, ENV_PREVIOUS: "x" * 31}, f"^{ENV_PREVIOUS} must be at least 32 bytes"),
        ({ENV_SECRET: current, ENV_SECRET_FILE: str(tmp_path / "now")}, "not both"),
        ({ENV_SECRET_FILE: str(tmp_path / "missing")}, "cannot read"),
        ({ENV_PREVIOUS: previous}, "without GOV_BEACON_SECRET"),
    ):
        with pytest.raises(ConfigurationError, match=match) as caught:
            keys_from_env(environ)
        assert "\n" not in str(caught.value) and current not in str(caught.value)


def test_the_payload_carries_the_token_and_its_subscription() -> None:
    token = BeaconKeys(SECRET).mint("u", "spring-1", 12345)
    bare = build_payload("Spring sale", "", "spring-1", "https://shop.example/sale", "P2", "spring-1")
    signed = build_payload("Spring sale", "", "spring-1", "https://shop.example/sale", "P2", "spring-1",
                           subscription_id=12345, token=token)
    assert json.loads(signed)["data"] == {"url": "https://shop.example/sale", "tier": "P2", "id": "spring-1",
                                          "sub": 12345, "token": token}
    # what it costs: ,"sub":12345 (12 bytes) and ,"token":"<22>" (33 bytes); at most 59
    assert len(signed) - len(bare) == 12 + 33
    assert BEACON_FIELDS_BYTES == 59
    with pytest.raises(InvalidMessage, match="subscription id"):
        build_payload("t", "", None, None, "P2", "m", token=token)


def test_a_message_that_fits_only_without_the_beacon_fields_is_refused_before_anything_is_recorded() -> None:
    empty = len(build_payload("T", "", "m", None, "P2", "m"))
    fits_bare = Message(user_id="u", id="m", tier="P2", title="T", body="b" * (MAX_PAYLOAD_BYTES - empty))
    with pytest.raises(InvalidMessage, match="bytes"):
        fits_bare.content()
    room = MAX_PAYLOAD_BYTES - empty - BEACON_FIELDS_BYTES
    fits = Message(user_id="u", id="m", tier="P2", title="T", body="b" * room)
    fits.content()
    # and what the runner then builds, with the largest subscription id, still fits one record
    longest = build_payload("T", "b" * room, "m", None, "P2", "m", subscription_id=MAX_SUBSCRIPTION_ID,
                            token=BeaconKeys(SECRET).mint("u", "m", MAX_SUBSCRIPTION_ID))
    assert len(longest) == MAX_PAYLOAD_BYTES
