"""Where a send starts costing more than it earns: the monotone crossover and its rule.

Input, per set of users (everyone, or one segment): per send *position* (the sends the
user had received in the 7 days before), the sends, the clicks they drew and the
unsubscribes charged to them (:class:`Counts`, from ``gov.fatigue_marginal_v1`` with groups
of one send). Three separate pieces, each with its own job (docs/analysts.md):

* **The curve** (:func:`fit`): clicks per send are fitted non-increasing and unsubscribes
  per send non-decreasing in position by weighted isotonic regression
  (pool-adjacent-violators, :func:`pava`, weighted by sends). A segment's raw rates are
  first shrunk toward the overall curve, scaled to the segment's own level, with
  empirical-Bayes pseudo-sends (:func:`shrink`): many where the segment's own data is thin
  or agrees with that shape, few where its own sends are many and say otherwise. The
  fitted curve gives the point estimate of the crossover and the sends still needed; it
  never confirms anything.
* **The rule** (:func:`confirm_down`): the crossover is *declared* only where the
  segment's own counts confirm it. Groups of positions (single positions where they hold
  ``min_events`` clicks and unsubscribes, merged from the top down where they are thin)
  are tested in a fixed order, highest first, each one-sided at 5 %:
  "this group earns at least as many clicks as it costs unsubscribes", by the exact
  conditional (sign) test on its clicks and unsubscribes. The walk stops at the first
  group that is not rejected; the declared crossover is the last position of the lowest
  rejected group. A fixed-sequence procedure keeps the chance of rejecting any true
  hypothesis at 5 % over the whole curve, and a declaration before the true crossover
  needs one; so the chance of declaring a crossover before the true one is at most 5 %,
  whatever the shape of the curve.
* **The interval**: from the declared position (the latest the crossover can be, 95 %)
  down to the lower end found by the mirror walk (:func:`confirm_up`: from position 0
  upward, "this group costs at least what it earns", stopping at the first group not
  rejected): the crossover is after every group that walk confirmed, if the curves are
  monotone. Jointly a 90 % interval.

Nothing here reads the database: the same functions serve ``gov report fatigue``,
``gov policy suggest``, ``gov simulate`` and its ``--grid`` calibration, and the tests.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

ALPHA = 0.05  # each end's one-sided error: the chance of a crossover declared before the true one
DEFAULT_MIN_EVENTS = 20  # clicks + unsubscribes a tested group must hold (thin positions are merged until they do)
PSEUDO_MAX = 1_000_000.0  # the most pseudo-sends a segment's position can borrow from the overall curve
OVERALL = "*"
CROSSOVER = "crossover"
NOT_REACHED = "not reached"
NOT_ENOUGH_DATA = "not enough data"
NO_MORE_SENDS = "more data would not decide it at these rates"


@dataclass(frozen=True)
class Counts:
    """One position of one set of users."""

    position: int
    sends: int
    clicks: int
    unsubscribes: int


# ---------------------------------------------------------------- monotone fitting


def pava(values: Sequence[float], weights: Sequence[float], *, increasing: bool = True) -> list[float]:
    """Weighted isotonic regression by pool-adjacent-violators: the non-decreasing (or, with
    ``increasing=False``, non-increasing) sequence closest to ``values`` in weighted least
    squares. Adjacent values that violate the order are pooled into their weighted mean
    until none does. A weight of 0 takes no part but is given its block's value."""
    if len(values) != len(weights):
        raise ValueError("one weight per value")
    if any(w < 0 for w in weights):
        raise ValueError("weights must not be negative")
    sign = 1.0 if increasing else -1.0
    blocks: list[list[float]] = []  # [mean (signed), weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([sign * v, float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks[-1]
            total = w1 + w2
            blocks[-1] = [(m1 * w1 + m2 * w2) / total if total > 0 else (m1 + m2) / 2, total, n1 + n2]
    out: list[float] = []
    for mean, _, n in blocks:
        out.extend([sign * mean] * int(n))
    return out


def _pseudo_sends(counts: Sequence[int], sends: Sequence[int], prior: Sequence[float]) -> float:
    """Empirical-Bayes pseudo-sends per position (a beta-binomial concentration by moments):
    how far the segment's raw rates stray from ``prior`` beyond what binomial noise
    explains. No excess spread: the most (PSEUDO_MAX); a lot: few."""
    used = [(k, n, min(max(p, 1e-6), 1 - 1e-6)) for k, n, p in zip(counts, sends, prior, strict=True) if n > 0]
    if not used:
        return PSEUDO_MAX
    # Pearson's statistic against the prior; under "the segment is the prior" it is about len(used)
    spread = sum((k - n * p) ** 2 / (n * p * (1 - p)) for k, n, p in used)
    excess = spread - len(used)
    if excess <= 0:
        return PSEUDO_MAX
    # E[spread] = sum(1 + (n - 1) / (a + 1)) for a beta prior of concentration a
    a = sum(n - 1 for _, n, _ in used) / excess - 1
    return min(max(a, 0.0), PSEUDO_MAX)


