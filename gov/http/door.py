"""The fast door: ``POST /internal/send`` answered in plain ASGI, the rest through FastAPI.

It wraps the whole FastAPI application (:func:`gov.http.app.asgi`), in front of its
middleware stack: a send it answers costs none of it.

The seeds' send is the one route under load, and FastAPI's routing, dependency and
response machinery cost more per request than the decision's own Python. This
middleware answers a well-formed, authorised send itself: the bearer token compared in
constant time, the body read within its limit, the same JSON rules and the same
pydantic model (:class:`gov.http.models.Send`), the verdict from the batcher
(:class:`gov.aio.SendBatcher`). Anything else, a refusal of any kind included, is handed
to the FastAPI route with the body it sent replayed, so every refusal is the route's
own, word for word (and tested as such).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from typing import Any

from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from gov.aio import SendBatcher
from gov.errors import DatabaseError, InvalidInput
from gov.governor import SendResult
from gov.http.models import Send as SendBody
from gov.http.refusals import clip

log = logging.getLogger("gov.http.door")

PATH = "/internal/send"


class FastSend:
    """ASGI middleware in front of the FastAPI app; see the module's docstring.

    gov serve's HTTP protocol (:class:`gov.http.wire.GuardedHttpToolsProtocol`) also
    answers through it below ASGI: :meth:`accepts` on the head, :meth:`start` on the
    body, :meth:`verdict` on the outcome; whatever :meth:`start` declines goes to the
    route as here.
    """

    path = PATH.encode()

    def __init__(self, app: Any, *, token: bytes, max_body: int) -> None:
        self.app: ASGIApp = app
        self.state = app.state  # the FastAPI app's: its batcher is made at start-up (lifespan)
        self.token = token
        self.max_body = max_body

    def accepts(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """True when the head is one the door answers: one Authorization header with the
        bearer token, and a Content-Length within the limit (no chunked body)."""
        authorization = length = b""
        authorizations = 0
        for name, value in headers:
            if name == b"authorization":
                authorization = value
                authorizations += 1
            elif name == b"content-length":
                length = value
        scheme, _, given = authorization.partition(b" ")
        # two Authorization headers are refused by the route, whichever of them holds the token
        authorised = (hmac.compare_digest(given.strip(), self.token) and scheme.lower() == b"bearer"
                      and authorizations == 1)
        return authorised and length.isdigit() and int(length) <= self.max_body

    def start(self, body: bytes) -> asyncio.Future[SendResult] | None:
        """The verdict of the send in ``body``, on its way (:meth:`gov.aio.SendBatcher.submit`);
        None for a body the route must refuse itself."""
        try:
            # pydantic's own JSON parser: what it accepts, json.loads and the model accept alike
            # (NaN, lone surrogates, NUL bytes are refused by both; tested), and whatever it
            # refuses goes to the route, which says why in its own words
            message = SendBody.model_validate_json(body).message()
        except (ValueError, ValidationError, InvalidInput):
            return None
        batcher: SendBatcher = self.state.batcher
        return batcher.submit(message)

    @staticmethod
    def verdict(outcome: asyncio.Future[SendResult]) -> tuple[int, bytes]:
        """(status, body) of a finished :meth:`start`; raises what the route would not answer."""
        try:
            result = outcome.result()
        except InvalidInput as exc:  # refused alone (an oversize payload, an unknown tier): the route's 422
            # a message may quote the input, and a lone surrogate there has no UTF-8: escape it
            return 422, _json({"error": clip(str(exc)).encode("utf-8", "backslashreplace").decode("utf-8")})
        except DatabaseError as exc:
            log.error("database error: %s", exc, extra={"action": "serve_database_error"})
            return 503, _json({"error": "the database is unavailable; retry later"})
        decision = result.decision
        if decision.allowed:
            return 200, _SENT
        key = (decision.action, decision.reason)
        payload = _SUPPRESSED.get(key)
        if payload is None:
            verdict = {k: v for k, v in result.as_json().items() if v is not None}
            payload = _json(verdict)
            if len(_SUPPRESSED) < _SUPPRESSED_MAX:
                _SUPPRESSED[key] = payload
        return 200, payload

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != PATH:
            await self.app(scope, receive, send)
            return
        if not self.accepts(scope["headers"]):
            await self.app(scope, receive, send)  # the route refuses it (401, 413, 400…) unread
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left
                return
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            if not message.get("more_body", False) or size > self.max_body:
                break
        body = b"".join(chunks)
        outcome = None
        if size <= self.max_body and not message.get("more_body", False):
            outcome = self.start(body)
        if outcome is None:
            await self.app(scope, _replay(body, message.get("more_body", False), receive), send)
            return
        await asyncio.wait([outcome])
        status, payload = self.verdict(outcome)
        await send({
            "type": "http.response.start", "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
        })
        await send({"type": "http.response.body", "body": payload})


#: A verdict's body depends on its action and reason alone, and a policy has a few dozen
#: reasons: each is written once (json.dumps of a fresh dict was 8 µs of a request's 10 in
#: verdict). Bounded all the same: a reason names a window, and windows are the policy's.
_SENT = b'{"sent":true}'
_SUPPRESSED: dict[tuple[str | None, str | None], bytes] = {}
_SUPPRESSED_MAX = 1024


def _json(doc: dict[str, Any]) -> bytes:
    # as Starlette's JSONResponse writes it
    return json.dumps(doc, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def _replay(body: bytes, more: bool, receive: Receive) -> Receive:
    """A receive that gives back what was read, then whatever the client still sends."""
    sent = False

    async def replay() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return replay
