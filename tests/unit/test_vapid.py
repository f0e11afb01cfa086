"""VAPID keys and tokens (WEBPUSH.md rules 7, 8 and 9)."""

from __future__ import annotations

import json
import re
import stat
import threading
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from py_vapid import Vapid02

from gov.delivery.subscription import b64url_decode, b64url_encode
from gov.delivery.vapid import (
    RESIGN_MARGIN_S,
    TOKEN_LIFETIME_S,
    VapidSigner,
    generate_keypair,
    load_private_key,
    public_key_of,
    validate_subject,
)
from gov.errors import ConfigurationError, InvalidSubscription

SUBJECT = "mailto:ops@example.com"
NOW = 1_750_000_000.0
FCM = "https://fcm.googleapis.com/fcm/send/abc:def"


@pytest.fixture(scope="module")
def key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem(key: object, fmt: serialization.PrivateFormat = serialization.PrivateFormat.PKCS8) -> str:
    return key.private_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.PEM, fmt, serialization.NoEncryption()
    ).decode()


def _raw(key: ec.EllipticCurvePrivateKey) -> str:
    return b64url_encode(key.private_numbers().private_value.to_bytes(32, "big"))


def _same_key(a: ec.EllipticCurvePrivateKey, b: ec.EllipticCurvePrivateKey) -> bool:
    return a.private_numbers().private_value == b.private_numbers().private_value


def _split(header: str) -> tuple[dict, dict, bytes, str, str]:
    match = re.fullmatch(r"vapid t=([A-Za-z0-9_.-]+),k=([A-Za-z0-9_-]+)", header)
    assert match, header
    token, k = match.groups()
    head, claims, signature = token.split(".")
    return (
        json.loads(b64url_decode(head)),
        json.loads(b64url_decode(claims)),
        b64url_decode(signature),
        f"{head}.{claims}",
        k,
    )


# -- generate_keypair ------------------------------------------------------


def test_generate_keypair_writes_a_0600_pem_and_returns_its_public_key(tmp_path: Path) -> None:
    path = tmp_path / "vapid.pem"
    public = generate_keypair(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    loaded = load_private_key(str(path))
    assert public_key_of(loaded) == public
    raw = b64url_decode(public)
    assert len(raw) == 65 and raw[0] == 4 and "=" not in public


def test_generate_keypair_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "vapid.pem"
    generate_keypair(path)
    before = path.read_bytes()
    with pytest.raises(ConfigurationError, match="refusing to overwrite"):
        generate_keypair(path)
    assert path.read_bytes() == before


def test_generate_keypair_in_a_missing_directory_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot create"):
        generate_keypair(tmp_path / "nope" / "vapid.pem")


# -- load_private_key -------------------------------------------------------


def test_loads_pem_text_pkcs8_and_sec1(key: ec.EllipticCurvePrivateKey) -> None:
    assert _same_key(load_private_key(_pem(key)), key)
    sec1 = _pem(key, serialization.PrivateFormat.TraditionalOpenSSL)
    assert sec1.startswith("-----BEGIN EC PRIVATE KEY-----")
    assert _same_key(load_private_key(sec1), key)


def test_loads_raw_scalar_as_web_push_prints_it(key: ec.EllipticCurvePrivateKey) -> None:
    raw = _raw(key)
    assert len(raw) == 43
    assert _same_key(load_private_key(raw), key)
    assert _same_key(load_private_key(raw + "=\n"), key)


def test_loads_pem_file_and_raw_scalar_file(key: ec.EllipticCurvePrivateKey, tmp_path: Path) -> None:
    pem_file = tmp_path / "k.pem"
    pem_file.write_text(_pem(key))
    raw_file = tmp_path / "k.txt"
    raw_file.write_text(_raw(key) + "\n")
    assert _same_key(load_private_key(str(pem_file)), key)
    assert _same_key(load_private_key(str(raw_file)), key)


def test_missing_file_is_refused_and_not_created(tmp_path: Path) -> None:
    path = tmp_path / "missing.pem"
    with pytest.raises(ConfigurationError) as caught:
        load_private_key(str(path))
    assert str(path) in str(caught.value)
    assert not path.exists()  # unlike py_vapid's Vapid.from_file


def test_mistyped_raw_key_is_not_quoted_back(key: ec.EllipticCurvePrivateKey) -> None:
    mistyped = _raw(key) + "Q"  # 44 characters: neither a scalar nor a file
    with pytest.raises(ConfigurationError) as caught:
        load_private_key(mistyped)
    assert _raw(key) not in str(caught.value)


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: _pem(ec.generate_private_key(ec.SECP384R1())), "P-256"),
        (lambda: _pem(ed25519.Ed25519PrivateKey.generate()), "P-256"),
        (lambda: "A" * 43, "not a valid P-256 scalar"),
        (lambda: "-----BEGIN PRIVATE KEY-----\nQUJDREVGR0g=\n-----END PRIVATE KEY-----\n", "PEM"),
        (lambda: "   ", "empty"),
    ],
)
def test_unusable_keys_are_configuration_errors(make, words: str) -> None:  # type: ignore[no-untyped-def]
    value = make()
    with pytest.raises(ConfigurationError, match=words) as caught:
        load_private_key(value)
    body = "".join(value.strip().splitlines()[1:-1])
    assert not body or body not in str(caught.value)


