"""HTTP bodies and paths, fuzzed, against ``gov serve``'s application (FastAPI, driven by Starlette's TestClient).

Property: every answer is a success or a 4xx carrying ``{"error": "<message>"}`` (the
router's own 404 and 405 too, e.g. for %2F in a user id) — never a 5xx — and a 4xx writes
nothing. Without the bearer token, /internal and /users answer 401 and write nothing,
whatever the body.
"""

from __future__ import annotations

import importlib.util
import json
import secrets
import warnings
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from gov import Governor, Message
from gov.delivery.beacon import BeaconKeys
from gov.testing import PushService
from gov.testing.postgres import TemplateDatabases
from tests.fuzz import FUZZ, NASTY, UNICODE, any_text

if importlib.util.find_spec("gov.http.app") is None:  # pragma: no cover - gov serve is part of gov now
    pytest.skip("gov.http.app does not exist yet: nothing to fuzz over HTTP", allow_module_level=True)

from gov.http.app import EVENT_FIELDS, PREFERENCE_FIELDS, SEND_FIELDS, create_app

with warnings.catch_warnings():
    # Starlette >= 1.10 prefers the httpx2 package for its TestClient and warns when it
    # finds only httpx; either drives the app the same way.
    warnings.filterwarnings("ignore", message=r"Using `httpx` with `starlette.testclient` is deprecated")
    from starlette.testclient import TestClient

TOKEN = secrets.token_urlsafe(24)
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
TABLES = ("messages", "sends", "push_suppressions", "message_content", "outbox", "deferred", "push_events", "users",
          "user_caps", "user_topic_optouts", "subscriptions")


@pytest.fixture(scope="module")
def http_url(databases: TemplateDatabases) -> Iterator[str]:
    url = databases.clone()
    yield url
    databases.drop(url)


KNOWN_USERS = ["u0", "u1", "u2"]
KNOWN_MESSAGES = ["m0", "m1", "m2"]


BEACON_KEYS = BeaconKeys(secrets.token_urlsafe(32).encode())
#: Each known user's subscription id, filled by the client fixture (beacon tokens cover it).
SUBSCRIPTIONS: dict[str, int] = {}


@pytest.fixture(scope="module")
def client(http_url: str) -> Iterator[TestClient]:
    with Governor(http_url, pool_size=2, allow_loopback_http=True) as governor, PushService() as push:
        for user in KNOWN_USERS:  # messages a beacon may be about, delivered to a subscription
            SUBSCRIPTIONS[user] = governor.subscribe(user, push.subscribe(user).info)
            for mid in KNOWN_MESSAGES:
                governor.send(Message(user_id=user, id=mid, tier="P0", title="hi"), deliver=False)
        app = create_app(governor, TOKEN, beacon_keys=BEACON_KEYS)
        with TestClient(app, raise_server_exceptions=False) as c:
            yield c


@pytest.fixture(scope="module")
def snapshot_conn(http_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(http_url, autocommit=True) as c:
        yield c


def snapshot(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Every row of every table the API writes (small: only this module writes here)."""
    return {t: sorted(map(repr, conn.execute(f"SELECT * FROM gov.{t}").fetchall())) for t in TABLES}


def check_answer(response: Any, ok: tuple[int, ...]) -> bool:
    """Success (one of ``ok``) or a 4xx with a message; never a 5xx. True when it succeeded."""
    if currently_in_test_context():
        event(f"status {response.status_code}")  # hypothesis statistics; outside a @given test there are none
    assert response.status_code < 500, f"{response.status_code}: {response.text[:300]}"
    if response.status_code in ok:
        return True
    assert 400 <= response.status_code < 500, response.status_code
    body = response.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"].strip(), body
    return False


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False, allow_infinity=False),
              any_text),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(any_text, children, max_size=4)),
    max_leaves=10,
)
field_values = st.one_of(any_text, st.none(), st.booleans(), st.integers(-5, 3_000_000), st.floats(allow_nan=False),
                         st.lists(any_text, max_size=2), st.sampled_from(["P0", "P1", "P2", "P3", "P7", "m1", "u1"]))


def shaped(fields: Any) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with the route's own field names (any values), sometimes an unknown field too."""
    return st.builds(
        lambda known, extra: {**known, **extra},
        st.fixed_dictionaries({}, optional=dict.fromkeys(fields, field_values)),
        st.dictionaries(st.sampled_from(["bogus", "user_id", "Tier", ""]), field_values, max_size=1),
    )


def bodies(fields: Any, plausible: st.SearchStrategy[dict[str, Any]] | None = None) -> st.SearchStrategy[bytes]:
    """Bytes, any JSON, objects with the route's fields, and (``plausible``) objects that may well succeed."""
    return st.one_of(
        st.binary(max_size=200),
        *([st.builds(lambda v: json.dumps(v).encode(), plausible)] * 3 if plausible is not None else []),
        st.builds(lambda v: json.dumps(v).encode(), json_values),
        st.builds(lambda v: json.dumps(v).encode(), shaped(fields)),
        st.builds(lambda v: json.dumps(v).encode(), shaped(fields)),
        st.sampled_from([b"", b"null", b"{", b"[]", b"NaN", b'{"tier": NaN}', b"[" * 5000, b'{"a":' * 3000,
                         b"\xff\xfe", b'{"userId": "u", "id": "m", "tier": "P1", "title": "t", "ttl": 1e400}']),
    )


valid_text = st.one_of(
    st.sampled_from([t for t in NASTY if "\x00" not in t and t.strip() and len(t) <= 256]),
    st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), min_size=1, max_size=30).filter(
        str.strip
    ),
)
plausible_sends = st.builds(
    lambda known, extra: {**known, **extra},
    st.fixed_dictionaries({"userId": st.one_of(valid_text, st.sampled_from(KNOWN_USERS)), "id": valid_text,
                           "tier": st.sampled_from(["P0", "P1", "P2", "P3", "P7"]), "title": valid_text}),
    st.fixed_dictionaries({}, optional={"body": valid_text, "url": valid_text, "topic": valid_text,
                                        "collapseKey": valid_text, "campaignId": valid_text,
                                        "ttl": st.integers(-1, 3_000_000)}),
)
def _with_token(event: dict[str, Any], how: str) -> dict[str, Any]:
    """The event with the token of its own delivery (``right``), of a neighbour's, or a junk one."""
    user, message = str(event["userId"]), str(event["messageId"])
    sub = SUBSCRIPTIONS.get(user, 1)
    if how == "right":
        return {**event, "subscriptionId": sub, "token": BEACON_KEYS.mint(user, message, sub)}
    if how == "other user":
        return {**event, "subscriptionId": sub, "token": BEACON_KEYS.mint(user + "x", message, sub)}
    if how == "other subscription":
        return {**event, "subscriptionId": sub + 1, "token": BEACON_KEYS.mint(user, message, sub)}
    if how == "junk":
        return {**event, "token": "A" * 22}
    return event  # "none": the unauthenticated beacon


