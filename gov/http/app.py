"""`gov serve`: the governor over HTTP (Starlette on uvicorn).

Routes::

    POST /internal/send               the seed's send: {"sent":true} | {"sent":false,"action":…,"reason":…}
    POST /events                      the service worker's beacon (display, click, close, unsubscribe) → 204
    GET  /users/{id}/preferences      a user's time zone, quiet hours, own caps, topic opt-outs
    PUT  /users/{id}/preferences      replace them (all or nothing)
    GET  /healthz                     200 when the database answers, else 503
    GET  /metrics                     Prometheus text format (gov.ops.metrics): counts only, no user data
    GET  /openapi.json                this API, described

``/internal/*`` and ``/users/*`` need ``Authorization: Bearer <GOV_API_TOKEN>`` (compared
in constant time; 401 and nothing written without it). ``/metrics`` needs a bearer token
too, since the server is often reachable from the internet for ``/events``: the scrape-only
``GOV_METRICS_TOKEN`` (so Prometheus never holds the token that sends), or the API token. ``/events`` is public, as a
beacon must be: it can only add one event of each kind to a message gov decided for
that user, so the worst a forger can do is count a click that did not happen once.
Bodies over 64 KiB are refused with 413 before they are read; malformed JSON is 400,
well-formed but invalid input is 422, and nothing is written for either.

Without ``GOV_VAPID_PRIVATE_KEY`` the server only records: an allowed message waits in
the outbox for ``gov dispatch``. With it, the server also attempts delivery at once.
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import json
import logging
import re
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import time
from typing import Any, cast

import prometheus_client
import psycopg
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gov import users
from gov.analytics.events import BEACON_EVENTS, InvalidEvent, record_event
from gov.errors import ConfigurationError, DatabaseError, InvalidInput
from gov.governor import Governor
from gov.message import MAX_ID_LENGTH, MAX_TTL_S, Message
from gov.ops import metrics as gov_metrics
from gov.policy import format_duration, parse_clock, parse_duration
from gov.queries import q

log = logging.getLogger("gov.http.app")

ENV_TOKEN = "GOV_API_TOKEN"
ENV_METRICS_TOKEN = "GOV_METRICS_TOKEN"
MAX_BODY_BYTES = 64 * 1024  # bytes: a send is a few hundred; anything near this is abuse
MIN_TOKEN_LENGTH = 16  # characters: a shorter bearer token can be guessed
DEFAULT_HOST = "127.0.0.1"  # loopback unless told otherwise: /internal is for your own services
DEFAULT_PORT = 8080
MAX_OPTOUTS = 200  # topics a user may opt out of
_CAP_SCOPE = re.compile(r"P[0-9]|global|topic")

#: The seed's send fields (JSON name → gov.Message field).
SEND_FIELDS = {
    "userId": "user_id",
    "tier": "tier",
    "id": "id",
    "title": "title",
    "body": "body",
    "url": "url",
    "topic": "topic",
    "collapseKey": "collapse_key",
    "ttl": "ttl",
    "campaignId": "campaign_id",
}
EVENT_FIELDS = ("userId", "messageId", "event", "subscriptionId")
PREFERENCE_FIELDS = ("userId", "timeZone", "quietHours", "caps", "topicsOptedOut")


class HTTPError(Exception):
    """An answer other than success: a status and a one-line reason, sent as {"error": …}."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


def _compact(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data, separators=(",", ":")), status_code=status, media_type="application/json")


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    return JSONResponse({"error": message}, status_code=status, headers=dict(headers or {}))


Handler = Callable[[Request], Awaitable[Response]]


def _answers(fn: Handler) -> Handler:
    """Map refusals to their status: HTTPError as given, gov's invalid input 422, database 503."""

    @functools.wraps(fn)
    async def wrapper(request: Request) -> Response:
        try:
            return await fn(request)
        except HTTPError as exc:
            return _error(exc.status, exc.message, exc.headers)
        except InvalidInput as exc:
            return _error(422, str(exc))
        except DatabaseError as exc:
            log.error("database error: %s", exc, extra={"action": "serve_database_error"})
            return _error(503, "the database is unavailable; retry later")

    return wrapper


