"""Only push services are reachable (invariant 13), end to end.

Subscribing to an internal address is refused by ``Governor.subscribe`` and ``gov subscribe``
with one line; a row that points somewhere it must not (stored before this check existed,
or by hand) is never posted to by a runner outside test mode: the row ends ``failed`` with
the reason, and the batch goes on.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from gov import Governor, InvalidSubscription, Message
from gov.cli import main
from gov.delivery.runner import Dispatcher
from gov.delivery.subscription import b64url_encode
from gov.delivery.vapid import VapidSigner
from gov.testing import PushService

SUBJECT = "mailto:push-ops@example.com"
KEYS = {"p256dh": b64url_encode(b"\x04" + bytes(64)), "auth": b64url_encode(b"\x01" * 16)}

HOSTILE = [
    "https://10.0.0.5/x",
    "https://169.254.169.254/latest/meta-data/",
    "https://127.0.0.1:8443/x",
    "https://[::1]/x",
    "https://192.168.1.1/x",
    "https://0.0.0.0/x",
    "https://100.64.0.1/x",
    "https://[::ffff:127.0.0.1]/x",
    "https://[fd00:ec2::254]/x",
    "https://0x7f000001/x",
    "https://2130706433/x",
    "https://localhost/x",
    "https://push.example.com:8443/x",
    "http://127.0.0.1:8080/push/x",
]


@pytest.fixture(autouse=True)
def _no_test_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOV_ALLOW_LOOPBACK_HTTP", raising=False)
    monkeypatch.delenv("GOV_PUSH_HOSTS", raising=False)


def _real_keys(push: PushService) -> dict[str, str]:
    return dict(push.subscribe().info["keys"])


@pytest.mark.parametrize("endpoint", HOSTILE)
def test_governor_refuses_hostile_endpoints_with_one_line(
    db_url: str, conn: psycopg.Connection[Any], endpoint: str, push: PushService
) -> None:
    with Governor(db_url, pool_size=1) as g, pytest.raises(InvalidSubscription) as refused:
        g.subscribe("u", {"endpoint": endpoint, "keys": _real_keys(push)})
    message = str(refused.value)
    assert message.startswith("endpoint:") and "\n" not in message, message
    assert conn.execute("SELECT count(*) FROM gov.subscriptions").fetchone() == (0,)


class _DNS:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, names: dict[str, str]) -> None:
        real = socket.getaddrinfo

        def fake(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
            if host in names:
                return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (names[host], int(port or 0)))]
            return real(host, port, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", fake)


def test_governor_resolves_the_name_when_storing(
    db_url: str, conn: psycopg.Connection[Any], push: PushService, monkeypatch: pytest.MonkeyPatch
) -> None:
    _DNS(monkeypatch, {"push.internal.example": "10.1.2.3", "push.public.example": "93.184.216.34"})
    with Governor(db_url, pool_size=1) as g:
        with pytest.raises(InvalidSubscription, match=r"push\.internal\.example resolves to 10\.1\.2\.3"):
            g.subscribe("u", {"endpoint": "https://push.internal.example/x", "keys": _real_keys(push)})
        assert g.subscribe("u", {"endpoint": "https://push.public.example/x", "keys": _real_keys(push)}) > 0
    assert conn.execute("SELECT endpoint FROM gov.subscriptions").fetchall() == [("https://push.public.example/x",)]


@pytest.mark.parametrize("endpoint", ["https://169.254.169.254/latest/meta-data/", "https://0x7f000001/x",
                                      "http://127.0.0.1:8080/push/x"])
def test_gov_subscribe_refuses_with_one_line(
    db_url: str, conn: psycopg.Connection[Any], push: PushService, endpoint: str
) -> None:
    stdin = json.dumps({"endpoint": endpoint, "keys": _real_keys(push)})
    result = CliRunner().invoke(main, ["subscribe", "--user", "u", "--database-url", db_url, "-"], input=stdin)
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gov: error: endpoint:"), result.stderr
    assert conn.execute("SELECT count(*) FROM gov.subscriptions").fetchone() == (0,)


# ---------------------------------------------------------------- at send time


def _store_by_hand(conn: psycopg.Connection[Any], user: str, endpoint: str, keys: dict[str, str]) -> None:
    """As an attacker with an old row would have it: straight into the table, unchecked."""
    conn.execute(
        "INSERT INTO gov.subscriptions (user_id, endpoint, p256dh, auth) VALUES (%s, %s, %s, %s)",
        (user, endpoint, keys["p256dh"], keys["auth"]),
    )


def _outcome(conn: psycopg.Connection[Any], message_id: str) -> tuple[str, list[str | None]]:
    row = conn.execute("SELECT state FROM gov.outbox WHERE message_id = %s", (message_id,)).fetchone()
    assert row is not None
    state = str(row[0])
    errors = [e for (e,) in conn.execute(
        "SELECT error FROM gov.delivery_attempts WHERE message_id = %s ORDER BY id", (message_id,))]
    return state, errors


def test_runner_without_test_mode_does_not_post_to_a_stored_http_endpoint(
    db_url: str, conn: psycopg.Connection[Any], push: PushService, signer: VapidSigner
) -> None:
    browser = push.subscribe("old")
    _store_by_hand(conn, "u", browser.endpoint, browser.info["keys"])
    with Governor(db_url, pool_size=1, allow_loopback_http=False) as g:
        g.send(Message(user_id="u", id="m1", tier="P0", title="hi"), deliver=False)
    with Dispatcher(db_url, signer, workers=2, allow_loopback_http=False) as runner:
        stats = runner.run_once()
    assert push.received == []
    assert stats.outcomes == {"failed": 1}
    state, errors = _outcome(conn, "m1")
    assert state == "failed"
    assert errors == ["endpoint refused: must use https://"] or (
        len(errors) == 1 and str(errors[0]).startswith("endpoint refused:")
    ), errors

    # with test mode, the same kind of row is delivered
    with Governor(db_url, pool_size=1, allow_loopback_http=False) as g:
        g.send(Message(user_id="u", id="m2", tier="P0", title="hi"), deliver=False)
    with Dispatcher(db_url, signer, workers=2, allow_loopback_http=True) as runner:
        runner.run_once()
    assert [json.loads(p)["data"]["id"] for p in push.delivered_payloads(browser)] == ["m2"]
    assert _outcome(conn, "m2")[0] == "delivered"


def test_runner_reads_test_mode_from_the_environment(
    db_url: str, conn: psycopg.Connection[Any], push: PushService, signer: VapidSigner,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    browser = push.subscribe()
    _store_by_hand(conn, "u", browser.endpoint, browser.info["keys"])
    with Governor(db_url, pool_size=1) as g:
        g.send(Message(user_id="u", id="m1", tier="P0", title="hi"), deliver=False)
    with Dispatcher(db_url, signer, workers=1) as runner:
        runner.run_once()
    assert push.received == []
    monkeypatch.setenv("GOV_ALLOW_LOOPBACK_HTTP", "1")
    with Governor(db_url, pool_size=1) as g:
        g.send(Message(user_id="u", id="m2", tier="P0", title="hi"), deliver=False)
    with Dispatcher(db_url, signer, workers=1) as runner:
        runner.run_once()
    assert len(push.delivered(browser)) == 1


def test_immediate_delivery_without_test_mode_does_not_post(
    db_url: str, conn: psycopg.Connection[Any], push: PushService, signer: VapidSigner
) -> None:
    browser = push.subscribe()
    _store_by_hand(conn, "u", browser.endpoint, browser.info["keys"])
    with Governor(db_url, signer=signer, pool_size=2, allow_loopback_http=False) as g:
        result = g.send(Message(user_id="u", id="m1", tier="P0", title="hi"))
    assert result.sent and result.delivered == 0
    assert push.received == []
    assert _outcome(conn, "m1")[0] == "failed"


@pytest.mark.parametrize(
    ("endpoint", "reason"),
    [
        ("https://10.0.0.5/push/x", "endpoint refused: 10.0.0.5 is a private address"),
        ("https://169.254.169.254/latest/meta-data/", "endpoint refused: 169.254.169.254 is a link-local"),
        ("https://127.0.0.1:{port}/push/x", "endpoint refused: 127.0.0.1 is a loopback address"),
        ("https://[::ffff:127.0.0.1]:{port}/push/x", "endpoint refused: ::ffff:127.0.0.1 is an IPv4-mapped"),
        ("https://2130706433:{port}/push/x", "endpoint refused: 2130706433 is a non-canonical"),
    ],
)
def test_stored_internal_endpoint_fails_its_row_and_the_batch_goes_on(
    db_url: str, conn: psycopg.Connection[Any], push: PushService, signer: VapidSigner, endpoint: str, reason: str
) -> None:
    bad = endpoint.format(port=push.port)
    _store_by_hand(conn, "bad", bad, _real_keys(push))
    good = push.subscribe("good")
    with Governor(db_url, pool_size=1, allow_loopback_http=True) as g:
        g.subscribe("good", good.info)
        g.send(Message(user_id="bad", id="b1", tier="P0", title="hi"), deliver=False)
        g.send(Message(user_id="good", id="g1", tier="P0", title="hi"), deliver=False)
    # test mode admits http and https to loopback literals on any port, never these forms
    with Dispatcher(db_url, signer, workers=2, allow_loopback_http=not bad.startswith("https://127.0.0.1")) as runner:
        runner.run_once()
    state, errors = _outcome(conn, "b1")
    assert state == "failed" and len(errors) == 1 and str(errors[0]).startswith(reason), errors
    assert {r.endpoint for r in push.received} <= {good.endpoint}
    if not bad.startswith("https://127.0.0.1"):
        assert _outcome(conn, "g1")[0] == "delivered"
