"""The HTTP API's request and response bodies, declared once.

`gov serve` validates every body against these models, and its OpenAPI document is
generated from them: a limit changed here changes both. The limits are gov's own
(:mod:`gov.message`, :mod:`gov.policy`, :mod:`gov.analytics.events`), not copies.

JSON names are camelCase (``userId``); the Python fields are snake_case. Every model
refuses unknown fields and coerces nothing (a number is not a string, ``true`` is not 1).
"""

from __future__ import annotations

import re
from datetime import time
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from gov.analytics.events import BEACON_EVENTS, MAX_SUBSCRIPTION_ID
from gov.message import MAX_ID_LENGTH, MAX_TTL_S, MIN_TTL_S, TIER_FORM, Message, is_utf8
from gov.policy import MAX_CAP, MAX_DURATION_MS, SEGMENT_NAME, format_duration, parse_clock, parse_duration

MAX_OPTOUTS = 200  # topics a user may opt out of
#: A user cap's scope: a tier, every tier ("global") or per topic ("topic").
CAP_SCOPE_FORM = re.compile(rf"^(?:{TIER_FORM.pattern.strip('^$')}|global|topic)$")


def _storable(value: str) -> str:
    """Text the database can hold: no NUL byte, no lone surrogate (which has no UTF-8)."""
    if "\x00" in value:
        raise ValueError("contains a NUL byte")
    if not is_utf8(value):
        raise ValueError("is not valid Unicode text (a lone surrogate)")
    return value


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    return value


def _clock(value: str) -> str:
    parse_clock(value, "time")  # ValueError: "time: expected a local time HH:MM, got …"
    return value


def _duration(value: str | int) -> str | int:
    parse_duration(value, "window")
    return value


def _none_is_empty(value: Any) -> Any:
    return [] if value is None else value


#: Text without NUL bytes or lone surrogates (title, body, url).
Text = Annotated[str, AfterValidator(_storable)]
#: An id: 1 to MAX_ID_LENGTH characters, not blank (user ids, message ids, topics, campaigns, collapse keys).
Id = Annotated[
    str, Field(min_length=1, max_length=MAX_ID_LENGTH), AfterValidator(_storable), AfterValidator(_not_blank)
]
Tier = Annotated[str, Field(pattern=TIER_FORM.pattern, description="P0..P9, required: there is no default",
                            examples=["P2"])]
Clock = Annotated[str, AfterValidator(_clock), Field(description="local time HH:MM", examples=["22:00"])]
Duration = Annotated[
    str | int,
    AfterValidator(_duration),
    Field(description=f"a window such as 24h or 7d (at most {format_duration(MAX_DURATION_MS)})", examples=["24h"]),
]
if TYPE_CHECKING:
    BeaconEvent = str
else:
    BeaconEvent = Literal[BEACON_EVENTS]  # the beacon's kinds, as gov.analytics.events lists them


class Body(BaseModel):
    """A JSON object with camelCase names, no unknown fields and no coercion."""

    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", strict=True)


class Error(BaseModel):
    """Every refusal: a status and one line saying why."""

    error: str = Field(examples=["tier is required (P0..P9, required: there is no default)"])


class Send(Body):
    """The seed's send: decide, record and (with a VAPID key) deliver one message."""

    user_id: Id
    tier: Tier
    id: Id = Field(description="stable: the idempotency key (a retry gets the first verdict)")
    title: Annotated[str, Field(min_length=1), AfterValidator(_storable), AfterValidator(_not_blank)]
    body: Text | None = None
    url: Text | None = None
    topic: Id | None = None
    collapse_key: Id | None = None
    ttl: int | None = Field(None, ge=MIN_TTL_S, le=MAX_TTL_S, description="seconds the push service keeps it")
    campaign_id: Id | None = None

    def message(self) -> Message:
        # by attribute, not model_dump(): the names are Message's own, and the door's every send
        # pays this (model_dump was 3 µs of it)
        return Message(user_id=self.user_id, tier=self.tier, id=self.id, title=self.title, body=self.body,
                       url=self.url, topic=self.topic, collapse_key=self.collapse_key, ttl=self.ttl,
                       campaign_id=self.campaign_id)


class Verdict(Body):
    """The seed's answer, compact: ``{"sent":true}`` or ``{"sent":false,"action":…,"reason":…}``."""

    sent: bool
    action: Literal["drop", "defer", "collapse"] | None = None
    reason: str | None = Field(None, examples=["cap_86400000ms", "quiet_hours"])


#: A beacon token as a body carries it: any short text; whether it is valid is the route's 403.
BeaconToken = Annotated[str, Field(max_length=64, description="the delivery's beacon token (data.token)")]


