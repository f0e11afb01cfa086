"""Subscribe tokens: minted for one user, refused when expired, tampered with, or shown for another."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from gov.errors import ConfigurationError, InvalidInput
from gov.http.tokens import (
    MIN_SECRET_BYTES,
    InvalidToken,
    mint_subscribe_token,
    secret_from_env,
    verify_subscribe_token,
)

SECRET = secrets.token_bytes(32)
NOW = 1_800_000_000


def test_round_trip_names_the_user() -> None:
    token = mint_subscribe_token(SECRET, "user-ü/42", ttl_s=600, now=NOW)
    assert verify_subscribe_token(SECRET, token, now=NOW + 599) == "user-ü/42"
    assert verify_subscribe_token(SECRET, token, user_id="user-ü/42", now=NOW) == "user-ü/42"


def test_expired_is_refused() -> None:
    token = mint_subscribe_token(SECRET, "u1", ttl_s=600, now=NOW)
    with pytest.raises(InvalidToken, match="expired"):
        verify_subscribe_token(SECRET, token, now=NOW + 600)


def test_wrong_user_is_refused() -> None:
    token = mint_subscribe_token(SECRET, "u1", now=NOW)
    with pytest.raises(InvalidToken, match="another user"):
        verify_subscribe_token(SECRET, token, user_id="u2", now=NOW)


def test_tampering_is_refused() -> None:
    version, user, expiry, mac = mint_subscribe_token(SECRET, "u1", now=NOW).split(".")
    other_user = mint_subscribe_token(SECRET, "u2", now=NOW).split(".")[1]
    forged = [
        f"{version}.{other_user}.{expiry}.{mac}",  # another user under this signature
        f"{version}.{user}.{int(expiry) + 86400}.{mac}",  # a later expiry
        f"{version}.{user}.{expiry}.{mac[:-2]}AA",  # a changed signature
        mint_subscribe_token(secrets.token_bytes(32), "u1", now=NOW),  # another secret
    ]
    for token in forged:
        with pytest.raises(InvalidToken, match="signature"):
            verify_subscribe_token(SECRET, token, now=NOW)


@pytest.mark.parametrize(
    "token", ["", "v1", "v2.dTE.1.x", "v1.dTE.soon.x", "v1.dTE.1.x.y", "ü" * 10, None, 7, "a" * 5000]
)
def test_malformed_is_refused(token: object) -> None:
    with pytest.raises(InvalidToken, match="malformed"):
        verify_subscribe_token(SECRET, token, now=NOW)


def test_minting_checks_its_input() -> None:
    with pytest.raises(ConfigurationError):
        mint_subscribe_token(b"short", "u1")
    with pytest.raises(InvalidInput):
        mint_subscribe_token(SECRET, "", now=NOW)
    with pytest.raises(InvalidInput):
        mint_subscribe_token(SECRET, "u1", ttl_s=86_401)


def test_secret_from_env_or_file(tmp_path: Path) -> None:
    value = "s" * MIN_SECRET_BYTES
    assert secret_from_env({}) is None
    assert secret_from_env({"GOV_SUBSCRIBE_SECRET": value}) == value.encode()
    path = tmp_path / "secret"
    path.write_text(value + "\n")
    assert secret_from_env({"GOV_SUBSCRIBE_SECRET_FILE": str(path)}) == value.encode()
    with pytest.raises(ConfigurationError, match="at least"):
        secret_from_env({"GOV_SUBSCRIBE_SECRET": "short"})
    with pytest.raises(ConfigurationError, match="not both"):
        secret_from_env({"GOV_SUBSCRIBE_SECRET": value, "GOV_SUBSCRIBE_SECRET_FILE": str(path)})
    with pytest.raises(ConfigurationError, match="cannot read"):
        secret_from_env({"GOV_SUBSCRIBE_SECRET_FILE": str(tmp_path / "missing")})
