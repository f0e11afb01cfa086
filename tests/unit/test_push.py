"""One delivery attempt against a real local push service, and the service itself.

``deliver`` runs pywebpush's real encryption and a real HTTP exchange; the
service verifies the VAPID token and decrypts with the subscriber's keys, so
what it records is what a browser would have received.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import os
import socket
import threading
import time
from collections.abc import Iterator

import http_ece
import pytest
import requests
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from gov.delivery.netguard import EndpointGuard
from gov.delivery.push import (
    MAX_PAYLOAD_BYTES,
    MAX_RETRY_AFTER_S,
    PushRequest,
    build_payload,
    check_push_fields,
    classify_status,
    deliver,
    parse_retry_after,
    topic_for,
)
from gov.delivery.pushclient import PushClient
from gov.delivery.subscription import Subscription, b64url_decode, b64url_encode, parse_subscription
from gov.delivery.vapid import TOKEN_LIFETIME_S, VapidSigner
from gov.errors import ConfigurationError, InvalidMessage
from gov.testing import BrowserSubscription, PushService

# The plugin under test provides the ``push_service`` fixture used below.


SUBJECT = "mailto:ops@example.com"


@pytest.fixture(scope="module")
def signer() -> VapidSigner:
    return VapidSigner(ec.generate_private_key(ec.SECP256R1()), SUBJECT)


@pytest.fixture(params=["pushclient", "requests"])
def session(request: pytest.FixtureRequest) -> Iterator[PushClient | requests.Session]:
    """Both transports deliver accepts: the runner's PushClient (test mode: loopback
    allowed) and a plain requests.Session."""
    if request.param == "pushclient":
        with PushClient(EndpointGuard(allow_loopback=True)) as client:
            yield client
    else:
        with requests.Session() as plain:
            yield plain


def _sub(browser: BrowserSubscription) -> Subscription:
    return parse_subscription(browser.info, allow_loopback_http=True)


def _send(
    browser: BrowserSubscription,
    signer: object,
    session: requests.Session,
    payload: bytes = b'{"title":"hi"}',
    **kwargs: object,
):  # type: ignore[no-untyped-def]
    fields = {"ttl": 60, "urgency": "normal", "topic": None}
    timeout = kwargs.pop("timeout", 5.0)
    fields.update(kwargs)
    request = PushRequest(_sub(browser), payload, **fields)  # type: ignore[arg-type]
    return deliver(request, signer, session, timeout=timeout)  # type: ignore[arg-type]


# -- what arrives ---------------------------------------------------------------


def test_payload_arrives_decrypted_with_every_header(
    push_service: PushService, signer: VapidSigner, session: requests.Session
) -> None:
    browser = push_service.subscribe("alice")
    topic = topic_for("user-7:digest", b"topic-secret")
    payload = build_payload("Hello", "World ✓", "digest", "https://app.example/x", "bulk", 42)
    outcome = _send(browser, signer, session, payload, ttl=3600, urgency="low", topic=topic)
    assert outcome.kind == "accepted" and outcome.status == 201 and outcome.ok
    [received] = push_service.delivered(browser)
    assert received.payload == payload
    assert json.loads(received.payload)["data"]["id"] == "42"
    assert received.headers["ttl"] == "3600"
    assert received.headers["urgency"] == "low"
    assert received.headers["topic"] == topic
    assert received.headers["content-type"] == "application/octet-stream"
    assert received.headers["content-encoding"] == "aes128gcm"
    assert push_service.delivered_payloads() == [payload]


def test_vapid_claims_name_the_service_origin_and_expire_within_12_hours(
    push_service: PushService, signer: VapidSigner, session: requests.Session
) -> None:
    browser = push_service.subscribe()
    assert _send(browser, signer, session).kind == "accepted"
    [received] = push_service.requests_for(browser)
    assert received.claims is not None
    assert received.claims["aud"] == push_service.origin
    assert received.claims["sub"] == SUBJECT
    ahead = received.claims["exp"] - received.at
    assert TOKEN_LIFETIME_S - 60 < ahead <= TOKEN_LIFETIME_S
    assert received.headers["authorization"].endswith(f",k={signer.public_key}")


def test_a_second_service_gets_its_own_aud_from_the_same_signer(
    push_service: PushService, signer: VapidSigner, session: requests.Session
) -> None:
    with PushService() as other:
        assert other.origin != push_service.origin
        first, second = push_service.subscribe(), other.subscribe()
        assert _send(first, signer, session).kind == "accepted"
        assert _send(second, signer, session).kind == "accepted"
        assert _send(first, signer, session).kind == "accepted"
        assert other.received[0].claims["aud"] == other.origin  # type: ignore[index]
        assert [r.claims["aud"] for r in push_service.received] == [  # type: ignore[index]
            push_service.origin,
            push_service.origin,
        ]


def test_the_largest_payload_fills_exactly_one_4096_byte_record(
    push_service: PushService, signer: VapidSigner, session: requests.Session
) -> None:
    browser = push_service.subscribe()
    payload = os.urandom(MAX_PAYLOAD_BYTES)
    assert _send(browser, signer, session, payload).kind == "accepted"
    [received] = push_service.delivered(browser)
    assert received.body_length == 4096
    assert received.payload == payload


def test_oversize_payload_is_refused_before_any_request(
    push_service: PushService, signer: VapidSigner, session: requests.Session
) -> None:
    browser = push_service.subscribe()
    with pytest.raises(InvalidMessage, match="3994 bytes"):
        _send(browser, signer, session, b"x" * (MAX_PAYLOAD_BYTES + 1))
    assert push_service.received == []


def test_connections_are_reused(push_service: PushService, signer: VapidSigner, session: requests.Session) -> None:
    browser = push_service.subscribe()
    for _ in range(3):
        assert _send(browser, signer, session).kind == "accepted"
    assert len({r.client_port for r in push_service.received}) == 1


# -- how answers are classified ----------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (200, "accepted"),
        (201, "accepted"),
        (202, "accepted"),
        (404, "gone"),
        (410, "gone"),
        (429, "throttled"),
        (406, "throttled"),
        (400, "rejected"),
        (413, "rejected"),
        (422, "rejected"),
        (401, "unauthorized"),
        (403, "unauthorized"),
        (500, "transient"),
        (502, "transient"),
        (503, "transient"),
    ],
)
def test_scripted_status_maps_to_outcome(
    push_service: PushService,
    signer: VapidSigner,
    session: requests.Session,
    status: int,
    kind: str,
) -> None:
    browser = push_service.subscribe()
    push_service.script(browser, [status])
    outcome = _send(browser, signer, session)
    assert (outcome.kind, outcome.status, outcome.error) == (kind, status, None)
    if status >= 400:
        assert "scripted answer" in outcome.body


def test_answer_body_is_kept_but_truncated(
    push_service: PushService, signer: VapidSigner, session: requests.Session
) -> None:
    browser = push_service.subscribe()
    push_service.script(browser, [(400, {}, "é" * 100_000), (413, {}, "payload too large")])
    huge = _send(browser, signer, session)
    assert (huge.kind, huge.body) == ("rejected", "é" * 1000)
    small = _send(browser, signer, session)
    assert (small.kind, small.body) == ("rejected", "payload too large")


@pytest.mark.parametrize("answer", ["explode", 99, 600, True, (429, "2"), (200, {}, 5)])
def test_unknown_scripted_answers_are_refused(push_service: PushService, answer: object) -> None:
    browser = push_service.subscribe()
    with pytest.raises(ValueError, match="scripted answer"):
        push_service.script(browser, [201, answer])  # type: ignore[list-item]
    with pytest.raises(KeyError):
        push_service.script(f"{push_service.origin}/push/unknown", [201])


def test_gone_subscription_stays_gone(
    push_service: PushService, signer: VapidSigner, session: requests.Session
) -> None:
    browser = push_service.subscribe()
    push_service.script(browser, [410])
    assert _send(browser, signer, session).kind == "gone"
    again = _send(browser, signer, session)
    assert (again.kind, again.status) == ("gone", 410)
    assert push_service.received[-1].reason == "subscription expired"


def test_expired_subscription_answers_410(
    push_service: PushService, signer: VapidSigner, session: requests.Session
) -> None:
    browser, other = push_service.subscribe(), push_service.subscribe()
    push_service.expire(browser.info)
    assert _send(browser, signer, session).status == 410
    assert _send(other, signer, session).status == 201


def test_retry_after_in_seconds(push_service: PushService, signer: VapidSigner, session: requests.Session) -> None:
    browser = push_service.subscribe()
    push_service.script(browser, [(429, {"Retry-After": "120"})])
    outcome = _send(browser, signer, session)
    assert (outcome.kind, outcome.retry_after_s) == ("throttled", 120.0)


def test_retry_after_as_http_date(push_service: PushService, signer: VapidSigner, session: requests.Session) -> None:
    browser = push_service.subscribe()
    when = email.utils.formatdate(time.time() + 90, usegmt=True)
    push_service.script(browser, [(503, {"Retry-After": when})])
    outcome = _send(browser, signer, session)
    assert outcome.kind == "transient"
    assert outcome.retry_after_s is not None and 85 <= outcome.retry_after_s <= 91


def test_a_strange_retry_after_never_changes_an_answer(
    push_service: PushService, signer: VapidSigner, session: requests.Session
) -> None:
    """An outside probe: "²" (a digit to str.isdigit, not to int) failed a 201 the service
    had accepted, and 400 nines overflowed; now the answer's status decides, the wait is
    bounded (a TTL is at most 28 days) and a value nobody can read falls back to backoff."""
    browser = push_service.subscribe()
    push_service.script(browser, [(201, {"Retry-After": "\u00b2"}), (429, {"Retry-After": "9" * 400}),
                                  (503, {"Retry-After": "\u00b2"}), (429, {"Retry-After": "10000000000000"})])
    said = [_send(browser, signer, session) for _ in range(4)]
    assert [(o.kind, o.retry_after_s) for o in said] == [
        ("accepted", None), ("throttled", MAX_RETRY_AFTER_S), ("transient", None), ("throttled", MAX_RETRY_AFTER_S)]


def test_a_redirect_fails_saying_where_it_pointed(
    push_service: PushService, signer: VapidSigner, session: requests.Session
) -> None:
    browser = push_service.subscribe()
    push_service.script(browser, [(307, {"Location": "http://127.0.0.1:9/elsewhere"}), 301])
    said = [_send(browser, signer, session) for _ in range(2)]
    assert [(o.kind, o.status, o.error) for o in said] == [
        ("rejected", 307, "redirect not followed (HTTP 307, Location: http://127.0.0.1:9/elsewhere)"),
        ("rejected", 301, "redirect not followed (HTTP 301, Location: none given)")]


def test_hang_is_transient_after_a_finite_timeout(
    push_service: PushService, signer: VapidSigner, session: requests.Session
) -> None:
    browser = push_service.subscribe()
    push_service.script(browser, ["hang"])
    started = time.monotonic()
    outcome = _send(browser, signer, session, timeout=0.5)
    elapsed = time.monotonic() - started
    assert (outcome.kind, outcome.status, outcome.error) == ("transient", None, "timeout")
    assert elapsed >= 0.4, f"gave up after {elapsed:.2f} s, before its 0.5 s timeout"
    assert push_service.received[0].reason == "scripted hang"


def test_a_trickled_answer_is_cut_off_at_the_total_deadline(
    push_service: PushService, signer: VapidSigner, session: requests.Session
) -> None:
    """requests' timeout is per read: one byte every 0.2 s would never trip it. The
    attempt's total deadline does, and the connection is closed under the server."""
    answer = b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n"
    written: list[int] = []
    closed = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))

    def trickle() -> None:
        client, _ = listener.accept()
        with client:
            client.recv(65536)  # headers and the small body, near enough
            for byte in answer:
                time.sleep(0.2)
                try:
                    client.sendall(bytes([byte]))
                except OSError:
                    break
                written.append(byte)
            client.settimeout(5)
            with contextlib.suppress(OSError):
                while client.recv(1024):
                    pass
            closed.set()

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    browser = push_service.subscribe()
    port = listener.getsockname()[1]
    sub = Subscription(f"http://127.0.0.1:{port}/push/x", browser.p256dh, browser.auth)
    try:
        outcome = deliver(PushRequest(sub, b'{"title":"hi"}', 60), signer, session, timeout=1.0)
        assert (outcome.kind, outcome.status, outcome.error) == ("transient", None, "timeout")
        assert closed.wait(5), "the client never closed the connection"
        assert len(written) < len(answer) // 2, len(written)
    finally:
        thread.join(timeout=15)
        listener.close()


