"""What an outside probe of `gov serve`'s doors found (stop 41), each now a clear refusal:
a NUL byte in a subscription proof (was a 503 "the database is unavailable"), a body the
client abandons (was a traceback in the log per request), percent-escapes that are not
UTF-8 in a user id (were read as U+FFFD: two ids, one user), two Authorization headers
(the fast door and the routes each read another one), a trailing slash (a redirect built
from the Host header), JSON that is not UTF-8 (was guessed), and a beacon token echoed to
a server that signs none (was taken)."""

from __future__ import annotations

import json
import secrets
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from gov import Governor
from gov.aio import AsyncGovernor
from gov.cli import main
from gov.errors import ConfigurationError
from gov.http import browser
from gov.http.app import asgi, create_app
from gov.http.browser import MAX_LIVE_SUBSCRIPTIONS
from gov.http.limits import RateLimit
from gov.http.models import Subscribe
from gov.http.refusals import HTTPError
from gov.http.tokens import mint_subscribe_token
from gov.testing import PushService
from tests.aio import run_async

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"Using `httpx` with `starlette.testclient` is deprecated")
    from starlette.testclient import TestClient

TOKEN = secrets.token_urlsafe(24)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SEND = {"userId": "u1", "id": "m1", "tier": "P2", "title": "t"}
SUBSCRIBE_SECRET = secrets.token_bytes(32)


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


# ---------------------------------------------------------------- the second probe (the browser half, the words)


@pytest.fixture
def door(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TestClient, Governor]]:
    """The app with subscribe tokens and a local push service's (loopback) endpoints admitted."""
    monkeypatch.setenv("GOV_ALLOW_LOOPBACK_HTTP", "1")
    with Governor(db_url, pool_size=4) as governor, TestClient(
        asgi(create_app(governor, TOKEN, subscribe_secret=SUBSCRIBE_SECRET, error_limit=RateLimit(per_client=2)))
    ) as c:
        yield c, governor


def live(conn: psycopg.Connection[Any], user: str) -> int:
    row = conn.execute("SELECT count(*) FROM gov.subscriptions WHERE user_id = %s AND retired_at IS NULL",
                       (user,)).fetchone()
    assert row is not None
    return int(row[0])


def proof(sub: dict[str, Any]) -> dict[str, str]:
    return {"endpoint": sub["endpoint"], "auth": sub["keys"]["auth"]}


def test_a_subscription_its_push_service_retired_is_renewed_once(door: tuple[TestClient, Governor],
                                                                conn: psycopg.Connection[Any]) -> None:
    """The probe renewed one 410'd subscription 50 times: 50 live subscriptions for its user."""
    client, _ = door
    with PushService() as service:
        old, *news = (service.subscribe().info for _ in range(4))
    token = mint_subscribe_token(SUBSCRIBE_SECRET, "alice")
    assert client.post("/subscriptions", json={"token": token, "subscription": old}).status_code == 201
    # as the runner leaves it when the push service answers 410
    conn.execute("UPDATE gov.subscriptions SET retired_at = now(), retired_reason = 'push service answered 410'")
    first = client.post("/subscriptions", json={"previous": proof(old), "subscription": news[0]})
    assert first.status_code == 201 and first.json()["userId"] == "alice", first.text
    for new in news[1:]:
        again = client.post("/subscriptions", json={"previous": proof(old), "subscription": new})
        assert again.status_code == 403 and "renew" in again.json()["error"], again.text
    assert live(conn, "alice") == 1
    assert conn.execute("SELECT retired_reason FROM gov.subscriptions WHERE endpoint = %s",
                        (old["endpoint"],)).fetchone() == (
        "replaced by the browser (pushsubscriptionchange) after: push service answered 410",)


