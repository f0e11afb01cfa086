"""Issue 29, part 1: outsiders cannot write the signals (invariant 15).

The attack of the issue, against gov serve's application: a user at their P2 cap, a
policy that gives engaged users a higher cap, one forged beacon. Without the beacon token
its push carried, every beacon is refused (403), writes nothing, and so moves no segment
and frees no budget. With the token the runner really put in the payload (read back from
gov's test push service, which decrypts as the browser would), the same beacon counts.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from gov import Governor, Message
from gov.cli import main
from gov.delivery.beacon import BeaconKeys, beacon_token
from gov.delivery.runner import Dispatcher
from gov.delivery.vapid import VapidSigner
from gov.hold.release import Releaser
from gov.http.app import create_app
from gov.http.limits import RateLimit
from gov.testing import Clock, PushService
from tests.acceptance.test_serve import post

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"Using `httpx` with `starlette.testclient` is deprecated")
    from starlette.testclient import TestClient

TOKEN = secrets.token_urlsafe(24)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SECRET = secrets.token_urlsafe(32).encode()
KEYS = BeaconKeys(SECRET)
ENGAGED_POLICY = """
[tiers.P2.segments.engaged]    # engaged users may have more: what a forged click would buy
windows = [{ window = "24h", cap = 4 }, { window = "7d", cap = 10 }]
"""
EVENTS = "SELECT count(*) FROM gov.push_events WHERE event <> 'accepted'"


def cli(db_url: str, *args: str) -> Any:
    result = CliRunner().invoke(main, list(args), env={"GOV_DATABASE_URL": db_url})
    assert result.exit_code == 0, result.output
    return result


def segment(conn: psycopg.Connection[Any], user: str) -> str | None:
    row = conn.execute("SELECT segment FROM gov.users WHERE user_id = %s", (user,)).fetchone()
    return None if row is None else row[0]


@pytest.fixture
def engaged_policy(db_url: str, tmp_path: Path) -> None:
    default = (Path(__file__).resolve().parents[2] / "gov" / "default_policy.toml").read_text()
    path = tmp_path / "policy.toml"
    path.write_text(default + ENGAGED_POLICY)
    cli(db_url, "policy", "apply", str(path))


@pytest.fixture
def gov(db_url: str) -> Iterator[Governor]:
    with Governor(db_url, pool_size=2, allow_loopback_http=True) as g:
        yield g


@pytest.fixture
def client(gov: Governor) -> Iterator[TestClient]:
    with TestClient(create_app(gov, TOKEN, beacon_keys=KEYS)) as c:
        yield c


@pytest.fixture
def victim(gov: Governor, client: TestClient, push: PushService, engaged_policy: None) -> dict[str, Any]:
    """A subscribed user whose third P2 of the day was dropped; m1 and m2 were delivered."""
    sub = gov.subscribe("victim", push.subscribe("victim").info)
    verdicts = [client.post("/internal/send", json={"userId": "victim", "tier": "P2", "id": f"m{i}", "title": f"t{i}"},
                            headers=AUTH).json() for i in (1, 2, 3)]
    assert verdicts == [{"sent": True}, {"sent": True},
                        {"sent": False, "action": "drop", "reason": "cap_86400000ms"}]
    return {"subscription_id": sub}


def flip(token: str, at: int) -> str:
    return token[:at] + ("B" if token[at] != "B" else "C") + token[at + 1:]


def beacon(client: TestClient, body: dict[str, Any]) -> Any:
    # as gov-sw.js sends it: text/plain, no preflight
    return client.post("/events", content=json.dumps(body), headers={"Content-Type": "text/plain"})


@pytest.mark.parametrize("event", ["click", "unsubscribe", "close", "display"])
def test_a_forged_beacon_is_refused_and_changes_no_row_segment_or_cap(
    db_url: str, client: TestClient, conn: psycopg.Connection[Any], victim: dict[str, Any], event: str,
) -> None:
    """The issue's sequence: one unauthenticated beacon used to move the user to `engaged`."""
    cli(db_url, "segments", "refresh")
    before = segment(conn, "victim")
    assert before == "casual"  # new, never clicked
    report_before = cli(db_url, "report", "fatigue", "--json").output
    for forged in (
        {"userId": "victim", "messageId": "m1", "event": event},  # the issue's, word for word
        {"userId": "victim", "messageId": "m1", "event": event, "subscriptionId": victim["subscription_id"]},
        {"userId": "victim", "messageId": "m1", "event": event, "subscriptionId": victim["subscription_id"],
         "token": "A" * 22},  # a guess of the right shape
    ):
        r = beacon(client, forged)
        assert r.status_code == 403 and "beacon token" in r.json()["error"], r.text
    assert conn.execute(EVENTS).fetchone() == (0,)
    cli(db_url, "segments", "refresh")
    assert segment(conn, "victim") == "casual"
    r = client.post("/internal/send", json={"userId": "victim", "tier": "P2", "id": "m4", "title": "t4"}, headers=AUTH)
    assert r.json() == {"sent": False, "action": "drop", "reason": "cap_86400000ms"}  # still at the cap
    assert cli(db_url, "report", "fatigue", "--json").output == report_before  # nothing for the report to read
    assert conn.execute(EVENTS).fetchone() == (0,)