async def read_json(request: Request, limit: int = MAX_BODY_BYTES) -> Any:
    """The request body as JSON: 413 past ``limit`` bytes (declared or streamed), 400 if not JSON."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise HTTPError(400, "invalid Content-Length")
        if int(declared) > limit:
            raise HTTPError(413, f"body of {declared} bytes is over the {limit}-byte limit")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPError(413, f"body is over the {limit}-byte limit")
    if not body:
        raise HTTPError(400, "a JSON body is required")

    def refuse_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        data = json.loads(bytes(body), parse_constant=refuse_constant)
        # a \uD800 escape parses to a lone surrogate, which no database text can hold
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise HTTPError(400, "invalid JSON: a string holds a lone surrogate (not valid Unicode)") from None
    except (ValueError, RecursionError) as exc:
        raise HTTPError(400, f"invalid JSON: {exc}") from None
    return data


def _object(data: Any, allowed: tuple[str, ...] | Mapping[str, str], what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise HTTPError(422, f"{what}: expected a JSON object")
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise HTTPError(422, f"{what}: unknown field {unknown[0]!r} (expected {', '.join(allowed)})")
    return data


def _text_fields(data: Mapping[str, Any], names: tuple[str, ...]) -> None:
    for name in names:
        value = data.get(name)
        if value is not None and not isinstance(value, str):
            raise HTTPError(422, f"{name} must be a string, got {type(value).__name__}")


def _check_user_id(user_id: str) -> None:
    if not user_id.strip() or len(user_id) > MAX_ID_LENGTH or "\x00" in user_id:
        raise HTTPError(422, f"invalid user id (1 to {MAX_ID_LENGTH} characters)")


# ---------------------------------------------------------------- preferences


def get_preferences(conn: psycopg.Connection[Any], user_id: str) -> dict[str, Any]:
    """A user's preferences as the API's JSON document (defaults for a user never seen)."""
    settings = conn.execute(q("user_settings"), {"user_id": user_id}).fetchone()
    time_zone, quiet_start, quiet_end = settings if settings else (None, None, None)
    caps = conn.execute(q("user_caps"), {"user_id": user_id}).fetchall()
    topics = conn.execute(q("user_topic_optouts"), {"user_id": user_id}).fetchall()
    return {
        "userId": user_id,
        "timeZone": time_zone,
        "quietHours": (
            {"start": f"{quiet_start:%H:%M}", "end": f"{quiet_end:%H:%M}"} if quiet_start is not None else None
        ),
        "caps": [{"scope": s, "window": format_duration(w), "cap": c} for s, w, c in caps],
        "topicsOptedOut": [t for (t,) in topics],
    }


def _parse_preferences(
    doc: Mapping[str, Any],
) -> tuple[str | None, tuple[time, time] | None, dict[tuple[str, int], int], list[str]]:
    time_zone = doc.get("timeZone")
    if time_zone is not None and (not isinstance(time_zone, str) or not time_zone):
        raise InvalidInput("timeZone must be an IANA zone name such as Europe/Berlin, or null")
    quiet = doc.get("quietHours")
    window = None
    if quiet is not None:
        if not isinstance(quiet, dict) or set(quiet) != {"start", "end"}:
            raise InvalidInput('quietHours must be {"start": "HH:MM", "end": "HH:MM"} or null')
        try:
            window = parse_clock(quiet["start"], "quietHours.start"), parse_clock(quiet["end"], "quietHours.end")
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        if window[0] == window[1]:
            raise InvalidInput("quietHours: start and end are equal")
    raw_caps = doc.get("caps") or []
    if not isinstance(raw_caps, list):
        raise InvalidInput('caps must be a list of {"scope": "P2", "window": "24h", "cap": 1}')
    caps: dict[tuple[str, int], int] = {}
    for item in raw_caps:
        if not isinstance(item, dict) or set(item) != {"scope", "window", "cap"}:
            raise InvalidInput('each cap must be {"scope": "P2", "window": "24h", "cap": 1}')
        scope, cap = item["scope"], item["cap"]
        if not isinstance(scope, str) or not _CAP_SCOPE.fullmatch(scope):
            raise InvalidInput(f"cap scope {scope!r}: expected a tier (P0..P9), 'global' or 'topic'")
        try:
            window_ms = parse_duration(item["window"], f"cap {scope} window")
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        if isinstance(cap, bool) or not isinstance(cap, int) or not 0 <= cap <= 1_000_000:
            raise InvalidInput(f"cap {scope}/{item['window']}: must be a whole number from 0 to 1000000, got {cap!r}")
        if (scope, window_ms) in caps:
            raise InvalidInput(f"cap {scope}/{item['window']} is given twice")
        caps[(scope, window_ms)] = cap
    topics = doc.get("topicsOptedOut") or []
    if not isinstance(topics, list) or len(topics) > MAX_OPTOUTS:
        raise InvalidInput(f"topicsOptedOut must be a list of at most {MAX_OPTOUTS} topics")
    for topic in topics:
        if not isinstance(topic, str) or not topic.strip() or len(topic) > MAX_ID_LENGTH or "\x00" in topic:
            raise InvalidInput(f"topic {topic!r}: expected 1 to {MAX_ID_LENGTH} characters")
    return time_zone, window, caps, sorted(set(topics))


def put_preferences(conn: psycopg.Connection[Any], user_id: str, doc: Mapping[str, Any]) -> dict[str, Any]:
    """Replace a user's preferences with ``doc`` in one transaction; return the stored document.

    An absent field is cleared (PUT replaces the whole document). A cap above the
    policy's default is refused (:class:`gov.PolicyError`) and nothing is written.
    """
    time_zone, window, caps, topics = _parse_preferences(doc)
    with conn.transaction():
        users.set_time_zone(conn, user_id, time_zone)
        users.set_quiet_hours(conn, user_id, window)
        for scope, window_ms, _cap in conn.execute(q("user_caps"), {"user_id": user_id}).fetchall():
            if (scope, window_ms) not in caps:
                users.clear_user_cap(conn, user_id, scope, window_ms)
        for (scope, window_ms), cap in caps.items():
            users.set_user_cap(conn, user_id, scope, window_ms, cap)
        conn.execute(q("clear_user_topic_optouts"), {"user_id": user_id})
        for topic in topics:
            conn.execute(q("add_user_topic_optout"), {"user_id": user_id, "topic": topic})
    return get_preferences(conn, user_id)


# ---------------------------------------------------------------- the application


def create_app(
    governor: Governor,
    token: str,
    *,
    max_body: int = MAX_BODY_BYTES,
    close_on_shutdown: bool = False,
    metrics_token: str | None = None,
) -> Starlette:
    """The ASGI application over ``governor``; ``token`` guards /internal and /users.

    /metrics takes ``token`` or ``metrics_token`` (a scrape-only secret). Creating the app
    turns on this process's attempt metrics (:func:`gov.ops.metrics.enable`).

    With ``close_on_shutdown`` the governor is closed when the server shuts down (its
    lifespan ends); otherwise it stays yours to close.
    """
    if not isinstance(token, str) or len(token.strip()) < MIN_TOKEN_LENGTH:
        raise ConfigurationError(
            f"{ENV_TOKEN} must be set to a secret of at least {MIN_TOKEN_LENGTH} characters "
            "(the bearer token /internal/send and /users require)"
        )
    if metrics_token is not None and len(metrics_token.strip()) < MIN_TOKEN_LENGTH:
        raise ConfigurationError(
            f"{ENV_METRICS_TOKEN}, when set, must be a secret of at least {MIN_TOKEN_LENGTH} characters"
        )
    expected = token.strip().encode()
    scrape_tokens = [expected] + ([metrics_token.strip().encode()] if metrics_token is not None else [])

    def authorize(request: Request, accepted: list[bytes] | None = None) -> None:
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        given = value.strip().encode()
        # compare_digest even for a wrong scheme: the time taken says nothing about the token;
        # every accepted token is compared, so the time says nothing about which one matched
        matches = [hmac.compare_digest(given, secret) for secret in (accepted or [expected])]
        if not any(matches) or scheme.lower() != "bearer":
            raise HTTPError(401, "missing or wrong bearer token", {"WWW-Authenticate": 'Bearer realm="gov"'})

    gov_metrics.enable()
    database = gov_metrics.DatabaseCollector(governor.source.connection)
    exposition = gov_metrics.Union(prometheus_client.REGISTRY, database)

    @_answers
    async def send(request: Request) -> Response:
        authorize(request)
        data = _object(await read_json(request, max_body), SEND_FIELDS, "send")
        for name in ("userId", "id", "tier", "title"):
            if data.get(name) is None:
                hint = " (P0, P1, P2 or P3: there is no default)" if name == "tier" else ""
                raise HTTPError(422, f"{name} is required{hint}")
        _text_fields(data, ("userId", "id", "tier", "title", "body", "url", "topic", "collapseKey", "campaignId"))
        message = Message(**{SEND_FIELDS[k]: v for k, v in data.items()})
        message.content()  # refuse an oversize or untitled payload before anything is recorded
        result = await run_in_threadpool(governor.send, message)
        return _compact(result.as_json())

    @_answers
    async def events(request: Request) -> Response:
        data = _object(await read_json(request, max_body), EVENT_FIELDS, "event")
        event = data.get("event")
        if event == "accepted":
            raise HTTPError(422, "accepted is recorded by the delivery runner, not by a beacon")
        if event not in BEACON_EVENTS:
            raise HTTPError(422, f"unknown event {event!r}: expected one of {', '.join(BEACON_EVENTS)}")
        try:
            # record_event refuses anything that is not an id (check_event takes any object)
            user_id, message_id = cast(str, data.get("userId")), cast(str, data.get("messageId"))
            await run_in_threadpool(record_event, governor, user_id, message_id, event, data.get("subscriptionId"))
        except InvalidEvent as exc:
            raise HTTPError(422, str(exc)) from None
        return Response(status_code=204)

    def _conn_call(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
        with governor.source.connection() as conn:
            return fn(conn, *args)

    @_answers
    async def preferences(request: Request) -> Response:
        authorize(request)
        user_id = request.path_params["user_id"]
        _check_user_id(user_id)
        if request.method == "GET":
            return JSONResponse(await run_in_threadpool(_conn_call, get_preferences, user_id))
        doc = _object(await read_json(request, max_body), PREFERENCE_FIELDS, "preferences")
        if doc.get("userId") not in (None, user_id):
            raise HTTPError(422, "userId in the body differs from the one in the path")
        return JSONResponse(await run_in_threadpool(_conn_call, put_preferences, user_id, doc))

    @_answers
    async def healthz(request: Request) -> Response:
        def ping() -> None:
            with governor.source.connection() as conn:
                conn.execute(q("ping"))

        await run_in_threadpool(ping)
        return _compact({"ok": True})

    async def openapi(request: Request) -> Response:
        return JSONResponse(OPENAPI)

    @_answers
    async def metrics(request: Request) -> Response:
        authorize(request, scrape_tokens)
        body = await run_in_threadpool(prometheus_client.generate_latest, exposition)
        return Response(body, media_type=prometheus_client.CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if close_on_shutdown:
                await run_in_threadpool(governor.close)

    return Starlette(
        lifespan=lifespan,
        routes=[
            Route("/internal/send", send, methods=["POST"]),
            Route("/events", events, methods=["POST"]),
            Route("/users/{user_id}/preferences", preferences, methods=["GET", "PUT"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/openapi.json", openapi, methods=["GET"]),
        ]
    )


def serve(
    database_url: str,
    *,
    token: str | None,
    metrics_token: str | None = None,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    signer: Any = None,
    pool_size: int = 8,
    access_log: bool = False,
) -> None:
    """Run the server until SIGINT/SIGTERM. Refuses to start without a good token.

    Binds first, then announces ``gov: serving on http://HOST:PORT`` on stderr (with
    ``port=0``, the port the system chose), then serves.
    """
    import uvicorn

    if token is None:
        raise ConfigurationError(f"{ENV_TOKEN} is not set: gov serve refuses to start without its bearer token")
    governor = Governor(database_url, signer=signer, pool_size=pool_size)
    try:
        app = create_app(governor, token, close_on_shutdown=True, metrics_token=metrics_token)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise ConfigurationError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        sock.listen(128)
        sock.set_inheritable(True)
        bound_port = sock.getsockname()[1]
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        if signer is None:
            print("gov: no VAPID key (GOV_VAPID_PRIVATE_KEY): sends are recorded, gov dispatch delivers them",
                  file=sys.stderr)
        print(f"gov: serving on http://{shown}:{bound_port}", file=sys.stderr, flush=True)
        # uvicorn ends the process with the signal it caught (SIGTERM: exit status -15)
        # once the lifespan has closed the governor
        config = uvicorn.Config(app, log_level="warning", access_log=access_log, lifespan="on")
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        governor.close()


# ---------------------------------------------------------------- OpenAPI

_ERROR = {"description": "refused", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_BEARER: list[dict[str, list[str]]] = [{"bearer": []}]

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "gov",
        "version": "1",
        "description": "The send-rate governor for web push, over HTTP. Bodies are at most 64 KiB.",
    },
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": "GOV_API_TOKEN"}},
        "schemas": {
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
            "Send": {
                "type": "object",
                "required": ["userId", "tier", "id", "title"],
                "additionalProperties": False,
                "properties": {
                    "userId": {"type": "string", "maxLength": MAX_ID_LENGTH},
                    "tier": {"type": "string", "pattern": "^P[0-9]$", "description": "required: there is no default"},
                    "id": {"type": "string", "maxLength": MAX_ID_LENGTH, "description": "stable: the idempotency key"},
                    "title": {"type": "string"},
                    "body": {"type": "string"},
                    "url": {"type": "string"},
                    "topic": {"type": "string"},
                    "collapseKey": {"type": "string"},
                    "ttl": {"type": "integer", "minimum": 0, "maximum": MAX_TTL_S},
                    "campaignId": {"type": "string"},
                },
            },
            "Verdict": {
                "type": "object",
                "required": ["sent"],
                "properties": {
                    "sent": {"type": "boolean"},
                    "action": {"type": "string", "enum": ["drop", "defer", "collapse"]},
                    "reason": {"type": "string", "examples": ["cap_86400000ms", "quiet_hours"]},
                },
            },
            "Event": {
                "type": "object",
                "required": ["userId", "messageId", "event"],
                "additionalProperties": False,
                "properties": {
                    "userId": {"type": "string"},
                    "messageId": {"type": "string"},
                    "event": {"type": "string", "enum": list(BEACON_EVENTS)},
                    "subscriptionId": {"type": ["integer", "null"]},
                },
            },
            "Preferences": {
                "type": "object",
                "additionalProperties": False,
                "description": "PUT replaces the whole document: an absent field is cleared.",
                "properties": {
                    "userId": {"type": "string"},
                    "timeZone": {"type": ["string", "null"], "description": "IANA zone; null: no quiet hours"},
                    "quietHours": {
                        "type": ["object", "null"],
                        "description": "local HH:MM; null: the policy's default",
                        "properties": {"start": {"type": "string"}, "end": {"type": "string"}},
                    },
                    "caps": {
                        "type": "array",
                        "description": "the user's own caps; each may only lower the policy's default",
                        "items": {
                            "type": "object",
                            "required": ["scope", "window", "cap"],
                            "properties": {
                                "scope": {"type": "string", "examples": ["P2", "global", "topic"]},
                                "window": {"type": "string", "examples": ["24h", "7d"]},
                                "cap": {"type": "integer", "minimum": 0},
                            },
                        },
                    },
                    "topicsOptedOut": {"type": "array", "items": {"type": "string"}, "maxItems": MAX_OPTOUTS},
                },
            },
        },
    },
    "paths": {
        "/internal/send": {
            "post": {
                "summary": "Decide and send one message (the seed's send)",
                "security": _BEARER,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Send"}}},
                },
                "responses": {
                    "200": {
                        "description": 'the verdict, compact: {"sent":true} or {"sent":false,"action":…,"reason":…}',
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Verdict"}}},
                    },
                    "400": _ERROR, "401": _ERROR, "413": _ERROR, "422": _ERROR, "503": _ERROR,
                },
            }
        },
        "/events": {
            "post": {
                "summary": "Beacon from the service worker: display, click, close or unsubscribe",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Event"}}},
                },
                "responses": {
                    "204": {"description": "recorded (or already recorded)"},
                    "400": _ERROR, "413": _ERROR, "422": _ERROR, "503": _ERROR,
                },
            }
        },
        "/users/{userId}/preferences": {
            "parameters": [{"name": "userId", "in": "path", "required": True, "schema": {"type": "string"}}],
            "get": {
                "summary": "A user's preferences",
                "security": _BEARER,
                "responses": {
                    "200": {
                        "description": "the preferences",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Preferences"}}},
                    },
                    "401": _ERROR,
                },
            },
            "put": {
                "summary": "Replace a user's preferences (all or nothing)",
                "security": _BEARER,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Preferences"}}},
                },
                "responses": {
                    "200": {
                        "description": "the stored preferences",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Preferences"}}},
                    },
                    "400": _ERROR, "401": _ERROR, "413": _ERROR, "422": _ERROR,
                },
            },
        },
        "/healthz": {
            "get": {
                "summary": "The server runs and the database answers",
                "responses": {"200": {"description": "ok"}, "503": _ERROR},
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics: decisions, suppressions, depths, delivery (counts only)",
                "security": _BEARER,
                "responses": {
                    "200": {"description": "the Prometheus text format", "content": {"text/plain": {}}},
                    "401": _ERROR,
                },
            }
        },
        "/openapi.json": {"get": {"summary": "This document", "responses": {"200": {"description": "OpenAPI 3.1"}}}},
    },
}
