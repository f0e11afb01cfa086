"""Two policies on the same story, side by side (`gov simulate --policy FILE --compare`).

Same seed, same users, same planned messages and the same dice for each (common random
numbers): the two runs differ only by what each policy let through (and so by who
unsubscribed, to whom the teams then stop sending), so a difference in unsubscribes or
clicks is the policy's doing. The terminal's table here; the HTML page
(:func:`gov.lab.simulate.summary.to_html`) shows the same rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:  # summary.py imports this module for its page: only the type from there
    from gov.lab.simulate.summary import Summary


def _net(s: Summary) -> int:
    return s.event_messages("click") - s.unsubscribed


def policy_comparison(candidate: Summary, baseline: Summary) -> Table:
    """The candidate policy's run beside the baseline's: volume, clicks, unsubscribes."""
    table = Table(title=policy_title(candidate, baseline),
                  title_justify="left", title_style="bold")
    table.add_column("")
    table.add_column(candidate.policy_name, justify="right")
    table.add_column(baseline.policy_name, justify="right")
    for row in policy_rows(candidate, baseline):
        table.add_row(*row)
    return table


def policy_title(candidate: Summary, baseline: Summary) -> str:
    return f"{candidate.policy_name} vs {baseline.policy_name} (same story, seed {candidate.seed})"


def policy_rows(candidate: Summary, baseline: Summary) -> list[tuple[str, str, str]]:
    """The comparison's rows, as the terminal and the HTML page show them."""
    cm, cp, _ = candidate.weekly
    bm, bp, _ = baseline.weekly
    rows = (
        ("messages delivered", candidate.total.delivered, baseline.total.delivered),
        (f"sends per user {candidate.rate_name}: median", f"{cm:.1f}", f"{bm:.1f}"),
        (f"sends per user {candidate.rate_name}: p90", f"{cp:.1f}", f"{bp:.1f}"),
        ("clicks", candidate.event_messages("click"), baseline.event_messages("click")),
        ("clicks per delivered non-P0 message", f"{candidate.click_rate_non_p0:.2%}",
         f"{baseline.click_rate_non_p0:.2%}"),
        ("users unsubscribed", candidate.unsubscribed, baseline.unsubscribed),
        ("clicks minus unsubscribes", _net(candidate), _net(baseline)),
    )
    return [(name, f"{a:,}" if isinstance(a, int) else a, f"{b:,}" if isinstance(b, int) else b)
            for name, a, b in rows]


def policy_verdict(candidate: Summary, baseline: Summary) -> Text:
    """Better means fewer unsubscribes and no fewer clicks minus unsubscribes."""
    text = (f"{candidate.unsubscribed:,} vs {baseline.unsubscribed:,} unsubscribes, "
            f"{_net(candidate):,} vs {_net(baseline):,} clicks minus unsubscribes")
    if candidate.unsubscribed < baseline.unsubscribed and _net(candidate) >= _net(baseline):
        return Text(f"{candidate.policy_name} did better than {baseline.policy_name}: {text} ✓", style="bold green")
    return Text(f"{candidate.policy_name} did not do better than {baseline.policy_name}: {text} ✗", style="bold red")
