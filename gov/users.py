"""A user's own settings: caps that only lower the defaults (invariant 6)."""

from __future__ import annotations

from typing import Any

import psycopg

from gov.db import translate_errors
from gov.errors import PolicyError
from gov.message import MAX_ID_LENGTH
from gov.queries import q


def _check_user(user_id: str) -> None:
    if not isinstance(user_id, str) or not user_id.strip() or len(user_id) > MAX_ID_LENGTH or "\x00" in user_id:
        raise PolicyError(f"invalid user id {user_id!r}")


def set_user_cap(conn: psycopg.Connection[Any], user_id: str, scope: str, window_ms: int, cap: int) -> None:
    """Give ``user_id`` their own ``cap`` over ``window_ms`` for ``scope`` (a tier, 'topic' or 'global').

    The cap must not exceed the default for that window; a higher one raises
    PolicyError and nothing is written. Runs in ``conn``'s transaction.
    """
    _check_user(user_id)
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
        raise PolicyError(f"cap must be a whole number ≥ 0, got {cap!r}")
    with translate_errors(), conn.transaction():
        conn.execute(q("ensure_user"), {"user_id": user_id})
        conn.execute(q("set_user_cap"), {"user_id": user_id, "scope": scope, "window_ms": window_ms, "cap": cap})


def clear_user_cap(conn: psycopg.Connection[Any], user_id: str, scope: str, window_ms: int) -> None:
    """Return ``user_id`` to the default cap for (scope, window)."""
    with translate_errors():
        conn.execute(q("clear_user_cap"), {"user_id": user_id, "scope": scope, "window_ms": window_ms})
