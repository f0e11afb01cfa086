"""What an outside probe of `gov serve`'s doors found (stop 41), each now a clear refusal:
a NUL byte in a subscription proof (was a 503 "the database is unavailable"), a body the
client abandons (was a traceback in the log per request), percent-escapes that are not
UTF-8 in a user id (were read as U+FFFD: two ids, one user), two Authorization headers
(the fast door and the routes each read another one), a trailing slash (a redirect built
from the Host header), JSON that is not UTF-8 (was guessed), and a beacon token echoed to
a server that signs none (was taken)."""

from __future__ import annotations

import secrets
import warnings
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from gov import Governor
from gov.aio import AsyncGovernor
from gov.http.app import asgi, create_app
from tests.aio import run_async

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"Using `httpx` with `starlette.testclient` is deprecated")
    from starlette.testclient import TestClient

TOKEN = secrets.token_urlsafe(24)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SEND = {"userId": "u1", "id": "m1", "tier": "P2", "title": "t"}


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    # behind its fast send door, as gov serve serves it (gov.http.app.asgi)
    with Governor(db_url, pool_size=2) as governor, TestClient(
        asgi(create_app(governor, TOKEN, subscribe_secret=secrets.token_bytes(32)))
    ) as c:
        yield c


def rows(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    return tuple(conn.execute(f"SELECT count(*) FROM gov.{t}").fetchone()[0]  # type: ignore[index]
                 for t in ("messages", "users", "subscriptions", "push_events"))


def test_a_nul_byte_in_a_subscription_proof_is_a_422_not_a_503(client: TestClient,
                                                              conn: psycopg.Connection[Any]) -> None:
    for proof in ({"endpoint": "https://push.example/a\x00", "auth": "x"}, {"endpoint": "https://p.example/a",
                                                                           "auth": "x\x00"}):
        r = client.post("/subscriptions/retire", json=proof)
        assert r.status_code == 422 and "NUL" in r.json()["error"], r.text
        sub = {"endpoint": "https://push.example/b", "keys": {"p256dh": "A" * 87, "auth": "A" * 22}}
        r = client.post("/subscriptions", json={"previous": proof, "subscription": sub})
        assert r.status_code == 422 and "NUL" in r.json()["error"], r.text
    assert rows(conn) == (0, 0, 0, 0)


def test_a_body_the_client_abandons_is_answered_not_raised(db_url: str) -> None:
    """The ASGI messages of a client that sends part of its body and closes the connection:
    the app answers (a 400 no one reads) instead of raising, which uvicorn logs as a traceback."""
    body: list[dict[str, Any]] = [{"type": "http.request", "body": b'{"timeZone": ', "more_body": True},
                                  {"type": "http.disconnect"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return body.pop(0) if body else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "PUT", "scheme": "http",
             "path": "/users/u1/preferences", "raw_path": b"/users/u1/preferences", "root_path": "",
             "query_string": b"", "server": ("testserver", 80), "client": ("127.0.0.1", 50000),
             "headers": [(b"host", b"testserver"), (b"authorization", f"Bearer {TOKEN}".encode()),
                         (b"content-type", b"application/json"), (b"content-length", b"100")]}
    with Governor(db_url, pool_size=1) as governor:
        run_async(asgi(create_app(governor, TOKEN))(scope, receive, send))  # type: ignore[arg-type]
    assert sent and sent[0]["type"] == "http.response.start" and sent[0]["status"] == 400, sent


def test_percent_escapes_that_are_not_utf8_are_refused(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    for path in ("/users/bad%ffid/preferences", "/users/bad%ed%a0%80/preferences", "/internal/users/bad%c0id/segment"):
        r = client.put(path, json={"timeZone": "UTC"} if "preferences" in path else {"segment": "engaged"},
                       headers=AUTH)
        assert r.status_code == 400 and "UTF-8" in r.json()["error"], (path, r.text)
    assert client.get("/users/bad%feid/preferences", headers=AUTH).status_code == 400
    assert rows(conn) == (0, 0, 0, 0)
    # a user id that is UTF-8, escaped, still names its user
    assert client.put("/users/b%C3%A9a/preferences", json={"timeZone": "UTC"}, headers=AUTH).status_code == 200
    assert conn.execute("SELECT user_id FROM gov.users").fetchall() == [("béa",)]


@pytest.mark.parametrize("order", ["wrong first", "token first"])
def test_two_authorization_headers_are_refused_at_every_door(client: TestClient, conn: psycopg.Connection[Any],
                                                             order: str) -> None:
    pair = [("Authorization", "Bearer wrong"), ("Authorization", f"Bearer {TOKEN}")]
    headers = pair if order == "wrong first" else pair[::-1]
    r = client.post("/internal/send", json=SEND, headers=headers)
    assert r.status_code == 401 and "more than one" in r.json()["error"], r.text
    assert client.get("/users/u1/preferences", headers=headers).status_code == 401
    assert rows(conn) == (0, 0, 0, 0)


def test_a_trailing_slash_is_a_json_404_not_a_redirect_to_the_host_header(client: TestClient) -> None:
    r = client.post("/internal/send/", json=SEND, headers={**AUTH, "Host": "evil.example"}, follow_redirects=False)
    assert r.status_code == 404 and "location" not in r.headers and "error" in r.json()


@pytest.mark.parametrize("encoding", ["utf-16", "utf-8-sig", "utf-32"])
def test_json_that_is_not_utf8_is_a_400(client: TestClient, conn: psycopg.Connection[Any], encoding: str) -> None:
    body = '{"userId": "u1", "id": "m1", "tier": "P2", "title": "t"}'.encode(encoding)
    r = client.post("/internal/send", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert rows(conn) == (0, 0, 0, 0)


def test_a_beacon_token_echoed_to_a_server_without_a_beacon_secret_is_refused(client: TestClient) -> None:
    report = {"kind": "payload", "userId": "u1", "messageId": "m1", "subscriptionId": 1, "token": "A" * 43}
    assert client.post("/events/errors", json=report).status_code == 403
    assert client.post("/events/errors", json={"kind": "payload"}).status_code == 204  # no token: counted


def test_refusals_of_deep_or_huge_json_say_what_is_wrong_not_how_to_tune_python(client: TestClient) -> None:
    for body, words in ((b"[" * 30_000 + b"]" * 30_000, "nested too deeply"),
                        (b'{"userId": "u1", "ttl": ' + b"9" * 5000 + b"}", "too many digits")):
        r = client.post("/internal/send", content=body, headers={**AUTH, "Content-Type": "application/json"})
        assert r.status_code == 400 and words in r.json()["error"] and "sys." not in r.json()["error"], r.text


def test_healthz_answers_for_the_sends_own_pool_too(db_url: str) -> None:
    """/healthz read the database through the app's own pool, while sends run on another
    (gov.aio): after a restart the sends' pool answered 503 for 20 s under a 200 here."""
    unreachable = AsyncGovernor("postgresql://gov@127.0.0.1:1/gov?connect_timeout=1", pool_size=1, pool_timeout=1.0)
    with Governor(db_url, pool_size=1) as governor, TestClient(
        asgi(create_app(governor, TOKEN, sender=unreachable))
    ) as c:
        r = c.get("/healthz")
        assert r.status_code == 503 and "error" in r.json(), r.text
    with Governor(db_url, pool_size=1) as governor, TestClient(asgi(create_app(governor, TOKEN))) as c:
        assert c.get("/healthz").json() == {"ok": True}