def test_a_token_for_another_user_message_or_subscription_is_refused(
    db_url: str, gov: Governor, client: TestClient, push: PushService, conn: psycopg.Connection[Any],
    victim: dict[str, Any],
) -> None:
    sub = victim["subscription_id"]
    other_sub = gov.subscribe("victim", push.subscribe("victim-phone").info)  # the same user's other browser
    attacker_sub = gov.subscribe("attacker", push.subscribe("attacker").info)
    click = {"userId": "victim", "messageId": "m1", "event": "click", "subscriptionId": sub}
    for token in (
        KEYS.mint("attacker", "m1", sub),        # another user's (an attacker's own, say)
        KEYS.mint("victim", "m2", sub),          # another message's
        KEYS.mint("victim", "m1", other_sub),    # another subscription's
        KEYS.mint("attacker", "m1", attacker_sub),
        beacon_token(secrets.token_bytes(32), "victim", "m1", sub),  # a secret gov does not have
        flip(KEYS.mint("victim", "m1", sub), 0),   # one character changed
        flip(KEYS.mint("victim", "m1", sub), 21),  # the last one (2 bits of the 128)
    ):
        r = beacon(client, {**click, "token": token})
        assert r.status_code == 403, (token, r.text)
    # the token of the m1 delivery, but claimed for the other subscription
    r = beacon(client, {**click, "subscriptionId": other_sub, "token": KEYS.mint("victim", "m1", sub)})
    assert r.status_code == 403
    assert conn.execute(EVENTS).fetchone() == (0,)

    # the right one counts, once per kind: what a stolen token allows, and no more
    good = {**click, "token": KEYS.mint("victim", "m1", sub)}
    assert beacon(client, good).status_code == 204
    assert beacon(client, good).status_code == 204  # idempotent: still one row
    assert conn.execute(EVENTS).fetchone() == (1,)
    cli(db_url, "segments", "refresh")
    assert segment(conn, "victim") == "engaged"  # the genuine click does what the forged one could not
    r = client.post("/internal/send", json={"userId": "victim", "tier": "P2", "id": "m5", "title": "t5"}, headers=AUTH)
    assert r.json() == {"sent": True}


def test_rotation_accepts_the_previous_secret_and_refuses_one_no_longer_configured(
    gov: Governor, push: PushService, conn: psycopg.Connection[Any],
) -> None:
    old, new = secrets.token_urlsafe(32).encode(), secrets.token_urlsafe(32).encode()
    sub = gov.subscribe("u", push.subscribe("u").info)
    for i in (1, 2, 3):
        gov.send(Message(user_id="u", id=f"r{i}", tier="P0", title="t"), deliver=False)
    made_before = BeaconKeys(old).mint("u", "r1", sub)
    with TestClient(create_app(gov, TOKEN, beacon_keys=BeaconKeys(new, previous=old))) as rotating:
        ok = {"userId": "u", "messageId": "r1", "event": "display", "subscriptionId": sub, "token": made_before}
        assert beacon(rotating, ok).status_code == 204
        assert beacon(rotating, {**ok, "messageId": "r2", "token": BeaconKeys(new).mint("u", "r2", sub)}).status_code \
            == 204
    with TestClient(create_app(gov, TOKEN, beacon_keys=BeaconKeys(new))) as rotated:  # the previous one dropped
        expired = {"userId": "u", "messageId": "r3", "event": "display", "subscriptionId": sub,
                   "token": BeaconKeys(old).mint("u", "r3", sub)}
        r = beacon(rotated, expired)
        assert r.status_code == 403, r.text
    assert conn.execute(EVENTS).fetchone() == (2,)


