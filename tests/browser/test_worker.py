"""gov-sw.js and gov.js in a real headless Chromium, against a real `gov serve --demo`.

A push reaches the worker through the DevTools protocol (``ServiceWorker.deliverPushMessage``),
carrying the payload gov's own runner built and encrypted for gov's test push service
(decrypted there, as the browser would). What cannot run here is the browser's own
``pushManager.subscribe`` returning a subscription: that needs a push service reachable from
Chromium (FCM for Chromium), so the tests stop at that call (its arguments are checked, and
its refusal is shown on the page) or answer it with a subscription of gov's test push service.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from gov.delivery.beacon import BeaconKeys
from gov.delivery.push import build_payload
from gov.delivery.subscription import b64url_decode
from gov.testing import PushService
from tests.browser.conftest import API_TOKEN, BEACON_SECRET, Server, fake_subscribe_script

USER = "user-42"
KEYS = BeaconKeys(BEACON_SECRET.encode())
LIVE = "SELECT id FROM gov.subscriptions WHERE retired_at IS NULL ORDER BY id DESC LIMIT 1"


def signed_payload(conn: psycopg.Connection[Any], title: str, tag: str, url: str | None, message_id: str) -> bytes:
    """A payload as gov's runner builds it for this browser's subscription: with its beacon token."""
    ((sub_id,),) = conn.execute(LIVE).fetchall()
    return build_payload(title, "", tag, url, "P0", message_id, subscription_id=sub_id,
                         token=KEYS.mint(USER, message_id, sub_id))
SUBSCRIBE_DONE = "() => /subscribed:|subscribe failed/.test(document.getElementById('log').textContent)"
ACTIVATED = """async () => { const r = await navigator.serviceWorker.getRegistration();
    return Boolean(r && r.active && r.active.state === 'activated'); }"""
NOTIFICATIONS = """async () => (await (await navigator.serviceWorker.ready).getNotifications())
    .map((n) => ({ title: n.title, body: n.body, tag: n.tag, data: n.data }))"""


def api(server: Server, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        server.url(path), data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read() or b"{}")  # type: ignore[no-any-return]


class Browser:
    """One page of gov's demo in a fresh Chromium context, with notifications granted."""

    def __init__(self, chromium: Any, server: Server, subscription: dict[str, Any] | None) -> None:
        self.server = server
        self.context = chromium.new_context()
        self.context.grant_permissions(["notifications"], origin=server.origin)
        self.context.add_init_script(fake_subscribe_script(subscription))
        self.page = self.context.new_page()
        self.page.goto(server.url("/demo"))
        self.page.wait_for_function("() => window.gov && document.readyState === 'complete'")
        self.cdp = self.context.new_cdp_session(self.page)
        self.registrations: list[dict[str, Any]] = []
        self.cdp.on("ServiceWorker.workerRegistrationUpdated",
                    lambda e: self.registrations.extend(e["registrations"]))
        self.cdp.send("ServiceWorker.enable")

    def subscribe(self, user: str = USER) -> None:
        """The demo page's flow: the operator's token, a user, the button."""
        self.page.fill("#api-token", API_TOKEN)
        self.page.fill("#user-id", user)
        self.page.click("#subscribe")
        self.page.wait_for_function(SUBSCRIBE_DONE)

    def registration_id(self) -> str:
        for _ in range(200):  # events arrive while Playwright waits
            live = [r for r in self.registrations if not r.get("isDeleted")]
            if live:
                return str(live[-1]["registrationId"])
            self.page.wait_for_timeout(25)
        raise AssertionError("no service worker registration reported by the DevTools protocol")

    def deliver(self, payload: bytes | str) -> int:
        """Hand a push to the worker as its push service would; return how many times it took.

        On a busy machine Chromium can drop a push the DevTools protocol hands over while
        its worker wakes (seen here with any payload): when the shown notifications have not
        changed after about 15 s, the push is handed over once more. A worker that shows
        nothing for a push fails either way.
        """
        data = payload.decode() if isinstance(payload, bytes) else payload
        # a push handed to a worker still activating can be lost: wait for an activated one
        for _ in range(600):
            if self.page.evaluate(ACTIVATED):
                break
            self.page.wait_for_timeout(50)
        else:
            raise AssertionError("the service worker never activated")
        before = self.page.evaluate(NOTIFICATIONS)
        for attempt in (1, 2):
            self.cdp.send("ServiceWorker.deliverPushMessage",
                          {"origin": self.server.origin, "registrationId": self.registration_id(), "data": data})
            for _ in range(300):
                if self.page.evaluate(NOTIFICATIONS) != before:
                    return attempt
                self.page.wait_for_timeout(50)
        return 2

    def notifications(self, count: int | None = None, showing: str | None = None) -> list[dict[str, Any]]:
        """The notifications shown, once there are ``count`` of them (and one is of message ``showing``)."""
        if count is not None:
            # polled from here: an async predicate given to wait_for_function is a promise,
            # truthy at once, so it would not wait at all
            for _ in range(300):  # a bound of about 15 s of the browser's own timer, then fail
                shown: list[dict[str, Any]] = self.page.evaluate(NOTIFICATIONS)
                if len(shown) == count and (showing is None or any((n.get("data") or {}).get("id") == showing
                                                                   for n in shown)):
                    return shown
                self.page.wait_for_timeout(50)
            raise AssertionError(f"the notifications never settled at {count}: {shown}")
        return self.page.evaluate(NOTIFICATIONS)  # type: ignore[no-any-return]

    def worker(self) -> Any:
        for _ in range(200):
            if self.context.service_workers:
                return self.context.service_workers[0]
            self.page.wait_for_timeout(25)
        raise AssertionError("the service worker never started")

    def log(self) -> str:
        return self.page.text_content("#log") or ""

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def open_browser(chromium: Any, gov_server: Server) -> Iterator[Callable[..., Browser]]:
    opened: list[Browser] = []

    def open_(subscription: dict[str, Any] | None) -> Browser:
        browser = Browser(chromium, gov_server, subscription)
        opened.append(browser)
        return browser

    yield open_
    for b in opened:
        b.close()