class Event(Body):
    """A beacon from the service worker about a message gov delivered to that user's subscription.

    ``token`` and ``subscriptionId`` are the push payload's ``data.token`` and ``data.sub``:
    without a token valid for the user, the message and the subscription, the beacon is 403.
    """

    user_id: Id
    message_id: Id
    event: BeaconEvent
    subscription_id: int | None = Field(None, ge=1, le=MAX_SUBSCRIPTION_ID)
    token: BeaconToken | None = None

    @model_validator(mode="before")
    @classmethod
    def _not_accepted(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("event") == "accepted":
            raise ValueError("accepted is recorded by the delivery runner, not by a beacon")
        return data


class QuietHours(Body):
    start: Clock
    end: Clock

    def times(self) -> tuple[time, time]:
        return parse_clock(self.start, "start"), parse_clock(self.end, "end")

    @model_validator(mode="after")
    def _not_empty(self) -> QuietHours:
        if self.start == self.end:
            raise ValueError("start and end are equal")
        return self


class Cap(Body):
    """The user's own cap for one window; it may only lower the policy's default."""

    scope: str = Field(pattern=CAP_SCOPE_FORM.pattern, description="a tier (P0..P9), global or topic",
                       examples=["P2", "global", "topic"])
    window: Duration
    cap: int = Field(ge=0, le=MAX_CAP)

    @property
    def window_ms(self) -> int:
        return parse_duration(self.window, "window")


class Segment(Body):
    """The app's segment for a user (engaged, casual, dormant or a name of its own); null: none.

    A name other than engaged, casual and dormant is the app's own: `gov segments refresh`
    leaves that user alone."""

    segment: Annotated[str, Field(pattern=SEGMENT_NAME.pattern, examples=["dormant"])] | None


class Preferences(Body):
    """A user's own settings. PUT replaces the whole document: an absent field is cleared."""

    user_id: Id | None = Field(None, description="PUT: optional, and then the id in the path")
    time_zone: Annotated[str, Field(min_length=1), AfterValidator(_storable)] | None = Field(
        None, description="IANA zone such as Europe/Berlin; null: no quiet hours", examples=["Europe/Berlin"]
    )
    quiet_hours: QuietHours | None = Field(None, description="in the user's time zone; null: the policy's default")
    caps: Annotated[list[Cap], BeforeValidator(_none_is_empty)] = Field(
        default_factory=list, description="the user's own caps; each may only lower the policy's default"
    )
    topics_opted_out: Annotated[list[Id], BeforeValidator(_none_is_empty)] = Field(
        default_factory=list, max_length=MAX_OPTOUTS
    )

    @model_validator(mode="after")
    def _caps_once(self) -> Preferences:
        seen: set[tuple[str, int]] = set()
        for cap in self.caps:
            if (cap.scope, cap.window_ms) in seen:
                raise ValueError(f"cap {cap.scope}/{cap.window} is given twice")
            seen.add((cap.scope, cap.window_ms))
        return self


class Health(Body):
    ok: bool


# ---------------------------------------------------------------- the browser half (gov.js, gov-sw.js)

#: Longest subscribe token accepted (the longest user id, base64url, with room to spare).
MAX_TOKEN_LENGTH = 32 + 4 * MAX_ID_LENGTH
#: A push service's endpoint is at most this long (gov.delivery.subscription refuses longer).
MAX_ENDPOINT_LENGTH = 2048
#: base64url of a 65-byte P-256 point is 87 characters, of a 16-byte secret 22: with padding room.
MAX_KEY_LENGTH = 128


class PushKeys(Body):
    """``PushSubscription.toJSON().keys``: the browser's P-256 public key and auth secret."""

    p256dh: str = Field(alias="p256dh", min_length=1, max_length=MAX_KEY_LENGTH)  # not camelCased: the browser's name
    auth: str = Field(min_length=1, max_length=MAX_KEY_LENGTH)


class PushSubscriptionJSON(Body):
    """What ``PushSubscription.toJSON()`` gives in the browser; checked again by gov when stored."""

    endpoint: Annotated[str, Field(min_length=1, max_length=MAX_ENDPOINT_LENGTH)]
    expiration_time: float | None = None
    keys: PushKeys


class Proof(Body):
    """A subscription the browser holds (its endpoint and auth secret, which only it and gov know)."""

    # storable: compared with stored rows, a NUL byte would fail in the database (a 503 for bad input)
    endpoint: Annotated[str, Field(min_length=1, max_length=MAX_ENDPOINT_LENGTH), AfterValidator(_storable)]
    auth: Annotated[str, Field(min_length=1, max_length=MAX_KEY_LENGTH), AfterValidator(_storable)]


class Subscribe(Body):
    """A browser's subscription, for the user of ``token`` (or of ``previous``, which it replaces).

    ``token`` is the app's short-lived subscribe token (:mod:`gov.http.tokens`): the user is
    the one it was minted for, never one the browser names. ``userId``, if given, must be that
    user. ``previous`` is for the service worker's ``pushsubscriptionchange``, which has no
    token: the subscription it replaces proves the user.
    """

    subscription: PushSubscriptionJSON
    token: Annotated[str, Field(min_length=1, max_length=MAX_TOKEN_LENGTH)] | None = None
    user_id: Id | None = None
    previous: Proof | None = None

    @model_validator(mode="after")
    def _one_proof(self) -> Subscribe:
        if (self.token is None) == (self.previous is None):
            raise ValueError("give token (a subscribe token from the app) or previous (the subscription replaced)")
        return self


class Subscribed(Body):
    """The stored subscription: the id beacons may name, and the user it belongs to."""

    subscription_id: int
    user_id: str


class WorkerError(Body):
    """gov-sw.js reports what it could not do (a payload it could not read, a renewal that
    failed); counted by kind, never stored."""

    kind: Literal["payload", "renewal"]  # a push it could not read; a pushsubscriptionchange gov did not take
    detail: Annotated[str, Field(max_length=200)] | None = None
    message_id: Id | None = None
    # what the worker could read of the push, echoed: a token given must be valid (403 otherwise)
    user_id: Id | None = None
    subscription_id: int | None = Field(None, ge=1, le=MAX_SUBSCRIPTION_ID)
    token: BeaconToken | None = None


class TokenRequest(Body):
    """``gov serve --demo``: the operator asks for a subscribe token for a user."""

    user_id: Id


class SubscribeToken(Body):
    """A subscribe token for ``userId``, valid ``expiresIn`` seconds."""

    token: str
    user_id: str
    expires_in: int
