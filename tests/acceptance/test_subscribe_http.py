"""POST /subscriptions and the other doors of the browser half, in process: every refusal is a
clear 4xx (or 501 when unconfigured) and writes nothing."""

from __future__ import annotations

import secrets
import warnings
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from gov import Governor
from gov.http.app import MAX_BODY_BYTES, create_app
from gov.http.tokens import mint_subscribe_token
from gov.testing import PushService

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"Using `httpx` with `starlette.testclient` is deprecated")
    from starlette.testclient import TestClient

TOKEN = secrets.token_urlsafe(24)
SECRET = secrets.token_bytes(32)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def app_client(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("GOV_ALLOW_LOOPBACK_HTTP", "1")
    with Governor(db_url, pool_size=2) as governor, TestClient(
        create_app(governor, TOKEN, subscribe_secret=SECRET, demo=True)
    ) as c:
        yield c


@pytest.fixture
def browser_sub() -> Iterator[dict[str, Any]]:
    with PushService() as service:
        yield service.subscribe().info


def subscriptions(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in conn.execute(
        "SELECT user_id, endpoint, retired_reason FROM gov.subscriptions ORDER BY id").fetchall()]


def test_a_token_subscribes_its_user(app_client: TestClient, browser_sub: dict[str, Any],
                                     conn: psycopg.Connection[Any]) -> None:
    token = mint_subscribe_token(SECRET, "alice")
    r = app_client.post("/subscriptions", json={"token": token, "subscription": browser_sub})
    assert r.status_code == 201, r.text
    assert r.json()["userId"] == "alice" and isinstance(r.json()["subscriptionId"], int)
    assert subscriptions(conn) == [("alice", browser_sub["endpoint"], None)]
    # naming the token's own user is fine; naming another is refused
    again = app_client.post("/subscriptions", json={"token": token, "subscription": browser_sub, "userId": "alice"})
    assert again.status_code == 201
    assert subscriptions(conn) == [("alice", browser_sub["endpoint"], None)]


@pytest.mark.parametrize(("status", "make", "error"), [
    (403, lambda s: {"token": mint_subscribe_token(SECRET, "alice", ttl_s=1, now=0), "subscription": s}, "expired"),
    (403, lambda s: {"token": mint_subscribe_token(secrets.token_bytes(32), "alice"), "subscription": s}, "signature"),
    (403, lambda s: {"token": mint_subscribe_token(SECRET, "alice"), "subscription": s, "userId": "bob"},
     "another user"),
    (403, lambda s: {"token": "v1.x.1.y", "subscription": s}, "signature"),
    (403, lambda s: {"token": "not a token", "subscription": s}, "malformed"),
    (422, lambda s: {"userId": "alice", "subscription": s}, "token"),  # a bare user id is not enough
    (422, lambda s: {"token": mint_subscribe_token(SECRET, "alice"),
                     "subscription": {**s, "keys": {"p256dh": "AAAA", "auth": s["keys"]["auth"]}}}, "p256dh"),
    (422, lambda s: {"token": mint_subscribe_token(SECRET, "alice"),
                     "subscription": {**s, "endpoint": "https://10.0.0.1/push"}}, "endpoint"),
    (422, lambda s: {"token": mint_subscribe_token(SECRET, "alice"), "subscription": s, "extra": 1}, "unknown field"),
    (403, lambda s: {"previous": {"endpoint": s["endpoint"], "auth": s["keys"]["auth"]}, "subscription": s},
     "no subscription"),
])
def test_refusals_write_nothing(app_client: TestClient, browser_sub: dict[str, Any], conn: psycopg.Connection[Any],
                                status: int, make: Any, error: str) -> None:
    r = app_client.post("/subscriptions", json=make(browser_sub))
    assert r.status_code == status, r.text
    assert error in r.json()["error"]
    assert subscriptions(conn) == []


def test_wrong_content_type_oversize_and_not_json(app_client: TestClient, browser_sub: dict[str, Any],
                                                  conn: psycopg.Connection[Any]) -> None:
    body = {"token": mint_subscribe_token(SECRET, "alice"), "subscription": browser_sub}
    import json

    r = app_client.post("/subscriptions", content=json.dumps(body), headers={"Content-Type": "text/plain"})
    assert r.status_code == 415 and "application/json" in r.json()["error"]
    r = app_client.post("/subscriptions", content=b"{" * 10, headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    r = app_client.post("/subscriptions", content=b" " * (MAX_BODY_BYTES + 1),
                        headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert subscriptions(conn) == []


def test_without_a_secret_token_subscribe_is_refused(db_url: str, browser_sub: dict[str, Any],
                                                     conn: psycopg.Connection[Any]) -> None:
    with Governor(db_url, pool_size=1) as governor, TestClient(create_app(governor, TOKEN)) as c:
        r = c.post("/subscriptions", json={"token": mint_subscribe_token(SECRET, "alice"), "subscription": browser_sub})
        assert r.status_code == 501 and "GOV_SUBSCRIBE_SECRET" in r.json()["error"]
        assert c.get("/demo").status_code == 404  # the demo only with --demo
    assert subscriptions(conn) == []


def test_renew_and_retire_need_the_old_endpoint_and_auth(app_client: TestClient, conn: psycopg.Connection[Any]) -> None:
    with PushService() as service:
        old, new, third = (service.subscribe().info for _ in range(3))
    app_client.post("/subscriptions", json={"token": mint_subscribe_token(SECRET, "alice"), "subscription": old})
    wrong = {"endpoint": old["endpoint"], "auth": new["keys"]["auth"]}
    assert app_client.post("/subscriptions", json={"previous": wrong, "subscription": new}).status_code == 403
    proof = {"endpoint": old["endpoint"], "auth": old["keys"]["auth"]}
    r = app_client.post("/subscriptions", json={"previous": proof, "subscription": new})
    assert r.status_code == 201 and r.json()["userId"] == "alice"
    assert subscriptions(conn) == [("alice", old["endpoint"], "replaced by the browser (pushsubscriptionchange)"),
                                   ("alice", new["endpoint"], None)]
    # retire: only with the auth secret; then the browser's own choice cannot be "renewed"
    wrong_auth = {"endpoint": new["endpoint"], "auth": "AAAA"}
    assert app_client.post("/subscriptions/retire", json=wrong_auth).status_code == 404
    new_proof = {"endpoint": new["endpoint"], "auth": new["keys"]["auth"]}
    assert app_client.post("/subscriptions/retire", json=new_proof).status_code == 204
    assert subscriptions(conn)[-1][2] == "unsubscribed in the browser (gov.unsubscribe)"
    assert app_client.post("/subscriptions", json={"previous": new_proof, "subscription": third}).status_code == 403


def test_assets_demo_token_and_worker_errors(app_client: TestClient) -> None:
    for path in ("/gov-sw.js", "/gov.js", "/demo/demo.js"):
        r = app_client.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript"), path
    assert "showNotification" in app_client.get("/gov-sw.js").text
    assert app_client.get("/demo").headers["content-type"].startswith("text/html")
    assert app_client.get("/demo/config.json").json() == {"vapidPublicKey": None, "subscribe": True}
    assert app_client.post("/demo/token", json={"userId": "alice"}).status_code == 401
    r = app_client.post("/demo/token", json={"userId": "alice"}, headers=AUTH)
    assert r.status_code == 200 and r.json()["userId"] == "alice"
    assert app_client.post("/events/errors", json={"kind": "payload", "detail": "x"}).status_code == 204
    assert app_client.post("/events/errors", json={"kind": "anything"}).status_code == 422
    assert app_client.post("/events/errors", json={"kind": "payload", "detail": "x" * 201}).status_code == 422
