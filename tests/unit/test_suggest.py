"""`gov policy suggest`'s rule: weekly caps at each confirmed crossover, only ever lower."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from gov.analytics.crossover import CrossoverEstimate
from gov.analytics.marginal import CROSSOVER, NOT_ENOUGH_DATA, NOT_REACHED, OVERALL, MarginalReport, MarginalRow
from gov.analytics.marginal import SegmentMeasure as Measure
from gov.analytics.suggest import WEEK_MS, suggest, weekly_capped
from gov.policy import Window, default_policy, parse_policy

DAY_MS = 24 * 3600 * 1000


def measure(segment: str, crossover_at: int | None, verdict: str | None = None) -> Measure:
    """Groups of positions 0–4, 5–9, 10–19; the crossover (if any) on the group starting at ``crossover_at``."""
    d = Decimal("0.01")
    rows = []
    for no, (lo, hi) in enumerate(((0, 4), (5, 9), (10, 19)), start=1):
        rows.append(MarginalRow(
            segment, no, lo, hi, 1000, 10, 5, d, d, d, d, d, d, d, lo == crossover_at,
            verdict or (CROSSOVER if crossover_at is not None else NOT_REACHED),
            500 if verdict == NOT_ENOUGH_DATA else None,
        ))
    kind = verdict or (CROSSOVER if crossover_at is not None else NOT_REACHED)
    if kind == CROSSOVER:
        result = CrossoverEstimate(CROSSOVER, crossover_at, max(0, (crossover_at or 0) - 2), crossover_at,
                                   crossover_at, 0.004)
    else:
        result = CrossoverEstimate(kind, low=3, estimate=12 if kind == NOT_ENOUGH_DATA else None,
                                   more_sends=500 if kind == NOT_ENOUGH_DATA else None)
    return Measure(segment, tuple(rows), result)


def report(*measures: Measure) -> MarginalReport:
    return MarginalReport(timedelta(days=28), None, 800, measures)


def test_weekly_cap_is_lowered_or_added_never_raised() -> None:
    assert weekly_capped((Window(DAY_MS, 2), Window(WEEK_MS, 5)), 3) == (Window(DAY_MS, 2), Window(WEEK_MS, 3))
    assert weekly_capped((Window(DAY_MS, 2), Window(WEEK_MS, 5)), 9) == (Window(DAY_MS, 2), Window(WEEK_MS, 5))
    assert weekly_capped((Window(DAY_MS, 6),), 10) == (Window(DAY_MS, 6), Window(WEEK_MS, 10))


def test_a_segment_crossover_caps_that_segment_only() -> None:
    stored = default_policy()
    result = suggest(stored, report(measure(OVERALL, None), measure("dormant", 5), measure("engaged", None)))
    tiers = result.policy.tiers
    # every capped tier's budget is bounded for dormant users at the crossover position
    assert tiers["P1"].windows_for("dormant") == (Window(DAY_MS, 6), Window(WEEK_MS, 5))
    assert tiers["P2"].windows_for("dormant") == stored.tiers["P2"].windows  # 7d cap 5 already
    assert tiers["P3"].windows_for("dormant") == stored.tiers["P3"].windows  # 7d cap 1 already
    assert dict(tiers["P2"].segments) == {}  # nothing to say where nothing changes
    # everyone else, and P0, keep what they had
    for name in ("P0", "P1", "P2", "P3"):
        assert tiers[name].windows == stored.tiers[name].windows
        assert tiers[name].windows_for("engaged") == stored.tiers[name].windows
    assert any("P1, segment dormant: weekly cap none → 5" in line for line in result.changes), result.changes
    assert any(line.startswith("all users: not reached") for line in result.unchanged)
    # it is a policy gov accepts, as text too
    assert parse_policy(result.policy.to_toml()).tiers["P1"].windows_for("dormant") == tiers["P1"].windows_for(
        "dormant")


def test_the_overall_crossover_caps_the_tiers_own_windows() -> None:
    stored = default_policy()
    result = suggest(stored, report(measure(OVERALL, 5)))
    assert result.policy.tiers["P1"].windows == (Window(DAY_MS, 6), Window(WEEK_MS, 5))
    assert result.policy.tiers["P0"] == stored.tiers["P0"]


def test_no_confirmed_crossover_changes_nothing() -> None:
    stored = default_policy()
    result = suggest(stored, report(measure(OVERALL, None), measure("dormant", None, NOT_ENOUGH_DATA)))
    assert result.policy == stored and result.changes == ()
    assert any("dormant: not enough data" in line for line in result.unchanged), result.unchanged


def test_an_existing_segment_cap_is_the_start_and_is_only_lowered() -> None:
    text = default_policy().to_toml() + '\n[tiers.P1.segments.dormant]\nwindows = [{ window = "7d", cap = 3 }]\n'
    stored = parse_policy(text)
    lower = suggest(stored, report(measure("dormant", 5)))
    assert lower.policy.tiers["P1"].windows_for("dormant") == (Window(WEEK_MS, 3),)
    assert suggest(stored, report(measure("dormant", 0))).policy.tiers["P1"].windows_for("dormant") == (
        Window(WEEK_MS, 0),)