def test_encrypted_pem_is_refused(key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    ).decode()
    with pytest.raises(ConfigurationError, match="encrypted"):
        load_private_key(pem)


def test_pem_file_of_a_wrong_curve_names_the_problem_not_the_key(tmp_path: Path) -> None:
    path = tmp_path / "p384.pem"
    pem = _pem(ec.generate_private_key(ec.SECP384R1()))
    path.write_text(pem)
    with pytest.raises(ConfigurationError, match="P-256") as caught:
        load_private_key(str(path))
    assert pem.splitlines()[1] not in str(caught.value)


# -- subject and from_env ---------------------------------------------------


@pytest.mark.parametrize(
    "subject",
    ["mailto:ops@example.com", "MAILTO:push-ops+gov@mail.example.co.uk", "https://example.com/c"],
)
def test_good_subjects(subject: str) -> None:
    assert validate_subject(subject) is None  # no refusal
    signer = VapidSigner(ec.generate_private_key(ec.SECP256R1()), subject)
    assert signer.subject == subject


@pytest.mark.parametrize(
    "subject",
    [
        "mailto:ops@localhost",
        "mailto:ops@push.localhost",
        "mailto:ops@example",
        "mailto:ops@127.0.0.1",
        "mailto:@example.com",
        "mailto:ops@exa mple.com",
        "mailto:ops@example.com?subject=x",
        "ops@example.com",
        "http://example.com",
        "https://localhost/",
        "https://user@example.com/",
        "",
    ],
)
def test_bad_subjects(subject: str) -> None:
    with pytest.raises(ConfigurationError, match="VAPID subject"):
        validate_subject(subject)


def _env(key: ec.EllipticCurvePrivateKey, **extra: str) -> dict[str, str]:
    return {"GOV_VAPID_PRIVATE_KEY": _pem(key), "GOV_VAPID_SUBJECT": SUBJECT, **extra}


def test_from_env(key: ec.EllipticCurvePrivateKey, tmp_path: Path) -> None:
    signer = VapidSigner.from_env(_env(key))
    assert signer.public_key == public_key_of(key)
    assert signer.subject == SUBJECT
    path = tmp_path / "k.pem"
    path.write_text(_pem(key))
    by_path = VapidSigner.from_env(_env(key, GOV_VAPID_PRIVATE_KEY=str(path)))
    assert by_path.public_key == signer.public_key


def test_from_env_accepts_the_matching_public_key_padded_or_not(
    key: ec.EllipticCurvePrivateKey,
) -> None:
    public = public_key_of(key)
    for given in (public, public + "="):
        assert VapidSigner.from_env(_env(key, GOV_VAPID_PUBLIC_KEY=given)).public_key == public


def test_from_env_refuses_a_mismatched_public_key(key: ec.EllipticCurvePrivateKey) -> None:
    other = public_key_of(ec.generate_private_key(ec.SECP256R1()))
    with pytest.raises(ConfigurationError, match="mismatch"):
        VapidSigner.from_env(_env(key, GOV_VAPID_PUBLIC_KEY=other))
    with pytest.raises(ConfigurationError, match="GOV_VAPID_PUBLIC_KEY"):
        VapidSigner.from_env(_env(key, GOV_VAPID_PUBLIC_KEY="not base64!"))


@pytest.mark.parametrize(
    ("missing", "subject", "words"),
    [
        ("GOV_VAPID_PRIVATE_KEY", SUBJECT, "GOV_VAPID_PRIVATE_KEY"),
        ("GOV_VAPID_SUBJECT", SUBJECT, "GOV_VAPID_SUBJECT"),
        (None, "mailto:ops@localhost", "localhost"),
        (None, "mailto:ops@intranet", "full domain"),
    ],
)
def test_from_env_refusals(key: ec.EllipticCurvePrivateKey, missing: str | None, subject: str, words: str) -> None:
    env = _env(key, GOV_VAPID_SUBJECT=subject)
    if missing:
        del env[missing]
    with pytest.raises(ConfigurationError, match=words):
        VapidSigner.from_env(env)


def test_signer_refuses_a_non_p256_key() -> None:
    with pytest.raises(ConfigurationError, match="P-256"):
        VapidSigner(ec.generate_private_key(ec.SECP384R1()), SUBJECT)  # type: ignore[arg-type]


