"""The marginal fatigue measure against the simulator's ground truth on two `gov simulate`
runs: where every curve crosses early, the measure agrees with the truth in every set of
users (within one position, or its interval holds it); where none crosses at all, it
declares no crossover anywhere (it may say "not enough data" where the fitted curve
crosses among the few sends at the top, never a crossover). The full grid is
`gov simulate --grid` (docs/analysts.md)."""

from __future__ import annotations

import pytest

from gov.lab.simulate import SimConfig, simulate
from gov.lab.simulate.summary import crossover_rows

# (seed, tolerance): one where every curve crosses early, one where none crosses at all
CELLS = ((2, 0.4), (2, 3.0))
USERS, DAYS = 1000, 14


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "tolerance"), CELLS)
def test_the_measure_finds_the_simulated_crossover(pg_server: str, seed: int, tolerance: float) -> None:
    # the fatigue measure alone: without the hidden hours (hour_effect 0), whose delayed and
    # hour-scaled clicks move the measured crossover of this cell (seed 2, tolerance 0.4, casual:
    # measured 7-17, truth 5-6 at the default 0.5; issue 30, not yet understood)
    config = SimConfig(users=USERS, days=DAYS, seed=seed, tolerance=tolerance, hour_effect=0.0)
    outcome = simulate(pg_server, config, governed=True)
    rows = crossover_rows(outcome.summary)
    assert [segment for segment, *_ in rows] == ["all users", "casual", "dormant", "engaged"]
    for segment, said, truth, mark in rows:
        where = f"{segment}: the measure says {said!r}, the truth {truth!r} (seed {seed}, tolerance {tolerance})"
        if tolerance < 1:
            assert mark == "✓", where
        else:
            assert not said.startswith("crossover"), where
    # the grid cell is the one intended: every curve crosses, or none does before position 20
    # (the truth is per position now: at tolerance 3 the dormant curve crosses at 25, far
    # above what two weeks of sends can confirm)
    crossed = [int(truth.rsplit(" ", 1)[1]) for _, _, truth, _ in rows if truth.startswith("crossover")]
    assert len(crossed) == len(rows) if tolerance < 1 else all(p >= 20 for p in crossed), rows