def test_reset_is_transient(push_service: PushService, signer: VapidSigner, session: requests.Session) -> None:
    browser = push_service.subscribe()
    push_service.script(browser, ["reset"])
    outcome = _send(browser, signer, session)
    assert (outcome.kind, outcome.status, outcome.error) == ("transient", None, "connection reset")
    # The session recovers: the next attempt opens a new connection.
    assert _send(browser, signer, session).kind == "accepted"


def test_connection_refused_is_transient(signer: VapidSigner, session: requests.Session) -> None:
    with PushService() as service:
        browser = service.subscribe()
    outcome = _send(browser, signer, session)
    assert (outcome.kind, outcome.error) == ("transient", "connection refused")


def test_a_stopped_service_answers_nothing_even_on_a_kept_alive_connection(
    signer: VapidSigner, session: requests.Session
) -> None:
    with PushService() as service:
        browser = service.subscribe()
        assert _send(browser, signer, session).kind == "accepted"
    outcome = _send(browser, signer, session)
    assert (outcome.kind, outcome.status) == ("transient", None)
    assert len(service.received) == 1


def test_redirects_are_not_followed(push_service: PushService, signer: VapidSigner, session: requests.Session) -> None:
    browser, elsewhere = push_service.subscribe(), push_service.subscribe()
    push_service.script(browser, [(307, {"Location": elsewhere.endpoint})])
    outcome = _send(browser, signer, session)
    assert (outcome.kind, outcome.status) == ("rejected", 307)
    assert push_service.requests_for(elsewhere) == []