def shrink(own: Sequence[Counts], overall: Mapping[int, tuple[float, float]]) -> tuple[list[float], list[float],
                                                                                     float, float]:
    """A segment's click and unsubscribe rates per position shrunk toward ``overall``
    (position -> fitted (click rate, unsubscribe rate) of everyone), scaled to the
    segment's own level. Returns (click rates, unsubscribe rates, pseudo-sends for clicks,
    pseudo-sends for unsubscribes)."""
    sends = [c.sends for c in own]
    shape_c = [overall.get(c.position, (0.0, 0.0))[0] for c in own]
    shape_u = [overall.get(c.position, (0.0, 0.0))[1] for c in own]

    def level(events: Sequence[int], shape: Sequence[float]) -> list[float]:
        expected = sum(n * p for n, p in zip(sends, shape, strict=True))
        ratio = sum(events) / expected if expected > 0 else 1.0
        return [min(ratio * p, 1.0) for p in shape]

    prior_c = level([c.clicks for c in own], shape_c)
    prior_u = level([c.unsubscribes for c in own], shape_u)
    a_c = _pseudo_sends([c.clicks for c in own], sends, prior_c)
    a_u = _pseudo_sends([c.unsubscribes for c in own], sends, prior_u)
    clicks = [(c.clicks + a_c * p) / (c.sends + a_c) if c.sends + a_c > 0 else p for c, p in zip(own, prior_c,
                                                                                                strict=True)]
    unsubs = [(c.unsubscribes + a_u * p) / (c.sends + a_u) if c.sends + a_u > 0 else p for c, p in zip(own, prior_u,
                                                                                                      strict=True)]
    return clicks, unsubs, a_c, a_u


@dataclass(frozen=True)
class Fit:
    """The monotone curve of one set of users, position by position."""

    positions: tuple[int, ...]
    click_rate: tuple[float, ...]  # non-increasing
    unsubscribe_rate: tuple[float, ...]  # non-decreasing
    pseudo_sends: tuple[float, float] = (0.0, 0.0)  # borrowed from the overall curve (clicks, unsubscribes)

    def as_map(self) -> dict[int, tuple[float, float]]:
        return {p: (c, u) for p, c, u in zip(self.positions, self.click_rate, self.unsubscribe_rate, strict=True)}

    @property
    def crossover(self) -> int | None:
        """The first position whose fitted unsubscribe rate exceeds its fitted click rate."""
        return next((p for p, c, u in zip(self.positions, self.click_rate, self.unsubscribe_rate, strict=True)
                     if u > c), None)


def fit(own: Sequence[Counts], overall: Fit | None = None) -> Fit:
    """The monotone curve of ``own`` (positions ascending), shrunk toward ``overall`` when given."""
    rows = [c for c in sorted(own, key=lambda c: c.position) if c.sends > 0]
    if not rows:
        return Fit((), (), ())
    sends = [c.sends for c in rows]
    if overall is None or not overall.positions:
        clicks = [c.clicks / c.sends for c in rows]
        unsubs = [c.unsubscribes / c.sends for c in rows]
        a_c = a_u = 0.0
    else:
        clicks, unsubs, a_c, a_u = shrink(rows, overall.as_map())
    return Fit(
        tuple(c.position for c in rows),
        tuple(pava(clicks, [n + a_c for n in sends], increasing=False)),
        tuple(pava(unsubs, [n + a_u for n in sends], increasing=True)),
        (a_c, a_u),
    )


# ---------------------------------------------------------------- the rule


def binomial_tail(k: int, m: int, *, upper: bool) -> float:
    """P(X >= k) (``upper``) or P(X <= k) for X ~ Binomial(m, 1/2), exactly."""
    if m <= 0:
        return 1.0
    ks = range(k, m + 1) if upper else range(0, k + 1)
    # in logs: math.comb(m, i) / 2**m overflows nothing this way for any m
    logs = [math.lgamma(m + 1) - math.lgamma(i + 1) - math.lgamma(m - i + 1) - m * math.log(2) for i in ks]
    if not logs:
        return 0.0
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(x - top) for x in logs))


@dataclass(frozen=True)
class Group:
    """A tested group of positions and its one-sided exact test."""

    first: int
    last: int
    sends: int
    clicks: int
    unsubscribes: int
    p_value: float  # of "it earns at least what it costs" (declaring walk) or "it costs at least what it earns"


@dataclass(frozen=True)
class Walk:
    """One closed-testing walk over the groups: which positions it confirms, and how surely."""

    groups: tuple[Group, ...]  # positions ascending
    bound: int | None  # declaring walk: the lowest position confirmed to cost more than it earns;
    #                    lower walk: the highest confirmed to earn more than it costs; None: none
    adjusted_p: float | None  # the closed procedure's adjusted p-value of ``bound``


def groups_of(rows: Sequence[Counts], min_events: int, *, from_top: bool) -> list[tuple[int, int, int, int, int]]:
    """Positions merged into groups of at least ``min_sends`` sends, starting from the top
    (``from_top``) or from position 0; a last group short of it joins the one before.
    Depends on the sends only, never on the outcomes. Returns (first, last, sends,
    clicks, unsubscribes), positions ascending."""
    ordered = sorted((c for c in rows if c.sends > 0), key=lambda c: c.position, reverse=from_top)
    out: list[list[int]] = []
    for c in ordered:
        if out and out[-1][3] + out[-1][4] < min_events:
            g = out[-1]
            g[0], g[1] = min(g[0], c.position), max(g[1], c.position)
            g[2], g[3], g[4] = g[2] + c.sends, g[3] + c.clicks, g[4] + c.unsubscribes
        else:
            out.append([c.position, c.position, c.sends, c.clicks, c.unsubscribes])
    if len(out) > 1 and out[-1][3] + out[-1][4] < min_events:
        last = out.pop()
        g = out[-1]
        g[0], g[1] = min(g[0], last[0]), max(g[1], last[1])
        g[2], g[3], g[4] = g[2] + last[2], g[3] + last[3], g[4] + last[4]
    return sorted((g[0], g[1], g[2], g[3], g[4]) for g in out)


def _tested(groups: Iterable[tuple[int, int, int, int, int]], *, unsubscribes_ahead: bool) -> tuple[Group, ...]:
    # conditional on the c + u sends that drew either, the unsubscribes are Binomial(c + u, q),
    # q <= 1/2 under "clicks at least match unsubscribes" (independent Poisson counts of rare events)
    return tuple(Group(f, last, n, c, u, binomial_tail(u, c + u, upper=unsubscribes_ahead))
                 for f, last, n, c, u in groups)


def confirm_down(rows: Sequence[Counts], min_events: int = DEFAULT_MIN_EVENTS, alpha: float = ALPHA) -> Walk:
    """The declaring walk over H_j: "position j earns at least what it costs".

    Groups (single positions where they hold ``min_events`` clicks and unsubscribes,
    merged from the top down where they are thin) are tested highest first, each
    one-sided at ``alpha`` by the exact sign test on its clicks and unsubscribes; the walk
    stops at the first group not rejected, and H_j is rejected for the last position j of
    every group before it (a fixed-sequence procedure: closed testing of the nested H_j
    with the group ending at j as the local test of H_j). Its family-wise error over the
    whole curve is at most ``alpha``: the first true H_j on the way must be rejected before
    any other true one is. A crossover declared at j before the true one is a rejected
    true H_j, so it happens at most ``alpha`` of the time. The grouping depends on the
    events (c + u) only, on which every test conditions."""
    groups = _tested(groups_of(rows, min_events, from_top=True), unsubscribes_ahead=True)
    return _closed(groups, alpha, down=True)


def confirm_up(rows: Sequence[Counts], min_events: int = DEFAULT_MIN_EVENTS, alpha: float = ALPHA) -> Walk:
    """The interval's lower walk, the mirror closed test of G_j: "position j costs at least
    what it earns" (under monotone curves G_j implies G_i for every i > j): the highest
    rejected j earns more than it costs, so the crossover is after it."""
    groups = _tested(groups_of(rows, min_events, from_top=False), unsubscribes_ahead=False)
    return _closed(groups, alpha, down=False)


