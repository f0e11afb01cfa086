"""The browser half of `gov serve`: the service worker, the subscribe helper, subscribe and the demo.

Routes (installed by :func:`install`)::

    GET  /gov-sw.js               the service worker (or importScripts it into your own)
    GET  /gov.js                  the page's subscribe helper: gov.subscribe(), gov.unsubscribe()
    POST /subscriptions           a browser's subscription, for the user of an app-signed token → 201
    POST /subscriptions/retire    the browser unsubscribed (proof: its endpoint and auth secret) → 204
    POST /events/errors           the worker could not read a push (counted in /metrics, not stored) → 204,
                                  bounded per client address and overall (:mod:`gov.http.limits`)
    GET  /demo                    with --demo: a page that subscribes this browser and sends it a test
    POST /demo/token              with --demo: a subscribe token for a user (bearer GOV_API_TOKEN)

``POST /subscriptions`` takes ``application/json`` only (415 otherwise) and never a bare user
id: the user is the one the app's token (:mod:`gov.http.tokens`) names, or, for a worker
renewing after ``pushsubscriptionchange``, the owner of the subscription it replaces, proved
by that subscription's endpoint and auth secret (which only the browser and gov know).
Without a subscribe secret (``GOV_SUBSCRIBE_SECRET``) token subscribe answers 501.

Beacons (``POST /events``, in :mod:`gov.http.app`) are checked here (:func:`check_beacon`):
each must echo the beacon token its push carried (:mod:`gov.delivery.beacon`).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Any, TypeVar

from fastapi import FastAPI, Security
from fastapi.responses import JSONResponse, Response
from psycopg.rows import tuple_row
from starlette.concurrency import run_in_threadpool

from gov.delivery.beacon import ENV_SECRET as ENV_BEACON_SECRET
from gov.delivery.beacon import ENV_SECRET_FILE as ENV_BEACON_SECRET_FILE
from gov.delivery.beacon import BeaconKeys
from gov.delivery.subscription import b64url_decode
from gov.governor import Governor
from gov.http.limits import RateLimit
from gov.http.models import Proof, Subscribe, Subscribed, SubscribeToken, TokenRequest, WorkerError
from gov.http.refusals import HTTPError, refusals
from gov.http.tokens import (
    DEFAULT_TTL_S,
    ENV_SECRET,
    ENV_SECRET_FILE,
    InvalidToken,
    mint_subscribe_token,
    verify_subscribe_token,
)
from gov.ops import metrics as gov_metrics
from gov.queries import q

JS = "text/javascript; charset=utf-8"
HTML = "text/html; charset=utf-8"
#: Retired this way, a subscription may be renewed by the browser that held it
#: (a push service's 404/410 often comes just before the browser's pushsubscriptionchange).
RENEWABLE_REASON = "push service answered"
REPLACED_REASON = "replaced by the browser (pushsubscriptionchange)"
UNSUBSCRIBED_REASON = "unsubscribed in the browser (gov.unsubscribe)"
#: Live subscriptions a user may have for POST /subscriptions to add one: a person has a
#: handful of browsers. Without it one subscribe token (ten minutes) stored 500 for one user,
#: and each of the user's sends then went out 500 times, to endpoints of the token holder's
#: choosing. A subscription past it is refused (409), not made by retiring the oldest: the
#: door never retires what the app stored through the trusted API (Governor.subscribe,
#: unbounded), and an abused token leaves no trail of retired rows. A person who truly
#: reaches it has stale subscriptions, which their push services retire at the next
#: delivery (404/410), and a browser's renewal replaces one rather than adding one.
MAX_LIVE_SUBSCRIPTIONS = 16
NO_SECRET = (
    f"subscribe is not configured: set {ENV_SECRET} (or {ENV_SECRET_FILE}) to the secret the app signs "
    "subscribe tokens with"
)

NO_BEACON_SECRET = (
    f"beacons are not configured: set {ENV_BEACON_SECRET} (or {ENV_BEACON_SECRET_FILE}) here and in every "
    "process that delivers (gov dispatch, gov release, gov send, the app's Governor), so each push carries a token"
)
BAD_BEACON_TOKEN = "beacon token: not valid for this user, message and subscription"

F = TypeVar("F", bound=Callable[..., Any])


def check_beacon(keys: BeaconKeys | None, token: str | None, user_id: str | None, message_id: str | None,
                 subscription_id: int | None) -> None:
    """Refuse a beacon that does not carry its delivery's token: HTTPError 501 without keys, else 403.

    The token is compared in constant time (:meth:`BeaconKeys.verify`) before anything
    touches the database, so a refused beacon writes nothing and costs one HMAC per secret.
    """
    if keys is None:
        raise HTTPError(501, NO_BEACON_SECRET)
    if token is None:
        raise HTTPError(403, "beacon token missing: a beacon echoes its push's data.token and data.sub")
    if subscription_id is None or user_id is None or message_id is None:
        raise HTTPError(403, "beacon token: the userId, messageId and subscriptionId (data.sub) it covers are "
                             "required")
    if not keys.verify(token, user_id, message_id, subscription_id):
        raise HTTPError(403, BAD_BEACON_TOKEN)


def json_only(endpoint: F) -> F:
    """Mark a route that refuses any Content-Type but application/json (415, before the body is read)."""
    endpoint.gov_json_only = True  # type: ignore[attr-defined]
    return endpoint


def rate_limited(limit: RateLimit) -> Callable[[F], F]:
    """Mark a route whose every request, whatever its body, first takes a token from ``limit``
    by client address (429 with Retry-After past it, before the body is read)."""
    def mark(endpoint: F) -> F:
        endpoint.gov_rate_limit = limit  # type: ignore[attr-defined]
        return endpoint

    return mark


@cache
def static(name: str) -> bytes:
    """A file shipped in ``gov/http/static`` (read once)."""
    return (resources.files("gov.http") / "static" / name).read_bytes()


def _asset(name: str, media_type: str) -> Response:
    # no-cache: revalidated on every load, so a gov upgrade reaches browsers at once
    return Response(static(name), media_type=media_type, headers={
        "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
    })


def _same_secret(given: str, stored: str) -> bool:
    """Two base64url auth secrets, compared as bytes in constant time (False when unreadable)."""
    try:
        return hmac.compare_digest(b64url_decode(given), b64url_decode(stored))
    except ValueError:
        return False


def _held(governor: Governor, proof: Proof, *, renewable: bool) -> tuple[int, str, bool] | None:
    """``(id, user_id, live)`` of the subscription ``proof`` holds, or None.

    Live rows always; with ``renewable`` also one a push service retired (404/410), which a
    browser renews after ``pushsubscriptionchange``. Never one the user left on purpose.
    """
    rows = governor.source.execute(q("subscriptions_by_endpoint"), {"endpoint": proof.endpoint})
    for sub_id, user_id, auth, live, reason in rows:
        if not (live or (renewable and str(reason).startswith(RENEWABLE_REASON))):
            continue
        if _same_secret(proof.auth, auth):
            return int(sub_id), str(user_id), bool(live)
    return None


def subscribe(governor: Governor, secret: bytes | None, body: Subscribe, *,
              max_live: int = MAX_LIVE_SUBSCRIPTIONS) -> Subscribed:
    """Store ``body.subscription`` for the user its token (or its previous subscription) proves.

    In one transaction, one at a time per user: a renewal first marks the subscription it
    replaces as replaced (once: a second renewal with the same proof is refused, even at the
    same moment), then the user's live subscriptions on other endpoints are counted (409 at
    ``max_live``), then the subscription is stored.

    Raises HTTPError 501 (no secret), 403 (bad token or proof), 409 (too many live), or
    :class:`gov.errors.InvalidSubscription` (422); nothing is written then.
    """
    renewed: int | None = None
    if body.token is not None:
        if secret is None:
            raise HTTPError(501, NO_SECRET)
        try:
            user_id = verify_subscribe_token(secret, body.token, user_id=body.user_id)
        except InvalidToken as exc:
            raise HTTPError(403, str(exc)) from None
    else:
        assert body.previous is not None  # the model requires one of the two
        held = _held(governor, body.previous, renewable=True)
        if held is None:
            raise HTTPError(403, "previous: no subscription with this endpoint and auth secret to renew")
        old_id, user_id, live = held
        if body.user_id is not None and body.user_id != user_id:
            raise HTTPError(403, "previous: the subscription belongs to another user")
        if not (live and body.previous.endpoint == body.subscription.endpoint):  # (else: the same row, updated)
            renewed = old_id
    params = governor.subscription_params(user_id, body.subscription.model_dump(by_alias=True))
    with governor.source.connection() as conn, conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(q("lock_user_subscriptions"), {"user_id": user_id})
        if renewed is not None and cur.execute(q("renew_subscription"), {
            "user_id": user_id, "id": renewed, "reason": REPLACED_REASON, "renewable": RENEWABLE_REASON,
        }).fetchone() is None:
            raise HTTPError(403, "previous: this subscription was renewed already")
        (live_count,) = cur.execute(q("live_subscriptions_besides"),
                                    {"user_id": user_id, "endpoint": params["endpoint"]}).fetchone() or (0,)
        if live_count >= max_live:
            raise HTTPError(409, f"this user already has {live_count} live subscriptions, the most "
                                 "POST /subscriptions allows (a browser's renewal replaces one)")
        (sub_id,) = cur.execute(q("subscribe"), params).fetchone() or (None,)
    return Subscribed.model_validate({"subscriptionId": sub_id, "userId": user_id})


def retire(governor: Governor, proof: Proof) -> None:
    """Retire the live subscription ``proof`` holds (the browser unsubscribed); 404 when none."""
    held = _held(governor, proof, renewable=False)
    if held is None:
        raise HTTPError(404, "no live subscription with this endpoint and auth secret")
    governor.source.execute(q("retire_subscription"),
                            {"user_id": held[1], "id": held[0], "reason": UNSUBSCRIBED_REASON})


def install(app: FastAPI, governor: Governor, *, secret: bytes | None, demo: bool, api_token: Any,
            beacon_keys: BeaconKeys | None = None, error_limit: RateLimit | None = None) -> None:
    """Add the browser routes to ``app`` (the demo's only with ``demo``).

    ``error_limit`` bounds ``POST /events/errors`` (default: :class:`gov.http.limits.RateLimit`'s).
    """
    limit = error_limit if error_limit is not None else RateLimit()
    @app.get("/gov-sw.js", summary="gov's service worker", response_class=Response,
             responses={200: {"content": {"text/javascript": {}}, "description": "JavaScript"}})
    async def service_worker() -> Response:
        return _asset("gov-sw.js", JS)

    @app.get("/gov.js", summary="The page's subscribe helper (gov.subscribe, gov.unsubscribe)",
             response_class=Response,
             responses={200: {"content": {"text/javascript": {}}, "description": "JavaScript"}})
    async def helper() -> Response:
        return _asset("gov.js", JS)

    @app.post(
        "/subscriptions", summary="Store this browser's subscription for the user of an app-signed token",
        status_code=201, response_model=Subscribed, responses=refusals(400, 403, 409, 413, 415, 422, 501, 503),
    )
    @json_only
    async def subscriptions(body: Subscribe) -> Subscribed:
        if body.token is not None and secret is None:
            raise HTTPError(501, NO_SECRET)
        return await run_in_threadpool(subscribe, governor, secret, body)

    @app.post(
        "/subscriptions/retire", summary="The browser unsubscribed: retire its subscription",
        status_code=204, response_class=Response, responses=refusals(400, 404, 413, 415, 422, 503),
    )
    @json_only
    async def retire_subscription(body: Proof) -> Response:
        await run_in_threadpool(retire, governor, body)
        return Response(status_code=204)

    @app.post(
        "/events/errors", summary="The service worker could not read a push (counted, not stored)",
        status_code=204, response_class=Response, responses=refusals(400, 403, 413, 422, 429),
    )
    @rate_limited(limit)
    async def worker_error(body: WorkerError) -> Response:
        # Public and mostly without a token (an unreadable push rarely has one to echo), so
        # bounded instead: every report, valid or not (unreadable, oversize, refused by the
        # model), takes from its address's bucket first, before its body is read (gov.http.app
        # GovRoute). Behind a proxy on this host, uvicorn takes the address from X-Forwarded-For.
        if body.token is not None:  # echoed: then it must be the push's own
            if beacon_keys is None:  # no push of this server carries one: no echo can be valid
                raise HTTPError(403, "beacon token refused: this server has no beacon secret")
            check_beacon(beacon_keys, body.token, body.user_id, body.message_id, body.subscription_id)
        gov_metrics.observe_worker_error(body.kind)
        return Response(status_code=204)

    if not demo:
        return

    @app.get("/demo", summary="Demo: subscribe this browser, send it a test notification", response_class=Response)
    async def demo_page() -> Response:
        return _asset("demo.html", HTML)

    @app.get("/demo/demo.js", summary="Demo: the page's script", response_class=Response)
    async def demo_script() -> Response:
        return _asset("demo.js", JS)

    @app.get("/demo/config.json", summary="Demo: the VAPID public key browsers subscribe with")
    async def demo_config() -> JSONResponse:
        key = governor.signer.public_key if governor.signer is not None else None
        return JSONResponse({"vapidPublicKey": key, "subscribe": secret is not None})

    @app.post(
        "/demo/token", summary="Demo: a subscribe token for a user (the operator's API token required)",
        response_model=SubscribeToken, dependencies=[Security(api_token)],
        responses=refusals(400, 401, 413, 422, 501),
    )
    async def demo_token(body: TokenRequest) -> SubscribeToken:
        if secret is None:
            raise HTTPError(501, NO_SECRET)
        token = mint_subscribe_token(secret, body.user_id, ttl_s=DEFAULT_TTL_S)
        return SubscribeToken.model_validate({"token": token, "userId": body.user_id, "expiresIn": DEFAULT_TTL_S})
