"""The browser tier: gov serve in a real process, gov's worker in a real headless Chromium.

Skipped, with the reason, when Chromium (Debian's `chromium`) or the playwright package is
missing. Playwright drives the machine's Chromium (never a browser of its own); pushes reach
the worker through the DevTools protocol (``ServiceWorker.deliverPushMessage``), since a
real subscription needs a push service Chromium can reach.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gov.testing import PushService

CHROMIUM = os.environ.get("GOV_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
API_TOKEN = secrets.token_urlsafe(24)
SUBSCRIBE_SECRET = secrets.token_urlsafe(32)
BEACON_SECRET = secrets.token_urlsafe(32)  # gov serve's runner puts tokens under it; /events checks them
SUBJECT = "mailto:push-ops@example.com"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    reason = None
    if not Path(CHROMIUM).exists():
        reason = f"no Chromium at {CHROMIUM} (apt-get install chromium): the browser tier needs a real browser"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            reason = "the playwright package is missing (pip install -e '.[dev]'): it drives Chromium"
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.browser)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@dataclass
class Server:
    origin: str
    process: subprocess.Popen[str]

    def url(self, path: str) -> str:
        return self.origin + path


@pytest.fixture
def gov_server(db_url: str, key_path: Path) -> Iterator[Server]:
    """`gov serve --demo` with a VAPID key, a subscribe and a beacon secret, and loopback push services allowed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOV_VAPID", "GOV_SUBSCRIBE", "GOV_BEACON"))}
    env.update({
        "GOV_DATABASE_URL": db_url, "GOV_API_TOKEN": API_TOKEN, "GOV_SUBSCRIBE_SECRET": SUBSCRIBE_SECRET,
        "GOV_BEACON_SECRET": BEACON_SECRET,
        "GOV_VAPID_PRIVATE_KEY": str(key_path), "GOV_VAPID_SUBJECT": SUBJECT, "GOV_ALLOW_LOOPBACK_HTTP": "1",
    })
    proc = subprocess.Popen(
        [sys.executable, "-m", "gov.cli", "serve", "--port", "0", "--demo"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("gov: serving on http://"):
            origin = line.strip().removeprefix("gov: serving on ")
            break
    else:
        proc.wait(timeout=10)
        pytest.fail(f"gov serve did not start: {''.join(lines)}")
    try:
        yield Server(origin, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode in (0, -signal.SIGTERM), err
        assert "Traceback" not in err, err


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def push_service(signer: Any) -> Iterator[PushService]:
    with PushService(expected_public_key=signer.public_key, hang_s=2.0) as service:
        yield service


def fake_subscribe_script(subscription: dict[str, Any] | None) -> str:
    """An init script that records pushManager.subscribe's arguments in window.__subscribeCalls.

    With ``subscription`` the call answers it (a subscription of gov's test push service, as a
    browser would get from its own); with None it goes on to the real pushManager.subscribe.
    """
    answer = json.dumps(subscription)
    return f"""
    (() => {{
      const original = PushManager.prototype.subscribe;
      const answer = {answer};
      window.__subscribeCalls = [];
      PushManager.prototype.subscribe = async function (options) {{
        window.__subscribeCalls.push({{
          userVisibleOnly: options.userVisibleOnly,
          applicationServerKey: Array.from(new Uint8Array(options.applicationServerKey)),
          permission: Notification.permission,
        }});
        if (!answer) return original.call(this, options);
        return {{ endpoint: answer.endpoint, toJSON: () => answer, unsubscribe: async () => true }};
      }};
    }})();
    """