plausible_events = st.builds(
    _with_token,
    st.fixed_dictionaries(
        {"userId": st.sampled_from([*KNOWN_USERS, "nobody"]),
         "messageId": st.sampled_from([*KNOWN_MESSAGES, "never"]),
         "event": st.sampled_from(["display", "click", "close", "unsubscribe", "accepted", "bogus"])},
        optional={"subscriptionId": st.one_of(st.none(), st.integers(-1, 2**40), st.just(True))},
    ),
    st.sampled_from(["right", "right", "other user", "other subscription", "junk", "none"]),
)


@FUZZ
@given(bodies(SEND_FIELDS, plausible_sends))
def test_send_bodies(client: TestClient, snapshot_conn: psycopg.Connection[Any], body: bytes) -> None:
    before = snapshot(snapshot_conn)
    response = client.post("/internal/send", content=body, headers=AUTH)
    if check_answer(response, (200,)):
        assert isinstance(response.json().get("sent"), bool), response.text
    else:
        assert snapshot(snapshot_conn) == before, f"a refused send wrote something: {body[:200]!r}"


@FUZZ
@given(bodies(EVENT_FIELDS, plausible_events))
def test_event_bodies(client: TestClient, snapshot_conn: psycopg.Connection[Any], body: bytes) -> None:
    before = snapshot(snapshot_conn)
    if not check_answer(client.post("/events", content=body, headers={"Content-Type": "application/json"}), (204,)):
        assert snapshot(snapshot_conn) == before, f"a refused event wrote something: {body[:200]!r}"
        return
    # taken: then it carried the token of exactly its own delivery (invariant 15)
    event = json.loads(body)
    assert BEACON_KEYS.verify(event.get("token"), event["userId"], event["messageId"], event.get("subscriptionId"))


preference_values = st.one_of(
    field_values,
    st.fixed_dictionaries({"start": st.sampled_from(["22:00", "07:30", "24:00", "x"]),
                           "end": st.sampled_from(["08:00", "22:00", ""])}),
    st.lists(st.fixed_dictionaries({"scope": st.sampled_from(["P1", "P2", "global", "topic", "P0", "X", "p2"]),
                                    "window": st.sampled_from(["24h", "7d", "1h", "0s", "-1h", "x", 86400000]),
                                    "cap": st.one_of(st.integers(-2, 10), st.sampled_from([True, "1", 2.5]))}),
             max_size=3),
    st.sampled_from(["Europe/Berlin", "America/New_York", "UTC", "Mars/Olympus", "", "../etc"]),
)
preference_docs = st.one_of(
    bodies(PREFERENCE_FIELDS),
    st.builds(lambda d: json.dumps(d).encode(),
              st.fixed_dictionaries({}, optional=dict.fromkeys(PREFERENCE_FIELDS, preference_values))),
)
user_paths = st.one_of(st.sampled_from(["u1", "u2", "%00", "%2F", "%ED%A0%80", "a" * 300]),
                       st.builds(lambda t: quote(t, safe=""), st.text(UNICODE, min_size=1, max_size=20)))