def test_wrong_vapid_key_is_forbidden_when_the_service_expects_one(
    signer: VapidSigner, session: requests.Session
) -> None:
    other = VapidSigner(ec.generate_private_key(ec.SECP256R1()), SUBJECT)
    with PushService(expected_public_key=signer.public_key) as service:
        browser = service.subscribe()
        wrong = _send(browser, other, session)
        assert (wrong.kind, wrong.status) == ("unauthorized", 403)
        assert _send(browser, signer, session).kind == "accepted"


class _Tampering:
    """Changes the claims of a real token without re-signing it."""

    def __init__(self, signer: VapidSigner) -> None:
        self.signer = signer

    def authorization(self, endpoint_or_origin: str, now: float | None = None) -> str:
        header = self.signer.authorization(endpoint_or_origin, now)
        token, key = header.removeprefix("vapid t=").split(",k=")
        head, claims, signature = token.split(".")
        forged = json.loads(b64url_decode(claims)) | {"sub": "mailto:evil@example.net"}
        claims = b64url_encode(json.dumps(forged).encode())
        return f"vapid t={head}.{claims}.{signature},k={key}"


def test_tampered_token_is_unauthorized(
    push_service: PushService, signer: VapidSigner, session: requests.Session
) -> None:
    outcome = _send(push_service.subscribe(), _Tampering(signer), session)
    assert (outcome.kind, outcome.status) == ("unauthorized", 401)
    assert "signature" in outcome.body


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), float("nan")])
def test_timeout_must_be_finite_and_positive(
    push_service: PushService, signer: VapidSigner, session: requests.Session, timeout: float
) -> None:
    with pytest.raises(ConfigurationError, match="timeout"):
        _send(push_service.subscribe(), signer, session, timeout=timeout)
    assert push_service.received == []


