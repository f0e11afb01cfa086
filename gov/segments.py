"""User segments from the policy's rules: `gov segments refresh`.

A user is in at most one segment (``gov.users.segment``). The policy's ``[segments]``
table gives the rules (defaults: *engaged* = a click in the last 7 days, *dormant* = no
click in the last 30 days, including a user who never clicked and has been known to gov
that long, else *casual*), and ``[tiers.<tier>.segments.<name>]`` tables give a tier
different windows for a segment's users. :func:`refresh` classifies everyone with a
subscription or a decision in one SQL statement (``gov.refresh_segments_v1``). A user
the app put in a segment of its own name (:func:`gov.users.set_segment`) is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from gov.db import translate_errors
from gov.queries import q


@dataclass(frozen=True)
class Refreshed:
    """One rule-based segment after a refresh: the users now in it, and how many moved in."""

    segment: str
    users: int
    changed: int


def refresh(conn: psycopg.Connection[Any], at: datetime | None = None) -> list[Refreshed]:
    """Classify every user from the stored policy's rules, as of ``at`` (default: the database clock).

    One statement, in ``conn``'s transaction. Returns one row per rule-based segment
    that holds anyone, in name order.
    """
    with translate_errors():
        rows = conn.execute(q("refresh_segments"), {"now": at}).fetchall()
    return [Refreshed(segment, int(users), int(changed)) for segment, users, changed in rows]
