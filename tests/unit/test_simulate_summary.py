"""`gov simulate`'s summary says only what it knows (issue 31, item 2): it leads with the
marginal measure beside the noiseless truth, shows the seeds' volume buckets without a
crossover verdict of their own (one only where the measure confirms it), and shows the
dice's realised outcomes as counts, with no verdict and not called the truth; in the
terminal and on the HTML page alike."""

from __future__ import annotations

import io
import re
from dataclasses import replace

from rich.console import Console

from gov.analytics.crossover import CrossoverEstimate
from gov.analytics.marginal import NOT_ENOUGH_DATA, NOT_REACHED, MarginalReport, SegmentMeasure
from gov.lab.simulate.summary import Summary, confirmed_bucket, render, to_html
from tests.unit.test_simulate_html import _measure, _summary


def _text(s: Summary) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(render(s))
    return console.export_text()


def _not_reached(s: Summary) -> Summary:
    """``s`` with the marginal measure finding no crossover, while the buckets' rates still cross."""
    def flat(segment: str) -> SegmentMeasure:
        return SegmentMeasure(segment, tuple(replace(r, crossover=False, verdict=NOT_REACHED)
                                             for r in _measure(segment).rows), CrossoverEstimate(NOT_REACHED))

    assert s.marginal is not None
    segments = tuple(flat(m.segment) for m in s.marginal.segments)
    return replace(s, marginal=MarginalReport(s.marginal.since, s.marginal.now, s.marginal.min_events, segments),
                   truth_positions=tuple((seg, pos, n, c, 0.0) for seg, pos, n, c, _ in s.truth_positions))


def _undecided(s: Summary, low: int) -> Summary:
    """``s`` with the marginal measure not decided, its confirmed lower end at ``low``."""
    def open_(segment: str) -> SegmentMeasure:
        return SegmentMeasure(segment, tuple(replace(r, crossover=False, verdict=NOT_ENOUGH_DATA)
                                             for r in _measure(segment).rows),
                              CrossoverEstimate(NOT_ENOUGH_DATA, None, low, None, 2, None, 120))

    assert s.marginal is not None
    segments = tuple(open_(m.segment) for m in s.marginal.segments)
    return replace(s, marginal=MarginalReport(s.marginal.since, s.marginal.now, s.marginal.min_events, segments))


def test_a_measure_that_has_not_decided_is_not_said_to_disagree_with_the_truth() -> None:
    s = _summary("governed", "default policy")  # the truth crosses at position 2
    text = " ".join(_text(_undecided(s, 2)).split())  # "it is after position 1": the truth may well be at 2
    assert ("the truth (no noise) says crossover at position 2 – (the measure has not decided; "
            "nothing it says rules the truth out)") in text
    assert "disagree" not in text
    assert 'data-agree="undecided"' in to_html(_undecided(s, 2)) and "disagree" not in to_html(_undecided(s, 2))
    # a lower end past the truth's position says something the truth rules out
    contradicted = " ".join(_text(_undecided(s, 3)).split())
    assert "the truth (no noise) says crossover at position 2 ✗ (they disagree)" in contradicted


def test_the_summary_leads_with_the_measure_and_the_truth() -> None:
    text = _text(_summary("governed", "default policy"))
    lead = text.index("Fatigue, all users: the marginal measure says crossover at or before position 2 (confirmed")
    assert lead < text.index("Crossover by send position") < text.index("The seeds' view")
    assert text.index("The seeds' view") < text.index("What the dice gave (realised, not the truth)")
    assert "Ground truth" not in text  # "truth" is only the noiseless one


def test_a_bucket_crossover_the_measure_confirms_is_kept() -> None:
    s = _summary("governed", "default policy")
    assert confirmed_bucket(s) == 3  # the buckets cross at 3, the measure at position 2: the same send
    text = _text(s)
    assert "crossover at bucket 3, as the marginal measure finds (crossover at or before position 2" in text
    assert "◀ crossover" in text.split("The seeds' view", 1)[1].split("What the dice gave", 1)[0]


def test_a_bucket_crossover_the_measure_does_not_confirm_is_no_verdict() -> None:
    s = _not_reached(_summary("governed", "default policy"))
    assert s.fatigue.crossover_bucket == 3 and confirmed_bucket(s) is None
    text = _text(s)
    assert "the marginal measure says not reached; the truth (no noise) says not reached ✓" in text
    seeds = text.split("The seeds' view", 1)[1].split("What the dice gave", 1)[0]
    assert "◀" not in seeds and "crossover at bucket" not in seeds
    assert "no verdict from the buckets: their rates cross at bucket 3, but the marginal measure: not reached" in seeds
    page = to_html(s)
    assert 'class="crossover"' not in page.split("The seeds&#39; view", 1)[1].split("What the dice gave", 1)[0]
    assert '<g class="crossover"' not in page  # no crossover drawn on the bucket charts either
    assert "no verdict from the buckets" in page and "Crossover from" not in page


def test_the_realised_outcomes_are_counts_without_a_verdict() -> None:
    s = _summary("governed", "default policy")  # curve: 100 sends at volume 0 (10 clicks, 1 unsub), 80 at 4
    text = _text(s)
    realised = text.split("What the dice gave", 1)[1]
    assert re.search(r"0–2 │\s+100 │\s+10 \(10\.00%\) │\s+1 \(1\.00%\)", realised), realised
    assert re.search(r"3–5 │\s+80 │\s+4 \(5\.00%\) │\s+6 \(7\.50%\)", realised), realised
    assert "no verdict from them" in realised and "crossover" not in realised.replace("crossover table", "")
    page = to_html(s)
    assert "<td>3–5</td><td>80</td><td>4 (5.00%)</td><td>6 (7.50%)</td>" in page
    # the page's order is the terminal's: the measure and the truth, the seeds' view, the dice
    assert page.index('class="verdict lead"') < page.index("The seeds&#39; view") < page.index("What the dice gave")


def test_the_collapse_line_splits_what_it_holds_as_the_tier_table_counts_it() -> None:
    # the per-tier table's "held at end" counts the waiting rows; the collapse line counts
    # every message not yet out, so it says which of them wait and which are folded in
    s = replace(_summary("governed", "default policy"), collapse_split=(("P3", 100, 40, 5, 30, 10, 20),))
    text = " ".join(_text(s).split())
    assert "P3 (collapse): 100 messages: 40 delivered on their own, 5 in delivered summaries, " \
           "30 held at the end (10 waiting, 20 folded into them), 10 expired" in text