# -- pure helpers ----------------------------------------------------------------


def test_classify_status_of_unexpected_codes() -> None:
    assert classify_status(204) == "rejected"
    assert classify_status(301) == "rejected"
    assert classify_status(599) == "transient"


def test_parse_retry_after() -> None:
    now = 1_750_000_000.0
    assert parse_retry_after("30", now=now) == 30.0
    assert parse_retry_after(" 0 ", now=now) == 0.0
    assert parse_retry_after(email.utils.formatdate(now + 45, usegmt=True), now=now) == 45.0
    assert parse_retry_after(email.utils.formatdate(now - 45, usegmt=True), now=now) == 0.0
    assert parse_retry_after(email.utils.formatdate(now + 45), now=now) == 45.0  # "-0000" zone
    assert parse_retry_after("soon", now=now) is None
    assert parse_retry_after("-5", now=now) is None
    assert parse_retry_after("\u00b2", now=now) is None  # superscript two: isdigit() says yes, int() no
    assert parse_retry_after("9" * 5000, now=now) == MAX_RETRY_AFTER_S
    assert parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now=now) == MAX_RETRY_AFTER_S
    assert parse_retry_after(None, now=now) is None


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"payload": b""}, "empty"),
        ({"payload": "text"}, "bytes"),
        ({"ttl": -1}, "ttl"),
        ({"ttl": True}, "ttl"),
        ({"ttl": "60"}, "ttl"),
        ({"ttl": 1.5}, "ttl"),
        ({"urgency": "urgent"}, "urgency"),
        ({"urgency": "HIGH"}, "urgency"),
        ({"topic": ""}, "topic"),
        ({"topic": "a" * 33}, "topic"),
        ({"topic": "a b"}, "topic"),
        ({"topic": "a/b"}, "topic"),
    ],
)
def test_push_fields_are_validated(fields: dict, words: str) -> None:
    values = {"payload": b"x", "ttl": 0, "urgency": "very-low", "topic": "a" * 32} | fields
    with pytest.raises(InvalidMessage, match=words):
        check_push_fields(**values)


