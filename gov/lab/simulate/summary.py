"""What a simulation did, read back from the database, and rendered for a terminal or a page.

Everything in a :class:`Summary` comes from SQL aggregates in a fixed order (or from the
engine's deterministic counters): no wall time, no ids, nothing that depends on which
thread ran first. Two runs with one seed render the same text.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from gov.db import Source
from gov.errors import GovError
from gov.lab.simulate.engine import CURVE_TOP, EngineStats, SimConfig
from gov.lab.simulate.story import TEAM_OF_TOPIC, TEAMS
from gov.queries import q

BLOCKING_RULES_SHOWN = 8
FATIGUE_WINDOW = timedelta(days=7)  # the seeds' weekly report
COLUMNS = ("messages", "sent", "released", "collapsed", "summaries", "dropped", "expired", "held", "delivered")
HEADERS = {
    "messages": "messages",
    "sent": "sent",
    "released": "deferred→released",
    "collapsed": "collapsed",
    "summaries": "→ summaries",
    "dropped": "dropped",
    "expired": "expired",
    "held": "held at end",
    "delivered": "delivered",
}


@dataclass(frozen=True)
class Row:
    """Dispositions of one tier's or one team's messages (see sim_dispositions)."""

    key: str
    messages: int = 0
    sent: int = 0
    released: int = 0
    collapsed: int = 0
    summaries: int = 0
    dropped: int = 0
    expired: int = 0
    held: int = 0
    delivered: int = 0

    def plus(self, other: Row) -> Row:
        return Row(self.key, *(getattr(self, c) + getattr(other, c) for c in COLUMNS))


@dataclass(frozen=True)
class Exempt:
    """The exempt tier's record: every message allowed and delivered, none suppressed."""

    messages: int
    allowed: int
    all_delivered: int
    no_endpoint: int
    suppressed: int

    @property
    def ok(self) -> bool:
        return self.suppressed == 0 and self.allowed == self.messages and self.all_delivered == self.messages


@dataclass(frozen=True)
class Summary:
    """One run, aggregated."""

    label: str
    users: int
    days: int
    seed: int
    policy_name: str
    start: datetime
    by_tier: tuple[Row, ...]
    by_team: tuple[Row, ...]
    exempt: Exempt
    blocking: tuple[tuple[str, str, str, int], ...]
    sends_per_user: tuple[int, ...]  # whole run, ascending
    daily: tuple[tuple[date, str, int], ...]
    attempts: tuple[tuple[str, int], ...]
    events: tuple[tuple[str, int, int], ...]  # (event, messages, users)
    events_available: bool
    unsubscribed: int
    messages_sent: int
    push_requests: int
    push_decrypted: int
    fatigue: Any = None  # gov.analytics.report.FatigueReport, or None when unavailable
    collapse_split: tuple[tuple[str, int, int, int, int, int], ...] = ()  # (tier, messages, alone, summarised,
    #                                                                       held, expired) per collapse tier
    expired_by_key: tuple[tuple[str, str, int], ...] = ()  # (tier, collapse key, expired), most first
    curve: tuple[tuple[int, int, int, int], ...] = ()  # ground truth: (volume, sends, clicks, unsubscribes)
    marginal: Any = None  # gov.analytics.marginal.MarginalReport over the whole run, or None when unavailable
    # ground truth by the marginal measure's definition: (segment, position, sends,
    # expected clicks, expected unsubscribes), from the simulator's own dice
    truth_positions: tuple[tuple[str, int, int, float, float], ...] = ()
    tolerance: float = 1.0

    def per_week(self, value: float) -> float:
        return value * 7 / self.days

    @property
    def weekly(self) -> tuple[float, float, int | float]:
        """Sends per user per week: (median, p90, max)."""
        xs = self.sends_per_user
        return (self.per_week(percentile(xs, 0.5)), self.per_week(percentile(xs, 0.9)),
                self.per_week(xs[-1] if xs else 0))

    @property
    def total(self) -> Row:
        out = Row("all")
        for r in self.by_tier:
            out = out.plus(r)
        return out

    def event_messages(self, event: str) -> int:
        return next((m for e, m, _ in self.events if e == event), 0)


