"""`gov simulate --html` renders through autoescaped templates: whatever a run's names
hold (a policy file's name, a tier, a rule, a segment) reaches the page as text."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from gov.analytics.marginal import CROSSOVER, MarginalReport, MarginalRow, SegmentMeasure
from gov.analytics.report import BucketRow, FatigueReport
from gov.lab.simulate.summary import Exempt, Row, Summary, to_html

HOSTILE = '<script>alert("x")</script>'
SEGMENT = "<img onerror=alert(1)>"


def _measure(segment: str) -> SegmentMeasure:
    rows = tuple(
        MarginalRow(segment, i, i, i, 1000, clicks, unsubs, Decimal(clicks) / 1000, Decimal("0.01"),
                    Decimal("0.05"), Decimal(unsubs) / 1000, Decimal("0.001"), Decimal("0.02"),
                    Decimal("0.001") if i == 2 else Decimal("-0.01"), i == 2, CROSSOVER, None)
        for i, (clicks, unsubs) in enumerate(((30, 2), (20, 10), (8, 25)))
    )
    return SegmentMeasure(segment, rows)


def _summary(label: str, policy: str) -> Summary:
    start = datetime(2026, 3, 3, tzinfo=UTC)
    return Summary(
        label=label, users=10, days=7, seed=1, policy_name=policy, start=start,
        by_tier=(Row("P2", messages=20, sent=12, dropped=8, delivered=12), Row(HOSTILE, messages=3, sent=3)),
        by_team=(Row(HOSTILE, messages=23, sent=15),),
        exempt=Exempt(messages=4, allowed=4, all_delivered=4, no_endpoint=0, suppressed=0),
        blocking=((HOSTILE, "P2", "drop", 8),),
        sends_per_user=(1, 2, 2, 3, 5, 8, 9, 12, 14, 20),
        daily=((date(2026, 3, 3), "P2", 7), (date(2026, 3, 3), HOSTILE, 2), (date(2026, 3, 4), "P2", 5)),
        attempts=(("accepted", 15),),
        events=(("display", 15, 9), ("click", 4, 3), ("unsubscribe", 1, 1)),
        events_available=True, unsubscribed=1, messages_sent=27, push_requests=15, push_decrypted=15,
        fatigue=FatigueReport(timedelta(days=7), start + timedelta(days=7), None, tuple(
            BucketRow(b, 5, 5 * b, 5 * b, 6 - b, 0, b // 3, Decimal(6 - b) / (5 * b), Decimal(b // 3) / 5,
                      Decimal(1), None, b == 3)
            for b in range(1, 5)
        )),
        curve=((0, 100, 10, 1), (4, 80, 4, 6)),
        marginal=MarginalReport(timedelta(days=7), start + timedelta(days=7), 800,
                                (_measure("*"), _measure(SEGMENT))),
        truth_positions=((SEGMENT, 0, 1000, 30.0, 2.0), (SEGMENT, 1, 1000, 20.0, 10.0), (SEGMENT, 2, 1000, 8.0, 25.0)),
    )


def test_hostile_names_are_escaped_on_the_page() -> None:
    page = to_html(_summary("governed", f"policy {HOSTILE}.toml"), _summary("governor off", "default policy"))
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page and "<img" not in page  # nothing a name holds becomes markup
    escaped = "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;"
    assert f"<h1>gov simulate · governed · policy {escaped}.toml" in page
    assert f"<td>{escaped}</td>" in page  # a tier, a team, a blocking rule
    assert '<tr data-segment="&lt;img onerror=alert(1)&gt;" data-agree="yes"><td>&lt;img onerror' in page


def test_the_page_shows_each_run_with_its_charts_and_crossovers() -> None:
    page = to_html(_summary("governed", "default policy"), _summary("governor off", "default policy"))
    charts = re.findall(r'<svg [^>]*data-chart="([^"]+)"', page)
    assert charts == ["sends_per_week", *(["dispositions", "daily", "ctr", "unsubscribe_rate"] * 2)]
    assert "<h2>Governed vs governor off (same story, seed 1)</h2>" in page and "<h2>Governed</h2>" in page
    assert '<g class="crossover" data-bucket="3">' in page  # the volume report's crossover, on both line charts
    assert "Marginal fatigue, all users: crossover at or before position 2 (confirmed" in page
    assert "Crossover by send position: the fatigue measure vs the simulated users&#39; truth (tolerance 1)" in page
    # the measure's crossover per segment beside the truth's, everyone first
    assert re.findall(r'<tr data-segment="([^"]+)" data-agree="(\w+)">', page)[:2] == [
        ("all users", "yes"), ("&lt;img onerror=alert(1)&gt;", "yes")]
    assert re.search(r"<td>crossover at or before position 2 \(confirmed[^<]*</td>"
                     r"<td>crossover at position 2</td>", page)
