"""`gov serve`: the governor over HTTP (FastAPI on Starlette and uvicorn).

Routes::

    POST /internal/send               the seed's send: {"sent":true} | {"sent":false,"action":…,"reason":…}
    POST /events                      the service worker's beacon (display, click, close, unsubscribe) → 204
    GET  /users/{id}/preferences      a user's time zone, quiet hours, own caps, topic opt-outs
    PUT  /users/{id}/preferences      replace them (all or nothing)
    GET  /healthz                     200 when the database answers (the app's pool and the sends'), else 503
    GET  /metrics                     Prometheus text format (gov.ops.metrics): counts only, no user data
    GET  /openapi.json                this API, described (generated from gov.http.models)

and the browser half (:mod:`gov.http.browser`): ``GET /gov-sw.js`` and ``/gov.js``,
``POST /subscriptions`` (with an app-signed subscribe token), ``POST /subscriptions/retire``,
``POST /events/errors``, and with ``--demo`` the page ``GET /demo``.

``/internal/*`` and ``/users/*`` need ``Authorization: Bearer <GOV_API_TOKEN>`` (compared
in constant time; 401 and nothing written without it). ``/metrics`` needs a bearer token
too, since the server is often reachable from the internet for ``/events``: the scrape-only
``GOV_METRICS_TOKEN`` (so Prometheus never holds the token that sends), or the API token. ``/events`` is public, as a
beacon must be, but each beacon must echo the beacon token its push carried
(:mod:`gov.delivery.beacon`: an HMAC over the user, the message and the subscription,
known only to the browser the encrypted payload reached): 403 and nothing written
without a valid one, 501 when no ``GOV_BEACON_SECRET`` is configured (invariant 15).
Bodies over 64 KiB are refused with 413 before they are read; malformed JSON is 400,
well-formed but invalid input is 422, and nothing is written for either. The bodies are
the pydantic models of :mod:`gov.http.models`: they validate each request and are the
OpenAPI document's schemas. Every refusal, 404 and 405 included, is ``{"error": "…"}``.

Without ``GOV_VAPID_PRIVATE_KEY`` the server only records: an allowed message waits in
the outbox for ``gov dispatch``. With it, the server also attempts delivery at once.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import math
import socket
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from typing import Annotated, Any
from urllib.parse import unquote_to_bytes

import prometheus_client
import psycopg
from fastapi import FastAPI, Path, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope
from starlette.types import Message as ASGIMessage
from starlette.types import Send as ASGISend

from gov import users
from gov.aio import DEFAULT_BATCH_MAX, DEFAULT_BATCH_WINDOW_MS, AsyncGovernor, SendBatcher
from gov.analytics.events import record_event
from gov.delivery.beacon import BeaconKeys
from gov.errors import ConfigurationError, DatabaseError, InvalidInput
from gov.governor import Governor
from gov.http import browser
from gov.http.door import FastSend
from gov.http.guard import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
    FD_RESERVE,
    Limits,
    connection_cap,
)
from gov.http.limits import RateLimit
from gov.http.models import Event, Health, Id, Preferences, Segment, Send, Verdict
from gov.http.refusals import HTTPError, refusals
from gov.http.refusals import error_response as _error
from gov.ops import metrics as gov_metrics
from gov.policy import format_duration
from gov.queries import q

log = logging.getLogger("gov.http.app")

ENV_TOKEN = "GOV_API_TOKEN"
ENV_METRICS_TOKEN = "GOV_METRICS_TOKEN"
MAX_BODY_BYTES = 64 * 1024  # bytes: a send is a few hundred; anything near this is abuse
MIN_TOKEN_LENGTH = 16  # characters: a shorter bearer token can be guessed
DEFAULT_HOST = "127.0.0.1"  # loopback unless told otherwise: /internal is for your own services
DEFAULT_PORT = 8080
# Grouped statements at once per process. One in flight gives the biggest batches (measured:
# 1 and 2 beat 4 on this 2-core machine, docs/performance.md); two keep the door moving when
# one batch waits on a user whose lock an app's own transaction holds.
DEFAULT_BATCH_CONCURRENCY = 2

#: Each route's JSON field names, from its model.
SEND_FIELDS = tuple(f.alias or name for name, f in Send.model_fields.items())
EVENT_FIELDS = tuple(f.alias or name for name, f in Event.model_fields.items())
PREFERENCE_FIELDS = tuple(f.alias or name for name, f in Preferences.model_fields.items())


async def read_json(request: Request, limit: int = MAX_BODY_BYTES) -> tuple[bytes, Any]:
    """The request body and its JSON: 413 past ``limit`` bytes (declared or streamed), 400 if not JSON."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise HTTPError(400, "invalid Content-Length")
        if int(declared) > limit:
            raise HTTPError(413, f"body of {declared} bytes is over the {limit}-byte limit")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise HTTPError(413, f"body is over the {limit}-byte limit")
    except ClientDisconnect:
        # a client that leaves mid-body gets no answer, and leaves no traceback in the log
        # (anyone who can reach a door could otherwise fill it, one stalled request a line)
        raise HTTPError(400, "the client closed the connection before its body was complete") from None
    if not body:
        raise HTTPError(400, "a JSON body is required")

    def refuse_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        # UTF-8 only (RFC 8259): json.loads would guess UTF-16 and skip a byte order mark
        text = bytes(body).decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPError(400, "invalid JSON: the body is not UTF-8") from None
    try:
        return bytes(body), json.loads(text, parse_constant=refuse_constant)
    except RecursionError:
        raise HTTPError(400, "invalid JSON: nested too deeply") from None
    except ValueError as exc:
        # the parser's words, but not its advice to the server's operator (sys.set_int_max_str_digits)
        reason = "a number with too many digits" if "integer string conversion" in str(exc) else str(exc)
        raise HTTPError(400, f"invalid JSON: {reason}") from None


