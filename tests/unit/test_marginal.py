"""The SQL function's own per-group rule in Python (gov.fatigue_marginal_v1's verdict
columns, kept as released): the Wilson interval, the merging of sparse positions, and
its crossover rule. The measure gov decides from is gov.analytics.crossover
(tests/unit/test_crossover.py)."""

from __future__ import annotations

import math

import pytest

from gov.analytics.marginal import (
    CONFIRM_Z,
    CROSSOVER,
    NOT_ENOUGH_DATA,
    NOT_REACHED,
    decide,
    difference_low,
    merge_positions,
    sends_to_decide,
    wilson,
)


def test_wilson_matches_the_textbook_values() -> None:
    low, high = wilson(0, 10)
    assert low == pytest.approx(0.0, abs=1e-12) and high == pytest.approx(0.27753, abs=1e-5)
    low, high = wilson(5, 10)
    assert (low, high) == (pytest.approx(0.23659, abs=1e-5), pytest.approx(0.76341, abs=1e-5))
    low, high = wilson(10, 10)
    assert low == pytest.approx(0.72247, abs=1e-5) and high == pytest.approx(1.0)
    low, high = wilson(3, 100)
    assert (low, high) == (pytest.approx(0.01026, abs=1e-5), pytest.approx(0.08452, abs=1e-5))


def test_wilson_holds_the_estimate_and_narrows_with_data() -> None:
    for k, n in ((1, 7), (4, 40), (40, 400), (400, 4000)):
        low, high = wilson(k, n)
        assert 0 <= low < k / n < high <= 1
    widths = [wilson(n // 10, n)[1] - wilson(n // 10, n)[0] for n in (100, 1000, 10000)]
    assert widths[0] > widths[1] > widths[2]
    assert widths[1] / widths[2] == pytest.approx(math.sqrt(10), rel=0.05)


def test_wilson_refuses_what_is_not_a_proportion() -> None:
    with pytest.raises(ValueError):
        wilson(0, 0)
    with pytest.raises(ValueError):
        wilson(11, 10)


def test_sparse_positions_merge_upward_and_a_short_tail_joins_the_group_before() -> None:
    assert merge_positions([(0, 500), (1, 300)], 200) == [(0, 0), (1, 1)]
    assert merge_positions([(0, 150), (1, 100), (2, 300), (3, 50)], 200) == [(0, 1), (2, 3)]
    assert merge_positions([(0, 250), (1, 90), (2, 90), (3, 90), (4, 10)], 200) == [(0, 0), (1, 4)]
    assert merge_positions([(0, 20), (5, 30)], 200) == [(0, 5)]  # never enough: one group
    assert merge_positions([], 200) == []


def test_a_clear_crossover_is_where_unsubscribes_overtake_clicks_for_good() -> None:
    groups = [(1000, 100, 0), (1000, 60, 10), (1000, 30, 40), (1000, 20, 80), (1000, 10, 120)]
    verdict = decide(groups)
    assert verdict.verdict == CROSSOVER and verdict.group == 2  # 40 > 30, confirmed by 80 vs 20 above it


def test_the_crossover_is_the_start_of_the_run_that_the_interval_confirms() -> None:
    # group 1 has more unsubscribes than clicks by noise, then clicks win again: not part of the run
    groups = [(500, 50, 1), (500, 10, 12), (500, 20, 15), (500, 15, 18), (500, 5, 40)]
    verdict = decide(groups)
    assert verdict.verdict == CROSSOVER and verdict.group == 3


def test_no_group_with_more_unsubscribes_than_clicks_is_not_reached() -> None:
    verdict = decide([(1000, 100, 0), (1000, 60, 10), (300, 9, 8)])
    assert verdict == decide([(1000, 100, 0), (1000, 60, 10), (300, 9, 8)])
    assert verdict.verdict == NOT_REACHED and verdict.group is None and verdict.more_sends is None
    assert decide([]).verdict == NOT_REACHED


def test_unsubscribes_ahead_without_the_interval_saying_so_is_not_enough_data() -> None:
    verdict = decide([(1000, 100, 0), (1000, 60, 10), (300, 9, 12)])
    assert verdict.verdict == NOT_ENOUGH_DATA and verdict.group is None
    assert verdict.more_sends == sends_to_decide(12, 9, 300)
    # that many more sends at the same rates decide it, one fewer does not
    more = verdict.more_sends or 0
    assert more > 0

    def confirmed(extra: int) -> bool:
        n = 300 + extra
        return difference_low(12 / 300 * n, 9 / 300 * n, n, CONFIRM_Z) > 0

    assert confirmed(more) and not confirmed(more - 1)
    assert sends_to_decide(80, 20, 1000) == 0  # confirmed already
    with pytest.raises(ValueError):
        sends_to_decide(9, 12, 300)  # clicks ahead: no amount of data confirms it


def test_the_difference_interval_is_newcombes_from_the_wilson_bounds() -> None:
    u_low = wilson(40, 1000)[0]
    c_high = wilson(30, 1000)[1]
    expected = 0.01 - math.sqrt((0.04 - u_low) ** 2 + (c_high - 0.03) ** 2)
    assert difference_low(40, 30, 1000) == pytest.approx(expected)
    assert difference_low(40, 30, 1000) < 0 < difference_low(80, 20, 1000)
