"""`gov serve`: the seed's verification against a real server process, then every route
and refusal in process (Starlette's TestClient)."""

from __future__ import annotations

import http.client
import json
import os
import secrets
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterator
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from click.testing import CliRunner

from gov import Governor
from gov.cli import main
from gov.delivery.beacon import BeaconKeys
from gov.http.app import MAX_BODY_BYTES, create_app
from gov.http.models import Error, Event, Preferences, Proof, Segment, Send, Subscribe, WorkerError
from gov.message import MAX_ID_LENGTH, MAX_TTL_S

with warnings.catch_warnings():
    # Starlette >= 1.10 prefers the httpx2 package for its TestClient and warns when it
    # finds only httpx; either drives the app the same way.
    warnings.filterwarnings("ignore", message=r"Using `httpx` with `starlette.testclient` is deprecated")
    from starlette.testclient import TestClient

TOKEN = secrets.token_urlsafe(24)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BEACON_KEYS = BeaconKeys(secrets.token_urlsafe(32).encode())


def _counts(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT (SELECT count(*) FROM gov.messages), (SELECT count(*) FROM gov.push_events), "
        "(SELECT count(*) FROM gov.user_caps), (SELECT count(*) FROM gov.users), "
        "(SELECT count(*) FROM gov.user_topic_optouts)"
    ).fetchone()
    assert row is not None
    return tuple(row)


# ---------------------------------------------------------------- a real server process