def wait_rows(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any], count: int, page: Any) -> list[Any]:
    """The rows once there are ``count`` of them (a beacon is asynchronous); polls, bounded."""
    rows: list[Any] = []
    for _ in range(400):
        rows = conn.execute(sql, params).fetchall()
        if len(rows) >= count:
            return rows
        page.wait_for_timeout(25)
    return rows


EVENTS = "SELECT user_id, message_id, event, subscription_id FROM gov.push_events WHERE event <> 'accepted' ORDER BY id"


def test_subscribe_send_display_replace(
    open_browser: Callable[..., Browser], gov_server: Server, push_service: PushService,
    conn: psycopg.Connection[Any],
) -> None:
    """The whole path: the demo page subscribes, gov decides and delivers, the worker shows and beacons."""
    sub = push_service.subscribe("chromium")
    browser = open_browser(sub.info)
    browser.subscribe()
    assert "subscribed: subscription" in browser.log()
    (row,) = conn.execute("SELECT id, user_id, endpoint FROM gov.subscriptions WHERE retired_at IS NULL").fetchall()
    sub_id, owner, endpoint = row
    assert (owner, endpoint) == (USER, sub.endpoint)  # the user of the token, never one the page named itself

    # gov decides and its runner encrypts and posts to the push service; the push service
    # decrypts it as the browser would, and hands it on: the payload is gov's, byte for byte
    for n, title in enumerate(["Order shipped", "Order out for delivery"], 1):
        verdict = api(gov_server, "/internal/send", {
            "userId": USER, "tier": "P0", "id": f"m{n}", "title": title, "body": f"step {n}",
            "url": "/orders/7", "collapseKey": "order-7",
        })
        assert verdict == {"sent": True}
        # gov serve answers once the decision has committed and delivers after (gov.aio.SendBatcher)
        received = []
        for _ in range(400):
            received = [r for r in push_service.requests_for(sub) if r.status == 201]
            if len(received) == n:
                break
            browser.page.wait_for_timeout(25)
        assert len(received) == n and received[-1].payload is not None
        browser.deliver(received[-1].payload)
        if n == 1:
            (shown,) = browser.notifications(1, showing="m1")
            assert shown == {"title": "Order shipped", "body": "step 1", "tag": "order-7",
                             "data": {"url": "/orders/7", "tier": "P0", "id": "m1", "sub": sub_id,
                                      "token": KEYS.mint(USER, "m1", sub_id)}}  # made by gov serve's runner

    # the same collapse key: the second replaced the first
    (shown,) = browser.notifications(1, showing="m2")
    assert (shown["title"], shown["tag"], shown["data"]["id"]) == ("Order out for delivery", "order-7", "m2")

    rows = wait_rows(conn, EVENTS, {}, 2, browser.page)
    assert [tuple(r) for r in rows] == [(USER, "m1", "display", sub_id), (USER, "m2", "display", sub_id)]