def test_push_request_validates_when_built() -> None:
    sub = Subscription("https://push.example.com/x", "p", "a")
    with pytest.raises(InvalidMessage, match="urgency"):
        PushRequest(sub, b"x", 60, "asap")
    assert PushRequest(sub, b"x", 0).urgency == "normal"


def test_topic_for_is_deterministic_opaque_and_valid() -> None:
    topic = topic_for("user-1:news", b"secret")
    assert topic == topic_for("user-1:news", b"secret")
    assert len(topic) == 32
    check_push_fields(b"x", 0, "normal", topic)
    assert "news" not in topic and "user" not in topic
    assert topic != topic_for("user-1:news", b"other secret")
    assert topic != topic_for("user-2:news", b"secret")
    with pytest.raises(ConfigurationError):
        topic_for("k", b"")
    with pytest.raises(InvalidMessage):
        topic_for("", b"secret")


def test_build_payload_shape() -> None:
    payload = build_payload("Título", "body", None, None, "transactional", "m-1")
    assert (
        payload
        == (
            '{"title":"Título","body":"body","tag":null,"data":{"url":null,"tier":"transactional","id":"m-1"}}'
        ).encode()
    )


def test_build_payload_ids_are_strings_even_beyond_2_pow_53() -> None:
    payload = json.loads(build_payload("t", "b", "tag", "/u", "bulk", 2**63 - 1))
    assert payload["data"]["id"] == str(2**63 - 1)


def test_build_payload_refusals() -> None:
    with pytest.raises(InvalidMessage, match="title"):
        build_payload(" ", "b", None, None, "bulk", 1)
    with pytest.raises(InvalidMessage, match="bytes"):
        build_payload("t", "é" * 2000, None, None, "bulk", 1)  # 4000 bytes of UTF-8


def test_a_summary_that_would_not_fit_with_its_count_drops_its_body() -> None:
    empty = len(build_payload("Digest", "", "digest", "/d", "P3", "m9"))
    body = "b" * (MAX_PAYLOAD_BYTES - empty)  # the message alone fills the budget exactly
    assert len(build_payload("Digest", body, "digest", "/d", "P3", "m9")) == MAX_PAYLOAD_BYTES
    summary = build_payload("Digest", body, "digest", "/d", "P3", "m9", count=12)
    assert len(summary) <= MAX_PAYLOAD_BYTES
    assert json.loads(summary) == {
        "title": "Digest", "body": "", "tag": "digest", "data": {"url": "/d", "tier": "P3", "id": "m9", "count": 12},
    }
    # one that fits with its count keeps its body
    assert json.loads(build_payload("Digest", "short", "digest", "/d", "P3", "m9", count=12))["body"] == "short"
    # a title too long to fit even without the body: refused, with the size
    with pytest.raises(InvalidMessage, match="bytes"):
        build_payload("T" * (MAX_PAYLOAD_BYTES - empty + 6), "", "digest", "/d", "P3", "m9", count=12)


# -- the push service refuses what it must (hand-built requests) ----------------------


def _jwt(key: ec.EllipticCurvePrivateKey, claims: dict, alg: str = "ES256") -> str:
    head = b64url_encode(json.dumps({"typ": "JWT", "alg": alg}).encode())
    body = b64url_encode(json.dumps(claims).encode())
    r, s = decode_dss_signature(key.sign(f"{head}.{body}".encode(), ec.ECDSA(hashes.SHA256())))
    return f"{head}.{body}.{b64url_encode(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def _encrypt(browser: BrowserSubscription, plaintext: bytes, rs: int = 4096) -> bytes:
    return http_ece.encrypt(
        plaintext,
        private_key=ec.generate_private_key(ec.SECP256R1()),
        dh=b64url_decode(browser.p256dh),
        auth_secret=browser.auth_secret,
        version="aes128gcm",
        rs=rs,
    )


