"""The fatigue report: the four signals by trailing-window send volume.

The numbers come from one SQL function, ``gov.fatigue_report_v1`` (its definitions are
in ``docs/analysts.md``); this module fetches them and renders them as a terminal table
(:func:`fatigue_table`) or a self-contained HTML page with inline SVG charts
(:func:`fatigue_html`): no script, no stylesheet, no font or image from anywhere else.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from psycopg.rows import class_row
from rich.table import Table

from gov.analytics.events import as_source
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


def _nice_top(value: float) -> float:
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


def _chart(
    report: FatigueReport, series: str, title: str, color: str, values: Sequence[tuple[int, Decimal | None]]
) -> str:
    """One inline SVG line chart of ``values`` (bucket, rate) with the crossover marked."""
    width, height = 540, 320
    left, right, top, bottom = 64, 20, 36, 52
    plot_w, plot_h = width - left - right, height - top - bottom
    points = [(b, float(v)) for b, v in values if v is not None]
    y_top = _nice_top(max((v for _, v in points), default=0.0))

    def x(bucket: int) -> float:
        return left + (bucket - 1) * plot_w / (TOP_BUCKET - 1)

    def y(value: float) -> float:
        return top + plot_h - value / y_top * plot_h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-chart="{series}" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{html.escape(title)} by send-volume bucket">',
        f'<text x="{left}" y="22" class="chart-title">{html.escape(title)}</text>',
    ]
    for i in range(5):  # horizontal grid and y labels
        value = y_top * i / 4
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{y(value):.1f}" y2="{y(value):.1f}" class="grid"/>')
        out.append(
            f'<text x="{left - 8}" y="{y(value) + 4:.1f}" class="tick" text-anchor="end">{value * 100:.3g}%</text>'
        )
    for bucket in range(1, TOP_BUCKET + 1):  # x labels
        label = f"{bucket}+" if bucket == TOP_BUCKET else str(bucket)
        out.append(
            f'<text x="{x(bucket):.1f}" y="{top + plot_h + 18}" class="tick" text-anchor="middle">{label}</text>'
        )
    out.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 10}" class="axis-label" text-anchor="middle">'
        "sends received in the window (bucket)</text>"
    )
    out.append(
        f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + plot_h}" class="axis"/>'
        f'<line x1="{left}" x2="{width - right}" y1="{top + plot_h}" y2="{top + plot_h}" class="axis"/>'
    )
    crossover = report.crossover_bucket
    if crossover is not None:
        out.append(
            f'<g class="crossover" data-bucket="{crossover}">'
            f'<line x1="{x(crossover):.1f}" x2="{x(crossover):.1f}" y1="{top}" y2="{top + plot_h}" '
            f'stroke="{CROSSOVER_COLOR}" stroke-width="2" stroke-dasharray="6 4"/>'
            f'<text x="{x(crossover) + 6:.1f}" y="{top + 12}" fill="{CROSSOVER_COLOR}" class="tick">crossover</text>'
            "</g>"
        )
    coords = " ".join(f"{x(b):.1f},{y(v):.1f}" for b, v in points)
    out.append(f'<g class="series" data-series="{series}">')
    if len(points) > 1:
        out.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="3"/>')
    for b, v in points:
        out.append(
            f'<circle cx="{x(b):.1f}" cy="{y(v):.1f}" r="5" fill="{color}" data-bucket="{b}" data-value="{v}">'
            f"<title>bucket {b}: {v * 100:.2f}%</title></circle>"
        )
    out.append("</g></svg>")
    return "\n".join(out)


_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px; }
p.window { margin: 0 0 16px; color: #555; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; }
svg.chart { border: 1px solid #ddd; background: #fff; }
.chart-title { font-size: 14px; font-weight: 600; }
.tick { font-size: 11px; fill: #444; }
.axis-label { font-size: 12px; fill: #444; }
.grid { stroke: #eee; }
.axis { stroke: #888; }
table { border-collapse: collapse; margin-top: 20px; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: right; }
th { background: #f6f6f6; }
tr.crossover td { background: #fff3e0; font-weight: 600; }
.notes { color: #555; font-size: 12px; max-width: 900px; }
"""


def fatigue_html(report: FatigueReport, suspects: int | None = None) -> str:
    """The report as one self-contained HTML page: inline SVG charts of CTR and
    unsubscribe rate against bucket, the crossover marked, and the table."""
    head = (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        "<title>gov fatigue report</title>\n"
        f"<style>{_STYLE}</style>\n</head>\n<body>\n"
        "<h1>Fatigue by send volume</h1>\n"
        f'<p class="window">{html.escape(_window_text(report))}</p>\n'
    )
    if not report.rows:
        body = '<p class="empty">No accepted sends in the window: nothing to report yet.</p>\n'
    else:
        crossover = report.crossover_bucket
        verdict = (
            f"Crossover at bucket {crossover}: from there the marginal notification costs more "
            "unsubscribes than it earns clicks."
            if crossover is not None
            else "No crossover in the window: unsubscribes never rose faster than clicks."
        )
        charts = (
            '<div class="charts">\n'
            + _chart(report, "ctr", "Click-through rate (clicks / accepted)", CTR_COLOR,
                     [(r.bucket, r.ctr) for r in report.rows])
            + "\n"
            + _chart(report, "unsubscribe_rate", "Unsubscribe rate (unsubscribes / subscribers)",
                     UNSUBSCRIBE_COLOR, [(r.bucket, r.unsubscribe_rate) for r in report.rows])
            + "\n</div>\n"
        )
        header = "".join(
            f"<th>{h}</th>"
            for h in ("bucket", "subscribers", "accepted", "displays", "clicks", "closes", "unsubscribes",
                      "CTR", "unsubscribe rate", "display rate", "close / click", "crossover")
        )
        rows = []
        for r in report.rows:
            cells = (
                r.label, r.subscribers, r.accepted, r.displays, r.clicks, r.closes, r.unsubscribes,
                _pct(r.ctr), _pct(r.unsubscribe_rate, 2), _pct(r.display_rate), _ratio(r.close_to_click),
                "crossover" if r.crossover else "",
            )
            css = ' class="crossover"' if r.crossover else ""
            rows.append(f"<tr{css}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
        body = (
            f'<p class="verdict">{html.escape(verdict)}</p>\n'
            + charts
            + f'<table class="buckets">\n<thead><tr>{header}</tr></thead>\n<tbody>\n'
            + "\n".join(rows)
            + "\n</tbody>\n</table>\n"
        )
    if suspects is not None:
        body += (
            f'<p class="suspects">Revocation suspects (accepted sends, no display): {suspects} user(s); '
            "see the view gov.revocation_suspects.</p>\n"
        )
    generated = datetime.now(UTC).isoformat(timespec="seconds")  # a label only; the window is the database's
    notes = (
        '<p class="notes">A bucket holds the users who received that many notifications in the window '
        f"({TOP_BUCKET}+: {TOP_BUCKET} or more). CTR and display rate are per accepted message, the unsubscribe "
        "rate per subscriber. The crossover is the first bucket where, stepping up from the bucket below, "
        "unsubscribes per subscriber rise, and by more than clicks per subscriber do. "
        f"Generated {html.escape(generated)} by gov.</p>\n"
    )
    return head + body + notes + "</body>\n</html>\n"