def test_tags_keep_apart_what_differs(
    open_browser: Callable[..., Browser], push_service: PushService, conn: psycopg.Connection[Any],
    gov_server: Server,
) -> None:
    """Two messages with different tags are two notifications; a payload built by gov's build_payload."""
    browser = open_browser(push_service.subscribe().info)
    browser.subscribe()
    for n in (1, 2):
        api(gov_server, "/internal/send", {"userId": USER, "tier": "P0", "id": f"k{n}", "title": f"T{n}"})
        browser.deliver(signed_payload(conn, f"T{n}", f"k{n}", None, f"k{n}"))
    shown = browser.notifications(2)
    assert sorted((n["title"], n["tag"]) for n in shown) == [("T1", "k1"), ("T2", "k2")]


@pytest.mark.parametrize("payload", ["", "not json", '{"body": "no title"}', '["a list"]', '{"title": 7}'])
def test_malformed_payload_still_shows_and_reports(
    open_browser: Callable[..., Browser], push_service: PushService, gov_server: Server, payload: str,
) -> None:
    """A push the worker cannot read shows a generic notification (never a silent push) and is reported."""
    browser = open_browser(push_service.subscribe().info)
    browser.subscribe()
    delivered = browser.deliver(payload)
    (shown,) = browser.notifications(1)
    assert shown["title"] == "New notification" and shown["tag"] == "gov-malformed"
    pattern = re.compile(r'^gov_worker_errors_total\{kind="payload"\} ([0-9.]+)$', re.M)
    reported = 0.0
    for _ in range(400):
        request = urllib.request.Request(gov_server.url("/metrics"), headers={"Authorization": f"Bearer {API_TOKEN}"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            found = pattern.search(answer.read().decode())
        reported = float(found.group(1)) if found else 0.0
        if reported >= 1:
            break
        browser.page.wait_for_timeout(25)
    assert 1 <= reported <= delivered, reported  # reported once per push it could not read


def test_click_and_close_beacons(
    open_browser: Callable[..., Browser], push_service: PushService, gov_server: Server,
    conn: psycopg.Connection[Any],
) -> None:
    """notificationclick and notificationclose become click and close events for the message.

    Headless Chromium has no notification to click or dismiss: the worker's own handlers run on
    the notification it shows, as the events would run them.
    """
    browser = open_browser(push_service.subscribe().info)
    browser.subscribe()
    for n in (1, 2):
        api(gov_server, "/internal/send", {"userId": USER, "tier": "P0", "id": f"c{n}", "title": f"C{n}"})
        browser.deliver(signed_payload(conn, f"C{n}", f"c{n}", "/demo", f"c{n}"))
    browser.notifications(2)
    result = browser.worker().evaluate("""async () => {
        let shown = [];
        for (let i = 0; i < 200 && shown.length < 2; i++) {  // as the worker sees them
            shown = await self.registration.getNotifications();
            if (shown.length < 2) await new Promise((r) => setTimeout(r, 25));
        }
        const a = shown.find((n) => n.tag === 'c1'), b = shown.find((n) => n.tag === 'c2');
        await self.gov.onClick({ notification: a });
        await self.gov.onClose({ notification: b });
        return (await self.registration.getNotifications()).map((n) => n.tag);
    }""")
    assert result == ["c2"]  # the clicked one was closed
    rows = wait_rows(conn, EVENTS, {}, 4, browser.page)
    assert sorted((r[1], r[2]) for r in rows) == [("c1", "click"), ("c1", "display"), ("c2", "close"),
                                                   ("c2", "display")]

    # the page itself, without the push's token, cannot write one (invariant 15)
    forged = browser.page.evaluate("""async (user) => (await fetch('/events', { method: 'POST',
        headers: { 'content-type': 'text/plain' },
        body: JSON.stringify({ userId: user, messageId: 'c1', event: 'unsubscribe' }) })).status""", USER)
    assert forged == 403
    # gov.unsubscribe() charges the unsubscribe to the last notification shown, with its token
    browser.page.evaluate("async () => gov.unsubscribe()")
    rows = wait_rows(conn, EVENTS, {}, 5, browser.page)
    assert [(r[1], r[2]) for r in rows if r[2] == "unsubscribe"] == [("c2", "unsubscribe")]


def test_the_notification_shown_last_stays_last_whatever_order_its_writes_end(
    open_browser: Callable[..., Browser], push_service: PushService,
) -> None:
    """gov.unsubscribe() charges the notification shown last. Two pushes handled at once write
    it in either order (each after its own awaits): the one shown earlier, written later,
    must not replace it."""
    browser = open_browser(push_service.subscribe().info)
    browser.subscribe()  # registers the worker
    last = browser.worker().evaluate("""async () => {
        await self.gov.keepLast({ messageId: 'shown-second', subscriptionId: 1, token: 't2' }, 2000);
        await self.gov.keepLast({ messageId: 'shown-first', subscriptionId: 1, token: 't1' }, 1000);
        const kept = await self.gov.kv('last');
        await self.gov.keepLast({ messageId: 'shown-third', subscriptionId: 1, token: 't3' }, 3000);
        return [kept.messageId, (await self.gov.kv('last')).messageId];
    }""")
    assert last == ["shown-second", "shown-third"]


def test_pushsubscriptionchange_sends_the_new_subscription(
    open_browser: Callable[..., Browser], push_service: PushService, conn: psycopg.Connection[Any],
) -> None:
    """The worker subscribes again and gov stores the new subscription for the same user, retiring the old."""
    old, new = push_service.subscribe("old"), push_service.subscribe("new")
    browser = open_browser(old.info)
    browser.subscribe()
    worker = browser.worker()
    calls = worker.evaluate("""async (fresh) => {
        const calls = [];
        self.registration.pushManager.subscribe = async (options) => {  // no push service here
            calls.push({ userVisibleOnly: options.userVisibleOnly, key: typeof options.applicationServerKey });
            return { endpoint: fresh.endpoint, toJSON: () => fresh };
        };
        await self.gov.onSubscriptionChange({ oldSubscription: null, newSubscription: null });
        return calls;
    }""", new.info)
    assert calls == [{"userVisibleOnly": True, "key": "string"}]
    rows = conn.execute(
        "SELECT user_id, endpoint, retired_reason FROM gov.subscriptions ORDER BY id").fetchall()
    assert [tuple(r) for r in rows] == [
        (USER, old.endpoint, "replaced by the browser (pushsubscriptionchange)"), (USER, new.endpoint, None)]
    # and the worker beacons with the new subscription from now on
    me = worker.evaluate("async () => self.gov.kv('me')")
    assert me["endpoint"] == new.endpoint and me["subscriptionId"] == conn.execute(
        "SELECT id FROM gov.subscriptions WHERE endpoint = %s", (new.endpoint,)).fetchone()[0]


def test_demo_page_reaches_the_real_push_manager(
    open_browser: Callable[..., Browser], gov_server: Server, signer: Any, conn: psycopg.Connection[Any],
) -> None:
    """Without a stand-in, the demo asks permission and calls the real pushManager.subscribe with
    gov's VAPID key; Chromium has no push service to reach here, so it refuses, the page says so,
    and nothing is stored."""
    browser = open_browser(None)
    browser.subscribe()
    calls = browser.page.evaluate("window.__subscribeCalls")
    assert calls == [{"userVisibleOnly": True, "applicationServerKey": list(b64url_decode(signer.public_key)),
                      "permission": "granted"}]
    assert "subscribe failed" in browser.log()
    assert conn.execute("SELECT count(*) FROM gov.subscriptions").fetchone() == (0,)


def test_a_click_opens_only_an_http_url_and_is_counted_whatever_the_url(
    open_browser: Callable[..., Browser], push_service: PushService, gov_server: Server,
    conn: psycopg.Connection[Any],
) -> None:
    """An outside probe: a push's javascript: or data: url went to clients.openWindow, and one
    the browser cannot parse ("http://[") threw before the click was counted. gov refuses such
    URLs when sending; a payload not from gov opens the worker's scope, and the click counts."""
    browser = open_browser(push_service.subscribe().info)
    browser.subscribe()
    urls = ["javascript:alert(1)", "http://[", "data:text/html,x"]
    for n, url in enumerate(urls):
        api(gov_server, "/internal/send", {"userId": USER, "tier": "P0", "id": f"u{n}", "title": f"U{n}"})
        browser.deliver(signed_payload(conn, f"U{n}", f"u{n}", url, f"u{n}"))
    browser.notifications(3)
    result = browser.worker().evaluate("""async () => {
        const opened = [];
        self.clients.openWindow = async (u) => { opened.push(u); return null; };
        let shown = [];
        for (let i = 0; i < 200 && shown.length < 3; i++) {
            shown = await self.registration.getNotifications();
            if (shown.length < 3) await new Promise((r) => setTimeout(r, 25));
        }
        for (const n of shown) await self.gov.onClick({ notification: n });
        return { opened, scope: self.registration.scope };
    }""")
    assert result["opened"] == [result["scope"]] * 3
    rows = wait_rows(conn, EVENTS, {}, 6, browser.page)
    assert sorted(r[1] for r in rows if r[2] == "click") == ["u0", "u1", "u2"]


def test_a_renewal_that_fails_is_reported_not_thrown(
    open_browser: Callable[..., Browser], push_service: PushService,
) -> None:
    """An outside probe: a pushsubscriptionchange gov refused (or the push service did) rejected
    unhandled, and the browser stayed on a subscription gov does not know, unreported."""
    browser = open_browser(push_service.subscribe().info)
    browser.subscribe()
    reports = browser.worker().evaluate("""async () => {
        const reports = [];
        const realFetch = self.fetch;
        self.fetch = async (url, init) => {
            if (String(url).endsWith('/events/errors')) reports.push(JSON.parse(init.body));
            return realFetch(url, init);
        };
        self.registration.pushManager.subscribe = async () => { throw new Error('Registration failed'); };
        await self.gov.onSubscriptionChange({ oldSubscription: null, newSubscription: null });  // resolves
        self.fetch = realFetch;
        return reports;
    }""")
    assert [(r["kind"], r["detail"]) for r in reports] == [("renewal", "Registration failed")]
