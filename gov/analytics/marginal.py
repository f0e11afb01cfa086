"""The marginal fatigue measure: what the n-th send of a week costs and earns, per send.

For every accepted send, its *position* is the number of sends the user had accepted in
the 7 days before it (0: the first of the week). Per position, overall and per segment
(``gov.users.segment``): the sends, clicks and unsubscribes, read from one SQL function,
``gov.fatigue_marginal_v1`` with groups of one send (its definitions are in
``docs/analysts.md``). The crossover, its interval and the monotone curves are computed
from those counts by :mod:`gov.analytics.crossover` (monotone fit, shrinkage toward the
overall curve, a fixed-sequence rule that keeps a crossover declared before the true one
at 5 % over the whole curve). This module fetches (:func:`marginal_report`) and renders
(:func:`marginal_table`, :func:`marginal_html`).

The SQL function's own ``crossover``/``verdict``/``more_sends`` columns are its released
per-group rule (one test per group at 95 %, which a noisy group can fool); they stay as
they were (a released ``_v1`` is a promise) and :func:`decide` holds that rule in Python
for its parity test. Nothing in gov decides from them any more.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from psycopg.rows import class_row
from rich.table import Table

from gov.analytics.crossover import (
    DEFAULT_MIN_EVENTS,
    Counts,
    CrossoverEstimate,
    estimate,
    estimate_report,
)
from gov.analytics.events import as_source
from gov.analytics.html import render
from gov.analytics.report import nice_top
from gov.queries import q

Z95 = 1.959963984540054  # the two-sided 95 % normal quantile: the Wilson intervals shown
#: The bound of (unsubscribe rate - click rate) that confirms a crossover: one-sided 95 %
#: ("unsubscribes exceed clicks" is a one-sided claim), from the 90 % Wilson bounds
CONFIRM_Z = 1.6448536269514722
DEFAULT_SINCE = timedelta(days=28)
DEFAULT_MIN_SENDS = 800  # the SQL function's own default group size (its released per-group rule)
OVERALL = "*"  # the segment name of the row set over every user
NO_SEGMENT = "(none)"  # users without a gov.users.segment
CROSSOVER = "crossover"
NOT_REACHED = "not reached"
NOT_ENOUGH_DATA = "not enough data"

CLICK_COLOR = "#1f77b4"
UNSUBSCRIBE_COLOR = "#d62728"
CROSSOVER_COLOR = "#ff7f0e"


# ---------------------------------------------------------------- the rule, in Python


def wilson(successes: float, trials: float, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``successes`` out of ``trials`` (as gov.wilson_interval_v1)."""
    if trials <= 0:
        raise ValueError("a Wilson interval needs at least one trial")
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be within 0..{trials}, got {successes}")
    p, z2 = successes / trials, z * z
    centre = p + z2 / (2 * trials)
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials))
    return (centre - half) / (1 + z2 / trials), (centre + half) / (1 + z2 / trials)


def difference_low(unsubscribes: float, clicks: float, sends: float, z: float = Z95) -> float:
    """The lower 95 % bound of (unsubscribe rate - click rate) over the same sends:
    Newcombe's hybrid score interval, built from the two Wilson intervals."""
    pu, pc = unsubscribes / sends, clicks / sends
    u_low, _ = wilson(unsubscribes, sends, z)
    _, c_high = wilson(clicks, sends, z)
    return (pu - pc) - math.sqrt((pu - u_low) ** 2 + (c_high - pc) ** 2)


def sends_to_decide(unsubscribes: int, clicks: int, sends: int, z: float = CONFIRM_Z) -> int:
    """How many more sends, at these rates, before :func:`difference_low` clears zero: the
    smallest m for which the counts scaled to ``sends + m`` confirm it (0: confirmed
    already), as gov.sends_to_decide_v1. Only for unsubscribes > clicks."""
    if sends <= 0 or unsubscribes <= clicks:
        raise ValueError("no amount of data confirms a crossover the rates do not show")
    if difference_low(unsubscribes, clicks, sends, z) > 0:
        return 0
    pu, pc = unsubscribes / sends, clicks / sends

    def enough(more: int) -> bool:
        n = sends + more
        return difference_low(pu * n, pc * n, n, z) > 0

    low, high = 0, 1
    while not enough(high):
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