class _Hand:
    """Builds requests by hand, valid unless told otherwise."""

    def __init__(self, service: PushService) -> None:
        self.service = service
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.public = b64url_encode(
            self.key.public_key().public_bytes(
                serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
            )
        )
        self.browser = service.subscribe()

    def claims(self, **changes: object) -> dict:
        base = {"aud": self.service.origin, "exp": int(time.time()) + 3600, "sub": SUBJECT}
        return {k: v for k, v in (base | changes).items() if v is not None}

    def post(
        self,
        body: bytes | None = None,
        drop: tuple[str, ...] = (),
        token: str | None = None,
        endpoint: str | None = None,
        **headers: str,
    ) -> requests.Response:
        sent = {
            "TTL": "60",
            "Content-Encoding": "aes128gcm",
            "Content-Type": "application/octet-stream",
            "Authorization": f"vapid t={token or _jwt(self.key, self.claims())},k={self.public}",
        }
        sent |= {name.replace("_", "-"): value for name, value in headers.items()}
        for name in drop:
            del sent[name]
        data = _encrypt(self.browser, b"hand made") if body is None else body
        return requests.post(endpoint or self.browser.endpoint, data=data, headers=sent, timeout=5)


@pytest.fixture
def hand(push_service: PushService) -> _Hand:
    return _Hand(push_service)


def _refused(response: requests.Response, status: int, words: str) -> None:
    assert response.status_code == status
    assert words in response.json()["error"]


def test_hand_built_request_is_accepted(hand: _Hand) -> None:
    response = hand.post()
    assert response.status_code == 201
    assert response.headers["Location"].startswith(hand.service.origin + "/message/")
    assert hand.service.delivered_payloads() == [b"hand made"]


def test_service_refuses_missing_or_bad_ttl(hand: _Hand) -> None:
    _refused(hand.post(drop=("TTL",)), 400, "TTL")
    _refused(hand.post(TTL="-1"), 400, "TTL")
    _refused(hand.post(TTL="60s"), 400, "TTL")
    assert hand.service.delivered() == []


def test_service_refuses_missing_content_type(hand: _Hand) -> None:
    _refused(hand.post(drop=("Content-Type",)), 400, "Content-Type")
    _refused(hand.post(Content_Type="application/json"), 400, "Content-Type")


def test_service_refuses_other_encodings(hand: _Hand) -> None:
    _refused(hand.post(Content_Encoding="aesgcm"), 400, "aes128gcm")
    _refused(hand.post(drop=("Content-Encoding",)), 400, "aes128gcm")


def test_service_refuses_bad_urgency_and_topic(hand: _Hand) -> None:
    _refused(hand.post(Urgency="urgent"), 400, "Urgency")
    _refused(hand.post(Topic="a" * 33), 400, "Topic")
    _refused(hand.post(Topic="not ok"), 400, "Topic")
    assert hand.post(Urgency="very-low", Topic="Ab_-9").status_code == 201


def test_service_refuses_a_body_over_4096_bytes(hand: _Hand) -> None:
    body = _encrypt(hand.browser, b"x" * (MAX_PAYLOAD_BYTES + 1))
    assert len(body) == 4097
    _refused(hand.post(body), 413, "4096")


def test_service_refuses_more_than_one_record(hand: _Hand) -> None:
    _refused(hand.post(_encrypt(hand.browser, b"x" * 100, rs=50)), 400, "record")


def test_service_refuses_a_body_it_cannot_decrypt(hand: _Hand) -> None:
    stranger = hand.service.subscribe()
    _refused(hand.post(_encrypt(stranger, b"not for you")), 400, "decrypt")


def test_service_refuses_a_bad_signature(hand: _Hand) -> None:
    token = _jwt(hand.key, hand.claims())
    signature = bytearray(b64url_decode(token.rsplit(".", 1)[1]))
    signature[10] ^= 1
    forged = token.rsplit(".", 1)[0] + "." + b64url_encode(bytes(signature))
    _refused(hand.post(token=forged), 401, "signature")
    other = ec.generate_private_key(ec.SECP256R1())
    _refused(hand.post(token=_jwt(other, hand.claims())), 401, "signature")


