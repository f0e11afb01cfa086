"""The fatigue report: the four signals by trailing-window send volume.

The numbers come from one SQL function, ``gov.fatigue_report_v1`` (its definitions are
in ``docs/analysts.md``); this module fetches them and renders them as a terminal table
(:func:`fatigue_table`) or a self-contained HTML page with inline SVG charts
(:func:`fatigue_html`): no script, no stylesheet, no font or image from anywhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from psycopg.rows import class_row
from rich.table import Table

from gov.analytics.events import as_source
from gov.analytics.html import render
from gov.policy import format_duration
from gov.queries import q

TOP_BUCKET = 8  # the seed's least(sends, 8): the last bucket holds 8 sends and more
DEFAULT_SINCE = timedelta(days=7)
DEFAULT_MIN_ACCEPTED = 3  # accepted sends without a display before a user is a revocation suspect

CTR_COLOR = "#1f77b4"
UNSUBSCRIBE_COLOR = "#d62728"
CROSSOVER_COLOR = "#ff7f0e"


@dataclass(frozen=True)
class BucketRow:
    """One send-volume bucket of the report (see ``gov.fatigue_report_v1``)."""

    bucket: int
    subscribers: int
    accepted: int
    displays: int
    clicks: int
    closes: int
    unsubscribes: int
    ctr: Decimal | None
    unsubscribe_rate: Decimal | None
    display_rate: Decimal | None
    close_to_click: Decimal | None
    crossover: bool

    @property
    def label(self) -> str:
        return f"{self.bucket}+" if self.bucket >= TOP_BUCKET else str(self.bucket)


@dataclass(frozen=True)
class FatigueReport:
    """The report over the window (now - since, now]; ``now`` None means the database clock."""

    since: timedelta
    now: datetime | None
    segment: str | None
    rows: tuple[BucketRow, ...]

    @property
    def crossover_bucket(self) -> int | None:
        """The first bucket where marginal unsubscribes exceed marginal clicks, if any."""
        return next((r.bucket for r in self.rows if r.crossover), None)

    def as_json(self) -> dict[str, Any]:
        """Plain JSON types (rates as floats), for ``--json`` and other tools."""

        def num(value: Decimal | None) -> float | None:
            return None if value is None else float(value)

        return {
            "since_s": int(self.since.total_seconds()),
            "now": self.now.isoformat() if self.now else None,
            "segment": self.segment,
            "crossover_bucket": self.crossover_bucket,
            "buckets": [
                {
                    "bucket": r.bucket,
                    "subscribers": r.subscribers,
                    "accepted": r.accepted,
                    "displays": r.displays,
                    "clicks": r.clicks,
                    "closes": r.closes,
                    "unsubscribes": r.unsubscribes,
                    "ctr": num(r.ctr),
                    "unsubscribe_rate": num(r.unsubscribe_rate),
                    "display_rate": num(r.display_rate),
                    "close_to_click": num(r.close_to_click),
                    "crossover": r.crossover,
                }
                for r in self.rows
            ],
        }


@dataclass(frozen=True)
class Suspect:
    """A user whose accepted sends stay up while no display comes back."""

    user_id: str
    accepted: int
    first_accepted_at: datetime
    last_accepted_at: datetime
    last_display_at: datetime | None
    live_subscriptions: int


def fatigue_report(
    source: Any,
    *,
    since: timedelta = DEFAULT_SINCE,
    segment: str | None = None,
    now: datetime | None = None,
) -> FatigueReport:
    """Fetch the report for the window (now - since, now].

    ``source`` is a Governor, a Source, or anything :class:`gov.db.Source` takes.
    ``segment`` is a campaign id prefix: engagement counts only its messages, buckets
    still count every send. ``now`` defaults to the database clock.
    """
    if since <= timedelta(0):
        raise ValueError("since must be a positive duration")
    src, owned = as_source(source)
    try:
        rows = src.execute(
            q("fatigue_report"), {"since": since, "now": now, "segment": segment}, row_factory=class_row(BucketRow)
        )
    finally:
        if owned:
            src.close()
    return FatigueReport(since, now, segment, tuple(rows))


def revocation_suspects(
    source: Any,
    *,
    since: timedelta = DEFAULT_SINCE,
    min_accepted: int = DEFAULT_MIN_ACCEPTED,
    now: datetime | None = None,
) -> list[Suspect]:
    """Users with at least ``min_accepted`` accepted sends and no display in the window."""
    src, owned = as_source(source)
    try:
        rows = src.execute(
            q("revocation_suspects"),
            {"since": since, "min_accepted": min_accepted, "now": now},
            row_factory=class_row(Suspect),
        )
    finally:
        if owned:
            src.close()
    return rows


# ---------------------------------------------------------------- rendering


def _pct(value: Decimal | None, digits: int = 1) -> str:
    return "–" if value is None else f"{float(value) * 100:.{digits}f}%"


def _ratio(value: Decimal | None) -> str:
    return "–" if value is None else f"{float(value):.2f}"


def _window_text(report: FatigueReport) -> str:
    span = format_duration(int(report.since.total_seconds() * 1000))
    end = report.now.isoformat(timespec="seconds") if report.now else "now"
    text = f"trailing {span} ending {end}"
    if report.segment:
        text += f", segment: campaigns starting {report.segment!r}"
    return text


def fatigue_table(report: FatigueReport) -> Table:
    """The report as a rich table, one row per bucket."""
    table = Table(title=f"Fatigue by send volume ({_window_text(report)})", title_justify="left")
    for name in ("bucket", "subscribers", "accepted", "displays", "clicks", "closes", "unsubs"):
        table.add_column(name, justify="right")
    for name in ("CTR", "unsub rate", "display rate", "close/click"):
        table.add_column(name, justify="right")
    table.add_column("crossover")
    for r in report.rows:
        table.add_row(
            r.label, str(r.subscribers), str(r.accepted), str(r.displays), str(r.clicks), str(r.closes),
            str(r.unsubscribes), _pct(r.ctr), _pct(r.unsubscribe_rate, 2), _pct(r.display_rate),
            _ratio(r.close_to_click), "◀ crossover" if r.crossover else "",
        )
    return table


def nice_top(value: float) -> float:
    """A round axis maximum at or above ``value``."""
    if value <= 0:
        return 0.01
    magnitude = 10 ** _floor_log10(value)
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * magnitude:
            return step * magnitude
    return 10 * magnitude  # pragma: no cover - the loop always returns


def _floor_log10(value: float) -> int:
    exponent = 0
    while value >= 10:
        value /= 10
        exponent += 1
    while value < 1:
        value *= 10
        exponent -= 1
    return exponent


@dataclass(frozen=True)
class Tick:
    label: str
    x: str = ""
    y: str = ""
    label_y: str = ""


@dataclass(frozen=True)
class Point:
    key: int
    value: float
    x: str
    y: str
    percent: str


@dataclass(frozen=True)
class Mark:
    key: int
    x: str
    label_x: str


@dataclass(frozen=True)
class Chart:
    """The geometry of one line chart; ``templates/_chart.svg.j2`` draws it."""

    series: str
    title: str
    color: str
    x_name: str
    x_label: str
    points: tuple[Point, ...]
    y_ticks: tuple[Tick, ...]
    x_ticks: tuple[Tick, ...]
    crossover: Mark | None
    crossover_color: str = CROSSOVER_COLOR
    width: int = 540
    height: int = 320
    left: int = 64
    top: int = 36
    right_px: int = 520
    bottom_px: int = 268

    @property
    def mid_x(self) -> str:
        return f"{self.left + (self.right_px - self.left) / 2:.1f}"

    @property
    def polyline(self) -> str:
        return " ".join(f"{p.x},{p.y}" for p in self.points)


def line_chart(
    series: str, title: str, color: str, values: Sequence[tuple[int, Decimal | float | None]], *,
    x_range: tuple[int, int], x_labels: dict[int, str], x_name: str, x_label: str, crossover: int | None,
) -> Chart:
    """A chart of ``values`` (key, rate) over keys ``x_range``, the crossover marked."""
    width, height, left, right, top, bottom = 540, 320, 64, 20, 36, 52
    plot_w, plot_h = width - left - right, height - top - bottom
    lo, hi = x_range
    points = [(k, float(v)) for k, v in values if v is not None]
    y_top = nice_top(max((v for _, v in points), default=0.0))

    def x(key: int) -> float:
        return left + (key - lo) * plot_w / max(hi - lo, 1)

    def y(value: float) -> float:
        return top + plot_h - value / y_top * plot_h

    y_ticks = tuple(
        Tick(label=f"{y_top * i / 4 * 100:.3g}%", y=f"{y(y_top * i / 4):.1f}", label_y=f"{y(y_top * i / 4) + 4:.1f}")
        for i in range(5)
    )
    x_ticks = tuple(Tick(label=x_labels.get(k, str(k)), x=f"{x(k):.1f}") for k in range(lo, hi + 1))
    mark = None if crossover is None else Mark(crossover, f"{x(crossover):.1f}", f"{x(crossover) + 6:.1f}")
    return Chart(
        series=series, title=title, color=color, x_name=x_name, x_label=x_label,
        points=tuple(Point(k, v, f"{x(k):.1f}", f"{y(v):.1f}", f"{v * 100:.2f}%") for k, v in points),
        y_ticks=y_ticks, x_ticks=x_ticks, crossover=mark,
        width=width, height=height, left=left, top=top, right_px=width - right, bottom_px=top + plot_h,
    )


def fatigue_html(report: FatigueReport, suspects: int | None = None) -> str:
    """The report as one self-contained HTML page: inline SVG charts of CTR and
    unsubscribe rate against bucket, the crossover marked, and the table."""
    crossover = report.crossover_bucket

    def chart(series: str, title: str, color: str, values: list[tuple[int, Decimal | None]]) -> Chart:
        return line_chart(
            series, title, color, values, x_range=(1, TOP_BUCKET), x_labels={TOP_BUCKET: f"{TOP_BUCKET}+"},
            x_name="bucket", x_label="sends received in the window (bucket)", crossover=crossover,
        )

    charts = [
        chart("ctr", "Click-through rate (clicks / accepted)", CTR_COLOR, [(r.bucket, r.ctr) for r in report.rows]),
        chart("unsubscribe_rate", "Unsubscribe rate (unsubscribes / subscribers)", UNSUBSCRIBE_COLOR,
              [(r.bucket, r.unsubscribe_rate) for r in report.rows]),
    ]
    verdict = (
        f"Crossover at bucket {crossover}: from there the marginal notification costs more "
        "unsubscribes than it earns clicks."
        if crossover is not None
        else "No crossover in the window: unsubscribes never rose faster than clicks."
    )
    rows = [
        {
            "crossover": r.crossover,
            "cells": (
                r.label, r.subscribers, r.accepted, r.displays, r.clicks, r.closes, r.unsubscribes,
                _pct(r.ctr), _pct(r.unsubscribe_rate, 2), _pct(r.display_rate), _ratio(r.close_to_click),
                "crossover" if r.crossover else "",
            ),
        }
        for r in report.rows
    ]
    return render(
        "fatigue_volume.html.j2",
        window=_window_text(report), verdict=verdict, charts=charts, rows=rows, suspects=suspects, top=TOP_BUCKET,
        header=("bucket", "subscribers", "accepted", "displays", "clicks", "closes", "unsubscribes",
                "CTR", "unsubscribe rate", "display rate", "close / click", "crossover"),
        generated=datetime.now(UTC).isoformat(timespec="seconds"),  # a label only; the window is the database's
    )