class JSONRequest(Request):
    """A request whose body gov has read within its limit and parsed, whatever the Content-Type.

    A beacon sent with ``navigator.sendBeacon`` says ``text/plain``; it is JSON all the same.
    """

    _raw: bytes
    _parsed: Any

    @classmethod
    async def read(cls, request: Request, limit: int) -> JSONRequest:
        raw, parsed = await read_json(request, limit)
        headers = [(k, v) for k, v in request.scope["headers"] if k.lower() != b"content-type"]
        new = cls({**request.scope, "headers": [*headers, (b"content-type", b"application/json")]}, request.receive)
        new._raw, new._parsed = raw, parsed
        return new

    async def body(self) -> bytes:
        return self._raw

    async def json(self) -> Any:
        return self._parsed


class BearerToken(HTTPBearer):
    """A bearer token that guards a route, compared in constant time; an OpenAPI security scheme too."""

    def __init__(self, accepted: Sequence[bytes], scheme_name: str, description: str) -> None:
        super().__init__(scheme_name=scheme_name, description=description, auto_error=False)
        self.accepted = list(accepted)

    def check(self, request: Request) -> None:
        if len(request.headers.getlist("authorization")) > 1:
            # which one would count? Refused, at every door alike (the fast door hands it here)
            raise HTTPError(401, "more than one Authorization header", {"WWW-Authenticate": 'Bearer realm="gov"'})
        # the header's own bytes (Starlette decodes them as Latin-1), split and stripped as bytes:
        # exactly as the fast door (gov.http.door) reads them, so both doors take the same tokens
        raw = request.headers.get("authorization", "").encode("latin-1")
        scheme, _, value = raw.partition(b" ")
        given = value.strip()
        # compare_digest even for a wrong scheme: the time taken says nothing about the token;
        # every accepted token is compared, so the time says nothing about which one matched
        matches = [hmac.compare_digest(given, secret) for secret in self.accepted]
        if not any(matches) or scheme.lower() != b"bearer":
            raise HTTPError(401, "missing or wrong bearer token", {"WWW-Authenticate": 'Bearer realm="gov"'})

    async def __call__(self, request: Request) -> None:  # type: ignore[override]
        self.check(request)


def _strict_path(request: Request) -> None:
    """400 for a path whose percent-escapes are not UTF-8: decoded leniently, ``bad%ffid`` and
    ``bad%feid`` would both name the user ``bad\ufffdid``."""
    raw = request.scope.get("raw_path") or b""
    try:
        unquote_to_bytes(raw).decode("utf-8")  # (raw bytes that are UTF-8 are read as uvicorn reads them)
    except UnicodeDecodeError:
        raise HTTPError(400, "the path's percent-escapes are not UTF-8") from None


