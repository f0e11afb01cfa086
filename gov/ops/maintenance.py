"""Housekeeping: pruning what no window can see, and the conservation check."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gov.db import Source
from gov.queries import q

DEFAULT_MARGIN = timedelta(hours=1)  # kept past the longest window, for clock slop and inspection
DEFAULT_KEEP_HISTORY = timedelta(days=180)  # suppressions and attempts kept for analysts
DEFAULT_BATCH = 5000  # rows per delete: each call is a short transaction


@dataclass
class PruneResult:
    sends: int = 0
    history: int = 0


def prune(
    source: Source,
    *,
    margin: timedelta = DEFAULT_MARGIN,
    keep_history: timedelta = DEFAULT_KEEP_HISTORY,
    batch: int = DEFAULT_BATCH,
    now: datetime | None = None,
) -> PruneResult:
    """Delete send rows older than the longest window + ``margin`` and history older than
    ``keep_history``, ``batch`` rows per transaction, without blocking decisions."""
    result = PruneResult()
    for query, params, attr in (
        ("prune_sends", {"margin": margin}, "sends"),
        ("prune_history", {"keep": keep_history}, "history"),
    ):
        while True:
            with source.connection() as conn:
                row = conn.execute(q(query), {"batch": batch, "now": now, **params}).fetchone()
            deleted = int(row[0]) if row else 0
            setattr(result, attr, getattr(result, attr) + deleted)
            if deleted < batch:
                break
    return result


@dataclass
class Conservation:
    """Messages by state over a period, and any that are in no state or two."""

    states: dict[str, int] = field(default_factory=dict)
    inconsistent: list[tuple[str, str, str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.inconsistent


def conservation(source: Source, since: datetime, until: datetime, *, limit: int = 20) -> Conservation:
    """Check that every message decided in [since, until) ends in exactly one state."""
    with source.connection() as conn:
        states = {state: int(n) for state, n in conn.execute(q("message_states"), {"since": since, "until": until})}
        bad = conn.execute(q("inconsistent_messages"), {"since": since, "until": until, "limit": limit}).fetchall()
    return Conservation(
        {k: v for k, v in states.items() if not k.startswith("INCONSISTENT")},
        [tuple(r) for r in bad],  # type: ignore[misc]
    )


