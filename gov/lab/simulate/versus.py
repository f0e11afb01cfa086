"""Two policies on the same story, side by side (`gov simulate --policy FILE --compare`).

Same seed, same users, same planned messages and the same dice for each (common random
numbers): the two runs differ only by what each policy let through (and so by who
unsubscribed, to whom the teams then stop sending), so a difference in unsubscribes or
clicks is the policy's doing. The terminal's table here; the HTML page
(:func:`gov.lab.simulate.summary.to_html`) shows the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:  # summary.py imports this module for its page: only the type from there
    from gov.lab.simulate.summary import Summary


@dataclass(frozen=True)
class Paired:
    """One group of messages delivered in both runs, each compared with itself.

    ``both``, ``only_candidate`` and ``only_baseline`` count the messages clicked in both
    runs, in the candidate's alone and in the baseline's alone (McNemar's table: the
    messages clicked in neither are ``messages`` less the three)."""

    name: str
    messages: int
    both: int
    only_candidate: int
    only_baseline: int

    @property
    def rates(self) -> tuple[float, float]:
        """Clicks per delivered message: in the candidate's run, in the baseline's."""
        n = self.messages or 1
        return (self.both + self.only_candidate) / n, (self.both + self.only_baseline) / n

    @property
    def p_value(self) -> float:
        """Exact two-sided McNemar test of "the candidate's run clicks these messages as often
        as the baseline's": of the messages clicked in one run only, the candidate's share is
        Binomial(discordant, 1/2) under it."""
        from gov.analytics.crossover import binomial_tail

        m = self.only_candidate + self.only_baseline
        low = min(self.only_candidate, self.only_baseline)
        return min(1.0, 2 * binomial_tail(low, m, upper=False))


def paired_by_timing(candidate: Summary, baseline: Summary) -> list[Paired]:
    """The non-P0 messages delivered in both runs, by what the candidate's timing did with
    them: moved to the best hour of the estimate, moved to an exploring hour, or neither
    (sent at once or at the first slot: the control). Both runs plan the same messages
    under the same ids and dice, so a message's two outcomes differ only by what each
    policy did with it (and by who was still subscribed). Empty when nothing was moved."""
    theirs = {(u, m): clicked for u, m, _, clicked in baseline.delivered_non_p0}
    counts: dict[str, list[int]] = {}
    for u, m, moved, clicked in candidate.delivered_non_p0:
        other = theirs.get((u, m))
        if other is None:  # not delivered in the baseline's run: nothing to compare it with
            continue
        c = counts.setdefault(moved or "", [0, 0, 0, 0])
        c[0] += 1
        c[1] += clicked and other
        c[2] += clicked and not other
        c[3] += other and not clicked
    if not counts.get("best") and not counts.get("explore"):
        return []
    names = {"best": "moved to the best hour", "explore": "moved to an exploring hour",
             "": "not moved (the control)"}
    return [Paired(names[k], *counts[k]) for k in ("best", "explore", "") if k in counts]


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
    out = [(name, f"{a:,}" if isinstance(a, int) else a, f"{b:,}" if isinstance(b, int) else b)
           for name, a, b in rows]
    for group in paired_by_timing(candidate, baseline):
        mine, theirs = group.rates
        lift = f" (×{mine / theirs:.2f}, p {group.p_value:.2g})" if theirs else ""
        out.append((f"the same messages in both runs, {group.name}: {group.messages:,}, clicks per delivered",
                    f"{mine:.2%}{lift}", f"{theirs:.2%}"))
    return out


def policy_verdict(candidate: Summary, baseline: Summary) -> Text:
    """Better means fewer unsubscribes and no fewer clicks minus unsubscribes."""
    text = (f"{candidate.unsubscribed:,} vs {baseline.unsubscribed:,} unsubscribes, "
            f"{_net(candidate):,} vs {_net(baseline):,} clicks minus unsubscribes")
    if candidate.unsubscribed < baseline.unsubscribed and _net(candidate) >= _net(baseline):
        return Text(f"{candidate.policy_name} did better than {baseline.policy_name}: {text} ✓", style="bold green")
    return Text(f"{candidate.policy_name} did not do better than {baseline.policy_name}: {text} ✗", style="bold red")