@FUZZ
@given(user_paths, preference_docs)
def test_preference_bodies(
    client: TestClient, snapshot_conn: psycopg.Connection[Any], user: str, body: bytes
) -> None:
    before = snapshot(snapshot_conn)
    response = client.put(f"/users/{user}/preferences", content=body, headers=AUTH)
    if not check_answer(response, (200,)):
        assert snapshot(snapshot_conn) == before, f"a refused PUT wrote something: {body[:200]!r}"
    check_answer(client.get(f"/users/{user}/preferences", headers=AUTH), (200,))


tokens = st.one_of(
    st.none(), st.just(""), st.just("Bearer"), st.just(f"Bearer {TOKEN[:-1]}"), st.just(f"Basic {TOKEN}"),
    st.just(f"Bearer {TOKEN} x"), st.just(f"Bearer  {TOKEN}x"), st.just(TOKEN),
    st.builds(lambda t: f"Bearer {t}", st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=40)),
)


@FUZZ
@given(tokens, st.sampled_from(["/internal/send", "/users/u1/preferences"]), bodies(SEND_FIELDS))
def test_without_the_token_nothing_is_written(
    client: TestClient, snapshot_conn: psycopg.Connection[Any], token: str | None, path: str, body: bytes
) -> None:
    before = snapshot(snapshot_conn)
    headers = {"Content-Type": "application/json"} | ({"Authorization": token} if token is not None else {})
    method = client.post if path.startswith("/internal") else client.put
    response = method(path, content=body, headers=headers)
    assert response.status_code == 401, (token, response.status_code, response.text[:200])
    assert response.headers.get("www-authenticate", "").startswith("Bearer")
    assert TOKEN not in response.text
    assert snapshot(snapshot_conn) == before


def test_an_oversize_body_is_refused_before_it_is_read(client: TestClient,
                                                        snapshot_conn: psycopg.Connection[Any]) -> None:
    before = snapshot(snapshot_conn)
    body = json.dumps({"userId": "u", "id": "big", "tier": "P1", "title": "t", "body": "x" * 70_000}).encode()
    assert client.post("/internal/send", content=body, headers=AUTH).status_code == 413
    assert snapshot(snapshot_conn) == before


# ---------------------------------------------------------------- known gov bugs, each its own test

SURROGATES = [  # JSON \uD800-style escapes decode to lone surrogates, which UTF-8 cannot encode
    ("POST", "/internal/send", b'{"userId": "\\ud800", "id": "m", "tier": "P1", "title": "t"}'),
    ("POST", "/internal/send", b'{"userId": "u", "id": "m\\udfff", "tier": "P1", "title": "t"}'),
    ("POST", "/internal/send", b'{"userId": "u", "id": "m", "tier": "P1", "title": "\\ud83d"}'),
    ("POST", "/events", b'{"userId": "\\ud800", "messageId": "m0", "event": "click"}'),
    ("PUT", "/users/u9/preferences", b'{"topicsOptedOut": ["\\ud800"]}'),
]


@pytest.mark.parametrize(("method", "path", "body"), SURROGATES)
def test_a_lone_surrogate_is_a_4xx(client: TestClient, snapshot_conn: psycopg.Connection[Any], method: str,
                                   path: str, body: bytes) -> None:
    before = snapshot(snapshot_conn)
    response = client.request(method, path, content=body, headers=AUTH)
    assert not check_answer(response, ())
    assert snapshot(snapshot_conn) == before


@pytest.mark.parametrize("sid", [2**63, 2**70])
def test_an_out_of_range_subscription_id_is_a_422(client: TestClient, sid: int) -> None:
    body = json.dumps({"userId": "u0", "messageId": "m0", "event": "click", "subscriptionId": sid}).encode()
    response = client.post("/events", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 422, (response.status_code, response.text)


@pytest.mark.parametrize("cap", [
    {"scope": "P2", "window": "24h", "cap": 2**31},
    {"scope": "P2", "window": "99999999999999999999d", "cap": 1},
])
def test_an_out_of_range_cap_is_a_422(client: TestClient, cap: dict[str, Any]) -> None:
    response = client.put("/users/u9/preferences", content=json.dumps({"caps": [cap]}).encode(), headers=AUTH)
    assert response.status_code == 422, (response.status_code, response.text)


def test_nasty_strings_are_stored_verbatim(client: TestClient) -> None:
    """Quotes, SQL and format strings in a user id go in and come out as they are."""
    for i, nasty in enumerate(t for t in NASTY if "\x00" not in t and t.strip() and len(t) <= 256):
        body = json.dumps({"userId": nasty, "id": f"nasty-{i}", "tier": "P0", "title": nasty}).encode()
        response = client.post("/internal/send", content=body, headers=AUTH)
        assert response.status_code == 200 and response.json() == {"sent": True}, (nasty, response.text)