def _closed(groups: tuple[Group, ...], alpha: float, *, down: bool) -> Walk:
    """Closed testing over nested hypotheses, one per group boundary; see :func:`confirm_down`."""
    ends = [g.last if down else g.first for g in groups]  # ascending
    local = {}
    for i, j in enumerate(ends):
        # the local test of H_j: the group that ends at j (the start of the mirror walk's),
        # whose average is at least position j's under monotone curves
        local[j] = groups[i].p_value
    if down:
        adjusted = {j: max(local[k] for k in ends if k >= j) for j in ends}
        confirmed = [j for j in ends if adjusted[j] <= alpha]
        bound = min(confirmed) if confirmed else None
    else:
        adjusted = {j: max(local[k] for k in ends if k <= j) for j in ends}
        confirmed = [j for j in ends if adjusted[j] <= alpha]
        bound = max(confirmed) if confirmed else None
    return Walk(groups, bound, None if bound is None else adjusted[bound])



def sends_needed(clicks: int, unsubscribes: int, click_rate: float, unsubscribe_rate: float,
                 alpha: float = ALPHA) -> int | None:
    """About how many more sends a group that drew ``clicks`` and ``unsubscribes`` needs
    before its test confirms that it costs more than it earns, if the further sends draw
    clicks and unsubscribes at these rates: the fewest extra sends whose expected events,
    added to the observed ones and rounded, the exact test rejects; None when the rates
    do not show it (no amount of data would)."""
    if unsubscribe_rate <= click_rate:
        return None

    def enough(more: int) -> bool:
        u, c = round(unsubscribes + more * unsubscribe_rate), round(clicks + more * click_rate)
        return binomial_tail(u, u + c, upper=True) <= alpha

    low, high = 0, 1
    while not enough(high):
        low, high = high, high * 2
        if high > 10**12:
            return None
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


@dataclass(frozen=True)
class CrossoverEstimate:
    """The measure's answer for one set of users."""

    verdict: str  # CROSSOVER, NOT_REACHED or NOT_ENOUGH_DATA
    position: int | None = None  # declared: the last position of the lowest confirmed group
    low: int | None = None  # the interval's lower end (the crossover is at or after it)
    high: int | None = None  # its upper end: the declared position (None: beyond the data)
    estimate: int | None = None  # the fitted curve's crossover, within [low, high] when declared
    adjusted_p: float | None = None  # the fixed-sequence adjusted p-value of the declaration
    # with NOT_ENOUGH_DATA: about how many more sends would decide it; None where more sends
    # at the highest group's rates (its own, else the fitted ones) would not (NO_MORE_SENDS)
    more_sends: int | None = None
    fit: Fit = field(default_factory=lambda: Fit((), (), ()))
    down: Walk = field(default_factory=lambda: Walk((), None, None))
    up: Walk = field(default_factory=lambda: Walk((), None, None))
    min_events: int = DEFAULT_MIN_EVENTS

    @classmethod
    def empty(cls) -> CrossoverEstimate:
        return cls(NOT_REACHED)

    @property
    def sureness(self) -> float | None:
        """1 - the adjusted p-value: how sure the rule is that the declared position already
        costs more than it earns (95 % at the least, when declared)."""
        return None if self.adjusted_p is None else 1.0 - self.adjusted_p

    def short_text(self) -> str:
        if self.verdict == CROSSOVER:
            return f"crossover by {self.position} (est. {self.estimate})"
        if self.verdict == NOT_ENOUGH_DATA:
            return f"not enough data (~{self.more_sends:,} sends)" if self.more_sends is not None else (
                "not enough data (not at these rates)")
        return NOT_REACHED

    def text(self) -> str:
        """One line: the declared position, its interval, the estimate, and how sure."""
        if self.verdict == CROSSOVER:
            span = f"{self.low}–{self.high}" if self.low != self.high else f"{self.high}"
            return (f"crossover at or before position {self.position} (confirmed, {self.sureness * 100:.1f} % sure; "
                    f"interval {span}, estimate {self.estimate})") if self.sureness is not None else (
                    f"crossover at or before position {self.position}")
        if self.verdict == NOT_ENOUGH_DATA:
            after = f"; it is after position {self.low - 1}" if self.low else ""
            more = NO_MORE_SENDS if self.more_sends is None else f"about {self.more_sends:,} more sends would decide it"
            return f"not enough data ({more}; the fitted curve crosses at position {self.estimate}{after})"
        return NOT_REACHED


