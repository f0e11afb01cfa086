"""Health checks for cron alerting (`gov check`): one SQL function, ``gov.health_v1``.

Each check is a named row (check, ok, detail). Today: ``p0_suppressions`` (any
suppression of an exempt tier, ever: invariant 4 says it cannot happen),
``outbox_stuck`` (rows left in ``sending`` long after their lease ran out: no runner
drains the outbox) and ``push_auth`` (a push service answered 401/403 in the last
hour: the VAPID key or subject is refused), ``deferred_overdue`` (held messages
long past their release time: no releaser runs), ``held_failed`` (the releaser failed
on a held message in the last 24 hours) and ``outbox_failed`` (a delivery ended failed
in the last 24 hours: failure stays with its row, and someone is told). ``conservation_check`` adds the
proof that every message of a period is in exactly one state.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gov.analytics.events import as_source
from gov.queries import q

DEFAULT_STUCK_AFTER = timedelta(minutes=15)  # an expired lease older than this is an alarm


@dataclass(frozen=True)
class Check:
    """One named check's result."""

    name: str
    ok: bool
    detail: str


def run_checks(
    source: Any, *, now: datetime | None = None, stuck_after: timedelta = DEFAULT_STUCK_AFTER
) -> list[Check]:
    """Every check, in a stable order. ``now`` defaults to the database clock."""
    src, owned = as_source(source)
    try:
        # read only, so safe to send again if the connection drops (a restart during cron)
        rows = src.execute(q("health"), {"now": now, "stuck_after": stuck_after})
    finally:
        if owned:
            src.close()
    return [Check(name, bool(ok), detail) for name, ok, detail in rows]


def conservation_check(source: Any, *, since: timedelta, now: datetime | None = None) -> Check:
    """``conservation``: every message decided in the trailing ``since`` is in exactly one state."""
    from datetime import UTC

    from gov.ops.maintenance import conservation

    until = now or datetime.now(UTC)  # a bound of the period only: no window depends on it
    src, owned = as_source(source)
    try:
        report = conservation(src, until - since, until + timedelta(seconds=1))
    finally:
        if owned:
            src.close()
    if report.ok:
        counts = ", ".join(f"{n} {state}" for state, n in sorted(report.states.items())) or "no message"
        return Check("conservation", True, f"every message in exactly one state ({counts})")
    user, message, _tier, state = report.inconsistent[0]
    return Check(
        "conservation", False,
        f"{len(report.inconsistent)} message(s) inconsistent, first {message} of user {user}: {state}",
    )


def summary(checks: list[Check]) -> str | None:
    """One line naming every failed check and why; None when all pass."""
    failed = [c for c in checks if not c.ok]
    if not failed:
        return None
    return "; ".join(f"{c.name}: {c.detail}" for c in failed)