def merge_positions(sends: Iterable[tuple[int, float]], min_sends: int) -> list[tuple[int, int]]:
    """Group positions: ``sends`` is (position, sends) ascending; positions are merged upward
    until a group holds ``min_sends``; a last group short of it joins the one before.
    Returns the groups as (first position, last position)."""
    groups: list[list[Any]] = []  # [first, last, sends]
    for position, n in sends:
        if groups and groups[-1][2] < min_sends:
            groups[-1][1] = position
            groups[-1][2] += n
        else:
            groups.append([position, position, n])
    if len(groups) > 1 and groups[-1][2] < min_sends:
        last = groups.pop()
        groups[-1][1], groups[-1][2] = last[1], groups[-1][2] + last[2]
    return [(g[0], g[1]) for g in groups]


@dataclass(frozen=True)
class Verdict:
    """Where the crossover is, per the rule of ``gov.fatigue_marginal_v1``."""

    verdict: str  # CROSSOVER, NOT_REACHED or NOT_ENOUGH_DATA
    group: int | None = None  # index into the groups given to decide()
    more_sends: int | None = None  # with NOT_ENOUGH_DATA


def decide(groups: Sequence[tuple[int, int, int]], z: float = CONFIRM_Z) -> Verdict:
    """The crossover rule over groups of (sends, clicks, unsubscribes), positions ascending.

    A group *confirms* a crossover when the one-sided 95 % lower bound of its unsubscribe
    rate minus its click rate (:func:`difference_low` at ``CONFIRM_Z``) is above zero. The
    crossover is then the first group of the unbroken run of groups with more
    unsubscribes than clicks that ends at the first confirming group. Without a
    confirming group: NOT_ENOUGH_DATA when some group has more unsubscribes than clicks
    (``more_sends``: the fewest extra sends, at its rates, that would confirm one of
    them), else NOT_REACHED.
    """
    above = [u > c for _, c, u in groups]
    sure = next((i for i, (n, c, u) in enumerate(groups) if n > 0 and difference_low(u, c, n, z) > 0), None)
    if sure is not None:
        start = sure
        while start > 0 and above[start - 1]:
            start -= 1
        return Verdict(CROSSOVER, start)
    if any(above):
        return Verdict(NOT_ENOUGH_DATA, more_sends=min(
            sends_to_decide(u, c, n, z) for (n, c, u), a in zip(groups, above, strict=True) if a
        ))
    return Verdict(NOT_REACHED)


# ---------------------------------------------------------------- the report from SQL


@dataclass(frozen=True)
class MarginalRow:
    """One group of positions of one segment (see ``gov.fatigue_marginal_v1``)."""

    segment: str
    group_no: int
    position_from: int
    position_to: int
    sends: int
    clicks: int
    unsubscribes: int
    click_rate: Decimal
    click_low: Decimal
    click_high: Decimal
    unsubscribe_rate: Decimal
    unsubscribe_low: Decimal
    unsubscribe_high: Decimal
    difference_low: Decimal
    crossover: bool
    verdict: str
    more_sends: int | None

    @property
    def label(self) -> str:
        if self.position_from == self.position_to:
            return str(self.position_from)
        return f"{self.position_from}–{self.position_to}"


@dataclass(frozen=True)
class SegmentMeasure:
    """One segment's positions (one row each) and the crossover estimated from them."""

    segment: str
    rows: tuple[MarginalRow, ...]
    estimate: CrossoverEstimate | None = None  # None: estimated from ``rows`` alone (no shrinkage)

    @property
    def result(self) -> CrossoverEstimate:
        if self.estimate is not None:
            return self.estimate
        return estimate([Counts(r.position_from, r.sends, r.clicks, r.unsubscribes) for r in self.rows])

    @property
    def verdict(self) -> str:
        return self.result.verdict

    @property
    def more_sends(self) -> int | None:
        return self.result.more_sends

    @property
    def crossover_position(self) -> int | None:
        """The declared crossover: the lowest position the rule confirms costs more than it earns."""
        r = self.result
        return r.position if r.verdict == CROSSOVER else None

    @property
    def crossover(self) -> MarginalRow | None:
        position = self.crossover_position
        return next((r for r in self.rows if r.position_from <= (position or -1) <= r.position_to), None)

    @property
    def sends(self) -> int:
        return sum(r.sends for r in self.rows)

    def verdict_text(self) -> str:
        return self.result.text()