def test_a_token_that_verified_once_is_still_checked_on_every_request(hand: _Hand) -> None:
    # the service remembers a token whose signature verified (a runner reuses one per
    # origin for hours); the same token under another key, or after its exp, is refused
    token = _jwt(hand.key, hand.claims(exp=int(time.time()) + 600))
    assert hand.post(token=token).status_code == 201
    other = ec.generate_private_key(ec.SECP256R1())
    other_public = b64url_encode(
        other.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    )
    _refused(hand.post(Authorization=f"vapid t={token},k={other_public}"), 401, "signature")
    later = hand.service.clock
    hand.service.clock = lambda: later() + 3600
    try:
        _refused(hand.post(token=token), 401, "expired")
    finally:
        hand.service.clock = later
    assert hand.post(token=token).status_code == 201
    assert hand.service.delivered_payloads() == [b"hand made", b"hand made"]


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"aud": "http://127.0.0.1:1"}, "aud"),
        ({"aud": None}, "aud"),
        ({"exp": None}, "exp"),
        ({"exp": int(time.time()) - 10}, "expired"),
        ({"exp": int(time.time()) + 25 * 3600}, "24 h"),
        ({"sub": "mailto:ops@localhost"}, "sub"),
        ({"sub": None}, "sub"),
    ],
)
def test_service_refuses_bad_claims(hand: _Hand, changes: dict, words: str) -> None:
    _refused(hand.post(token=_jwt(hand.key, hand.claims(**changes))), 401, words)


def test_service_refuses_missing_or_old_style_authorization(hand: _Hand) -> None:
    _refused(hand.post(drop=("Authorization",)), 401, "missing")
    token = _jwt(hand.key, hand.claims())
    _refused(hand.post(Authorization=f"WebPush {token}"), 401, "vapid")
    _refused(hand.post(token=_jwt(hand.key, hand.claims(), alg="HS256")), 401, "ES256")


def test_service_answers_404_for_an_unknown_endpoint(hand: _Hand) -> None:
    _refused(hand.post(endpoint=f"{hand.service.origin}/push/nobody"), 404, "no such")


def _raw(service: PushService, head: bytes) -> bytes:
    """Send ``head`` (a request line and header block, no body); the answer, up to its close."""
    with socket.create_connection(("127.0.0.1", service.port), timeout=5) as sock:
        sock.sendall(head)
        return sock.makefile("rb").read()


def test_header_fields_are_read_as_sent_without_their_leading_blanks(push_service: PushService) -> None:
    browser = push_service.subscribe()
    path = browser.endpoint.removeprefix(push_service.origin).encode()
    # no Content-Length: refused 411, after the head was read and recorded
    head = b"POST " + path + b" HTTP/1.1\r\nX-Note: \t said twice  \r\nTTL:60\r\n\r\n"
    assert _raw(push_service, head).split()[1] == b"411"
    (received,) = push_service.received
    assert received.headers == {"x-note": "said twice  ", "ttl": "60"}  # leading blanks only, as http.server


@pytest.mark.parametrize(
    ("head", "status"),
    [
        # no version, or one that is not 1.x: answered as HTTP/0.9 (no status line), as http.server does
        (b"POST /push/x\r\n\r\n", None),
        (b"POST /push/x HTTP/2.0\r\n\r\n", None),
        (b"POST /push/x HTTP/1.1\r\nTTL: 60\r\n folded: on\r\n\r\n", b"400"),  # obs-fold
        (b"POST /push/x HTTP/1.1\r\nno colon here\r\n\r\n", b"400"),
        (b"POST /push/x HTTP/1.1\r\nBad Name: x\r\n\r\n", b"400"),
        (b"POST /push/x HTTP/1.1\r\n" + b"A: b\r\n" * 101 + b"\r\n", b"431"),
        (b"POST /push/x HTTP/1.1\r\nA: " + b"b" * 65536 + b"\r\n\r\n", b"431"),
    ],
)
def test_service_refuses_a_malformed_head(push_service: PushService, head: bytes, status: bytes | None) -> None:
    answer = _raw(push_service, head)
    if status is None:
        assert not answer.startswith(b"HTTP/") and b"Error code: 400" in answer
    else:
        assert answer.split()[1] == status
    assert push_service.received == []  # refused before the request was looked at


def test_answers_carry_the_current_date(hand: _Hand) -> None:
    for _ in range(2):  # the second answer's Date is the formatted one kept for its second
        answer = hand.post()
        when = email.utils.parsedate_to_datetime(answer.headers["Date"]).timestamp()
        assert abs(when - time.time()) < 5
