"""Integrity checks after a run or a fault: conservation (every message in exactly one
state), no user over any cap in any window (a scan of ``gov.sends`` independent of the
decision's own counting), and every allowed message spent exactly once per budget.

The soak run (`gov soak`) and the fault tests use them; an operator can too:

    from gov.ops.integrity import check_integrity
    result = check_integrity(url, since, until)
    assert result.ok, result.problems()
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from gov.db import Source
from gov.ops.maintenance import conservation
from gov.queries import q


@dataclass(frozen=True)
class OverCap:
    """One (user, budget) over a cap: ``used`` sends in some ``window_ms`` window, allowed ``cap``."""

    user_id: str
    budget: str
    window_ms: int
    used: int
    cap: int


def over_cap(conn: psycopg.Connection[Any]) -> list[OverCap]:
    """Every user over any cap in any window, by a scan of ``gov.sends`` (empty when exact)."""
    found: list[OverCap] = []
    for (window_ms,) in conn.execute(q("integrity_cap_windows")).fetchall():
        frame = timedelta(milliseconds=window_ms) - timedelta(microseconds=1)
        rows = conn.execute(q("integrity_over_cap"), {"frame": frame, "window_ms": window_ms}).fetchall()
        found += [OverCap(u, b, int(w), int(n), int(c)) for u, b, w, n, c in rows]
    return found


def spend_mismatches(conn: psycopg.Connection[Any], limit: int = 20) -> list[tuple[Any, ...]]:
    """Messages that spent other than one row per consumed budget: (user, message, tier, expected, spent)."""
    row = conn.execute(q("budget_map")).fetchone()
    assert row is not None
    params = {"limit": limit, "budget_map": Jsonb(row[0])}  # read once: no table lookup per message
    return [tuple(r) for r in conn.execute(q("integrity_spend_mismatches"), params).fetchall()]


@dataclass
class Integrity:
    """The checks after a run or a fault: conservation, budgets, spends."""

    states: dict[str, int]
    inconsistent: list[tuple[Any, ...]]
    over_cap: list[OverCap]
    spend_mismatches: list[tuple[Any, ...]]

    @property
    def ok(self) -> bool:
        return not (self.inconsistent or self.over_cap or self.spend_mismatches)

    def problems(self) -> str:
        """A readable account of what failed (empty when ok)."""
        out = []
        if self.inconsistent:
            out.append(f"conservation: {self.inconsistent[:10]}")
        if self.over_cap:
            out.append(f"over cap: {self.over_cap[:10]}")
        if self.spend_mismatches:
            out.append(f"spend mismatches (user, message, tier, expected, spent): {self.spend_mismatches[:10]}")
        return "; ".join(out)


def check_integrity(source: Source | str, since: datetime, until: datetime) -> Integrity:
    """Conservation over [since, until), the budget scan and the spend check, in one call."""
    src = source if isinstance(source, Source) else Source(source, pool_size=1)
    try:
        result = conservation(src, since, until, limit=50)
        with src.connection() as conn:
            caps = over_cap(conn)
            spends = spend_mismatches(conn)
    finally:
        if src is not source:
            src.close()
    return Integrity(result.states, result.inconsistent, caps, spends)
