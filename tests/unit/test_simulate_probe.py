"""What runs with settings no test used found in `gov simulate`'s summary (stop 41): a run
shorter than a week printed its users' sends scaled up to a week (one user's two sends in
a day read "14 a week"), and `--policy FILE --compare --html` left the comparison, the
verdict and the baseline's run out of the page."""

from __future__ import annotations

import io
from dataclasses import replace

from rich.console import Console

from gov.lab.simulate.summary import Row, Summary, expired_lines, render, to_html
from gov.lab.simulate.versus import policy_comparison
from tests.unit.test_simulate_html import _summary


def _text(renderable: object) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(renderable)
    return " ".join(console.export_text().split())


def test_a_run_shorter_than_a_week_counts_sends_over_its_days_not_per_week() -> None:
    short = replace(_summary("governed", "default policy"), days=1, sends_per_user=(2,))
    assert short.weekly == (2, 2, 2)
    text = _text(render(short))
    assert "Sends per user in 1 day: median 2.0 · p90 2.0 · max 2.0" in text and "per week" not in text
    assert "Sends per user in 1 day: median 2.0" in to_html(short)
    week = replace(_summary("governed", "default policy"), days=14, sends_per_user=(2,))
    assert week.weekly == (1, 1, 1)  # two sends in two weeks: one a week
    assert "Sends per user per week: median 1.0" in _text(render(week))


def _policies() -> tuple[Summary, Summary]:
    candidate = replace(_summary("policy mine.toml", "policy mine.toml"), unsubscribed=2)
    baseline = replace(_summary("default policy", "default policy"), unsubscribed=4)
    return candidate, baseline


def test_the_page_of_a_policy_comparison_shows_what_the_terminal_shows() -> None:
    candidate, baseline = _policies()
    page = to_html(candidate, versus=baseline)
    assert "policy mine.toml vs default policy (same story, seed 1)" in page
    terminal = _text(policy_comparison(candidate, baseline))
    for row in ("users unsubscribed", "clicks minus unsubscribes", "clicks per delivered non-P0 message"):
        assert row in page and row in terminal
    assert "did better than default policy" in page or "did not do better than default policy" in page
    assert page.count('<section class="run">') == 2  # and the baseline's run, for a closer look


def test_every_expired_count_is_named_for_what_it_counts_and_adds_up_to_the_tier_table() -> None:
    """Seed 7, 400 users x 6 days: the summary said "P1 expired (TTL): 7" beside the tier
    table's 21, and "cap_86400000ms P1 drop 13" for 13 of the 14 defer_expired messages,
    which it never named."""
    s = replace(
        _summary("governed", "default policy"),
        by_tier=(Row("P1", messages=966, sent=615, released=328, expired=21, held=2, delivered=943),),
        blocking=(("cap_86400000ms", "P1", "drop: defer_expired", 13),),
        expired_split=(("P1", 7, 0),),
        expired_outcomes=(("P1", "defer_expired", 14, 13), ("P1", "ttl_expired", 7, 1)),
    )
    text = _text(render(s))
    assert ("P1 expired while held: 21 = 14 defer_expired (waiting would pass defer_max) + 7 ttl_expired "
            "(waiting would pass the TTL: 7 no slot opened before it, 0 a slot went to a later deadline); "
            '14 of them at their decision ("drop: …" in the blocking rules)') in text
    assert "expired (TTL)" not in text
    assert "drop: defer_expired" in text and "counted under \"expired\" in the per-tier table" in text
    page = to_html(s)
    assert "P1 expired while held: 21 = 14 defer_expired" in page and "logged as drops" in page
    # each tier's line adds up to the tier table's "expired"
    for line in expired_lines(s):
        tier = line.plain.split(" ", 1)[0]
        total = int(line.plain.split(": ", 1)[1].split(" ", 1)[0])
        assert total == next(r.expired for r in s.by_tier if r.key == tier)


def test_a_comparison_pairs_each_delivered_message_with_itself_by_what_the_timing_did() -> None:
    """`--policy F --compare` with [timing] on: the messages the timing moved are compared
    with the same messages (user and id) in the baseline's run, those delivered in both only."""
    from gov.lab.simulate.versus import paired_by_timing, policy_rows

    candidate = replace(_summary("timing", "policy timing.toml"), delivered_non_p0=(
        ("a", "m1", "best", True), ("b", "m1", "best", False), ("c", "m1", "best", True),  # c: not in the baseline
        ("d", "m2", "explore", False), ("e", "m3", None, True), ("f", "m3", None, False),
    ))
    baseline = replace(_summary("default", "default policy"), delivered_non_p0=(
        ("a", "m1", None, False), ("b", "m1", None, True), ("b", "m9", None, True),
        ("d", "m2", None, False), ("e", "m3", None, True), ("f", "m3", None, True), ("g", "m1", None, True),
    ))
    best, explore, control = paired_by_timing(candidate, baseline)
    assert (best.messages, best.both, best.only_candidate, best.only_baseline) == (2, 0, 1, 1)
    assert best.rates == (0.5, 0.5) and best.p_value == 1.0
    assert (explore.messages, explore.rates) == (1, (0.0, 0.0))
    assert (control.messages, control.both, control.only_baseline, control.rates) == (2, 1, 1, (0.5, 1.0))
    rows = {name: (mine, theirs) for name, mine, theirs in policy_rows(candidate, baseline)}
    key = "the same messages in both runs, moved to the best hour: 2, clicks per delivered"
    assert rows[key] == ("50.00% (×1.00, p 1)", "50.00%")
    # nothing moved (timing off in both): no such rows
    still = replace(candidate, delivered_non_p0=(("e", "m3", None, True),))
    assert paired_by_timing(still, baseline) == []
    assert not any(name.startswith("the same messages") for name, _, _ in policy_rows(still, baseline))


def test_the_paired_test_of_a_lift_is_mcnemar_s_exact_two_sided_one() -> None:
    from gov.lab.simulate.versus import Paired

    # 10 messages clicked with the candidate only, 2 with the baseline only: P(X <= 2 | 12, 1/2) = 79/4096
    assert abs(Paired("x", 40, 5, 10, 2).p_value - 2 * 79 / 4096) < 1e-12
    assert Paired("x", 40, 5, 2, 10).p_value == Paired("x", 40, 5, 10, 2).p_value
    assert Paired("x", 40, 5, 0, 0).p_value == 1.0
