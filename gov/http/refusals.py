"""How `gov serve` says no: :class:`HTTPError` and the OpenAPI description of each refusal.

Shared by the API (:mod:`gov.http.app`) and the browser half (:mod:`gov.http.browser`),
which each import it, never each other.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from fastapi.responses import JSONResponse, Response

from gov.http.models import Error


class HTTPError(Exception):
    """An answer other than success: a status and a one-line reason, sent as {"error": …}."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


#: Characters of an input a refusal quotes back, at most (then "…").
MAX_ECHO = 64
#: A refusal's whole line, at most, whatever it quotes.
MAX_ERROR_CHARS = 1000
# a quoted value (as repr or an f-string's !r writes it) longer than MAX_ECHO
_CHAR = {q: rf"(?:[^{q}\\]|\\.)" for q in "'\""}  # a character inside that quote, or an escape
_LONG_QUOTE = re.compile("|".join(f"{q}({c}{{{MAX_ECHO}}}){c}+{q}" for q, c in _CHAR.items()), re.S)


def clip(message: str) -> str:
    """``message`` with every quoted value cut to :data:`MAX_ECHO` characters and "…", the whole to
    :data:`MAX_ERROR_CHARS`: a refusal says what was wrong, it does not send a 64 KB input back."""
    def cut(m: re.Match[str]) -> str:
        quote = m.group(0)[0]
        return f"{quote}{m.group(1) if m.group(1) is not None else m.group(2)}…{quote}"

    clipped = _LONG_QUOTE.sub(cut, message)
    return clipped if len(clipped) <= MAX_ERROR_CHARS else clipped[:MAX_ERROR_CHARS] + "…"


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    """``{"error": message}`` with ``status``, its quotes of the input clipped (:func:`clip`)."""
    # a message may quote the input, and a lone surrogate there has no UTF-8: escape it
    safe = clip(message).encode("utf-8", "backslashreplace").decode("utf-8")
    return JSONResponse({"error": safe}, status_code=status, headers=dict(headers or {}))


_REASONS = {
    400: "not JSON, or no body", 401: "missing or wrong bearer token", 403: "the token or proof is refused",
    404: "nothing to act on", 409: "the user has as many live subscriptions as the door allows",
    413: "the body is over the limit", 415: "the body must be application/json",
    429: "too many requests from this address: retry after Retry-After seconds",
    501: "not configured on this server (see the message)",
    422: "well-formed but invalid: nothing was written", 503: "the database is unavailable; retry later",
}


def refusals(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI responses for these refusals: each an :class:`~gov.http.models.Error`."""
    return {status: {"model": Error, "description": _REASONS[status]} for status in statuses}