@dataclass(frozen=True)
class MarginalReport:
    """The measure over the sends accepted in (now - since, now]; ``now`` None: the database clock."""

    since: timedelta
    now: datetime | None
    min_events: int
    segments: tuple[SegmentMeasure, ...]  # the overall set (OVERALL) first, then by name

    @property
    def overall(self) -> SegmentMeasure:
        return next((s for s in self.segments if s.segment == OVERALL), SegmentMeasure(OVERALL, ()))

    def segment(self, name: str) -> SegmentMeasure:
        return next((s for s in self.segments if s.segment == name), SegmentMeasure(name, ()))

    def as_json(self) -> dict[str, Any]:
        """Plain JSON types (rates as floats), for ``--json`` and other tools."""
        return {
            "since_s": int(self.since.total_seconds()),
            "now": self.now.isoformat() if self.now else None,
            "min_events": self.min_events,
            "segments": [
                {
                    "segment": s.segment,
                    "verdict": s.verdict,
                    "crossover_position": s.crossover_position,
                    "interval": [s.result.low, s.result.high],
                    "estimate": s.result.estimate,
                    "adjusted_p": s.result.adjusted_p,
                    "more_sends": s.more_sends,
                    "fit": [
                        {"position": p, "click_rate": c, "unsubscribe_rate": u}
                        for p, c, u in zip(s.result.fit.positions, s.result.fit.click_rate,
                                           s.result.fit.unsubscribe_rate, strict=True)
                    ],
                    "positions": [
                        {
                            "group": r.group_no,
                            "position_from": r.position_from,
                            "position_to": r.position_to,
                            "sends": r.sends,
                            "clicks": r.clicks,
                            "unsubscribes": r.unsubscribes,
                            "click_rate": float(r.click_rate),
                            "click_interval": [float(r.click_low), float(r.click_high)],
                            "unsubscribe_rate": float(r.unsubscribe_rate),
                            "unsubscribe_interval": [float(r.unsubscribe_low), float(r.unsubscribe_high)],
                        }
                        for r in s.rows
                    ],
                }
                for s in self.segments
            ],
        }


def fatigue_groups(source: Any, *, since: timedelta = DEFAULT_SINCE, now: datetime | None = None,
                   min_sends: int = DEFAULT_MIN_SENDS) -> list[MarginalRow]:
    """The SQL function's rows as they come, grouped by ``min_sends`` (its own verdict columns included)."""
    if since <= timedelta(0):
        raise ValueError("since must be a positive duration")
    if min_sends < 1:
        raise ValueError("min_sends must be at least 1")
    src, owned = as_source(source)
    try:
        return list(src.execute(
            q("fatigue_marginal"),
            {"since": since, "now": now, "min_sends": min_sends},
            row_factory=class_row(MarginalRow),
        ))
    finally:
        if owned:
            src.close()


def marginal_counts(source: Any, *, since: timedelta = DEFAULT_SINCE,
                    now: datetime | None = None) -> dict[str, list[Counts]]:
    """Sends, clicks and unsubscribes per position, per segment (OVERALL first)."""
    out: dict[str, list[Counts]] = {}
    for r in fatigue_groups(source, since=since, now=now, min_sends=1):
        out.setdefault(r.segment, []).append(Counts(r.position_from, r.sends, r.clicks, r.unsubscribes))
    return out


def marginal_report(
    source: Any,
    *,
    since: timedelta = DEFAULT_SINCE,
    now: datetime | None = None,
    min_events: int = DEFAULT_MIN_EVENTS,
) -> MarginalReport:
    """The measure for the sends accepted in (now - since, now]: one row per position and
    segment, and each segment's crossover (:func:`gov.analytics.crossover.estimate_report`).

    ``source`` is a Governor, a Source, or anything :class:`gov.db.Source` takes.
    """
    if min_events < 1:
        raise ValueError("min_events must be at least 1")
    named = fatigue_groups(source, since=since, now=now, min_sends=1)
    order: list[str] = []
    for r in named:
        if r.segment not in order:
            order.append(r.segment)
    counts = {name: [Counts(r.position_from, r.sends, r.clicks, r.unsubscribes) for r in named if r.segment == name]
              for name in order}
    estimates = estimate_report(counts, min_events=min_events)
    segments = tuple(SegmentMeasure(name, tuple(r for r in named if r.segment == name), estimates[name])
                     for name in order)
    return MarginalReport(since, now, min_events, segments)


# ---------------------------------------------------------------- rendering


def _pct(value: Decimal | float, digits: int = 2) -> str:
    return f"{float(value) * 100:.{digits}f}%"


def _interval(low: Decimal, high: Decimal) -> str:
    return f"{float(low) * 100:.2f}–{float(high) * 100:.2f}%"


def segment_title(name: str) -> str:
    return "all users" if name == OVERALL else f"segment {name}"


def window_text(report: MarginalReport) -> str:
    end = report.now.isoformat(timespec="seconds") if report.now else "now"
    days = report.since.total_seconds() / 86400
    span = f"{days:g} days" if days >= 1 else f"{report.since.total_seconds() / 3600:g} hours"
    return (f"sends accepted in the {span} ending {end}; monotone fit; tested groups of at least "
            f"{report.min_events:,} clicks and unsubscribes")