def percentile(sorted_values: Sequence[int], fraction: float) -> float:
    """Linear interpolation between closest ranks (PostgreSQL's percentile_cont)."""
    if not sorted_values:
        return 0.0
    pos = (len(sorted_values) - 1) * fraction
    low = int(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


def _fatigue(source: Source, config: SimConfig) -> Any:
    """The telemetry engineer's fatigue report over the last week, or None without it."""
    try:
        from gov.analytics.report import fatigue_report
    except ImportError:
        return None
    try:
        return fatigue_report(source, since=min(FATIGUE_WINDOW, config.end - config.start), now=config.end)
    except GovError:  # the SQL function is not in this schema yet
        return None


def _marginal(source: Source, config: SimConfig) -> Any:
    """The marginal fatigue measure over the whole run, or None without it."""
    try:
        from gov.analytics.marginal import marginal_report
    except ImportError:
        return None
    try:
        return marginal_report(source, since=config.end - config.start, now=config.end)
    except GovError:  # the SQL function is not in this schema yet
        return None


def collect(dsn: str, config: SimConfig, *, label: str, stats: EngineStats) -> Summary:
    """Aggregate one finished run from its database."""
    source = Source(dsn, pool_size=1)
    try:
        rows = source.execute(q("sim_dispositions"), {})
        tiers: dict[str, Row] = {}
        teams: dict[str, Row] = {team: Row(team) for team in TEAMS}
        for tier, topic, *counts in rows:
            row = Row(tier, *(int(c) for c in counts))
            tiers[tier] = tiers[tier].plus(row) if tier in tiers else row
            team = TEAM_OF_TOPIC.get(topic, "other")
            teams[team] = teams.get(team, Row(team)).plus(row)
        (exempt,) = source.execute(q("sim_exempt_delivery"), {})
        blocking = source.execute(q("sim_blocking_rules"), {"limit": BLOCKING_RULES_SHOWN})
        sends = tuple(int(r[0]) for r in source.execute(q("sim_sends_per_user"), {}))
        daily = tuple((d, t, int(n)) for d, t, n in source.execute(q("sim_daily_sends"), {}))
        attempts = tuple((o, int(n)) for o, n in source.execute(q("sim_delivery_totals"), {}))
        try:
            events = tuple((e, int(m), int(u)) for e, m, u in source.execute(q("sim_event_totals"), {}))
        except GovError:  # no telemetry table in this schema
            events = ()
        fatigue = _fatigue(source, config)
        marginal = _marginal(source, config)
        split = tuple((str(t), *(int(x) for x in rest)) for t, *rest in source.execute(q("sim_collapse_split"), {}))
        expired_keys = tuple(
            (str(t), str(k), int(n)) for t, k, n in source.execute(q("sim_collapse_expired_by_key"), {})
        )
    finally:
        source.close()
    unsubscribed = next((u for e, _, u in events if e == "unsubscribe"), stats.unsubscribed)
    return Summary(
        label=label,
        users=config.users,
        days=config.days,
        seed=config.seed,
        policy_name=config.policy_name,
        start=config.start,
        by_tier=tuple(tiers[t] for t in sorted(tiers)),
        by_team=tuple(r for r in teams.values() if r.messages or r.key in TEAMS),
        exempt=Exempt(*(int(x) for x in exempt)),
        blocking=tuple((str(r), str(t), str(a), int(n)) for r, t, a, n in blocking),
        sends_per_user=sends,
        daily=daily,
        attempts=attempts,
        events=events,
        events_available=stats.events_available and bool(events),
        unsubscribed=unsubscribed,
        messages_sent=stats.sent,
        push_requests=stats.push_requests,
        push_decrypted=stats.push_decrypted,
        fatigue=fatigue,
        collapse_split=split,  # type: ignore[arg-type]
        expired_by_key=expired_keys,
        curve=tuple((v, *stats.curve[v]) for v in sorted(stats.curve)),  # type: ignore[misc]
        marginal=marginal,
        truth_positions=tuple(
            (seg, pos, int(n), float(c), float(u)) for (seg, pos), (n, c, u) in sorted(stats.truth.items())
        ),
        tolerance=config.tolerance,
    )


# ---------------------------------------------------------------- terminal


def _n(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def _rows_table(title: str, rows: Sequence[Row], first: str) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold")
    table.add_column(first)
    for c in COLUMNS:
        table.add_column(HEADERS[c], justify="right")
    for r in rows:
        table.add_row(r.key, *(_n(getattr(r, c)) if getattr(r, c) else "–" for c in COLUMNS))
    return table


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def headline(s: Summary) -> str:
    return (
        f"gov simulate · {s.label} · {s.policy_name} · {plural(s.users, 'user')} × {plural(s.days, 'day')} "
        f"from {s.start:%Y-%m-%d (%a)} · seed {s.seed}"
    )


def exempt_line(s: Summary) -> Text:
    e = s.exempt
    if e.ok:
        text = Text("P0: ", style="bold")
        text.append(f"{e.messages:,} messages, all allowed and delivered to every endpoint; 0 suppressed ✓",
                    style="green")
        return text
    text = Text("P0: ", style="bold")
    text.append(
        f"{e.messages:,} messages, {e.allowed:,} allowed, {e.all_delivered:,} delivered to every endpoint, "
        f"{e.no_endpoint:,} without an endpoint, {e.suppressed:,} suppressed ✗",
        style="bold red",
    )
    return text


def collapse_lines(s: Summary) -> list[Text]:
    """Per collapse tier: every message delivered, summarised into a delivered summary, held, or expired."""
    out = []
    for tier, messages, alone, summarised, held, expired in s.collapse_split:
        other = messages - alone - summarised - held - expired
        share = expired / messages * 100 if messages else 0.0
        text = Text(f"{tier} (collapse): ", style="bold")
        text.append(
            f"{messages:,} messages: {alone:,} delivered on their own, {summarised:,} in delivered summaries, "
            f"{held:,} held at the end, {expired:,} expired ({share:.1f} %"
            + "".join(f"; {key} {n:,}" for t, key, n in s.expired_by_key if t == tier) + ")"
            + (f", {other:,} other (dropped, failed or not delivered)" if other else ""),
            style="green" if share <= 5 else "yellow",
        )
        out.append(text)
    return out


def render(s: Summary) -> RenderableType:
    """The run's summary as rich renderables (printed to stdout by the CLI)."""
    parts: list[RenderableType] = [Text(headline(s), style="bold"), Text("")]
    parts.append(_rows_table("Per tier", s.by_tier, "tier"))
    parts.append(_rows_table("Per team", s.by_team, "team"))
    parts.append(exempt_line(s))
    parts.extend(collapse_lines(s))
    parts.append(Text(""))
    rules = Table(title="Top blocking rules", title_justify="left", title_style="bold")
    for name, justify in (("rule", "left"), ("tier", "left"), ("action", "left"), ("suppressed", "right")):
        rules.add_column(name, justify=justify)  # type: ignore[arg-type]
    for rule, tier, action, n in s.blocking:
        rules.add_row(rule, tier, action, f"{n:,}")
    if not s.blocking:
        rules.add_row("(none)", "", "", "0")
    parts.append(rules)
    median, p90, top = s.weekly
    parts.append(Text.assemble(
        ("Sends per user per week: ", "bold"),
        f"median {median:.1f} · p90 {p90:.1f} · max {top:.1f}",
        ("  (messages accepted for the user; one message on two browsers is one send)", "dim"),
    ))
    attempts = ", ".join(f"{n:,} {outcome}" for outcome, n in s.attempts) or "none"
    parts.append(Text.assemble(
        ("Push service: ", "bold"),
        f"{s.push_requests:,} requests ({attempts}); {s.push_decrypted:,} VAPID-verified, decrypted and accepted",
    ))
    if s.events_available:
        parts.append(Text.assemble(
            ("Engagement: ", "bold"),
            f"{s.event_messages('display'):,} displayed, {s.event_messages('click'):,} clicked, "
            f"{s.event_messages('close'):,} closed; {s.unsubscribed:,} users unsubscribed",
        ))
    else:
        parts.append(Text.assemble(("Engagement: ", "bold"), f"{s.unsubscribed:,} users unsubscribed (no telemetry)"))
    parts.append(Text(""))
    parts.append(_fatigue_renderable(s))
    parts.append(Text(""))
    parts.append(_truth_renderable(s))
    parts.append(Text(""))
    parts.append(_marginal_renderable(s))
    return Group(*parts)


def _fatigue_renderable(s: Summary) -> RenderableType:
    if s.fatigue is None:
        return Text("fatigue report unavailable", style="yellow")
    try:
        from gov.analytics.report import fatigue_table
    except ImportError:
        return Text("fatigue report unavailable", style="yellow")
    if not s.fatigue.rows:
        return Text("fatigue report: no accepted sends in the window")
    crossover = s.fatigue.crossover_bucket
    verdict = (f"crossover at bucket {crossover}: past it one more send costs more unsubscribes than it earns clicks"
               if crossover is not None else "no crossover in the window")
    return Group(fatigue_table(s.fatigue), Text(verdict, style="bold"))


TRUTH_GROUPS = ((0, 2), (3, 5), (6, 8), (9, 11), (12, 14), (15, CURVE_TOP))


def truth(s: Summary) -> list[tuple[str, int, float, float]]:
    """The ground truth by group: (label, sends, clicks per send, unsubscribes per send)."""
    out = []
    for lo, hi in TRUTH_GROUPS:
        rows = [r for r in s.curve if lo <= r[0] <= hi]
        sends = sum(r[1] for r in rows)
        if not sends:
            continue
        label = f"{lo}+" if hi == CURVE_TOP and lo == CURVE_TOP else f"{lo}–{hi}"
        out.append((label, sends, sum(r[2] for r in rows) / sends, sum(r[3] for r in rows) / sends))
    return out


def truth_crossover(s: Summary) -> str | None:
    """The first group where one more send costs more unsubscribes than it earns clicks."""
    return next((label for label, _, click, unsub in truth(s) if unsub > click), None)


def _truth_renderable(s: Summary) -> RenderableType:
    title = Text("Ground truth: what the simulated users did, per send, by sends already received that week",
                 style="bold")
    table = Table()
    for name in ("sends that week", "sends", "clicked", "unsubscribed"):
        table.add_column(name, justify="right")
    for label, sends, click, unsub in truth(s):
        table.add_row(label, f"{sends:,}", f"{click * 100:.2f}%", f"{unsub * 100:.2f}%")
    crossover = truth_crossover(s)
    verdict = (f"one more send costs more unsubscribes than it earns clicks from {crossover} sends a week"
               if crossover else "no crossover: clicks outweigh unsubscribes at every volume reached")
    return Group(title, table, Text(verdict, style="bold"))


OVERALL_TRUTH = "*"


def truth_by_position(s: Summary, segment: str) -> list[tuple[int, int, float, float]]:
    """The truth curve of one segment (``*``: everyone): (position, sends, expected clicks, expected unsubscribes)."""
    out: dict[int, list[float]] = {}
    for seg, pos, n, c, u in s.truth_positions:
        if segment in (OVERALL_TRUTH, seg):
            acc = out.setdefault(pos, [0, 0.0, 0.0])
            acc[0] += n
            acc[1] += c
            acc[2] += u
    return [(p, int(v[0]), v[1], v[2]) for p, v in sorted(out.items())]


def crossover_rows(s: Summary) -> list[tuple[str, str, str, bool]]:
    """Per segment (everyone first): (segment, what the measure says, what the truth says, agree).

    The truth is by the measure's own definition (gov.analytics.marginal.expected_crossover):
    the simulator's expected clicks and unsubscribes of every delivered send, grouped into
    the same positions, without noise. They agree when both name a crossover within one
    position of each other, or both say it is not reached.
    """
    from gov.analytics.marginal import NOT_REACHED, expected_crossover

    report = s.marginal
    segments = [OVERALL_TRUTH, *sorted({seg for seg, *_ in s.truth_positions})]
    out = []
    for seg in segments:
        measure = report.segment(seg)
        truth = expected_crossover(truth_by_position(s, seg), report.min_sends)
        said = measure.verdict_text()
        truth_text = "not reached" if truth is None else (
            f"crossover at position {truth[0]}" if truth[0] == truth[1] else
            f"crossover at positions {truth[0]}–{truth[1]} (from position {truth[0]})")
        position = measure.crossover_position
        agree = (position is None and truth is None and measure.verdict == NOT_REACHED) or (
            position is not None and truth is not None and abs(position - truth[0]) <= 1)
        out.append(("all users" if seg == OVERALL_TRUTH else seg, said, truth_text, agree))
    return out


def _marginal_renderable(s: Summary) -> RenderableType:
    if s.marginal is None:
        return Text("marginal fatigue measure unavailable", style="yellow")
    from gov.analytics.marginal import marginal_table

    table = Table(title=f"Crossover by send position: the fatigue measure vs the simulated users' truth "
                  f"(tolerance {s.tolerance:g})", title_justify="left", title_style="bold")
    for name in ("segment", "fatigue measure (gov report fatigue)", "truth (same definition, no noise)", ""):
        table.add_column(name)
    for seg, said, truth_text, agree in crossover_rows(s):
        table.add_row(seg, said, truth_text, "✓" if agree else "✗")
    return Group(marginal_table(s.marginal.overall), table)


def comparison(governed: Summary, off: Summary) -> tuple[Table, bool]:
    """Governed vs governor off, side by side; True when the governed run did better on both."""
    table = Table(title=f"Governed vs governor off (same traffic, seed {governed.seed})", title_justify="left",
                  title_style="bold")
    table.add_column("")
    table.add_column("governed", justify="right")
    table.add_column("governor off", justify="right")
    gm, gp, gx = governed.weekly
    om, op, ox = off.weekly
    rows = (
        ("messages handed to gov", _n(governed.messages_sent), _n(off.messages_sent)),
        ("messages delivered", _n(governed.total.delivered), _n(off.total.delivered)),
        ("sends per user per week: median", f"{gm:.1f}", f"{om:.1f}"),
        ("sends per user per week: p90", f"{gp:.1f}", f"{op:.1f}"),
        ("sends per user per week: max", f"{gx:.1f}", f"{ox:.1f}"),
        ("clicks", _n(governed.event_messages("click")), _n(off.event_messages("click"))),
        ("users unsubscribed", _n(governed.unsubscribed), _n(off.unsubscribed)),
    )
    for row in rows:
        table.add_row(*row)
    better = gp < op and governed.unsubscribed < off.unsubscribed
    return table, better


def compare_verdict(governed: Summary, off: Summary) -> Text:
    _, better = comparison(governed, off)
    gp, op = governed.weekly[1], off.weekly[1]
    text = f"p90 {gp:.1f} vs {op:.1f} a week, {governed.unsubscribed:,} vs {off.unsubscribed:,} unsubscribes"
    if better:
        return Text(f"The governor lowered both: {text} ✓", style="bold green")
    return Text(f"The governor did not lower both: {text} ✗", style="bold red")


def print_summary(console: Console, governed: Summary, off: Summary | None = None) -> None:
    """Print the run (and the comparison with the ungoverned run) to ``console``."""
    console.print(render(governed))
    if off is not None:
        console.print()
        console.print(comparison(governed, off)[0])
        console.print(compare_verdict(governed, off))


# ---------------------------------------------------------------- HTML

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; max-width: 1200px; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: right; }
th { background: #f6f6f6; } td:first-child, th:first-child { text-align: left; }
.ok { color: #1a7f37; font-weight: 600; } .bad { color: #c62828; font-weight: 600; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; }
svg { border: 1px solid #ddd; background: #fff; }
svg text { font-size: 11px; fill: #444; } svg .title { font-size: 13px; font-weight: 600; fill: #222; }
.grid { stroke: #eee; } .axis { stroke: #888; }
"""
DISPOSITION_COLORS = {
    "sent": "#2e7d32", "released": "#66bb6a", "summaries": "#1e88e5", "collapsed": "#90caf9",
    "dropped": "#e53935", "expired": "#fb8c00", "held": "#9e9e9e",
}
TIER_COLORS = ("#c62828", "#1565c0", "#2e7d32", "#6a1b9a", "#ef6c00", "#00838f")
RUN_COLORS = ("#1565c0", "#e53935")


def _e(value: object) -> str:
    return html.escape(str(value))


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "\n".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>"


def _nice(value: float) -> float:
    if value <= 0:
        return 1.0
    magnitude = 1.0
    while magnitude * 10 <= value:
        magnitude *= 10
    while magnitude > value:
        magnitude /= 10
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * magnitude:
            return step * magnitude
    return 10 * magnitude


class _Plot:
    """A small SVG canvas with a y axis from 0 to a round top."""

    def __init__(self, title: str, top: float, width: int = 560, height: int = 300, percent: bool = False) -> None:
        self.width, self.height = width, height
        self.left, self.right, self.top_px, self.bottom = 56, 16, 32, 48
        self.top = _nice(top)
        self.percent = percent
        self.parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(title)}">',
            f'<text x="{self.left}" y="20" class="title">{_e(title)}</text>',
        ]
        for i in range(5):
            v = self.top * i / 4
            y = self.y(v)
            label = f"{v * 100:.3g}%" if percent else f"{v:,.4g}"
            self.parts.append(f'<line x1="{self.left}" x2="{width - self.right}" y1="{y:.1f}" y2="{y:.1f}" '
                              'class="grid"/>')
            self.parts.append(f'<text x="{self.left - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
        self.parts.append(f'<line x1="{self.left}" x2="{self.left}" y1="{self.top_px}" y2="{self.y(0):.1f}" '
                          f'class="axis"/><line x1="{self.left}" x2="{width - self.right}" y1="{self.y(0):.1f}" '
                          f'y2="{self.y(0):.1f}" class="axis"/>')

    @property
    def plot_w(self) -> float:
        return self.width - self.left - self.right

    def y(self, value: float) -> float:
        plot_h = self.height - self.top_px - self.bottom
        return self.top_px + plot_h - value / self.top * plot_h

    def xlabel(self, x: float, text: str) -> None:
        self.parts.append(f'<text x="{x:.1f}" y="{self.height - self.bottom + 16}" text-anchor="middle">'
                          f"{_e(text)}</text>")

    def caption(self, text: str) -> None:
        self.parts.append(f'<text x="{self.left + self.plot_w / 2:.1f}" y="{self.height - 8}" '
                          f'text-anchor="middle">{_e(text)}</text>')

    def legend(self, items: Sequence[tuple[str, str]]) -> None:
        x = self.width - self.right - 8
        for i, (name, color) in enumerate(reversed(items)):
            y = self.top_px + 4 + 14 * (len(items) - 1 - i)
            self.parts.append(f'<rect x="{x - 10}" y="{y - 8}" width="10" height="10" fill="{color}"/>'
                              f'<text x="{x - 14}" y="{y + 1}" text-anchor="end">{_e(name)}</text>')

    def svg(self) -> str:
        return "\n".join([*self.parts, "</svg>"])


def _histogram(runs: Sequence[Summary]) -> str:
    """Users by sends per week, one bar per run in each bin."""
    rates = [[r.per_week(n) for n in r.sends_per_user] for r in runs]
    high = max((max(x) for x in rates if x), default=1.0)
    width = max(1, int(_nice(high / 12)))
    bins = int(high // width) + 1
    counts = [[0] * bins for _ in runs]
    for i, xs in enumerate(rates):
        for x in xs:
            counts[i][min(int(x // width), bins - 1)] += 1
    plot = _Plot("Users by sends per week", max(max(c) for c in counts))
    slot = plot.plot_w / bins
    bar = slot * 0.8 / len(runs)
    for b in range(bins):
        for i in range(len(runs)):
            x = plot.left + b * slot + slot * 0.1 + i * bar
            y = plot.y(counts[i][b])
            plot.parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{plot.y(0) - y:.1f}" '
                              f'fill="{RUN_COLORS[i % 2]}"><title>{_e(runs[i].label)}: {counts[i][b]} users with '
                              f"{b * width}–{(b + 1) * width} a week</title></rect>")
        if bins <= 16 or b % 2 == 0:
            plot.xlabel(plot.left + (b + 0.5) * slot, f"{b * width}")
    plot.caption("sends per user per week (bin start)")
    plot.legend([(r.label, RUN_COLORS[i % 2]) for i, r in enumerate(runs)])
    return plot.svg()


def _dispositions(s: Summary) -> str:
    """One stacked bar per tier: what became of its messages."""
    keys = ("sent", "released", "summaries", "collapsed", "dropped", "expired", "held")
    plot = _Plot(f"What became of each tier's messages ({s.label})", max((r.messages for r in s.by_tier), default=1))
    slot = plot.plot_w / max(1, len(s.by_tier))
    for i, r in enumerate(s.by_tier):
        base = 0.0
        x = plot.left + i * slot + slot * 0.2
        for k in keys:
            # a summary is one of the collapsed messages: draw it apart from the rest
            v = getattr(r, k) - (r.summaries if k == "collapsed" else 0)
            if v <= 0:
                continue
            y0, y1 = plot.y(base), plot.y(base + v)
            plot.parts.append(f'<rect x="{x:.1f}" y="{y1:.1f}" width="{slot * 0.6:.1f}" height="{y0 - y1:.1f}" '
                              f'fill="{DISPOSITION_COLORS[k]}"><title>{r.key} {HEADERS[k]}: {v:,}</title></rect>')
            base += v
        plot.xlabel(x + slot * 0.3, r.key)
    plot.legend([(HEADERS[k], DISPOSITION_COLORS[k]) for k in keys])
    return plot.svg()


def _daily(s: Summary) -> str:
    """Messages delivered per simulated day, stacked by tier."""
    days = sorted({d for d, _, _ in s.daily})
    tiers = sorted({t for _, t, _ in s.daily})
    totals = {d: sum(n for dd, _, n in s.daily if dd == d) for d in days}
    plot = _Plot(f"Messages delivered per day ({s.label})", max(totals.values(), default=1), width=640)
    slot = plot.plot_w / max(1, len(days))
    for i, d in enumerate(days):
        base = 0
        x = plot.left + i * slot + slot * 0.15
        for j, t in enumerate(tiers):
            v = next((n for dd, tt, n in s.daily if dd == d and tt == t), 0)
            if not v:
                continue
            y0, y1 = plot.y(base), plot.y(base + v)
            plot.parts.append(f'<rect x="{x:.1f}" y="{y1:.1f}" width="{slot * 0.7:.1f}" height="{y0 - y1:.1f}" '
                              f'fill="{TIER_COLORS[j % len(TIER_COLORS)]}"><title>{d:%a %d %b} {t}: {v:,}</title>'
                              "</rect>")
            base += v
        plot.xlabel(x + slot * 0.35, f"{d:%a}"[:2])
    plot.caption("simulated day (UTC)")
    plot.legend([(t, TIER_COLORS[j % len(TIER_COLORS)]) for j, t in enumerate(tiers)])
    return plot.svg()


def _fatigue_chart(s: Summary) -> str:
    """Click-through and unsubscribe rate by send-volume bucket, the crossover marked."""
    rows = [r for r in s.fatigue.rows if r.ctr is not None]
    top = max([float(r.ctr) for r in rows] + [float(r.unsubscribe_rate) for r in rows] + [0.01])
    plot = _Plot(f"Fatigue by sends in the last week ({s.label})", top, percent=True)
    buckets = [r.bucket for r in s.fatigue.rows]
    span = max(buckets) if buckets else 8

    def x(b: int) -> float:
        return plot.left + (b - 0.5) * plot.plot_w / span

    for series, color, label in (("ctr", RUN_COLORS[0], "click-through"),
                                 ("unsubscribe_rate", RUN_COLORS[1], "unsubscribe rate")):
        pts = [(r.bucket, float(getattr(r, series))) for r in s.fatigue.rows if getattr(r, series) is not None]
        plot.parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2.5" points="'
                          + " ".join(f"{x(b):.1f},{plot.y(v):.1f}" for b, v in pts) + '"/>')
        for b, v in pts:
            plot.parts.append(f'<circle cx="{x(b):.1f}" cy="{plot.y(v):.1f}" r="4" fill="{color}">'
                              f"<title>{label}, bucket {b}: {v * 100:.2f}%</title></circle>")
    crossover = s.fatigue.crossover_bucket
    if crossover is not None:
        plot.parts.append(f'<line x1="{x(crossover):.1f}" x2="{x(crossover):.1f}" y1="{plot.top_px}" '
                          f'y2="{plot.y(0):.1f}" stroke="#ff7f0e" stroke-width="2" stroke-dasharray="6 4"/>'
                          f'<text x="{x(crossover) + 4:.1f}" y="{plot.top_px + 12}">crossover</text>')
    for b in buckets:
        plot.xlabel(x(b), f"{b}+" if b == span and b >= 8 else str(b))
    plot.caption("sends received in the last 7 days (bucket)")
    plot.legend([("click-through", RUN_COLORS[0]), ("unsubscribe rate", RUN_COLORS[1])])
    return plot.svg()


def _html_run(s: Summary) -> str:
    rows_headers = ["", *(HEADERS[c] for c in COLUMNS)]
    median, p90, top = s.weekly
    e = s.exempt
    out = [
        f"<h2>{_e(s.label.capitalize())}</h2>",
        _html_table(["tier", *rows_headers[1:]], [[r.key, *(f"{getattr(r, c):,}" for c in COLUMNS)]
                                                  for r in s.by_tier]),
        _html_table(["team", *rows_headers[1:]], [[r.key, *(f"{getattr(r, c):,}" for c in COLUMNS)]
                                                  for r in s.by_team]),
        f'<p class="{"ok" if e.ok else "bad"}">P0: {e.messages:,} messages, {e.all_delivered:,} delivered to every '
        f"endpoint, {e.suppressed:,} suppressed {'✓' if e.ok else '✗'}</p>",
        "<h3>Top blocking rules</h3>",
        _html_table(["rule", "tier", "action", "suppressed"], [[r, t, a, f"{n:,}"] for r, t, a, n in s.blocking]),
        f"<p>Sends per user per week: median {median:.1f}, p90 {p90:.1f}, max {top:.1f}. "
        f"{s.unsubscribed:,} users unsubscribed. The push service received {s.push_requests:,} requests and "
        f"verified, decrypted and accepted {s.push_decrypted:,}.</p>",
        '<div class="charts">',
        _dispositions(s),
        _daily(s),
    ]
    if s.fatigue is not None and s.fatigue.rows:
        out.append(_fatigue_chart(s))
    out.append("</div>")
    if s.fatigue is not None and s.fatigue.rows:
        out.append(_html_table(
            ["bucket", "subscribers", "accepted", "clicks", "unsubscribes", "CTR", "unsubscribe rate", "crossover"],
            [[r.label, f"{r.subscribers:,}", f"{r.accepted:,}", f"{r.clicks:,}", f"{r.unsubscribes:,}",
              "–" if r.ctr is None else f"{float(r.ctr) * 100:.1f}%",
              "–" if r.unsubscribe_rate is None else f"{float(r.unsubscribe_rate) * 100:.2f}%",
              "◀" if r.crossover else ""] for r in s.fatigue.rows],
        ))
    elif s.fatigue is None:
        out.append("<p>fatigue report unavailable</p>")
    crossover = truth_crossover(s)
    out.append("<h3>Ground truth: the simulated users, per send, by sends already received that week</h3>")
    out.append(_html_table(["sends that week", "sends", "clicked", "unsubscribed"],
                           [[label, f"{n:,}", f"{c * 100:.2f}%", f"{u * 100:.2f}%"] for label, n, c, u in truth(s)]))
    out.append(f"<p>{_e(f'Crossover from {crossover} sends a week.' if crossover else 'No crossover reached.')}</p>")
    return "\n".join(out)


def to_html(governed: Summary, off: Summary | None = None) -> str:
    """The summary as one self-contained page: inline SVG, inline CSS, no script, nothing fetched."""
    runs = [governed] if off is None else [governed, off]
    body = [f"<h1>{_e(headline(governed))}</h1>"]
    if off is not None:
        gm, gp, gx = governed.weekly
        om, op, ox = off.weekly
        verdict = compare_verdict(governed, off)
        body.append("<h2>Governed vs governor off</h2>")
        body.append(_html_table(
            ["", "governed", "governor off"],
            [["messages handed to gov", f"{governed.messages_sent:,}", f"{off.messages_sent:,}"],
             ["messages delivered", f"{governed.total.delivered:,}", f"{off.total.delivered:,}"],
             ["sends per user per week: median", f"{gm:.1f}", f"{om:.1f}"],
             ["sends per user per week: p90", f"{gp:.1f}", f"{op:.1f}"],
             ["sends per user per week: max", f"{gx:.1f}", f"{ox:.1f}"],
             ["clicks", f"{governed.event_messages('click'):,}", f"{off.event_messages('click'):,}"],
             ["users unsubscribed", f"{governed.unsubscribed:,}", f"{off.unsubscribed:,}"]],
        ))
        body.append(f'<p class="{"ok" if comparison(governed, off)[1] else "bad"}">{_e(verdict.plain)}</p>')
    body.append(f'<div class="charts">{_histogram(runs)}</div>')
    for s in runs:
        body.append(_html_run(s))
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{_e(headline(governed))}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )
