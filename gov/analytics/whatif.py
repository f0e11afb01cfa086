"""What if a candidate policy had been in force? Replay the window's decisions under it.

In one transaction that is always rolled back: store the candidate policy, then call
``gov.whatif_v1``, which replays every message decided in the window (in decision
order, each at its own ``decided_at``) through ``gov.decide_v1`` under stand-in user
ids seeded with each user's real history from before the window, and undoes its own
writes before it returns. Nothing is changed: not the policy, not a budget, not the
suppression log (only identity sequences move on, as any rolled-back insert makes them).

History before the window: decisions write send rows only for budgets some cap reads,
so the stand-ins are seeded from the send rows *and* from every allowed message in
``gov.messages``, spending the budgets the candidate has it spend: a candidate that caps
a budget the live policy leaves uncapped (global, a topic) counts the sends before the
window as far back as ``gov.messages`` keeps them (``gov prune --keep-history``).

Honest about its limits: the replay sees users' own caps and settings as they are now,
not as they were; a message released from the deferral queue is replayed at its
release time, as ``gov.messages`` records it; sends outside gov's decisions do not exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from psycopg.rows import class_row

from gov import policy as policy_mod
from gov.analytics.events import as_source
from gov.queries import q

DIMENSIONS = ("tier", "topic", "campaign", "reason", "total")


@dataclass(frozen=True)
class WhatIfRow:
    """Recorded against replayed verdicts for one tier, topic, campaign or replayed reason.

    ``extra_suppressed``: allowed as recorded, suppressed under the candidate.
    ``freed``: suppressed as recorded, allowed under the candidate.
    """

    dimension: str
    key: str | None
    messages: int
    allowed: int
    would_allow: int
    extra_suppressed: int
    freed: int


@dataclass(frozen=True)
class WhatIf:
    since: timedelta
    now: datetime | None
    rows: tuple[WhatIfRow, ...]

    def by(self, dimension: str) -> list[WhatIfRow]:
        """The rows of one dimension: tier, topic, campaign, reason or total."""
        if dimension not in DIMENSIONS:
            raise ValueError(f"unknown dimension {dimension!r}: expected one of {', '.join(DIMENSIONS)}")
        return [r for r in self.rows if r.dimension == dimension]

    @property
    def total(self) -> WhatIfRow:
        totals = self.by("total")
        return totals[0] if totals else WhatIfRow("total", None, 0, 0, 0, 0, 0)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "since_s": int(self.since.total_seconds()),
            "now": self.now.isoformat() if self.now else None,
        }
        for dim in DIMENSIONS:
            rows = [
                {
                    "key": r.key,
                    "messages": r.messages,
                    "allowed": r.allowed,
                    "would_allow": r.would_allow,
                    "extra_suppressed": r.extra_suppressed,
                    "freed": r.freed,
                }
                for r in self.by(dim)
            ]
            out[dim] = rows[0] if dim == "total" and rows else rows
        if not self.by("total"):
            out["total"] = {"key": None, "messages": 0, "allowed": 0, "would_allow": 0, "extra_suppressed": 0,
                            "freed": 0}
        return out


def whatif(
    source: Any,
    candidate: policy_mod.Policy,
    candidate_text: str = "",
    *,
    since: timedelta = timedelta(days=7),
    now: datetime | None = None,
) -> WhatIf:
    """Replay the decisions of the window (now - since, now] under ``candidate``; change nothing.

    ``source`` is a Governor, a Source, or anything :class:`gov.db.Source` takes. With
    your own connection the candidate lives in a savepoint that is rolled back, so your
    transaction is left as it was. The replay holds no real user's lock and blocks no
    live decision; a concurrent ``gov policy apply`` waits for it.
    """
    if since <= timedelta(0):
        raise ValueError("since must be a positive duration")
    src, owned = as_source(source)
    try:
        with src.connection() as conn, conn.transaction(force_rollback=True):
            policy_mod.apply(conn, candidate, candidate_text or candidate.to_toml(), drop_held=True, backfill=False)
            with conn.cursor(row_factory=class_row(WhatIfRow)) as cur:
                rows = cur.execute(q("whatif_summary"), {"since": since, "now": now}).fetchall()
    finally:
        if owned:
            src.close()
    return WhatIf(since, now, tuple(rows))