def test_without_a_beacon_secret_no_beacon_is_taken(gov: Governor, push: PushService,
                                                     conn: psycopg.Connection[Any]) -> None:
    sub = gov.subscribe("u", push.subscribe("u").info)
    gov.send(Message(user_id="u", id="n1", tier="P0", title="t"), deliver=False)
    with TestClient(create_app(gov, TOKEN)) as unconfigured:
        for token in (None, KEYS.mint("u", "n1", sub)):
            body = {"userId": "u", "messageId": "n1", "event": "click", "subscriptionId": sub}
            r = beacon(unconfigured, body if token is None else {**body, "token": token})
            assert r.status_code == 501 and "GOV_BEACON_SECRET" in r.json()["error"], r.text
    assert conn.execute(EVENTS).fetchone() == (0,)


def test_the_runner_puts_the_token_in_each_delivery_and_the_worker_echo_counts(
    db_url: str, gov: Governor, client: TestClient, push: PushService, signer: VapidSigner,
    conn: psycopg.Connection[Any],
) -> None:
    """Two browsers of one user: each payload's token covers its own subscription, and a
    collapsed summary's covers the summary's message id."""
    laptop, phone = push.subscribe("laptop"), push.subscribe("phone")
    subs = {gov.subscribe("u", laptop.info): laptop, gov.subscribe("u", phone.info): phone}
    clock = Clock(datetime.now(UTC).replace(microsecond=0))  # near the real time: VAPID's exp
    with Governor(db_url, pool_size=2, allow_loopback_http=True, clock=clock) as timed, \
            Dispatcher(db_url, signer, workers=2, clock=clock, beacon_keys=KEYS, allow_loopback_http=True) as runner:
        timed.send(Message(user_id="u", id="p1", tier="P0", title="Your code"), deliver=False)
        for i in (1, 2, 3):  # the first goes out, the next two collapse into one summary
            timed.send(Message(user_id="u", id=f"d{i}", tier="P3", title=f"Digest {i}", collapse_key="digest",
                               ttl=14 * 86_400), deliver=False)
        runner.run_once()
        clock.advance(days=7, hours=1)
        assert Releaser(db_url, clock=clock).run_once().outcomes.get("summary") == 1
        runner.run_once()
    seen = []
    for sub_id, browser in subs.items():
        for raw in push.delivered_payloads(browser):
            data = json.loads(raw)["data"]
            assert data["sub"] == sub_id and KEYS.verify(data["token"], "u", data["id"], sub_id), data
            seen.append((data["id"], data.get("count")))
            # what gov-sw.js posts for it
            r = beacon(client, {"userId": "u", "messageId": data["id"], "event": "display", "subscriptionId": sub_id,
                                "token": data["token"]})
            assert r.status_code == 204, r.text
    assert sorted(seen) == sorted([("p1", None), ("d1", None), ("d3", 2)] * 2), seen
    assert conn.execute(EVENTS).fetchone() == (6,)