def estimate(rows: Sequence[Counts], overall: Fit | None = None, *, min_events: int = DEFAULT_MIN_EVENTS,
             alpha: float = ALPHA) -> CrossoverEstimate:
    """The crossover of one set of users: fitted curve, declaring walk, interval."""
    own = [c for c in sorted(rows, key=lambda c: c.position) if c.sends > 0]
    if not own:
        return CrossoverEstimate(NOT_REACHED, min_events=min_events)
    curve = fit(own, overall)
    down = confirm_down(own, min_events, alpha)
    up = confirm_up(own, min_events, alpha)
    low = own[0].position if up.bound is None else up.bound + 1
    fitted = curve.crossover
    if down.bound is not None:
        declared = down.bound
        low = min(low, declared)  # the two walks contradict each other only by their 5 % each
        point = declared if fitted is None else min(max(fitted, low), declared)
        return CrossoverEstimate(CROSSOVER, declared, low, declared, point, down.adjusted_p, None, curve,
                                 down, up, min_events)
    if fitted is None:
        return CrossoverEstimate(NOT_REACHED, low=low, fit=curve, down=down, up=up, min_events=min_events)
    # nothing confirmed, but the fitted curve crosses: the further sends its highest group
    # would need, drawing at its own rates when they show more unsubscribes than clicks, else
    # at the fitted curve's over its positions (sends-weighted). A group merged from thin
    # positions can reach below the fitted crossover, and then even its fitted rates show
    # more clicks than unsubscribes: no number of sends at those rates decides it, and the
    # answer says so (more_sends None) instead of borrowing another position's rates.
    blocker = down.groups[-1]
    if blocker.unsubscribes > blocker.clicks:
        pc, pu = blocker.clicks / blocker.sends, blocker.unsubscribes / blocker.sends
    else:
        rates = curve.as_map()
        inside = [(c.sends, *rates[c.position]) for c in own if blocker.first <= c.position <= blocker.last]
        pc = sum(n * c for n, c, _ in inside) / blocker.sends
        pu = sum(n * u for n, _, u in inside) / blocker.sends
    more = sends_needed(blocker.clicks, blocker.unsubscribes, pc, pu, alpha)
    return CrossoverEstimate(NOT_ENOUGH_DATA, None, low, None, fitted, None, more, curve, down, up, min_events)


def rates_at(curve: Fit, position: int) -> tuple[float, float]:
    """The fitted (click rate, unsubscribe rate) at ``position``."""
    return curve.as_map()[position]


def estimate_report(counts: Mapping[str, Sequence[Counts]], *, min_events: int = DEFAULT_MIN_EVENTS,
                    alpha: float = ALPHA) -> dict[str, CrossoverEstimate]:
    """Every set of users: everyone (OVERALL) unshrunk, each segment shrunk toward it."""
    out: dict[str, CrossoverEstimate] = {}
    overall_rows = counts.get(OVERALL, ())
    overall = estimate(overall_rows, min_events=min_events, alpha=alpha)
    out[OVERALL] = overall
    for segment, rows in counts.items():
        if segment != OVERALL:
            out[segment] = estimate(rows, overall.fit, min_events=min_events, alpha=alpha)
    return out


def true_crossover(curve: Iterable[tuple[int, int, float, float]]) -> int | None:
    """The noiseless crossover of (position, sends, expected clicks, expected unsubscribes):
    the first position whose expected unsubscribes exceed its expected clicks."""
    return next((p for p, n, c, u in sorted(curve) if n > 0 and u > c), None)


@dataclass(frozen=True)
class Cell:
    """One simulation's one set of users: the measure beside the truth."""

    seed: int
    tolerance: float
    segment: str
    estimate: CrossoverEstimate
    truth: int | None  # the first position whose expected unsubscribes exceed its expected clicks

    @property
    def declared(self) -> int | None:
        return self.estimate.position if self.estimate.verdict == CROSSOVER else None

    @property
    def agrees(self) -> bool:
        """Within one position, or the truth inside the measure's interval, or both not reached."""
        e = self.estimate
        if self.truth is None:
            return e.verdict == NOT_REACHED
        if e.verdict != CROSSOVER or e.position is None:
            return False
        inside = e.low is not None and e.high is not None and e.low <= self.truth <= e.high
        return abs(e.position - self.truth) <= 1 or inside

    @property
    def undecided(self) -> bool:
        """Nothing declared, and nothing the measure says rules the truth out: its confirmed
        lower end is at or before the truth's position (or the truth has none). Not an
        agreement, and not a contradiction either: a reader is told "not decided"."""
        e = self.estimate
        if self.agrees or e.verdict == CROSSOVER:
            return False
        return self.truth is None or e.low is None or e.low <= self.truth

    @property
    def mark(self) -> str:
        """✓ agrees, – undecided, ✗ contradicts the truth (a declaration that does not agree, or
        a confirmed lower end past the truth's position)."""
        return "✓" if self.agrees else ("–" if self.undecided else "✗")

    @property
    def false_early(self) -> bool:
        """A crossover declared more than one position before the truth's, or where the truth has none."""
        if self.declared is None:
            return False
        return self.truth is None or self.declared < self.truth - 1