class GovRoute(APIRoute):
    """A route that checks its bearer token before it reads the body, then reads the body gov's way.

    FastAPI reads and parses a body before it runs a route's dependencies; gov answers 401
    without reading a byte, 413 before reading past the limit, and 400 for what is not JSON
    (NaN and Infinity included) before the model sees anything.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        guards = [d.call for d in self.dependant.dependencies if isinstance(d.call, BearerToken)]
        takes_body = self.body_field is not None

        json_only = getattr(self.endpoint, "gov_json_only", False)
        limit: RateLimit | None = getattr(self.endpoint, "gov_rate_limit", None)

        async def guarded(request: Request) -> Response:
            if limit is not None:
                # every request takes from its address's bucket first, whatever its body: a
                # malformed one costs the server as much as a valid one (browser.rate_limited)
                wait = limit.allow(request.client.host if request.client is not None else "-")
                if wait is not None:
                    raise HTTPError(429, "too many requests from this address; retry later",
                                    {"Retry-After": str(max(1, math.ceil(wait)))})
            for guard in guards:
                guard.check(request)
            if self.dependant.path_params:
                _strict_path(request)
            if json_only:
                media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
                if media_type != "application/json":
                    raise HTTPError(415, f"Content-Type must be application/json, got {media_type or 'none'}")
            if takes_body:
                request = await JSONRequest.read(request, request.app.state.max_body)
            return await handler(request)

        return guarded


class HeadAsGet:
    """Answer HEAD as GET without the body, as Starlette's own routes did (a load balancer's health check)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: ASGISend) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def without_body(message: ASGIMessage) -> None:
            await send({**message, "body": b""} if message["type"] == "http.response.body" else message)

        await self.app({**scope, "method": "GET"}, receive, without_body)


# ---------------------------------------------------------------- refusals


_EXPECTED = {
    "string_type": "a string", "int_type": "a whole number", "bool_type": "true or false", "list_type": "a list",
    "model_type": "a JSON object", "model_attributes_type": "a JSON object", "dict_type": "a JSON object",
}
_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


def _json_type(value: Any) -> str:
    return "null" if value is None else _JSON_TYPES.get(type(value), type(value).__name__)


def describe(error: Mapping[str, Any], model: type[BaseModel] | None) -> str:
    """One line for one pydantic error, in gov's words: ``tier is required``, ``unknown field 'x'``…"""
    loc = [str(p) for p in error.get("loc", ())[1:]]  # without "body" / "path"
    what = model.__name__.lower() if model is not None else "request"
    name = "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in loc).lstrip(".") or what
    kind, ctx, given = error.get("type", ""), error.get("ctx") or {}, error.get("input")
    if kind == "missing":
        return f"{name} is required"
    if kind == "extra_forbidden":
        parent = "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in loc[:-1]).lstrip(".") or what
        expected = ""
        if model is not None and len(loc) == 1:
            expected = f" (expected {', '.join(f.alias or n for n, f in model.model_fields.items())})"
        return f"{parent}: unknown field {loc[-1]!r}{expected}"
    if kind in _EXPECTED:
        if not loc:
            return f"{what}: expected {_EXPECTED[kind]}, got {_json_type(given)}"
        return f"{name} must be {_EXPECTED[kind]}, got {_json_type(given)}"
    if kind == "value_error" and "error" in ctx:
        return f"{name}: {ctx['error']}"
    if kind == "literal_error":
        return f"unknown {name} {given!r}: expected one of {ctx.get('expected')}"
    if kind == "string_pattern_mismatch":
        return f"unknown {name} {given!r}: expected the form {ctx.get('pattern')}"
    return f"{name}: {error.get('msg', 'invalid')}"


def _body_model(request: Request) -> type[BaseModel] | None:
    route = request.scope.get("route")
    field = getattr(route, "body_field", None)
    annotation = getattr(getattr(field, "field_info", None), "annotation", None)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _allowed_methods(request: Request) -> str:
    methods: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, APIRoute) and route.matches(request.scope)[0] is not Match.NONE:
            methods |= route.methods or set()
    return ", ".join(sorted(methods))


