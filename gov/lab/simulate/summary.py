"""What a simulation did, read back from the database, and rendered for a terminal or a page.

Everything in a :class:`Summary` comes from SQL aggregates in a fixed order (or from the
engine's deterministic counters): no wall time, no ids, nothing that depends on which
thread ran first. Two runs with one seed render the same text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from gov.analytics.html import render as render_template
from gov.analytics.marginal import segment_title
from gov.analytics.report import CTR_COLOR, TOP_BUCKET, UNSUBSCRIBE_COLOR, Chart, Tick, line_chart, nice_top
from gov.db import Source
from gov.errors import GovError
from gov.lab.simulate.hours import collect_hours, hours_lines
from gov.lab.simulate.model import CURVE_TOP, EngineStats, SimConfig
from gov.lab.simulate.story import TEAM_OF_TOPIC, TEAMS
from gov.lab.simulate.versus import policy_rows, policy_title, policy_verdict
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
    # (tier, messages, alone, summarised, held, expired, held folded into a waiting carrier) per collapse tier
    collapse_split: tuple[tuple[str, int, int, int, int, int, int], ...] = ()
    expired_by_key: tuple[tuple[str, str, int], ...] = ()  # (tier, collapse key, expired), most first
    # (tier, ttl_expired, of which a slot went to a later deadline) per tier (sim_expired_split)
    expired_split: tuple[tuple[str, int, int], ...] = ()
    # (tier, outcome, expired, of which at the decision) per tier and outcome (sim_expired_outcomes)
    expired_outcomes: tuple[tuple[str, str, int, int], ...] = ()
    curve: tuple[tuple[int, int, int, int], ...] = ()  # ground truth: (volume, sends, clicks, unsubscribes)
    marginal: Any = None  # gov.analytics.marginal.MarginalReport over the whole run, or None when unavailable
    # ground truth by the marginal measure's definition: (segment, position, sends,
    # expected clicks, expected unsubscribes), from the simulator's own dice
    truth_positions: tuple[tuple[str, int, int, float, float], ...] = ()
    tolerance: float = 1.0
    hours: Any = None  # hours.HourRecovery: gov's best hours vs the hidden ones (None without an hour effect)
    clicks_non_p0: int = 0  # non-P0 messages that drew a click (what the timing of held messages can move)
    # every delivered non-P0 message: (user id, message id, moved by the timing: 'best', 'explore'
    # or None, clicked), sim_delivered_non_p0: a comparison pairs them by message (versus.py)
    delivered_non_p0: tuple[tuple[str, str, str | None, bool], ...] = ()

    @property
    def click_rate_non_p0(self) -> float:
        """Clicks per delivered non-P0 message."""
        delivered = sum(r.delivered for r in self.by_tier if r.key != "P0")
        return self.clicks_non_p0 / delivered if delivered else 0.0

    def per_week(self, value: float) -> float:
        """A user's sends as a weekly rate over a run of a week or more; as counted over a shorter run
        (scaled up, one user's two sends in a day would read 14 a week, which no cap let through)."""
        return value * 7 / self.days if self.days >= 7 else value

    @property
    def rate_name(self) -> str:
        """What :meth:`per_week` measures: "per week", or over the run's days when it is shorter."""
        return "per week" if self.days >= 7 else f"in {self.days} day{'s' if self.days != 1 else ''}"

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
            (clicks_non_p0,) = source.execute(q("sim_clicks_non_p0"), {})[0]
            delivered_non_p0 = tuple((str(u), str(m), moved, bool(clicked))
                                     for u, m, moved, clicked in source.execute(q("sim_delivered_non_p0"), {}))
        except GovError:  # no telemetry table in this schema
            events, clicks_non_p0, delivered_non_p0 = (), 0, ()
        fatigue = _fatigue(source, config)
        marginal = _marginal(source, config)
        split = tuple((str(t), *(int(x) for x in rest)) for t, *rest in source.execute(q("sim_collapse_split"), {}))
        expired_keys = tuple(
            (str(t), str(k), int(n)) for t, k, n in source.execute(q("sim_collapse_expired_by_key"), {})
        )
        expired_split = tuple(
            (str(t), int(n), int(later)) for t, n, later in source.execute(q("sim_expired_split"), {})
        )
        expired_outcomes = tuple(
            (str(t), str(o), int(n), int(now)) for t, o, n, now in source.execute(q("sim_expired_outcomes"), {})
        )
        try:
            hours = collect_hours(source, config) if events else None
        except GovError:  # gov.user_hour_estimates is not in this schema yet
            hours = None
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
        expired_split=expired_split,
        expired_outcomes=expired_outcomes,
        clicks_non_p0=int(clicks_non_p0),
        delivered_non_p0=delivered_non_p0,
        curve=tuple((v, *stats.curve[v]) for v in sorted(stats.curve)),  # type: ignore[misc]
        marginal=marginal,
        truth_positions=tuple(
            (seg, pos, int(n), float(c), float(u)) for (seg, pos), (n, c, u) in sorted(stats.truth.items())
        ),
        tolerance=config.tolerance,
        hours=hours,
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
    for tier, messages, alone, summarised, held, expired, folded in s.collapse_split:
        other = messages - alone - summarised - held - expired
        share = expired / messages * 100 if messages else 0.0
        text = Text(f"{tier} (collapse): ", style="bold")
        text.append(
            f"{messages:,} messages: {alone:,} delivered on their own, {summarised:,} in delivered summaries, "
            f"{held:,} held at the end ({held - folded:,} waiting, {folded:,} folded into them), "
            f"{expired:,} expired ({share:.1f} %"
            + "".join(f"; {key} {n:,}" for t, key, n in s.expired_by_key if t == tier) + ")"
            + (f", {other:,} other (dropped, failed or not delivered)" if other else ""),
            style="green" if share <= 5 else "yellow",
        )
        out.append(text)
    return out


EXPIRED_WHY = {"defer_expired": "waiting would pass defer_max", "ttl_expired": "waiting would pass the TTL"}


def expired_lines(s: Summary) -> list[Text]:
    """Per tier: the per-tier table's "expired", the held messages whose wait ran out, by why.

    defer_expired: waiting for a slot would pass the tier's defer_max; ttl_expired: it would
    pass the message's TTL, split by whether a slot went to a later deadline (between the
    message's hold and its deadline the user was sent, in the message's own budget, a
    message of another group whose own deadline was later: sql/queries_simulate.sql,
    sim_expired_split; earliest deadline first makes it 0). Those that expired at their
    decision (never waited) are logged in gov.push_suppressions as drops: "Top blocking
    rules" shows them as ``drop: defer_expired`` / ``drop: ttl_expired``.
    """
    out = []
    split = {tier: (expired, later) for tier, expired, later in s.expired_split}
    for tier in sorted({t for t, *_ in s.expired_outcomes} | set(split)):
        outcomes = [(o, n, now) for t, o, n, now in s.expired_outcomes if t == tier]
        if not outcomes:  # a summary without sim_expired_outcomes: the TTL split alone
            outcomes = [("ttl_expired", split[tier][0], 0)]
        total = sum(n for _, n, _ in outcomes)
        at_decision = sum(now for _, _, now in outcomes)
        parts = []
        later = 0
        for outcome, n, _ in outcomes:
            why = EXPIRED_WHY.get(outcome, outcome)
            if outcome == "ttl_expired" and tier in split:
                ttl, later = split[tier]
                why += f": {ttl - later:,} no slot opened before it, {later:,} a slot went to a later deadline"
            parts.append(f"{n:,} {outcome} ({why})")
        text = Text(f"{tier} expired while held: ", style="bold")
        at_once = f"; {at_decision:,} of them at their decision (\"drop: …\" in the blocking rules)"
        text.append(
            f"{total:,} = " + " + ".join(parts) + (at_once if at_decision else ""),
            style="green" if later == 0 else "red",
        )
        out.append(text)
    return out


BLOCKING_NOTE = ("drop: defer_expired / drop: ttl_expired: held and expired at the decision (its wait would pass "
                 "defer_max / its TTL); logged as drops, counted under \"expired\" in the per-tier table")


def engagement_text(s: Summary) -> str:
    if not s.events_available:
        return f"{s.unsubscribed:,} users unsubscribed (no telemetry)"
    return (f"{s.event_messages('display'):,} displayed, {s.event_messages('click'):,} clicked, "
            f"{s.event_messages('close'):,} closed; {s.unsubscribed:,} users unsubscribed")


def render(s: Summary) -> RenderableType:
    """The run's summary as rich renderables (printed to stdout by the CLI)."""
    parts: list[RenderableType] = [Text(headline(s), style="bold"), Text("")]
    parts.append(_rows_table("Per tier", s.by_tier, "tier"))
    parts.append(_rows_table("Per team", s.by_team, "team"))
    parts.append(exempt_line(s))
    parts.extend(collapse_lines(s))
    parts.extend(expired_lines(s))
    parts.append(Text(""))
    rules = Table(title="Top blocking rules", title_justify="left", title_style="bold")
    for name, justify in (("rule", "left"), ("tier", "left"), ("action", "left"), ("suppressed", "right")):
        rules.add_column(name, justify=justify)  # type: ignore[arg-type]
    for rule, tier, action, n in s.blocking:
        rules.add_row(rule, tier, action, f"{n:,}")
    if not s.blocking:
        rules.add_row("(none)", "", "", "0")
    parts.append(rules)
    if any(":" in action for _, _, action, _ in s.blocking):
        parts.append(Text(BLOCKING_NOTE, style="dim"))
    median, p90, top = s.weekly
    parts.append(Text.assemble(
        (f"Sends per user {s.rate_name}: ", "bold"),
        f"median {median:.1f} · p90 {p90:.1f} · max {top:.1f}",
        ("  (messages accepted for the user; one message on two browsers is one send)", "dim"),
    ))
    attempts = ", ".join(f"{n:,} {outcome}" for outcome, n in s.attempts) or "none"
    parts.append(Text.assemble(
        ("Push service: ", "bold"),
        f"{s.push_requests:,} requests ({attempts}); {s.push_decrypted:,} VAPID-verified, decrypted and accepted",
    ))
    parts.append(Text.assemble(("Engagement: ", "bold"), engagement_text(s)))
    # What the run knows about fatigue, most certain first: the marginal measure beside the
    # noiseless truth, then the seeds' volume buckets (a view, no verdict of its own), then
    # what the dice gave (counts, no verdict: a handful of sends decides nothing).
    parts.append(Text(""))
    parts.append(_marginal_renderable(s))
    parts.append(Text(""))
    parts.append(_fatigue_renderable(s))
    parts.append(Text(""))
    parts.append(_realised_renderable(s))
    if s.hours is not None:
        parts.append(Text(""))
        parts.extend(Text(line) for line in hours_lines(s.hours))
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
    title = Text(SEEDS_VIEW_TITLE, style="bold")
    return Group(title, fatigue_table(seeds_view(s)), Text(fatigue_verdict(s), style="bold"))


SEEDS_VIEW_TITLE = "The seeds' view: sends by volume bucket (gov report fatigue's buckets; no verdict of its own)"


def confirmed_bucket(s: Summary) -> int | None:
    """The seeds' crossover bucket, when the marginal measure confirms it; else None.

    A bucket counts a subscriber's sends in the window, the measure's position the sends
    received before this one: bucket b is the b-th send, position b - 1. The bucket's
    crossover stands only when the measure (all users) names a crossover within one
    position of it; a bucket table reads a difference of two noisy rates off a few
    subscribers and must not overrule the measure's intervals.
    """
    if s.fatigue is None or s.marginal is None:
        return None
    bucket = s.fatigue.crossover_bucket
    position = s.marginal.overall.crossover_position
    if bucket is None or position is None or abs(position - (bucket - 1)) > 1:
        return None
    return int(bucket)


def seeds_view(s: Summary) -> Any:
    """The fatigue report with its crossover mark kept only where the marginal measure confirms it."""
    from dataclasses import replace

    keep = confirmed_bucket(s)
    return replace(s.fatigue, rows=tuple(replace(r, crossover=r.crossover and r.bucket == keep)
                                         for r in s.fatigue.rows))


def fatigue_verdict(s: Summary) -> str:
    """What the seeds' buckets may say: a crossover only where the marginal measure confirms it."""
    keep = confirmed_bucket(s)
    if keep is not None:
        return (f"crossover at bucket {keep}, as the marginal measure finds "
                f"({s.marginal.overall.verdict_text()})")
    said = "no marginal measure" if s.marginal is None else f"the marginal measure: {s.marginal.overall.verdict_text()}"
    if s.fatigue.crossover_bucket is not None:
        return (f"no verdict from the buckets: their rates cross at bucket {s.fatigue.crossover_bucket}, "
                f"but {said} (the measure, with its intervals, decides)")
    return f"no verdict from the buckets ({said})"


REALISED_GROUPS = ((0, 2), (3, 5), (6, 8), (9, 11), (12, 14), (15, CURVE_TOP))
REALISED_TITLE = ("What the dice gave (realised, not the truth): the simulated users' clicks and unsubscribes "
                  "per send, by sends already received that week")
REALISED_NOTE = ("counts of one run's draws: no verdict from them (the truth is the noiseless column of the "
                 "crossover table above)")


def realised(s: Summary) -> list[tuple[str, int, int, int]]:
    """The users' realised outcomes by group: (label, sends, clicks, unsubscribes)."""
    out = []
    for lo, hi in REALISED_GROUPS:
        rows = [r for r in s.curve if lo <= r[0] <= hi]
        sends = sum(r[1] for r in rows)
        if not sends:
            continue
        label = f"{lo}+" if hi == CURVE_TOP and lo == CURVE_TOP else f"{lo}–{hi}"
        out.append((label, sends, sum(r[2] for r in rows), sum(r[3] for r in rows)))
    return out


def _share(part: int, whole: int) -> str:
    return f"{part:,} ({part / whole * 100:.2f}%)" if whole else f"{part:,}"


def _realised_renderable(s: Summary) -> RenderableType:
    table = Table()
    for name in ("sends that week", "sends", "clicked", "unsubscribed"):
        table.add_column(name, justify="right")
    for label, sends, clicks, unsubs in realised(s):
        table.add_row(label, f"{sends:,}", _share(clicks, sends), _share(unsubs, sends))
    return Group(Text(REALISED_TITLE, style="bold"), table, Text(REALISED_NOTE, style="dim"))


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


def crossover_rows(s: Summary) -> list[tuple[str, str, str, str]]:
    """Per segment (everyone first): (segment, what the measure says, what the truth says, mark).

    The truth is the simulator's expected clicks and unsubscribes of every delivered send
    by position, without noise (gov.analytics.crossover.true_crossover: the first position
    whose expected unsubscribes exceed its expected clicks). They agree as in
    ``gov simulate --grid`` (gov.analytics.crossover.Cell.agrees): a declared crossover within
    one position of the truth or an interval that holds it, or both not reached. The mark
    (gov.analytics.crossover.Cell.mark): ✓ they agree, – the measure has not decided and
    nothing it says rules the truth out, ✗ they disagree.
    """
    from gov.analytics.crossover import Cell, true_crossover

    report = s.marginal
    segments = [OVERALL_TRUTH, *sorted({seg for seg, *_ in s.truth_positions})]
    out = []
    for seg in segments:
        measure = report.segment(seg)
        truth = true_crossover(truth_by_position(s, seg))
        said = measure.verdict_text()
        truth_text = "not reached" if truth is None else f"crossover at position {truth}"
        mark = Cell(s.seed, s.tolerance, seg, measure.result, truth).mark
        out.append(("all users" if seg == OVERALL_TRUTH else seg, said, truth_text, mark))
    return out


CROSSOVER_HEADERS = ("segment", "fatigue measure (gov report fatigue)", "truth (same definition, no noise)", "")


def crossover_title(s: Summary) -> str:
    return f"Crossover by send position: the fatigue measure vs the simulated users' truth (tolerance {s.tolerance:g})"


def _marginal_renderable(s: Summary) -> RenderableType:
    if s.marginal is None:
        return Text("marginal fatigue measure unavailable", style="yellow")
    from gov.analytics.marginal import marginal_table

    table = Table(title=crossover_title(s), title_justify="left", title_style="bold")
    for name in CROSSOVER_HEADERS:
        table.add_column(name)
    for seg, said, truth_text, mark in crossover_rows(s):
        table.add_row(seg, said, truth_text, mark)
    return Group(Text(fatigue_lead(s), style="bold"), table, marginal_table(s.marginal.overall))


def fatigue_lead(s: Summary) -> str:
    """The run's one sentence on fatigue: the marginal measure and the noiseless truth, all users."""
    seg, said, truth_text, mark = crossover_rows(s)[0]
    return (f"Fatigue, {seg}: the marginal measure says {said}; the truth (no noise) says {truth_text} "
            + LEAD_MARKS[mark])


# "they disagree" only where the measure says something the truth rules out; a measure that
# has not decided is not wrong (issue 31: the first run says only what it knows)
LEAD_MARKS = {"✓": "✓", "–": "– (the measure has not decided; nothing it says rules the truth out)",
              "✗": "✗ (they disagree)"}


def comparison(governed: Summary, off: Summary) -> tuple[Table, bool]:
    """Governed vs governor off, side by side; True when the governed run did better on both."""
    table = Table(title=f"Governed vs governor off (same story, seed {governed.seed})", title_justify="left",
                  title_style="bold")
    table.add_column("")
    table.add_column("governed", justify="right")
    table.add_column("governor off", justify="right")
    gm, gp, gx = governed.weekly
    om, op, ox = off.weekly
    rows = (
        ("messages handed to gov", _n(governed.messages_sent), _n(off.messages_sent)),
        ("messages delivered", _n(governed.total.delivered), _n(off.total.delivered)),
        (f"sends per user {governed.rate_name}: median", f"{gm:.1f}", f"{om:.1f}"),
        (f"sends per user {governed.rate_name}: p90", f"{gp:.1f}", f"{op:.1f}"),
        (f"sends per user {governed.rate_name}: max", f"{gx:.1f}", f"{ox:.1f}"),
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
#
# The page is gov.analytics.html.render of templates/simulate.html.j2 (autoescaped): this
# part computes what it shows (formatted cells, chart geometry) and writes no markup.

DISPOSITION_KEYS = ("sent", "released", "summaries", "collapsed", "dropped", "expired", "held")
DISPOSITION_COLORS = {
    "sent": "#2e7d32", "released": "#66bb6a", "summaries": "#1e88e5", "collapsed": "#90caf9",
    "dropped": "#e53935", "expired": "#fb8c00", "held": "#9e9e9e",
}
TIER_COLORS = ("#c62828", "#1565c0", "#2e7d32", "#6a1b9a", "#ef6c00", "#00838f")
RUN_COLORS = ("#1565c0", "#e53935")


@dataclass(frozen=True)
class Bar:
    """One rectangle of a bar chart, its tooltip in ``title``."""

    key: str
    x: str
    y: str
    width: str
    height: str
    color: str
    title: str


@dataclass(frozen=True)
class Swatch:
    """One legend entry: a colour square and its name."""

    name: str
    color: str
    x: str
    y: str
    text_x: str
    text_y: str


@dataclass(frozen=True)
class BarChart:
    """The geometry of one bar chart (grouped or stacked); ``templates/_bars.svg.j2`` draws it."""

    series: str
    title: str
    x_label: str
    bars: tuple[Bar, ...]
    y_ticks: tuple[Tick, ...]
    x_ticks: tuple[Tick, ...]
    legend: tuple[Swatch, ...]
    width: int
    height: int
    left: int
    top: int
    right_px: int
    bottom_px: int

    @property
    def mid_x(self) -> str:
        return f"{self.left + (self.right_px - self.left) / 2:.1f}"


@dataclass(frozen=True)
class _Frame:
    """A bar chart's canvas: a y axis from 0 to a round top at or above ``y_max``."""

    y_max: float
    width: int = 560
    height: int = 300
    left: int = 56
    right: int = 16
    top: int = 32
    bottom: int = 48

    @property
    def y_top(self) -> float:
        return nice_top(max(self.y_max, 1.0))

    @property
    def plot_w(self) -> float:
        return self.width - self.left - self.right

    def y(self, value: float) -> float:
        plot_h = self.height - self.top - self.bottom
        return self.top + plot_h - value / self.y_top * plot_h

    def bar(self, key: str, x: float, width: float, base: float, value: float, color: str, title: str) -> Bar:
        y0, y1 = self.y(base), self.y(base + value)
        return Bar(key, f"{x:.1f}", f"{y1:.1f}", f"{width:.1f}", f"{y0 - y1:.1f}", color, title)

    def chart(self, series: str, title: str, x_label: str, bars: Sequence[Bar],
              x_ticks: Sequence[tuple[float, str]], legend: Sequence[tuple[str, str]]) -> BarChart:
        y_ticks = tuple(
            Tick(label=f"{self.y_top * i / 4:,.4g}", y=f"{self.y(self.y_top * i / 4):.1f}",
                 label_y=f"{self.y(self.y_top * i / 4) + 4:.1f}")
            for i in range(5)
        )
        right_px = self.width - self.right
        swatches = tuple(
            Swatch(name, color, x=f"{right_px - 18}", y=f"{self.top - 4 + 14 * i}", text_x=f"{right_px - 22}",
                   text_y=f"{self.top + 5 + 14 * i}")
            for i, (name, color) in enumerate(legend)
        )
        return BarChart(
            series=series, title=title, x_label=x_label, bars=tuple(bars), y_ticks=y_ticks,
            x_ticks=tuple(Tick(label=label, x=f"{x:.1f}") for x, label in x_ticks), legend=swatches,
            width=self.width, height=self.height, left=self.left, top=self.top, right_px=right_px,
            bottom_px=round(self.y(0)),
        )


def _histogram(runs: Sequence[Summary]) -> BarChart:
    """Users by sends per week, one bar per run in each bin."""
    rates = [[r.per_week(n) for n in r.sends_per_user] for r in runs]
    high = max((max(x) for x in rates if x), default=1.0)
    width = max(1, int(nice_top(high / 12)))
    bins = int(high // width) + 1
    counts = [[0] * bins for _ in runs]
    for i, xs in enumerate(rates):
        for x in xs:
            counts[i][min(int(x // width), bins - 1)] += 1
    frame = _Frame(max(max(c) for c in counts))
    slot = frame.plot_w / bins
    bar = slot * 0.8 / len(runs)
    bars = [
        frame.bar(f"{b * width}", frame.left + b * slot + slot * 0.1 + i * bar, bar, 0, counts[i][b],
                  RUN_COLORS[i % 2],
                  f"{runs[i].label}: {counts[i][b]} users with {b * width}–{(b + 1) * width} {runs[i].rate_name}")
        for b in range(bins) for i in range(len(runs))
    ]
    ticks = [(frame.left + (b + 0.5) * slot, f"{b * width}") for b in range(bins) if bins <= 16 or b % 2 == 0]
    return frame.chart("sends_per_week", f"Users by sends {runs[0].rate_name}",
                       f"sends per user {runs[0].rate_name} (bin start)", bars,
                       ticks, [(r.label, RUN_COLORS[i % 2]) for i, r in enumerate(runs)])


def _dispositions(s: Summary) -> BarChart:
    """One stacked bar per tier: what became of its messages."""
    frame = _Frame(max((r.messages for r in s.by_tier), default=1))
    slot = frame.plot_w / max(1, len(s.by_tier))
    bars, ticks = [], []
    for i, r in enumerate(s.by_tier):
        base = 0.0
        x = frame.left + i * slot + slot * 0.2
        for k in DISPOSITION_KEYS:
            # a summary is one of the collapsed messages: draw it apart from the rest
            v = getattr(r, k) - (r.summaries if k == "collapsed" else 0)
            if v <= 0:
                continue
            bars.append(frame.bar(r.key, x, slot * 0.6, base, v, DISPOSITION_COLORS[k],
                                  f"{r.key} {HEADERS[k]}: {v:,}"))
            base += v
        ticks.append((x + slot * 0.3, r.key))
    return frame.chart("dispositions", f"What became of each tier's messages ({s.label})", "tier", bars, ticks,
                       [(HEADERS[k], DISPOSITION_COLORS[k]) for k in DISPOSITION_KEYS])


def _daily(s: Summary) -> BarChart:
    """Messages delivered per simulated day, stacked by tier."""
    days = sorted({d for d, _, _ in s.daily})
    tiers = sorted({t for _, t, _ in s.daily})
    totals = {d: sum(n for dd, _, n in s.daily if dd == d) for d in days}
    frame = _Frame(max(totals.values(), default=1), width=640)
    slot = frame.plot_w / max(1, len(days))
    bars, ticks = [], []
    for i, d in enumerate(days):
        base = 0
        x = frame.left + i * slot + slot * 0.15
        for j, t in enumerate(tiers):
            v = next((n for dd, tt, n in s.daily if dd == d and tt == t), 0)
            if not v:
                continue
            bars.append(frame.bar(f"{d:%Y-%m-%d}", x, slot * 0.7, base, v, TIER_COLORS[j % len(TIER_COLORS)],
                                  f"{d:%a %d %b} {t}: {v:,}"))
            base += v
        ticks.append((x + slot * 0.35, f"{d:%a}"[:2]))
    return frame.chart("daily", f"Messages delivered per day ({s.label})", "simulated day (UTC)", bars, ticks,
                       [(t, TIER_COLORS[j % len(TIER_COLORS)]) for j, t in enumerate(tiers)])


def _fatigue_charts(s: Summary) -> list[Chart]:
    """Click-through and unsubscribe rate by send-volume bucket, the crossover marked
    (gov.analytics.report's line charts, as on ``gov report fatigue --html``)."""
    rows = s.fatigue.rows
    return [
        line_chart(series, f"{title} ({s.label})", color, [(r.bucket, getattr(r, series)) for r in rows],
                   x_range=(1, TOP_BUCKET), x_labels={TOP_BUCKET: f"{TOP_BUCKET}+"}, x_name="bucket",
                   x_label="sends received in the last 7 days (bucket)", crossover=confirmed_bucket(s))
        for series, title, color in (("ctr", "Click-through rate", CTR_COLOR),
                                     ("unsubscribe_rate", "Unsubscribe rate", UNSUBSCRIBE_COLOR))
    ]


def _percent(value: Any, digits: int = 2) -> str:
    return "–" if value is None else f"{float(value) * 100:.{digits}f}%"


def _interval(low: Any, high: Any) -> str:
    return f"{float(low) * 100:.2f}–{float(high) * 100:.2f}%"


def _marginal_context(s: Summary) -> dict[str, Any] | None:
    """The marginal measure's overall groups and its crossover per segment beside the truth's."""
    if s.marginal is None:
        return None
    overall = s.marginal.overall
    return {
        "lead": fatigue_lead(s),
        "title": f"Marginal fatigue, {segment_title(overall.segment)}: {overall.verdict_text()}",
        "header": ("position", "sends", "clicks", "unsubscribes", "click rate", "95% interval", "unsubscribe rate",
                   "95% interval", "crossover"),
        "rows": [
            {"crossover": r.position_from == overall.crossover_position, "cells": (
                r.label, f"{r.sends:,}", f"{r.clicks:,}", f"{r.unsubscribes:,}", _percent(r.click_rate),
                _interval(r.click_low, r.click_high), _percent(r.unsubscribe_rate),
                _interval(r.unsubscribe_low, r.unsubscribe_high),
                "◀ crossover" if r.position_from == overall.crossover_position else "")}
            for r in overall.rows
        ],
        "crossover_title": crossover_title(s),
        "crossover_header": CROSSOVER_HEADERS,
        "crossovers": [{"segment": seg, "measure": said, "truth": truth_text, "mark": mark}
                       for seg, said, truth_text, mark in crossover_rows(s)],
    }


def _run_context(s: Summary) -> dict[str, Any]:
    """What the page shows of one run."""
    median, p90, top = s.weekly
    e = s.exempt
    fatigue = s.fatigue is not None and bool(s.fatigue.rows)
    return {
        "title": s.label.capitalize(),
        "header": tuple(HEADERS[c] for c in COLUMNS),
        "tiers": [(r.key, *(f"{getattr(r, c):,}" for c in COLUMNS)) for r in s.by_tier],
        "teams": [(r.key, *(f"{getattr(r, c):,}" for c in COLUMNS)) for r in s.by_team],
        "exempt_ok": e.ok,
        "exempt": f"P0: {e.messages:,} messages, {e.all_delivered:,} delivered to every endpoint, "
                  f"{e.suppressed:,} suppressed {'✓' if e.ok else '✗'}",
        "collapse": [
            {"text": line.plain, "ok": line.style == "green"} for line in [*collapse_lines(s), *expired_lines(s)]
        ],
        "blocking": [(r, t, a, f"{n:,}") for r, t, a, n in s.blocking],
        "blocking_note": BLOCKING_NOTE if any(":" in a for _, _, a, _ in s.blocking) else None,
        "sends": f"Sends per user {s.rate_name}: median {median:.1f}, p90 {p90:.1f}, max {top:.1f}. "
                 f"{s.unsubscribed:,} users unsubscribed. The push service received {s.push_requests:,} requests "
                 f"and verified, decrypted and accepted {s.push_decrypted:,}.",
        "engagement": f"Engagement: {engagement_text(s)}.",
        "bar_charts": [_dispositions(s), _daily(s)],
        "line_charts": _fatigue_charts(s) if fatigue else [],
        "fatigue_available": s.fatigue is not None,
        "fatigue_verdict": fatigue_verdict(s) if fatigue else None,
        "fatigue_title": SEEDS_VIEW_TITLE,
        "fatigue_header": ("bucket", "subscribers", "accepted", "clicks", "unsubscribes", "CTR", "unsubscribe rate",
                           "crossover"),
        "fatigue_rows": [
            {"crossover": r.crossover, "cells": (
                r.label, f"{r.subscribers:,}", f"{r.accepted:,}", f"{r.clicks:,}", f"{r.unsubscribes:,}",
                _percent(r.ctr, 1), _percent(r.unsubscribe_rate), "◀" if r.crossover else "")}
            for r in (seeds_view(s).rows if fatigue else ())
        ],
        "realised_title": REALISED_TITLE,
        "realised": [(label, f"{n:,}", _share(c, n), _share(u, n)) for label, n, c, u in realised(s)],
        "realised_note": REALISED_NOTE,
        "marginal": _marginal_context(s),
    }


def to_html(governed: Summary, off: Summary | None = None, versus: Summary | None = None) -> str:
    """The summary as one self-contained page: inline SVG, inline CSS, no script, nothing fetched.

    ``off``: the same story with the governor off; ``versus``: under another policy (the
    baseline of ``--policy FILE --compare``), compared as the terminal compares them.
    """
    runs = [governed] + [r for r in (off, versus) if r is not None]
    compare = None
    if versus is not None:
        verdict = policy_verdict(governed, versus)
        compare = {
            "title": policy_title(governed, versus),
            "columns": ("", governed.policy_name, versus.policy_name),
            "rows": policy_rows(governed, versus),
            "better": verdict.style == "bold green",
            "verdict": verdict.plain,
        }
    elif off is not None:
        gm, gp, gx = governed.weekly
        om, op, ox = off.weekly
        compare = {
            "title": f"Governed vs governor off (same story, seed {governed.seed})",
            "columns": ("", "governed", "governor off"),
            "rows": [
                ("messages handed to gov", f"{governed.messages_sent:,}", f"{off.messages_sent:,}"),
                ("messages delivered", f"{governed.total.delivered:,}", f"{off.total.delivered:,}"),
                (f"sends per user {governed.rate_name}: median", f"{gm:.1f}", f"{om:.1f}"),
                (f"sends per user {governed.rate_name}: p90", f"{gp:.1f}", f"{op:.1f}"),
                (f"sends per user {governed.rate_name}: max", f"{gx:.1f}", f"{ox:.1f}"),
                ("clicks", f"{governed.event_messages('click'):,}", f"{off.event_messages('click'):,}"),
                ("users unsubscribed", f"{governed.unsubscribed:,}", f"{off.unsubscribed:,}"),
            ],
            "better": comparison(governed, off)[1],
            "verdict": compare_verdict(governed, off).plain,
        }
    return render_template(
        "simulate.html.j2", package="gov.lab.simulate",
        headline=headline(governed), compare=compare, histogram=_histogram(runs),
        runs=[_run_context(s) for s in runs],
    )
