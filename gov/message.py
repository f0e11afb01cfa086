"""The message a caller asks about, and the verdict it gets."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

from gov.errors import InvalidMessage

TIER_FORM = re.compile(r"^P[0-9]$")
MAX_ID_LENGTH = 256  # characters, for user ids, message ids, topics, campaigns, collapse keys
MIN_TTL_S = 1  # second: 0 ("now or never") would expire before any runner could send it
MAX_TTL_S = 28 * 86400  # seconds: push services keep a message four weeks at most (the one place in
#                          Python; the CHECK constraints on gov.tiers and gov.message_content mirror it)


def is_utf8(value: str) -> bool:
    """False for text that cannot be stored: a lone surrogate has no UTF-8 encoding."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_user_id(value: object) -> str:
    """``value`` as a user id, checked as :class:`Message` checks its ``user_id``."""
    _check_text("user_id", value, required=True)
    assert isinstance(value, str)  # _check_text refuses anything else
    return value


def _check_text(name: str, value: object, *, required: bool) -> None:
    if value is None:
        if required:
            raise InvalidMessage(f"{name} is required")
        return
    if not isinstance(value, str):
        raise InvalidMessage(f"{name} must be a string, got {type(value).__name__}")
    if required and not value.strip():
        raise InvalidMessage(f"{name} must not be empty")
    if not required and value == "":
        raise InvalidMessage(f"{name} must not be empty when given (omit it instead)")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidMessage(f"{name} is {len(value)} characters; at most {MAX_ID_LENGTH}")
    if "\x00" in value:
        raise InvalidMessage(f"{name} contains a NUL byte")
    if not is_utf8(value):
        raise InvalidMessage(f"{name} is not valid Unicode text (a lone surrogate)")


def _check_url(url: str) -> None:
    """The click's URL: an http(s) URL or a path the worker resolves against its scope.
    Any other scheme (javascript:, data:) or a URL that does not parse (http://[) is
    refused: the worker would open it, or throw before the click is counted."""
    if any(ord(c) < 0x20 or c == "\x7f" for c in url):
        raise InvalidMessage("url must not contain control characters")
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018  (a port that is not a number raises here)
    except ValueError as exc:
        raise InvalidMessage(f"url is not a URL: {exc}") from None
    if parts.scheme and parts.scheme.lower() not in ("http", "https"):
        raise InvalidMessage(f"url must be http(s) or a path, not {parts.scheme.lower()}:")


@dataclass(frozen=True)
class Message:
    """One notification for one user.

    ``tier`` is required and has no default (invariant 8): an unclassified message is
    refused here, before the database is touched. ``id`` is the stable id of the logical
    message: a retry with the same id gets the first verdict and spends nothing.
    """

    user_id: str
    id: str
    tier: str
    topic: str | None = None
    campaign_id: str | None = None
    title: str | None = None
    body: str | None = None
    url: str | None = None
    collapse_key: str | None = None
    ttl: int | None = None

    def __post_init__(self) -> None:
        _check_text("user_id", self.user_id, required=True)
        _check_text("message id", self.id, required=True)
        if self.tier is None or self.tier == "":
            raise InvalidMessage("tier is required (P0, P1, P2 or P3): there is no default")
        if not isinstance(self.tier, str) or not TIER_FORM.match(self.tier):
            raise InvalidMessage(f"unknown tier {self.tier!r}: expected P0..P9 as the policy defines")
        _check_text("topic", self.topic, required=False)
        _check_text("campaign_id", self.campaign_id, required=False)
        _check_text("collapse_key", self.collapse_key, required=False)
        for name in ("title", "body", "url"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or "\x00" in value or not is_utf8(value)):
                raise InvalidMessage(f"{name} must be valid Unicode text without NUL bytes")
        if self.url is not None:
            _check_url(self.url)
        if self.ttl is not None and (
            isinstance(self.ttl, bool) or not isinstance(self.ttl, int) or not MIN_TTL_S <= self.ttl <= MAX_TTL_S
        ):
            # 0 ("now or never") is refused: its deadline would pass before any runner could
            # send it, so it would be allowed, counted and never delivered. Use a short TTL.
            raise InvalidMessage(f"ttl must be whole seconds from {MIN_TTL_S} to {MAX_TTL_S}, got {self.ttl!r}")

    @property
    def tag(self) -> str:
        """The notification tag: the collapse key (so the browser replaces) or the message id."""
        return self.collapse_key or self.id

    def content(self) -> dict[str, Any]:
        """What is stored for delivery; refused here when it cannot be sent at all."""
        if self.title is None or not self.title.strip():
            raise InvalidMessage(f"message {self.id}: a title is required to send (every push must show one)")
        # Built once now only to refuse an oversize payload before anything is recorded, with
        # the longest beacon fields the runner may add (a token, the largest subscription id):
        # a message that fits only without them would be refused by the runner after its
        # budget was spent. Checked whether or not this process has a beacon secret, since
        # the process that delivers may have one. (Most messages are short enough that no
        # content could make them too long: those skip the building, 9 µs of gov serve's CPU.)
        push = _push()
        if not push.surely_fits(self.title, self.body, self.tag, self.url, self.tier, self.id):
            from gov.delivery.beacon import MAX_SUBSCRIPTION_ID, PLACEHOLDER_TOKEN

            push.build_payload(self.title, self.body or "", self.tag, self.url, self.tier, self.id,
                               subscription_id=MAX_SUBSCRIPTION_ID, token=PLACEHOLDER_TOKEN)
        return {"title": self.title, "body": self.body or "", "url": self.url}


@functools.cache
def _push() -> ModuleType:
    """gov.delivery.push, imported on first use: it brings requests and the crypto, which
    a process that only decides (the cron's releaser, a CLI query) never needs. Held here
    after that: a ``from … import`` per message was 4 µs of gov serve's 6 in content()."""
    import gov.delivery.push

    return gov.delivery.push


@dataclass(frozen=True)
class Decision:
    """The governor's answer: allowed, or suppressed with the verb and the rule that said so.

    ``reason`` is the blocking rule's stable name: ``cap_<ms>ms`` for a tier window,
    ``topic_cap_<ms>ms`` for a topic cap, ``global_cap_<ms>ms`` for the global cap.
    ``retry_after_ms`` is when that window next frees a slot (None for a cap of 0).
    ``repeated`` is True when this message id was decided before and this is that verdict.
    """

    allowed: bool
    action: str | None = None
    reason: str | None = None
    used: int | None = None
    cap: int | None = None
    retry_after_ms: int | None = None
    repeated: bool = False

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Decision:
        """The decision in a row that holds its columns by name (and maybe others)."""
        return cls(**{name: row[name] for name in _DECISION_FIELDS if name in row})

    def as_send_json(self) -> dict[str, Any]:
        """The seeds' send shape: ``{"sent": true}`` or ``{"sent": false, "action", "reason"}``."""
        if self.allowed:
            return {"sent": True}
        return {"sent": False, "action": self.action, "reason": self.reason}

    def as_json(self) -> dict[str, Any]:
        """The CLI's shape: ``{"allowed": true}`` or the suppression with its reason."""
        if self.allowed:
            return {"allowed": True}
        return {
            "allowed": False,
            "action": self.action,
            "reason": self.reason,
            "retry_after_ms": self.retry_after_ms,
        }


_DECISION_FIELDS = tuple(f.name for f in fields(Decision))  # once: from_row runs per verdict