def install_error_handlers(app: FastAPI) -> None:
    """Every refusal as ``{"error": "<one line>"}``, FastAPI's own (422, 404, 405) included."""

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPError)
        return _error(exc.status, exc.message, exc.headers)

    async def starlette_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed_methods(request) or headers.get("Allow", "")
        return _error(exc.status_code, str(exc.detail), headers)

    async def invalid_request(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors = exc.errors()
        return _error(422, describe(errors[0], _body_model(request)) if errors else "invalid request")

    async def invalid_input(request: Request, exc: Exception) -> Response:
        return _error(422, str(exc))

    async def database_error(request: Request, exc: Exception) -> Response:
        log.error("database error: %s", exc, extra={"action": "serve_database_error"})
        return _error(503, "the database is unavailable; retry later")

    app.add_exception_handler(HTTPError, http_error)
    app.add_exception_handler(StarletteHTTPException, starlette_error)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(InvalidInput, invalid_input)
    app.add_exception_handler(DatabaseError, database_error)


# ---------------------------------------------------------------- preferences


def get_preferences(conn: psycopg.Connection[Any], user_id: str) -> Preferences:
    """A user's preferences (defaults for a user never seen)."""
    settings = conn.execute(q("user_settings"), {"user_id": user_id}).fetchone()
    time_zone, quiet_start, quiet_end = settings if settings else (None, None, None)
    caps = conn.execute(q("user_caps"), {"user_id": user_id}).fetchall()
    topics = conn.execute(q("user_topic_optouts"), {"user_id": user_id}).fetchall()
    return Preferences.model_validate({
        "userId": user_id,
        "timeZone": time_zone,
        "quietHours": (
            {"start": f"{quiet_start:%H:%M}", "end": f"{quiet_end:%H:%M}"} if quiet_start is not None else None
        ),
        "caps": [{"scope": s, "window": format_duration(w), "cap": c} for s, w, c in caps],
        "topicsOptedOut": [t for (t,) in topics],
    })


def put_preferences(conn: psycopg.Connection[Any], user_id: str, doc: Preferences) -> Preferences:
    """Replace a user's preferences with ``doc`` in one transaction; return the stored document.

    An absent field is cleared (PUT replaces the whole document). A cap above the
    policy's default is refused (:class:`gov.PolicyError`) and nothing is written.
    """
    window = doc.quiet_hours.times() if doc.quiet_hours is not None else None
    caps = {(cap.scope, cap.window_ms): cap.cap for cap in doc.caps}
    with conn.transaction():
        users.set_time_zone(conn, user_id, doc.time_zone)
        users.set_quiet_hours(conn, user_id, window)
        for scope, window_ms, _cap in conn.execute(q("user_caps"), {"user_id": user_id}).fetchall():
            if (scope, window_ms) not in caps:
                users.clear_user_cap(conn, user_id, scope, window_ms)
        for (scope, window_ms), cap in caps.items():
            users.set_user_cap(conn, user_id, scope, window_ms, cap)
        conn.execute(q("clear_user_topic_optouts"), {"user_id": user_id})
        for topic in sorted(set(doc.topics_opted_out)):
            conn.execute(q("add_user_topic_optout"), {"user_id": user_id, "topic": topic})
    return get_preferences(conn, user_id)


# ---------------------------------------------------------------- the application

UserId = Annotated[Id, Path(alias="userId", description="the user's id")]


def create_app(
    governor: Governor,
    token: str,
    *,
    max_body: int = MAX_BODY_BYTES,
    close_on_shutdown: bool = False,
    metrics_token: str | None = None,
    subscribe_secret: bytes | None = None,
    beacon_keys: BeaconKeys | None = None,
    error_limit: RateLimit | None = None,
    demo: bool = False,
    sender: AsyncGovernor | None = None,
    batch_window_ms: float = DEFAULT_BATCH_WINDOW_MS,
    batch_max: int = DEFAULT_BATCH_MAX,
    batch_concurrency: int = DEFAULT_BATCH_CONCURRENCY,
) -> FastAPI:
    """The ASGI application over ``governor``; ``token`` guards /internal and /users.

    ``POST /internal/send`` runs on the async core: ``sender`` (by default an
    :class:`gov.aio.AsyncGovernor` over the governor's database, opened and closed with
    the app) through a :class:`gov.aio.SendBatcher`, which decides the sends that arrive
    together in one statement (``batch_window_ms``, ``batch_max``; ``batch_concurrency``
    statements at once, one connection each). The other routes use ``governor``.

    /metrics takes ``token`` or ``metrics_token`` (a scrape-only secret). Creating the app
    turns on this process's attempt metrics (:func:`gov.ops.metrics.enable`).

    With ``close_on_shutdown`` the governor is closed when the server shuts down (its
    lifespan ends); otherwise it stays yours to close.

    ``subscribe_secret`` (:mod:`gov.http.tokens`) lets browsers subscribe with the app's
    tokens (``POST /subscriptions``: 501 without it); ``demo`` adds the demo page.

    ``beacon_keys`` (:mod:`gov.delivery.beacon`) checks the beacon token of every
    ``POST /events`` (501 without keys: no beacon is taken unauthenticated);
    ``error_limit`` bounds ``POST /events/errors`` (:class:`gov.http.limits.RateLimit`).
    """
    if not isinstance(token, str):
        raise ConfigurationError(f"{ENV_TOKEN} must be set to a secret of at least {MIN_TOKEN_LENGTH} characters")
    check_settings(token, metrics_token, workers=1, batch_window_ms=batch_window_ms, batch_max=batch_max,
                   batch_concurrency=batch_concurrency, connections=False)
    expected = token.strip().encode()
    api_token = BearerToken([expected], "bearer", ENV_TOKEN)
    scrape_token = BearerToken(
        [expected] + ([metrics_token.strip().encode()] if metrics_token is not None else []),
        "metrics", f"{ENV_METRICS_TOKEN} (scrape-only) or {ENV_TOKEN}",
    )

    owns_sender = sender is None
    if sender is None:
        if governor.source.dsn is None:
            raise ConfigurationError(
                "create_app needs a governor over a DSN or a pool (its sends run on their own async pool), "
                "or sender=gov.aio.AsyncGovernor(...)"
            )
        sender = AsyncGovernor(governor.source.dsn, signer=governor.signer, pool_size=batch_concurrency + 1,
                               pool_timeout=governor.source.pool_timeout, clock=governor.clock,
                               allow_loopback_http=governor.allow_loopback_http)
    batcher = SendBatcher(sender, window_ms=batch_window_ms, max_batch=batch_max, concurrency=batch_concurrency,
                          on_batch=gov_metrics.observe_batch)

    gov_metrics.enable()
    database = gov_metrics.DatabaseCollector(governor.source.connection)
    exposition = gov_metrics.Union(prometheus_client.REGISTRY, database)
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            await sender.open()
        except DatabaseError as exc:  # /healthz says so; the pool keeps trying
            log.error("database unavailable at start: %s", exc, extra={"action": "serve_database_error"})
        try:
            yield
        finally:
            await batcher.close()
            if owns_sender:
                await sender.close()
            if close_on_shutdown:
                await run_in_threadpool(governor.close)

    app = FastAPI(
        title="gov",
        version="1",
        description=f"The send-rate governor for web push, over HTTP. Bodies are at most {max_body} bytes; "
                    'every refusal is {"error": "<one line>"}.',
        lifespan=lifespan,
        openapi_url=None,  # served by the route above, which the document lists
        docs_url=None,
        redoc_url=None,
        separate_input_output_schemas=False,
        # no redirect from /path/ to /path: its Location would be built from the Host header
        redirect_slashes=False,
    )
    app.router.route_class = GovRoute

    @app.post(
        "/internal/send", summary="Decide and send one message (the seed's send)",
        response_model=Verdict, response_model_exclude_none=True, dependencies=[Security(api_token)],
        responses=refusals(400, 401, 413, 422, 503),
    )
    async def send(body: Send) -> Verdict:
        # (gov.http.door answers a well-formed send before it reaches here; this route
        # refuses the rest, and answers what the door hands over, e.g. a chunked body)
        message = body.message()
        message.content()  # refuse an oversize or untitled payload before anything is recorded
        result = await batcher.send(message)
        return Verdict.model_validate(result.as_json())

    @app.post(
        "/events", summary="Beacon from the service worker: display, click, close or unsubscribe",
        status_code=204, response_class=Response, responses=refusals(400, 403, 413, 422, 501, 503),
    )
    async def events(body: Event) -> Response:
        # invariant 15: only the browser the push reached knows its token; checked before the database
        browser.check_beacon(beacon_keys, body.token, body.user_id, body.message_id, body.subscription_id)
        await run_in_threadpool(record_event, governor, body.user_id, body.message_id, body.event,
                                body.subscription_id)
        return Response(status_code=204)

    def _conn_call(fn: Callable[..., Preferences], *args: Any) -> Preferences:
        # a read, or a whole replacement: safe to run again on a fresh connection when the
        # pool handed out one the server had dropped (an outside probe saw a 503 then)
        return governor.source.transaction(lambda conn: fn(conn, *args))

    @app.get(
        "/users/{userId}/preferences", summary="A user's preferences", response_model=Preferences,
        dependencies=[Security(api_token)], responses=refusals(401, 422, 503),
    )
    async def read_preferences(user_id: UserId) -> Preferences:
        return await run_in_threadpool(_conn_call, get_preferences, user_id)

    @app.put(
        "/users/{userId}/preferences", summary="Replace a user's preferences (all or nothing)",
        response_model=Preferences, dependencies=[Security(api_token)],
        responses=refusals(400, 401, 413, 422, 503),
    )
    async def replace_preferences(user_id: UserId, body: Preferences) -> Preferences:
        if body.user_id not in (None, user_id):
            raise HTTPError(422, "userId in the body differs from the one in the path")
        return await run_in_threadpool(_conn_call, put_preferences, user_id, body)

    def _set_segment(user_id: str, segment: str | None) -> Segment:
        governor.source.transaction(lambda conn: users.set_segment(conn, user_id, segment))  # idempotent
        return Segment(segment=segment)

    @app.put(
        "/internal/users/{userId}/segment", summary="Put a user in the app's segment (null: in none)",
        response_model=Segment, dependencies=[Security(api_token)], responses=refusals(400, 401, 413, 422, 503),
    )
    async def put_segment(user_id: UserId, body: Segment) -> Segment:
        return await run_in_threadpool(_set_segment, user_id, body.segment)

    @app.get(
        "/healthz", summary="The server runs and the database answers", response_model=Health,
        responses=refusals(503),
    )
    async def healthz() -> Health:
        # "the database answers": a dropped connection in a pool is replaced, not reported
        await run_in_threadpool(governor.source.execute, q("ping"), {})
        # and the sends' own pool: after a restart of the database it was the last to
        # recover (an outside probe saw 20 s of 503s on /internal/send under a 200 here)
        await sender.source.execute(q("ping"), {})
        return Health(ok=True)

    @app.get(
        "/metrics", summary="Prometheus metrics: decisions, suppressions, depths, delivery (counts only)",
        response_class=PlainTextResponse, dependencies=[Security(scrape_token)], responses=refusals(401),
    )
    async def metrics() -> Response:
        body = await run_in_threadpool(prometheus_client.generate_latest, exposition)
        return Response(body, media_type=prometheus_client.CONTENT_TYPE_LATEST)

    @app.get(
        "/openapi.json", summary="This document, generated from the models",
        response_class=JSONResponse, responses={200: {"description": "OpenAPI 3.1"}},
    )
    async def openapi() -> Response:
        return JSONResponse(app.openapi())

    browser.install(app, governor, secret=subscribe_secret, demo=demo, api_token=api_token,
                    beacon_keys=beacon_keys, error_limit=error_limit)

    app.state.max_body = max_body
    app.state.batcher = batcher
    app.state.door = FastSend(app, token=expected, max_body=max_body)
    install_error_handlers(app)
    app.add_middleware(HeadAsGet)
    return app


def asgi(app: FastAPI) -> ASGIApp:
    """What to serve: ``app`` behind its fast door (:mod:`gov.http.door`), which answers a
    well-formed, authorised ``POST /internal/send`` itself and hands everything else on."""
    door: ASGIApp = app.state.door
    return door


def serve(
    database_url: str,
    *,
    token: str | None,
    metrics_token: str | None = None,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    signer: Any = None,
    pool_size: int = 4,
    access_log: bool = False,
    subscribe_secret: bytes | None = None,
    beacon_keys: BeaconKeys | None = None,
    demo: bool = False,
    workers: int = 1,
    batch_window_ms: float = DEFAULT_BATCH_WINDOW_MS,
    batch_max: int = DEFAULT_BATCH_MAX,
    batch_concurrency: int = DEFAULT_BATCH_CONCURRENCY,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT_S,
    body_timeout: float = DEFAULT_BODY_TIMEOUT_S,
    max_connections: int | None = None,
) -> None:
    """Run the server until SIGINT/SIGTERM. Refuses to start without a good token.

    Checks its settings, binds, then announces ``gov: serving on http://HOST:PORT`` on
    stderr (with ``port=0``, the port the system chose), then serves: in this process, or
    with ``workers`` above 1 in that many forked processes, each listening on the port
    (SO_REUSEPORT: the kernel spreads new connections over them) with its own pools;
    SIGTERM or SIGINT stops them all.

    Each process bounds what a client may hold (:mod:`gov.http.guard`): ``header_timeout``
    and ``body_timeout`` seconds, and ``max_connections`` at once (None: the default, kept
    below the open-file limit).
    """
    limits = check_settings(token, metrics_token, workers=workers, batch_window_ms=batch_window_ms,
                            batch_max=batch_max, batch_concurrency=batch_concurrency, header_timeout=header_timeout,
                            body_timeout=body_timeout, max_connections=max_connections, pool_size=pool_size)
    assert token is not None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # One listening socket per process, all bound before any fork (a port in use is one
    # line, before work). With several processes each gets its own socket on the same port
    # (SO_REUSEPORT): the kernel then spreads new connections over them. A single shared
    # socket did not: the process that woke first accepted the whole burst (16 keep-alive
    # connections split 15 to 1 and 11 to 5, measured), and one process served nearly all.
    socks: list[socket.socket] = []
    for _ in range(workers):
        try:
            socks.append(_listen(family, host, port if not socks else socks[0].getsockname()[1], workers > 1))
        except OSError as exc:
            for sock in socks:
                sock.close()
            raise ConfigurationError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    bound_port = socks[0].getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    if signer is None:
        print("gov: no VAPID key (GOV_VAPID_PRIVATE_KEY): sends are recorded, gov dispatch delivers them",
              file=sys.stderr)
    if subscribe_secret is None:
        print("gov: no subscribe secret (GOV_SUBSCRIBE_SECRET): POST /subscriptions refuses tokens (501)",
              file=sys.stderr)
    if beacon_keys is None:
        print("gov: no beacon secret (GOV_BEACON_SECRET): POST /events refuses beacons (501)", file=sys.stderr)
    if demo:
        print(f"gov: demo page on http://{shown}:{bound_port}/demo", file=sys.stderr)

    def run_one(sock: socket.socket) -> None:
        import uvicorn

        governor = Governor(database_url, signer=signer, pool_size=pool_size)
        try:
            app = create_app(governor, token, close_on_shutdown=True, metrics_token=metrics_token,
                             subscribe_secret=subscribe_secret, beacon_keys=beacon_keys, demo=demo,
                             batch_window_ms=batch_window_ms,
                             batch_max=batch_max, batch_concurrency=batch_concurrency)
            # uvicorn ends the process with the signal it caught (SIGTERM: exit status -15)
            # once the lifespan has closed the governor
            from gov.http.wire import GovServer, GuardedHttpToolsProtocol

            # httptools, each answer's head and body written at once (gov.http.wire), with
            # what a client may hold bounded (gov.http.guard); an idle connection between two
            # requests is closed after uvicorn's keep-alive timeout, at most the header timeout
            config = uvicorn.Config(asgi(app), log_level="warning", access_log=access_log, lifespan="on",
                                    # (an access log is uvicorn's to write: every request through ASGI then)
                                    http=GuardedHttpToolsProtocol.with_limits(
                                        limits, None if access_log else app.state.door),
                                    timeout_keep_alive=min(5, header_timeout))  # type: ignore[arg-type]
            GovServer(config, limits).run(sockets=[sock])
        finally:
            governor.close()

    if workers == 1:
        print(f"gov: serving on http://{shown}:{bound_port}", file=sys.stderr, flush=True)
        run_one(socks[0])
        return
    _run_workers(run_one, socks, f"gov: serving on http://{shown}:{bound_port} ({workers} processes)")


def check_settings(
    token: str | None, metrics_token: str | None, *, workers: int, batch_window_ms: float, batch_max: int,
    batch_concurrency: int, header_timeout: float = DEFAULT_HEADER_TIMEOUT_S,
    body_timeout: float = DEFAULT_BODY_TIMEOUT_S, max_connections: int | None = None, pool_size: int = 4,
    connections: bool = True,
) -> Limits:
    """Every setting of ``gov serve`` checked before it binds or forks: one ConfigurationError.

    Returns the bounds of each connection (:mod:`gov.http.guard`); without ``connections``
    (the app alone, which holds none) the connection cap is not worked out from the open-file limit.
    """
    if token is None:
        raise ConfigurationError(f"{ENV_TOKEN} is not set: gov serve refuses to start without its bearer token")
    if len(token.strip()) < MIN_TOKEN_LENGTH:
        raise ConfigurationError(
            f"{ENV_TOKEN} must be set to a secret of at least {MIN_TOKEN_LENGTH} characters "
            "(the bearer token /internal/send and /users require)"
        )
    if metrics_token is not None and len(metrics_token.strip()) < MIN_TOKEN_LENGTH:
        raise ConfigurationError(
            f"{ENV_METRICS_TOKEN}, when set, must be a secret of at least {MIN_TOKEN_LENGTH} characters"
        )
    for name, secret in ((ENV_TOKEN, token), (ENV_METRICS_TOKEN, metrics_token)):
        # an HTTP header carries bytes, which clients encode as they please past ASCII: a token
        # that is not printable ASCII would open one door and not another (or none)
        if secret is not None and not (secret.strip().isascii() and secret.strip().isprintable()):
            raise ConfigurationError(f"{name} must be printable ASCII (letters, digits, punctuation): "
                                     "HTTP clients encode other characters differently")
    if workers < 1:
        raise ConfigurationError(f"--workers must be at least 1, got {workers}")
    if not 0 <= batch_window_ms <= 1000:
        raise ConfigurationError(f"the batch window must be 0 to 1000 ms, got {batch_window_ms}")
    if batch_max < 1:
        raise ConfigurationError(f"a batch holds at least 1 send, got {batch_max}")
    if batch_concurrency < 1:
        raise ConfigurationError(f"at least 1 batch must run at a time, got {batch_concurrency}")
    for name, value in (("--header-timeout", header_timeout), ("--body-timeout", body_timeout)):
        if not 0.1 <= value <= 3600:
            raise ConfigurationError(f"{name} must be 0.1 to 3600 seconds, got {value}")
    # the descriptors the pools may hold come out of the room for connections
    cap = connection_cap(max_connections, FD_RESERVE + pool_size + batch_concurrency + 1) if connections else 0
    return Limits(header_timeout=header_timeout, body_timeout=body_timeout, max_connections=cap)


def _listen(family: socket.AddressFamily, host: str, port: int, shared: bool) -> socket.socket:
    """A listening TCP socket on ``host:port``; ``shared``: one of several on the same port,
    one per process (SO_REUSEPORT), among which the kernel spreads new connections."""
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets that say they are
    # TCP, and without it every answer written in two parts (head, body) waited for the
    # client's delayed ACK: 40 ms a request, measured (docs/performance.md)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(1024)  # a burst of clients connecting at once must not be refused
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _run_workers(run_one: Callable[[socket.socket], None], socks: list[socket.socket], banner: str) -> None:
    """Fork a process per socket that runs ``run_one`` on it; stop them all on SIGTERM/SIGINT
    or when one ends, and end with the first failure's status."""
    import os
    import signal

    children: list[int] = []
    # each child says on this pipe that it holds its own socket only; the banner waits for
    # all of them, so "serving" is never printed while a child still holds another's socket
    ready_r, ready_w = os.pipe()
    for mine in socks:
        pid = os.fork()
        if pid == 0:  # the child: its own socket, pools and event loop, made after the fork
            code = 0
            try:
                os.close(ready_r)
                for other in socks:
                    if other is not mine:
                        other.close()
                os.write(ready_w, b"+")
                os.close(ready_w)
                run_one(mine)
            except BaseException:  # reported here; the parent sees the status
                log.exception("gov serve worker failed", extra={"action": "serve_worker_failed"})
                code = 1
            finally:
                os._exit(code)
        children.append(pid)
    for sock in socks:  # each child holds its own; a connection queued on a socket no child accepts would wait forever
        sock.close()
    os.close(ready_w)
    ready = 0
    while ready < len(children):  # until every child has said so, or every one's end is closed (one died)
        said = os.read(ready_r, len(children))
        if not said:
            break
        ready += len(said)
    os.close(ready_r)
    print(banner, file=sys.stderr, flush=True)
    stopping = False

    def stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    status = 0
    while children:
        pid, raw = os.wait()
        if pid not in children:
            continue
        children.remove(pid)
        code = os.waitstatus_to_exitcode(raw)
        clean = code == 0 or (stopping and code in (-signal.SIGTERM, -signal.SIGINT))
        if not clean and status == 0:
            status = 1
        if not stopping:  # one worker ended on its own: stop the rest, do not serve at part strength
            stop(signal.SIGTERM, None)
    if status:
        raise SystemExit(status)
