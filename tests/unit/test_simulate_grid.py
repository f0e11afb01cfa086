"""`gov simulate --grid` from saved simulations: the cells, their agreement and false-early
marks, and the cache that lets the measure be evaluated again without simulating."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from gov.analytics.crossover import CROSSOVER, NOT_ENOUGH_DATA, NOT_REACHED, OVERALL, CrossoverEstimate
from gov.lab.simulate.cli import simulate
from gov.lab.simulate.grid import Cell, SimData, cache_path, cells, grid_verdict, load_or_simulate, parse_list


def _sim(seed: int = 11, tolerance: float = 0.9) -> SimData:
    rows = [(k, 3000, round(3000 * (0.05 - 0.003 * k)), round(3000 * 0.004 * k)) for k in range(14)]
    return SimData(seed, tolerance, 2000, 14, {OVERALL: rows, "dormant": rows},
                   [("dormant", k, n, float(c), float(u)) for k, n, c, u in rows])


def test_a_cell_agrees_within_one_or_inside_its_interval_and_is_false_early_only_before_that() -> None:
    def cell(verdict: str, position: int | None, low: int | None, truth: int | None) -> Cell:
        return Cell(1, 1.0, OVERALL, CrossoverEstimate(verdict, position, low, position, position), truth)

    assert cell(CROSSOVER, 9, 9, 10).agrees and not cell(CROSSOVER, 9, 9, 10).false_early
    assert cell(CROSSOVER, 20, 8, 12).agrees  # the interval holds the truth
    assert not cell(CROSSOVER, 20, 14, 12).agrees
    assert cell(CROSSOVER, 7, 5, 10).false_early and not cell(CROSSOVER, 7, 5, 10).agrees
    assert cell(CROSSOVER, 7, 5, None).false_early
    assert cell(NOT_REACHED, None, 3, None).agrees and not cell(NOT_ENOUGH_DATA, None, 3, None).agrees
    assert not cell(NOT_ENOUGH_DATA, None, 3, 12).agrees and not cell(NOT_ENOUGH_DATA, None, 3, 12).false_early


def test_a_cell_that_has_not_decided_is_marked_undecided_unless_its_lower_end_rules_the_truth_out() -> None:
    def cell(verdict: str, position: int | None, low: int | None, truth: int | None) -> Cell:
        return Cell(1, 1.0, OVERALL, CrossoverEstimate(verdict, position, low, position, position), truth)

    # "not enough data; it is after position 13" beside a truth at 17: not decided, not wrong
    assert cell(NOT_ENOUGH_DATA, None, 14, 17).mark == "–" and cell(NOT_ENOUGH_DATA, None, 17, 17).undecided
    assert cell(NOT_REACHED, None, 5, 17).mark == "–"
    assert cell(NOT_ENOUGH_DATA, None, 3, None).mark == "–"  # the truth has none, nothing declared
    # a confirmed lower end past the truth's position says something the truth rules out
    assert cell(NOT_ENOUGH_DATA, None, 18, 17).mark == "✗" and not cell(NOT_ENOUGH_DATA, None, 18, 17).undecided
    assert cell(NOT_REACHED, None, 20, 17).mark == "✗"
    # a declaration is never "undecided": it agrees or it does not
    assert cell(CROSSOVER, 9, 9, 10).mark == "✓" and cell(CROSSOVER, 20, 14, 12).mark == "✗"
    assert cell(CROSSOVER, 7, 5, None).mark == "✗" and cell(NOT_REACHED, None, 3, None).mark == "✓"


def test_the_grid_is_evaluated_from_saved_simulations_without_simulating(tmp_path: Path) -> None:
    sim = _sim()
    path = cache_path(tmp_path, sim.seed, sim.tolerance, sim.users, sim.days)
    path.write_text(json.dumps(sim.as_json()), encoding="utf-8")

    def never(seed: int, tolerance: float) -> None:
        raise AssertionError("a saved simulation was simulated again")

    loaded = load_or_simulate(tmp_path, None, 11, 0.9, 2000, 14, on_simulate=never)
    assert loaded == sim
    grid = cells([loaded])
    assert [c.segment for c in grid] == [OVERALL, "dormant"]
    assert all(c.truth == 8 and c.estimate.verdict == CROSSOVER and c.agrees for c in grid)
    assert grid_verdict(grid).startswith("2 of 2 cells agree (100.0 %); false early: 0")

    out = CliRunner().invoke(simulate, ["--grid", "--seeds", "11", "--tolerances", "0.9",
                                        "--grid-cache", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "2 of 2 cells agree" in out.stdout and "dormant" in out.stdout


def test_seed_and_tolerance_lists() -> None:
    assert parse_list("1-5", int) == (1, 2, 3, 4, 5)
    assert parse_list("11,13", int) == (11, 13)
    assert parse_list("0.75, 1,1.5", float) == (0.75, 1.0, 1.5)
