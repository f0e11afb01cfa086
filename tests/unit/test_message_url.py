"""The click URL a message carries: an http(s) URL or a path the service worker resolves
against its scope. An outside probe of the worker in Chromium: gov accepted and delivered
javascript:, data: and "http://[" (which threw in the worker before the click was counted)."""

from __future__ import annotations

import pytest

from gov import InvalidMessage, Message


@pytest.mark.parametrize("url", ["javascript:alert(1)", " JaVaScRiPt:alert(1)", "data:text/html,<script>x</script>",
                                 "vbscript:x", "blob:https://a.example/1", "file:///etc/passwd", "http://[",
                                 "https://a.example:99999/", "https://a.example/\nx", "/a\tb"])
def test_a_url_the_worker_must_not_open_is_refused(url: str) -> None:
    with pytest.raises(InvalidMessage, match="url"):
        Message(user_id="u", id="m", tier="P0", title="t", url=url)


@pytest.mark.parametrize("url", ["https://shop.example/orders/7?x=1#y", "http://shop.example/", "/orders/7",
                                 "orders/7", "?tab=2", "//cdn.example/x", ""])
def test_http_urls_and_paths_are_kept(url: str) -> None:
    assert Message(user_id="u", id="m", tier="P0", title="t", url=url).url == url
