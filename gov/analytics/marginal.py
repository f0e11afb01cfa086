"""The marginal fatigue measure: what the n-th send of a week costs and earns, per send.

For every accepted send, its *position* is the number of sends the user had accepted in
the 7 days before it (0: the first of the week). Per position, merged upward into groups
of at least ``min_sends`` sends: the click rate and the unsubscribe rate per send, each
with a 95 % Wilson interval, overall and per segment (``gov.users.segment``). The
crossover is where the unsubscribe rate overtakes the click rate for good, declared only
when the intervals say so. The numbers come from one SQL function,
``gov.fatigue_marginal_v1`` (its definitions are in ``docs/analysts.md``); this module
fetches them (:func:`marginal_report`), renders them (:func:`marginal_table`,
:func:`marginal_html`), and holds the same rule in Python (:func:`wilson`,
:func:`merge_positions`, :func:`decide`) for the simulator's ground truth and the tests.
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

from gov.analytics.events import as_source
from gov.analytics.html import render
from gov.analytics.report import nice_top
from gov.queries import q

Z95 = 1.959963984540054  # the two-sided 95 % normal quantile: the Wilson intervals shown
#: The bound of (unsubscribe rate - click rate) that confirms a crossover: one-sided 95 %
#: ("unsubscribes exceed clicks" is a one-sided claim), from the 90 % Wilson bounds
CONFIRM_Z = 1.6448536269514722
DEFAULT_SINCE = timedelta(days=28)
DEFAULT_MIN_SENDS = 800  # sends a group of positions must hold before it stands on its own
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


def expected_crossover(curve: Iterable[tuple[int, float, float, float]], min_sends: int) -> tuple[int, int] | None:
    """The noiseless crossover by the same definition: ``curve`` is (position, sends,
    expected clicks, expected unsubscribes) per position; positions are grouped as the
    measure groups them, and the crossover is the first group whose expected
    unsubscribes exceed its expected clicks, as (first position, last position)."""
    rows = sorted(curve)
    for first, last in merge_positions([(p, n) for p, n, _, _ in rows], min_sends):
        inside = [r for r in rows if first <= r[0] <= last]
        if sum(r[3] for r in inside) > sum(r[2] for r in inside):
            return first, last
    return None


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
    """One segment's groups and its verdict."""

    segment: str
    rows: tuple[MarginalRow, ...]

    @property
    def verdict(self) -> str:
        return self.rows[0].verdict if self.rows else NOT_REACHED

    @property
    def more_sends(self) -> int | None:
        return self.rows[0].more_sends if self.rows else None

    @property
    def crossover(self) -> MarginalRow | None:
        return next((r for r in self.rows if r.crossover), None)

    @property
    def crossover_position(self) -> int | None:
        """The first position of the crossover group, if there is one."""
        row = self.crossover
        return None if row is None else row.position_from

    @property
    def sends(self) -> int:
        return sum(r.sends for r in self.rows)

    def verdict_text(self) -> str:
        row = self.crossover
        if row is not None:
            where = f"position {row.position_from}" if row.position_from == row.position_to else (
                f"positions {row.label} (from position {row.position_from})")
            return f"crossover at {where}"
        if self.verdict == NOT_ENOUGH_DATA:
            return f"not enough data (about {self.more_sends:,} more sends would decide it)"
        return "not reached"


@dataclass(frozen=True)
class MarginalReport:
    """The measure over the sends accepted in (now - since, now]; ``now`` None: the database clock."""

    since: timedelta
    now: datetime | None
    min_sends: int
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
            "min_sends": self.min_sends,
            "segments": [
                {
                    "segment": s.segment,
                    "verdict": s.verdict,
                    "crossover_position": s.crossover_position,
                    "more_sends": s.more_sends,
                    "groups": [
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
                            "difference_low": float(r.difference_low),
                            "crossover": r.crossover,
                        }
                        for r in s.rows
                    ],
                }
                for s in self.segments
            ],
        }


def marginal_report(
    source: Any,
    *,
    since: timedelta = DEFAULT_SINCE,
    now: datetime | None = None,
    min_sends: int = DEFAULT_MIN_SENDS,
) -> MarginalReport:
    """Fetch the measure for the sends accepted in (now - since, now].

    ``source`` is a Governor, a Source, or anything :class:`gov.db.Source` takes.
    """
    if since <= timedelta(0):
        raise ValueError("since must be a positive duration")
    if min_sends < 1:
        raise ValueError("min_sends must be at least 1")
    src, owned = as_source(source)
    try:
        named = src.execute(
            q("fatigue_marginal"),
            {"since": since, "now": now, "min_sends": min_sends},
            row_factory=class_row(MarginalRow),
        )
    finally:
        if owned:
            src.close()
    order: list[str] = []
    for r in named:
        if r.segment not in order:
            order.append(r.segment)
    segments = tuple(SegmentMeasure(name, tuple(r for r in named if r.segment == name)) for name in order)
    return MarginalReport(since, now, min_sends, segments)


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
    return f"sends accepted in the {span} ending {end}; groups of at least {report.min_sends:,} sends"


def marginal_table(measure: SegmentMeasure, title: str | None = None) -> Table:
    """One segment's groups as a rich table."""
    table = Table(title=title or f"Marginal fatigue, {segment_title(measure.segment)}: {measure.verdict_text()}",
                  title_justify="left")
    for name in ("position", "sends", "clicks", "unsubs", "click rate", "95% interval", "unsub rate",
                 "95% interval"):
        table.add_column(name, justify="right")
    table.add_column("crossover")
    for r in measure.rows:
        table.add_row(
            r.label, f"{r.sends:,}", f"{r.clicks:,}", f"{r.unsubscribes:,}", _pct(r.click_rate),
            _interval(r.click_low, r.click_high), _pct(r.unsubscribe_rate),
            _interval(r.unsubscribe_low, r.unsubscribe_high), "◀ crossover" if r.crossover else "",
        )
    return table


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

    crossing = next((i for i, r in enumerate(rows) if r.crossover), None)
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
