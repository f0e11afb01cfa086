"""How `gov serve` says no: :class:`HTTPError` and the OpenAPI description of each refusal.

Shared by the API (:mod:`gov.http.app`) and the browser half (:mod:`gov.http.browser`),
which each import it, never each other.
"""

from __future__ import annotations

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


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    """``{"error": message}`` with ``status``."""
    # a message may quote the input, and a lone surrogate there has no UTF-8: escape it
    safe = message.encode("utf-8", "backslashreplace").decode("utf-8")
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