@pytest.fixture
def server(db_url: str) -> Iterator[tuple[str, int]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOV_VAPID")}
    env.update({"GOV_DATABASE_URL": db_url, "GOV_API_TOKEN": TOKEN})
    proc = subprocess.Popen(
        [sys.executable, "-m", "gov.cli", "serve", "--port", "0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:  # until it announces where it listens (or dies: end of file)
        lines.append(line)
        if line.startswith("gov: serving on http://"):
            host, port = line.strip().rsplit("//", 1)[1].rsplit(":", 1)
            break
    else:
        proc.wait(timeout=10)
        pytest.fail(f"gov serve did not start: {''.join(lines)}")
    try:
        yield host, int(port)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        # uvicorn shuts down gracefully, then re-raises the signal it caught
        assert proc.returncode in (0, -signal.SIGTERM), err
        assert "Traceback" not in err, err


def post(address: tuple[str, int], path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(*address, timeout=10)
    try:
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json", **headers})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_seed_verification_over_http(server: tuple[str, int], conn: psycopg.Connection[Any]) -> None:
    assert server[0] == "127.0.0.1"  # loopback by default
    printed = []
    for i in (1, 2, 3):
        body = json.dumps({"userId": "u42", "tier": "P2", "id": f"m{i}", "title": f"t{i}"}).encode()
        status, answer = post(server, "/internal/send", body, AUTH)
        assert status == 200
        printed.append(answer.decode())
    status, answer = post(server, "/internal/send", b'{"userId":"u42","tier":"P0","id":"otp-1","title":"Your code"}',
                          AUTH)
    printed.append(answer.decode())
    assert printed == [
        '{"sent":true}',
        '{"sent":true}',
        '{"sent":false,"action":"drop","reason":"cap_86400000ms"}',
        '{"sent":true}',
    ]
    # without the token: 401, and nothing written
    status, answer = post(server, "/internal/send", b'{"userId":"u42","tier":"P0","id":"otp-2","title":"x"}', {})
    assert status == 401 and json.loads(answer)["error"]
    assert conn.execute("SELECT message_id FROM gov.messages ORDER BY message_id").fetchall() == [
        ("m1",), ("m2",), ("m3",), ("otp-1",)
    ]


def test_refuses_to_start_without_a_token(db_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GOV_API_TOKEN"}
    result = subprocess.run(
        [sys.executable, "-m", "gov.cli", "serve", "--port", "0", "--database-url", db_url],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith("gov: error: GOV_API_TOKEN is not set"), line
    # nor with a guessable one
    weak = CliRunner().invoke(main, ["serve", "--port", "0", "--database-url", db_url], env={"GOV_API_TOKEN": "short"})
    assert weak.exit_code == 1 and weak.stderr.startswith("gov: error: GOV_API_TOKEN must be set"), weak.stderr


# ---------------------------------------------------------------- every route, in process


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    with Governor(db_url, pool_size=2, allow_loopback_http=True) as governor, \
            TestClient(create_app(governor, TOKEN, beacon_keys=BEACON_KEYS)) as c:
        yield c


def send(client: TestClient, payload: Any, headers: dict[str, str] | None = None) -> Any:
    return client.post("/internal/send", json=payload, headers=AUTH if headers is None else headers)


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong-token-of-enough-length"}, {"Authorization": f"Basic {TOKEN}"},
     {"Authorization": TOKEN}],
)
def test_internal_routes_need_the_token(client: TestClient, conn: psycopg.Connection[Any],
                                        headers: dict[str, str]) -> None:
    before = _counts(conn)
    r = send(client, {"userId": "u", "tier": "P0", "id": "m", "title": "t"}, headers)
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    assert client.get("/users/u/preferences", headers=headers).status_code == 401
    assert client.put("/users/u/preferences", json={"timeZone": "Europe/Paris"}, headers=headers).status_code == 401
    assert _counts(conn) == before


@pytest.mark.parametrize(
    ("body", "status", "match"),
    [
        (b"{not json", 400, "invalid JSON"),
        (b"", 400, "JSON body is required"),
        (b'{"userId": "u", "tier": "P2", "id": "m", "title": NaN}', 400, "invalid JSON"),
        (b"[1, 2]", 422, "expected a JSON object"),
        (b'{"userId": "u", "id": "m", "title": "t"}', 422, "tier is required"),
        (b'{"userId": "u", "tier": "P7", "id": "m", "title": "t"}', 422, "unknown tier"),
        (b'{"userId": "u", "tier": "P2", "id": "m"}', 422, "title is required"),
        (b'{"userId": 42, "tier": "P2", "id": "m", "title": "t"}', 422, "userId must be a string"),
        (b'{"userId": "u", "tier": "P2", "id": "m", "title": "t", "ttl": "1h"}', 422, "ttl"),
        (b'{"userId": "u", "tier": "P2", "id": "m", "title": "t", "campaignID": "c"}', 422,
         "unknown field 'campaignID'"),
    ],
)
def test_bad_sends_are_refused_and_record_nothing(
    client: TestClient, conn: psycopg.Connection[Any], body: bytes, status: int, match: str
) -> None:
    r = client.post("/internal/send", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert match in r.json()["error"]
    assert _counts(conn) == (0, 0, 0, 0, 0)


def test_oversize_bodies_get_413(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    big = {"userId": "u", "tier": "P2", "id": "m", "title": "t", "body": "x" * MAX_BODY_BYTES}
    assert send(client, big).status_code == 413
    # streamed without a Content-Length: counted as it arrives
    chunks = iter([b'{"userId": "u", "body": "', b"x" * MAX_BODY_BYTES, b'"}'])
    r = client.post("/events", content=chunks, headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert _counts(conn) == (0, 0, 0, 0, 0)


def test_send_takes_every_field(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    payload = {"userId": "u", "tier": "P3", "id": "d1", "title": "Digest", "body": "b", "url": "https://x.example/",
               "topic": "digest", "collapseKey": "weekly", "ttl": 600, "campaignId": "digest-w30"}
    assert send(client, payload).content == b'{"sent":true}'
    assert send(client, payload).content == b'{"sent":true}'  # a repeat gets the first verdict
    row = conn.execute(
        "SELECT m.tier, m.topic, m.campaign_id, c.collapse_key, c.ttl_s, c.content->>'url' "
        "FROM gov.messages m JOIN gov.message_content c USING (user_id, message_id)"
    ).fetchone()
    assert row == ("P3", "digest", "digest-w30", "weekly", 600, "https://x.example/")


def test_events_beacon(client: TestClient, db_url: str, conn: psycopg.Connection[Any], push: Any) -> None:
    with Governor(db_url, pool_size=1, allow_loopback_http=True) as governor:
        sub = governor.subscribe("u", push.subscribe("u").info)
    assert send(client, {"userId": "u", "tier": "P0", "id": "m", "title": "t"}).status_code == 200
    # what gov-sw.js echoes: the push's data.sub and data.token (tests/acceptance/test_beacons.py refuses the rest)
    beacon = {"userId": "u", "messageId": "m", "event": "click", "subscriptionId": sub,
              "token": BEACON_KEYS.mint("u", "m", sub)}
    r = client.post("/events", content=json.dumps(beacon), headers={"Content-Type": "text/plain"})  # sendBeacon
    assert r.status_code == 204 and r.content == b""
    assert client.post("/events", json=beacon).status_code == 204  # idempotent
    assert conn.execute("SELECT user_id, message_id, event FROM gov.push_events").fetchall() == [("u", "m", "click")]
    for bad, match in (
        ({**beacon, "messageId": "nope", "token": BEACON_KEYS.mint("u", "nope", sub)}, "unknown message nope"),
        ({**beacon, "event": "accepted"}, "delivery runner"),
        ({**beacon, "event": "open"}, "unknown event 'open'"),
        ({**beacon, "subscriptionId": 999, "token": BEACON_KEYS.mint("u", "m", 999)}, "subscription 999"),
        ({**beacon, "extra": 1}, "unknown field 'extra'"),
        ({**beacon, "token": "x" * 65}, "token"),
    ):
        r = client.post("/events", json=bad)
        assert r.status_code == 422 and match in r.json()["error"], (bad, r.text)
    assert conn.execute("SELECT count(*) FROM gov.push_events").fetchone() == (1,)


def test_the_app_puts_a_user_in_a_segment(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    assert client.put("/internal/users/u7/segment", json={"segment": "vip"}).status_code == 401  # the app's call only
    r = client.put("/internal/users/u7/segment", json={"segment": "vip"}, headers=AUTH)
    assert r.status_code == 200 and r.json() == {"segment": "vip"}, r.text
    assert conn.execute("SELECT segment FROM gov.users WHERE user_id = 'u7'").fetchone() == ("vip",)
    for bad in ({"segment": "VIP"}, {"segment": "a" * 33}, {"segment": 1}, {}):
        refused = client.put("/internal/users/u7/segment", json=bad, headers=AUTH)
        assert refused.status_code == 422 and "error" in refused.json(), (bad, refused.text)
    assert conn.execute("SELECT segment FROM gov.users WHERE user_id = 'u7'").fetchone() == ("vip",)
    assert client.put("/internal/users/u7/segment", json={"segment": None}, headers=AUTH).json() == {"segment": None}
    assert conn.execute("SELECT segment FROM gov.users WHERE user_id = 'u7'").fetchone() == (None,)


def test_preferences_round_trip(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    empty = client.get("/users/u42/preferences", headers=AUTH)
    assert empty.json() == {"userId": "u42", "timeZone": None, "quietHours": None, "caps": [], "topicsOptedOut": []}
    # quiet hours well away from now in Paris, so the sends below are not held by them
    paris_hour = datetime.now(ZoneInfo("Europe/Paris")).hour
    quiet = {"start": f"{(paris_hour + 6) % 24:02d}:30", "end": f"{(paris_hour + 8) % 24:02d}:00"}
    doc = {
        "timeZone": "Europe/Paris",
        "quietHours": quiet,
        "caps": [{"scope": "P2", "window": "24h", "cap": 1}, {"scope": "P2", "window": "7d", "cap": 3}],
        "topicsOptedOut": ["sale", "digest", "sale"],
    }
    put = client.put("/users/u42/preferences", json=doc, headers=AUTH)
    assert put.status_code == 200, put.text
    expected = {**doc, "userId": "u42", "topicsOptedOut": ["digest", "sale"]}
    assert put.json() == expected
    assert client.get("/users/u42/preferences", headers=AUTH).json() == expected
    # the user's own cap now governs: one P2 a day
    assert send(client, {"userId": "u42", "tier": "P2", "id": "a", "title": "t"}).content == b'{"sent":true}'
    second = send(client, {"userId": "u42", "tier": "P2", "id": "b", "title": "t"})
    assert json.loads(second.content)["sent"] is False
    # PUT replaces: what is left out is cleared
    smaller = client.put("/users/u42/preferences", json={"caps": [{"scope": "P2", "window": "7d", "cap": 2}]},
                         headers=AUTH)
    assert smaller.json() == {"userId": "u42", "timeZone": None, "quietHours": None,
                              "caps": [{"scope": "P2", "window": "7d", "cap": 2}], "topicsOptedOut": []}


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"timeZone": "Mars/Olympus_Mons"}, "unknown time zone"),
        ({"caps": [{"scope": "P2", "window": "24h", "cap": 5}]}, "above the default"),
        ({"caps": [{"scope": "P2", "window": "3h", "cap": 1}]}, "no default"),
        ({"caps": [{"scope": "P2", "window": "soon", "cap": 1}]}, "window"),
        ({"quietHours": {"start": "25:00", "end": "07:00"}}, "HH:MM"),
        ({"topicsOptedOut": "sale"}, "topicsOptedOut"),
        ({"userId": "someone-else"}, "differs"),
        ({"timezone": "Europe/Paris"}, "unknown field 'timezone'"),
    ],
)
def test_invalid_preferences_change_nothing(
    client: TestClient, conn: psycopg.Connection[Any], doc: dict[str, Any], match: str
) -> None:
    good = {"timeZone": "Europe/Berlin", "caps": [{"scope": "P2", "window": "24h", "cap": 1}], "topicsOptedOut": ["x"]}
    assert client.put("/users/u/preferences", json=good, headers=AUTH).status_code == 200
    before = _counts(conn)
    # a valid first part does not get written when a later part is refused
    r = client.put("/users/u/preferences", json={"topicsOptedOut": ["y"], **doc}, headers=AUTH)
    assert r.status_code == 422 and match in r.json()["error"], r.text
    assert _counts(conn) == before
    assert client.get("/users/u/preferences", headers=AUTH).json() == {**good, "userId": "u", "quietHours": None}


def test_healthz_and_openapi(client: TestClient, db_url: str) -> None:
    assert client.get("/healthz").json() == {"ok": True}
    spec = client.get("/openapi.json").json()
    assert spec["openapi"].startswith("3.")
    assert set(spec["paths"]) == {"/internal/send", "/events", "/users/{userId}/preferences",
                                  "/internal/users/{userId}/segment", "/healthz",
                                  "/metrics", "/openapi.json",
                                  # the browser half (gov.http.browser); the demo's routes only with --demo
                                  "/gov-sw.js", "/gov.js", "/subscriptions", "/subscriptions/retire", "/events/errors"}
    assert spec["components"]["schemas"]["Send"]["required"] == ["userId", "tier", "id", "title"]
    with Governor(db_url, pool_size=1, pool_timeout=0.5) as governor:
        app = create_app(governor, TOKEN)
    # the governor is closed: the database is unreachable for this app
    with TestClient(app) as down:
        r = down.get("/healthz")
    assert r.status_code == 503 and "database" in r.json()["error"]


def test_create_app_refuses_a_weak_token(governor: Governor) -> None:
    from gov import ConfigurationError

    with pytest.raises(ConfigurationError, match="GOV_API_TOKEN"):
        create_app(governor, "too-short")


# ---------------------------------------------------------------- one source: the models


#: Every route and the model of its request body (None: it takes none).
ROUTES = [
    ("post", "/internal/send", Send),
    ("post", "/events", Event),
    ("get", "/users/{userId}/preferences", None),
    ("put", "/users/{userId}/preferences", Preferences),
    ("put", "/internal/users/{userId}/segment", Segment),
    ("get", "/healthz", None),
    ("get", "/metrics", None),
    ("get", "/openapi.json", None),
    ("get", "/gov-sw.js", None),
    ("get", "/gov.js", None),
    ("post", "/subscriptions", Subscribe),
    ("post", "/subscriptions/retire", Proof),
    ("post", "/events/errors", WorkerError),
]


def _resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    assert ref.startswith("#/components/schemas/"), ref
    return spec["components"]["schemas"][ref.rsplit("/", 1)[1]]


def _conforms(spec: dict[str, Any], schema: dict[str, Any], value: Any) -> None:
    """``value`` fits the documented object ``schema``: its required fields, no others, the right types."""
    schema = _resolve(spec, schema)
    assert schema["type"] == "object" and isinstance(value, dict), (schema, value)
    assert set(schema.get("required", ())) <= set(value) <= set(schema["properties"]), (schema, value)
    types = {"string": str, "integer": int, "boolean": bool, "object": dict, "array": list}
    for name, item in value.items():
        assert isinstance(item, types[schema["properties"][name]["type"]]), (name, item)


def test_openapi_lists_every_route_with_its_request_model(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert spec["openapi"].startswith("3.1")
    served = {(method, path) for path, item in spec["paths"].items() for method in item}
    assert served == {(method, path) for method, path, _ in ROUTES}
    for method, path, model in ROUTES:
        operation = spec["paths"][path][method]
        if model is None:
            assert "requestBody" not in operation, (method, path)
            continue
        schema = operation["requestBody"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{model.__name__}"}, (method, path)
        documented = spec["components"]["schemas"][model.__name__]
        assert set(documented["properties"]) == {f.alias for f in model.model_fields.values()}
        assert documented["additionalProperties"] is False
        # every refusal is documented as gov's error body, never FastAPI's {"detail": [...]}
        for status in ("400", "413", "422"):
            refusal = operation["responses"][status]["content"]["application/json"]["schema"]
            assert _resolve(spec, refusal) == _resolve(spec, {"$ref": f"#/components/schemas/{Error.__name__}"})
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    # the limits are gov's constants, not copies
    send = spec["components"]["schemas"]["Send"]
    assert send["required"] == ["userId", "tier", "id", "title"]
    assert send["properties"]["userId"]["maxLength"] == MAX_ID_LENGTH
    (ttl,) = (t for t in send["properties"]["ttl"]["anyOf"] if t["type"] == "integer")
    assert ttl["maximum"] == MAX_TTL_S
    assert spec["paths"]["/internal/send"]["post"]["security"] == [{"bearer": []}]
    assert spec["paths"]["/metrics"]["get"]["security"] == [{"metrics": []}]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/internal/send", {"userId": "u", "tier": "P2", "id": "m", "title": "t", "ttl": MAX_TTL_S + 1}),
        ("post", "/internal/send", {"userId": "u" * (MAX_ID_LENGTH + 1), "tier": "P2", "id": "m", "title": "t"}),
        ("post", "/internal/send", {"userId": "u", "tier": "P2", "id": "m", "title": 7}),
        ("post", "/events", {"userId": "u", "messageId": "m", "event": "click", "subscriptionId": "1"}),
        ("put", "/users/{userId}/preferences", {"caps": [{"scope": "P2", "window": "24h", "cap": -1}]}),
        ("put", "/users/{userId}/preferences", {"quietHours": {"start": "22:00"}}),
    ],
)
def test_a_body_the_model_refuses_gets_the_documented_error(
    client: TestClient, conn: psycopg.Connection[Any], method: str, path: str, body: Any
) -> None:
    spec = client.get("/openapi.json").json()
    r = client.request(method.upper(), path.replace("{userId}", "u"), json=body, headers=AUTH)
    assert r.status_code == 422, r.text
    _conforms(spec, spec["paths"][path][method]["responses"]["422"]["content"]["application/json"]["schema"],
              r.json())
    assert r.json()["error"].strip()
    assert _counts(conn) == (0, 0, 0, 0, 0)


def test_limits_are_the_constants(client: TestClient) -> None:
    def status(**fields: Any) -> int:
        return send(client, {"userId": "u", "tier": "P2", "id": "m", "title": "t", **fields}).status_code

    assert status(userId="u" * MAX_ID_LENGTH, id="a") == 200
    assert status(userId="u" * (MAX_ID_LENGTH + 1), id="b") == 422
    assert status(ttl=MAX_TTL_S, id="c") == 200
    assert status(ttl=MAX_TTL_S + 1, id="d") == 422
    assert status(ttl=True, id="e") == 422  # no coercion: true is not 1
    assert status(topic="x\x00", id="f") == 422
    assert status(topic="", id="g") == 422


def test_unknown_routes_and_methods_answer_json(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    error = spec["components"]["schemas"]["Error"]
    missing = client.get("/nowhere", headers=AUTH)
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/json"
    _conforms(spec, error, missing.json())
    wrong = client.delete("/users/u/preferences", headers=AUTH)
    assert wrong.status_code == 405 and wrong.headers["content-type"] == "application/json"
    _conforms(spec, error, wrong.json())
    assert wrong.headers["allow"] == "GET, PUT"
    assert client.get("/internal/send", headers=AUTH).json() == {"error": "Method Not Allowed"}
    # HEAD is GET without the body, as before
    head = client.head("/healthz")
    assert head.status_code == 200 and head.content == b""


def test_every_door_answers_after_the_database_dropped_its_connections(
    client: TestClient, db_url: str, conn: psycopg.Connection[Any], push: Any
) -> None:
    """The database is up but closed the server's connections (a failover, an idle
    timeout, pg_terminate_backend): each door's first statement finds its pooled
    connection dead and runs again on a fresh one, as the README promises; an outside
    probe saw 503s from /healthz, /metrics, /events and the preference and segment PUTs."""
    with Governor(db_url, pool_size=1, allow_loopback_http=True) as governor:
        sub = governor.subscribe("u", push.subscribe("u").info)
    assert send(client, {"userId": "u", "tier": "P0", "id": "m", "title": "t"}).status_code == 200
    beacon = {"userId": "u", "messageId": "m", "event": "click", "subscriptionId": sub,
              "token": BEACON_KEYS.mint("u", "m", sub)}
    doors = [
        lambda: client.get("/healthz"),
        lambda: client.post("/events", json=beacon),
        lambda: client.get("/users/u/preferences", headers=AUTH),
        lambda: client.put("/users/u/preferences", json={"timeZone": "Europe/Berlin"}, headers=AUTH),
        lambda: client.put("/internal/users/u/segment", json={"segment": "vip"}, headers=AUTH),
        lambda: send(client, {"userId": "u", "tier": "P0", "id": "m2", "title": "t"}),
    ]
    for door in doors:
        assert door().status_code < 300  # every pool has its connections open
    for door in doors:
        (dropped,) = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                                  " WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchone()
        assert dropped >= 1
        r = door()
        assert r.status_code < 300, r.text
    assert conn.execute("SELECT segment, time_zone FROM gov.users WHERE user_id = 'u'").fetchone() == (
        "vip", "Europe/Berlin")
