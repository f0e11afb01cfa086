"""Caps suggested by the marginal fatigue measure (`gov policy suggest`).

Where the measure's rule confirms a crossover at position ``c`` (the ``c``-th send of a
week, counted from 0, costs more unsubscribes than it earns clicks, confirmed with a
family-wise error of at most 5 % over the whole curve: gov.analytics.crossover), a user
should get at most ``c`` sends a week. The fitted curve's estimate, which may be lower,
is never used: only a confirmed position lowers a cap. Every capped tier's weekly (7-day) window is
lowered to at most ``c`` (added when the tier has none). Because the capped tiers consume
one another's budgets (P2 and P3 spend P1's), this bounds all capped sends together.

* The overall crossover (all users) lowers each tier's own windows: they apply to every
  user whose segment has no windows of its own.
* A segment's crossover lowers that segment's windows (``[tiers.P2.segments.dormant]``),
  starting from the segment's current windows, or the tier's when it has none.
* A verdict of "not reached" or "not enough data" changes nothing for that set of users.
* Exempt tiers (P0) are never capped. Nothing is ever raised: a suggestion only lowers.

The suggestion is a new :class:`~gov.policy.Policy`; nothing is applied.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gov.analytics.marginal import NO_SEGMENT, OVERALL, MarginalReport, SegmentMeasure
from gov.policy import Policy, Tier, Window

WEEK_MS = 7 * 24 * 3600 * 1000


@dataclass(frozen=True)
class Suggestion:
    """The suggested policy and, one line each, what changed and why (or why not)."""

    policy: Policy
    changes: tuple[str, ...]
    unchanged: tuple[str, ...]


def sureness(measure: SegmentMeasure, c: int) -> str:
    """How sure the rule is of the crossover a cap comes from, in one phrase."""
    r = measure.result
    sure = "" if r.sureness is None else f", {r.sureness * 100:.1f} % sure (adjusted p {r.adjusted_p:.2g})"
    span = "" if r.low is None else f"; the crossover itself lies in positions {r.low}–{c}, estimate {r.estimate}"
    return f"crossover confirmed by position {c}{sure}{span}"


def weekly_capped(windows: tuple[Window, ...], cap: int) -> tuple[Window, ...]:
    """``windows`` with the 7-day window lowered to at most ``cap`` (added if missing)."""
    if any(w.window_ms == WEEK_MS for w in windows):
        return tuple(sorted(Window(w.window_ms, min(w.cap, cap)) if w.window_ms == WEEK_MS else w for w in windows))
    return tuple(sorted((*windows, Window(WEEK_MS, cap))))


def _weekly(windows: tuple[Window, ...]) -> int | None:
    return next((w.cap for w in windows if w.window_ms == WEEK_MS), None)


def _capped_tiers(policy: Policy) -> list[Tier]:
    return [t for t in sorted(policy.tiers.values(), key=lambda t: t.name) if not t.exempt and t.windows]


def suggest(policy: Policy, report: MarginalReport) -> Suggestion:
    """The caps ``report`` supports, applied to ``policy`` (see the module's rules)."""
    tiers = dict(policy.tiers)
    changes: list[str] = []
    unchanged: list[str] = []

    def note(name: str, tier: Tier, before: tuple[Window, ...], after: tuple[Window, ...], c: int,
             measure: SegmentMeasure) -> None:
        if after != before:
            old = _weekly(before)
            changes.append(
                f"{tier.name}, {name}: weekly cap {'none' if old is None else old} → {_weekly(after)} "
                f"({sureness(measure, c)})"
            )

    defaults = [m for m in (report.overall, report.segment(NO_SEGMENT)) if m.crossover_position is not None]
    if defaults:
        c = min(m.crossover_position for m in defaults if m.crossover_position is not None)
        for tier in _capped_tiers(policy):
            after = weekly_capped(tier.windows, c)
            note("all users", tier, tier.windows, after, c, next(m for m in defaults if m.crossover_position == c))
            tiers[tier.name] = replace(tier, windows=after)
    else:
        unchanged.append(f"all users: {report.overall.verdict_text()}")

    for measure in report.segments:
        if measure.segment in (OVERALL, NO_SEGMENT):
            continue
        crossover = measure.crossover_position
        if crossover is None:
            unchanged.append(f"segment {measure.segment}: {measure.verdict_text()}")
            continue
        for name in [t.name for t in _capped_tiers(policy)]:
            tier = tiers[name]
            segments = dict(tier.segments)
            before = segments.get(measure.segment, tier.windows)
            after = weekly_capped(before, crossover)
            note(f"segment {measure.segment}", tier, before, after, crossover, measure)
            if after != tier.windows or measure.segment in segments:
                segments[measure.segment] = after
            tiers[name] = replace(tier, segments=tuple(sorted(segments.items())))
    return Suggestion(replace(policy, tiers=tiers), tuple(changes), tuple(unchanged))