def test_derived_secret_is_stable_per_key_and_label(key: ec.EllipticCurvePrivateKey) -> None:
    signer = VapidSigner(key, SUBJECT)
    secret = signer.derived_secret(b"gov topic")
    assert len(secret) == 32
    assert secret == VapidSigner(key, "https://example.com/").derived_secret(b"gov topic")
    assert secret != signer.derived_secret(b"other use")
    assert secret != VapidSigner(ec.generate_private_key(ec.SECP256R1()), SUBJECT).derived_secret(b"gov topic")
    assert secret != key.private_numbers().private_value.to_bytes(32, "big")
    with pytest.raises(ValueError):
        signer.derived_secret(b"")


def test_repr_shows_no_private_key(key: ec.EllipticCurvePrivateKey) -> None:
    text = repr(VapidSigner(key, SUBJECT))
    assert public_key_of(key) in text and _raw(key) not in text


# -- authorization ------------------------------------------------------------


def test_authorization_is_a_valid_es256_vapid_header(key: ec.EllipticCurvePrivateKey) -> None:
    signer = VapidSigner(key, SUBJECT)
    header = signer.authorization(FCM, now=NOW)
    head, claims, signature, signing_input, k = _split(header)
    assert head == {"typ": "JWT", "alg": "ES256"}
    assert claims == {
        "aud": "https://fcm.googleapis.com",
        "exp": int(NOW) + 12 * 3600,
        "sub": SUBJECT,
    }
    assert k == signer.public_key
    assert len(signature) == 64  # raw r||s, not DER
    der = encode_dss_signature(int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big"))
    key.public_key().verify(der, signing_input.encode(), ec.ECDSA(hashes.SHA256()))
    assert Vapid02.verify(header)  # py_vapid, as an independent verifier


def test_aud_is_the_origin_whatever_form_is_given(key: ec.EllipticCurvePrivateKey) -> None:
    signer = VapidSigner(key, SUBJECT)
    for given in (FCM, "https://fcm.googleapis.com", "HTTPS://FCM.googleapis.com:443/x"):
        assert _split(signer.authorization(given, now=NOW))[1]["aud"] == ("https://fcm.googleapis.com")
    port = _split(signer.authorization("http://127.0.0.1:8123/push/x", now=NOW))[1]
    assert port["aud"] == "http://127.0.0.1:8123"


def test_each_origin_gets_its_own_claims(key: ec.EllipticCurvePrivateKey) -> None:
    # pywebpush would keep the first aud in a shared claims dict (rule 8).
    signer = VapidSigner(key, SUBJECT)
    first = signer.authorization(FCM, now=NOW)
    moz = signer.authorization("https://updates.push.services.mozilla.com/wpush/v2/x", now=NOW)
    assert _split(moz)[1]["aud"] == "https://updates.push.services.mozilla.com"
    assert signer.authorization(FCM, now=NOW + 5) == first
    assert _split(first)[1]["aud"] == "https://fcm.googleapis.com"


def test_token_is_cached_per_origin_until_one_hour_remains(
    key: ec.EllipticCurvePrivateKey,
) -> None:
    signer = VapidSigner(key, SUBJECT)
    first = signer.authorization(FCM, now=NOW)
    last_reuse = NOW + TOKEN_LIFETIME_S - RESIGN_MARGIN_S
    assert signer.authorization(FCM, now=NOW + 600) == first
    assert signer.authorization(FCM, now=last_reuse) == first
    renewed = signer.authorization(FCM, now=last_reuse + 1)
    assert renewed != first
    assert _split(renewed)[1]["exp"] == int(last_reuse + 1) + TOKEN_LIFETIME_S


def test_token_is_resigned_when_the_clock_steps_back(key: ec.EllipticCurvePrivateKey) -> None:
    signer = VapidSigner(key, SUBJECT)
    first = signer.authorization(FCM, now=NOW)
    earlier = NOW - 13 * 3600  # the cached exp would now be 25 h ahead: refused
    again = signer.authorization(FCM, now=earlier)
    assert again != first
    assert _split(again)[1]["exp"] == int(earlier) + TOKEN_LIFETIME_S


def test_concurrent_callers_share_one_token(key: ec.EllipticCurvePrivateKey) -> None:
    signer = VapidSigner(key, SUBJECT)
    barrier = threading.Barrier(16)
    results: list[str] = []

    def call() -> None:
        barrier.wait()
        results.append(signer.authorization(FCM, now=NOW))

    threads = [threading.Thread(target=call) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # ECDSA signatures are randomised: two signings would differ.
    assert len(results) == 16 and len(set(results)) == 1


def test_authorization_of_a_non_url_is_refused(key: ec.EllipticCurvePrivateKey) -> None:
    with pytest.raises(InvalidSubscription):
        VapidSigner(key, SUBJECT).authorization("not a url")