def test_two_renewals_of_one_subscription_at_once_one_wins(door: tuple[TestClient, Governor],
                                                          conn: psycopg.Connection[Any]) -> None:
    client, governor = door
    with PushService() as service:
        old, a, b = (service.subscribe().info for _ in range(3))
    token = mint_subscribe_token(SUBSCRIBE_SECRET, "alice")
    assert client.post("/subscriptions", json={"token": token, "subscription": old}).status_code == 201
    conn.execute("UPDATE gov.subscriptions SET retired_at = now(), retired_reason = 'push service answered 404'")
    outcomes: list[object] = []
    # both are past their look-up of the old row before either may write: they meet at the write
    with psycopg.connect(conn.info.dsn) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(hashtextextended('alice', 2))")

        def renew(new: dict[str, Any]) -> None:
            try:
                outcomes.append(browser.subscribe(governor, SUBSCRIBE_SECRET, Subscribe.model_validate(
                    {"previous": proof(old), "subscription": new})).subscription_id)
            except HTTPError as exc:
                outcomes.append(exc.status)

        threads = [threading.Thread(target=renew, args=(new,)) for new in (a, b)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and conn.execute(  # both wait on the lock
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").fetchone() != (2,):
            time.sleep(0.02)
    for t in threads:
        t.join(timeout=30)
    assert sorted(outcomes, key=str).count(403) == 1 and len(outcomes) == 2, outcomes
    assert live(conn, "alice") == 1


def test_one_token_adds_at_most_the_cap_of_live_subscriptions(door: tuple[TestClient, Governor],
                                                              conn: psycopg.Connection[Any]) -> None:
    """The probe stored 500 subscriptions for one user with one token in 0.6 s, and a P0 send
    then went out 500 times."""
    client, governor = door
    token = mint_subscribe_token(SUBSCRIBE_SECRET, "alice")
    with PushService() as service:
        subs = [service.subscribe().info for _ in range(MAX_LIVE_SUBSCRIPTIONS + 3)]
    for sub in subs[:MAX_LIVE_SUBSCRIPTIONS]:
        assert client.post("/subscriptions", json={"token": token, "subscription": sub}).status_code == 201
    over = client.post("/subscriptions", json={"token": token, "subscription": subs[MAX_LIVE_SUBSCRIPTIONS]})
    assert over.status_code == 409 and "live subscriptions" in over.json()["error"], over.text
    assert live(conn, "alice") == MAX_LIVE_SUBSCRIPTIONS
    # the same endpoint again is an update, not one more; a renewal replaces one
    assert client.post("/subscriptions", json={"token": token, "subscription": subs[0]}).status_code == 201
    renewal = {"previous": proof(subs[1]), "subscription": subs[MAX_LIVE_SUBSCRIPTIONS + 1]}
    assert client.post("/subscriptions", json=renewal).status_code == 201
    assert live(conn, "alice") == MAX_LIVE_SUBSCRIPTIONS
    # the app's own trusted API is not bounded
    governor.subscribe("alice", subs[MAX_LIVE_SUBSCRIPTIONS + 2])
    assert live(conn, "alice") == MAX_LIVE_SUBSCRIPTIONS + 1


def test_padded_base64url_keys_are_taken_and_stored_unpadded(door: tuple[TestClient, Governor],
                                                            conn: psycopg.Connection[Any]) -> None:
    client, _ = door
    with PushService() as service:
        sub = service.subscribe().info
    padded = {**sub, "keys": {k: v + "=" * (-len(v) % 4) for k, v in sub["keys"].items()}}
    assert padded["keys"] != sub["keys"]
    token = mint_subscribe_token(SUBSCRIBE_SECRET, "alice")
    assert client.post("/subscriptions", json={"token": token, "subscription": padded}).status_code == 201
    assert conn.execute("SELECT p256dh, auth FROM gov.subscriptions").fetchone() == (
        sub["keys"]["p256dh"], sub["keys"]["auth"])
    wrong = {**sub, "keys": {**sub["keys"], "auth": sub["keys"]["auth"] + "==="}}
    assert client.post("/subscriptions", json={"token": token, "subscription": wrong}).status_code == 422


def test_a_token_that_is_not_printable_ascii_is_refused_at_start(governor: Governor, db_url: str) -> None:
    """A non-ASCII token worked on the fast door (bytes) and not on the others (401)."""
    for token in ("jeton-secret-très-long", "token-with-a-tab\t-inside-x"):
        with pytest.raises(ConfigurationError, match="printable ASCII"):
            create_app(governor, token)
    result = CliRunner().invoke(main, ["serve", "--port", "0", "--database-url", db_url],
                                env={"GOV_API_TOKEN": "jeton-secret-très-long"})
    assert result.exit_code == 1 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "printable ASCII" in result.stderr


def test_every_door_reads_the_authorization_header_as_the_same_bytes(db_url: str,
                                                                    conn: psycopg.Connection[Any]) -> None:
    """A token followed by a byte the routes stripped (Latin-1 NBSP, as str.strip reads it)
    and the fast door kept. Raw ASGI: an HTTP client library re-encodes such a header."""

    def status(method: str, path: str, authorization: bytes, body: bytes = b"") -> int:
        sent: list[dict[str, Any]] = []
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
                 "server": ("testserver", 80), "client": ("127.0.0.1", 50000),
                 "headers": [(b"host", b"testserver"), (b"authorization", authorization),
                             (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
        with Governor(db_url, pool_size=1) as governor:
            run_async(asgi(create_app(governor, TOKEN))(scope, receive, send))  # type: ignore[arg-type]
        return int(sent[0]["status"])

    nbsp = b"Bearer " + TOKEN.encode() + b"\xa0"
    assert status("GET", "/users/u1/preferences", b"Bearer " + TOKEN.encode()) == 200  # the token itself opens
    assert status("GET", "/users/u1/preferences", nbsp) == 401
    assert status("PUT", "/users/u1/preferences", nbsp, b'{"timeZone": "UTC"}') == 401
    assert status("POST", "/internal/send", nbsp, json.dumps(SEND).encode()) == 401
    assert rows(conn) == (0, 0, 0, 0)


@pytest.mark.parametrize(("method", "path", "body"), [
    ("post", "/internal/send", {**SEND, "tier": "P" * 65_000}),
    ("post", "/events", {"userId": "u1", "messageId": "m1", "event": "e" * 65_000}),
    ("put", "/users/u1/preferences", {"timeZone": "Z" * 65_000}),
    ("put", "/users/u1/preferences", {"quietHours": {"start": "9" * 65_000, "end": "08:00"}}),
])
def test_a_refusal_quotes_a_long_input_cut_short(client: TestClient, method: str, path: str,
                                                 body: dict[str, Any]) -> None:
    r = getattr(client, method)(path, json=body, headers=AUTH)
    assert r.status_code == 422, r.text[:300]
    error = r.json()["error"]
    assert len(r.content) < 400 and "…" in error, error[:400]


def test_malformed_worker_error_reports_take_from_the_bucket_too(door: tuple[TestClient, Governor]) -> None:
    client, _ = door  # 2 reports a minute per address here
    assert client.post("/events/errors", json={"kind": "bogus"}).status_code == 422
    assert client.post("/events/errors", content=b"not json").status_code == 400
    for bad in ({"kind": "bogus"}, {"kind": "payload"}):
        r = client.post("/events/errors", json=bad)
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1, r.text
    assert client.post("/events/errors", content=b"x" * 100_000).status_code == 429


def test_localtime_is_not_a_time_zone(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    """It names the host's /etc/localtime: quiet hours would follow the database host's setting."""
    for zone in ("localtime", "posixrules"):
        r = client.put("/users/u1/preferences", json={"timeZone": zone}, headers=AUTH)
        assert r.status_code == 422 and "host" in r.json()["error"], r.text
    assert rows(conn) == (0, 0, 0, 0)
    assert client.put("/users/u1/preferences", json={"timeZone": "Europe/Berlin"}, headers=AUTH).status_code == 200