def test_error_reports_are_bounded_per_address_and_check_a_token_given(gov: Governor, push: PushService) -> None:
    now = [0.0]
    limit = RateLimit(per_client=3, overall=5, max_clients=2, clock=lambda: now[0])
    sub = gov.subscribe("u", push.subscribe("u").info)
    with TestClient(create_app(gov, TOKEN, beacon_keys=KEYS, error_limit=limit)) as c:
        report = {"kind": "payload", "detail": "payload has no title"}
        assert [c.post("/events/errors", json=report).status_code for _ in range(4)] == [204, 204, 204, 429]
        r = c.post("/events/errors", json=report)
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1 and r.json()["error"]
        now[0] += 60  # a minute later the bucket is full again
        # a token echoed must be the push's own
        forged = {**report, "userId": "u", "messageId": "m", "subscriptionId": sub, "token": "A" * 22}
        assert c.post("/events/errors", json=forged).status_code == 403
        genuine = {**forged, "token": KEYS.mint("u", "m", sub)}
        assert c.post("/events/errors", json=genuine).status_code == 204
    # the table of addresses stays bounded whatever comes; everyone together is bounded too
    for i in range(50):
        limit.allow(f"198.51.100.{i}")
    assert len(limit) <= 2
    assert limit.allow("203.0.113.9") is not None  # the overall bucket (5 a minute) is spent


# ---------------------------------------------------------------- a real gov serve process


@pytest.fixture
def serve_process(db_url: str, request: pytest.FixtureRequest) -> Iterator[tuple[tuple[str, int], str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOV_VAPID", "GOV_BEACON"))}
    env.update({"GOV_DATABASE_URL": db_url, "GOV_API_TOKEN": TOKEN, **request.param})
    proc = subprocess.Popen([sys.executable, "-m", "gov.cli", "serve", "--port", "0"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("gov: serving on http://"):
            host, port = line.strip().rsplit("//", 1)[1].rsplit(":", 1)
            break
    else:
        proc.wait(timeout=10)
        pytest.fail(f"gov serve did not start: {''.join(lines)}")
    try:
        yield (host, int(port)), "".join(lines)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode in (0, -signal.SIGTERM), err
        assert "Traceback" not in err, err


@pytest.mark.parametrize("serve_process", [{"GOV_BEACON_SECRET": SECRET.decode()}], indirect=True)
def test_gov_serve_refuses_the_forged_click_over_http(
    serve_process: tuple[tuple[str, int], str], gov: Governor, push: PushService, conn: psycopg.Connection[Any],
) -> None:
    address, started = serve_process
    assert "no beacon secret" not in started
    sub = gov.subscribe("victim", push.subscribe("victim").info)
    gov.send(Message(user_id="victim", id="m1", tier="P2", title="t"), deliver=False)
    forged = json.dumps({"userId": "victim", "messageId": "m1", "event": "click"}).encode()
    status, answer = post(address, "/events", forged, {"Content-Type": "text/plain"})
    assert status == 403 and "beacon token" in json.loads(answer)["error"]
    assert conn.execute(EVENTS).fetchone() == (0,)
    genuine = json.dumps({"userId": "victim", "messageId": "m1", "event": "click", "subscriptionId": sub,
                          "token": KEYS.mint("victim", "m1", sub)}).encode()
    assert post(address, "/events", genuine, {"Content-Type": "text/plain"})[0] == 204
    assert conn.execute(EVENTS).fetchone() == (1,)


@pytest.mark.parametrize("serve_process", [{}], indirect=True)
def test_gov_serve_without_a_beacon_secret_says_so_and_takes_no_beacon(
    serve_process: tuple[tuple[str, int], str], gov: Governor, conn: psycopg.Connection[Any],
) -> None:
    address, started = serve_process
    assert "gov: no beacon secret (GOV_BEACON_SECRET): POST /events refuses beacons (501)" in started
    gov.send(Message(user_id="victim", id="m1", tier="P2", title="t"), deliver=False)
    status, answer = post(address, "/events", b'{"userId": "victim", "messageId": "m1", "event": "click"}', {})
    assert status == 501 and "GOV_BEACON_SECRET" in json.loads(answer)["error"]
    assert conn.execute(EVENTS).fetchone() == (0,)


def test_gov_serve_refuses_a_weak_beacon_secret_in_one_line(db_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOV_BEACON")}
    env.update({"GOV_DATABASE_URL": db_url, "GOV_API_TOKEN": TOKEN, "GOV_BEACON_SECRET": "short"})
    done = subprocess.run([sys.executable, "-m", "gov.cli", "serve", "--port", "0"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert done.stderr.strip().count("\n") == 0 and "GOV_BEACON_SECRET must be at least 32 bytes" in done.stderr