def marginal_table(measure: SegmentMeasure, title: str | None = None) -> Table:
    """One segment's positions as a rich table: raw rates with their 95 % Wilson intervals,
    the monotone (shrunk) fit, and the declared crossover, its interval and estimate marked."""
    table = Table(title=title or f"Marginal fatigue, {segment_title(measure.segment)}: {measure.verdict_text()}",
                  title_justify="left")
    for name in ("position", "sends", "clicks", "unsubs", "click rate", "95% interval", "fitted",
                 "unsub rate", "95% interval", "fitted"):
        table.add_column(name, justify="right")
    table.add_column("crossover")
    result = measure.result
    fitted = result.fit.as_map()
    for r in measure.rows:
        fc, fu = fitted.get(r.position_from, (float("nan"), float("nan")))
        table.add_row(
            r.label, f"{r.sends:,}", f"{r.clicks:,}", f"{r.unsubscribes:,}", _pct(r.click_rate),
            _interval(r.click_low, r.click_high), _pct(fc), _pct(r.unsubscribe_rate),
            _interval(r.unsubscribe_low, r.unsubscribe_high), _pct(fu), _mark(result, r.position_from),
        )
    return table


def _mark(result: CrossoverEstimate, position: int) -> str:
    marks = []
    if result.verdict == CROSSOVER and position == result.position:
        marks.append("◀ crossover (confirmed)")
    elif position == result.estimate:
        marks.append("estimate")
    if result.low is not None and position == result.low and result.verdict == CROSSOVER:
        marks.append("interval from")
    return ", ".join(marks)


def _chart(measure: SegmentMeasure) -> dict[str, Any]:
    """Coordinates of one segment's SVG chart: both curves, their bands, the crossover."""
    width, height, left, right, top, bottom = 620, 320, 64, 20, 36, 52
    plot_w, plot_h = width - left - right, height - top - bottom
    rows = measure.rows
    y_max = max([float(r.click_high) for r in rows] + [float(r.unsubscribe_high) for r in rows] + [0.001])
    y_top = nice_top(y_max)
    n = len(rows)

    def x(i: int) -> float:
        return left + (i + 0.5) * plot_w / max(n, 1)

    def y(value: float) -> float:
        return top + plot_h - min(value, y_top) / y_top * plot_h

    def series(rate: str, low: str, high: str) -> dict[str, Any]:
        points = [(x(i), y(float(getattr(r, rate)))) for i, r in enumerate(rows)]
        upper = [(x(i), y(float(getattr(r, high)))) for i, r in enumerate(rows)]
        lower = [(x(i), y(float(getattr(r, low)))) for i, r in enumerate(rows)]
        return {
            "line": " ".join(f"{a:.1f},{b:.1f}" for a, b in points),
            "band": " ".join(f"{a:.1f},{b:.1f}" for a, b in [*upper, *reversed(lower)]),
            "points": [
                {"x": f"{a:.1f}", "y": f"{b:.1f}", "label": r.label, "value": float(getattr(r, rate))}
                for (a, b), r in zip(points, rows, strict=True)
            ],
        }

    declared = measure.crossover_position
    crossing = next((i for i, r in enumerate(rows) if r.position_from == declared), None)
    return {
        "width": width, "height": height, "left": left, "right": width - right, "top": top,
        "bottom": top + plot_h, "mid": left + plot_w / 2,
        "grid": [{"y": f"{y(y_top * i / 4):.1f}", "label": f"{y_top * i / 4 * 100:.3g}%"} for i in range(5)],
        "ticks": [{"x": f"{x(i):.1f}", "label": r.label} for i, r in enumerate(rows)],
        "click": series("click_rate", "click_low", "click_high"),
        "unsubscribe": series("unsubscribe_rate", "unsubscribe_low", "unsubscribe_high"),
        "crossover": None if crossing is None else {
            "x": f"{x(crossing):.1f}", "position": rows[crossing].position_from, "label": rows[crossing].label},
    }


def marginal_html(report: MarginalReport) -> str:
    """The measure as one self-contained page (Jinja2, autoescaped): per segment, the click
    and unsubscribe rate by position with their 95 % bands, the crossover marked, and the table."""
    return render(
        "fatigue_marginal.html.j2",
        window=window_text(report),
        segments=[
            {"measure": s, "title": segment_title(s.segment), "verdict": s.verdict_text(),
             "chart": _chart(s) if s.rows else None}
            for s in report.segments
        ],
        pct=_pct,
        interval=_interval,
        colors={"click": CLICK_COLOR, "unsubscribe": UNSUBSCRIBE_COLOR, "crossover": CROSSOVER_COLOR},
        generated=datetime.now(UTC).isoformat(timespec="seconds"),  # a label only
    )
