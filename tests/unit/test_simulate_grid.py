"""`gov simulate --grid` from saved simulations: the cells, their agreement and false-early
marks, and the cache that lets the measure be evaluated again without simulating."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from gov.analytics.crossover import CROSSOVER, NOT_ENOUGH_DATA, NOT_REACHED, OVERALL, CrossoverEstimate
from gov.cli import main
from gov.lab.simulate import grid as grid_mod
from gov.lab.simulate.cli import simulate
from gov.lab.simulate.grid import (
    Cell,
    SimData,
    cache_path,
    cells,
    code_version,
    grid_verdict,
    load_or_simulate,
    parse_list,
)
from gov.lab.simulate.model import SimConfig


def _sim(seed: int = 11, tolerance: float = 0.9) -> SimData:
    rows = [(k, 3000, round(3000 * (0.05 - 0.003 * k)), round(3000 * 0.004 * k)) for k in range(14)]
    return SimData(seed, tolerance, 2000, 14, 0.5, code_version(), {OVERALL: rows, "dormant": rows},
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


def test_every_tolerance_is_checked_before_any_simulation(tmp_path: Path) -> None:
    """--tolerances 0 was a ZeroDivisionError mid-run, -1 complex numbers, nan accepted; and
    --tolerance / --hour-effect let nan through (click.FloatRange does)."""

    def never(*args: object, **kwargs: object) -> SimData:
        raise AssertionError("simulated before every value was checked")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grid_mod, "simulate_data", never)
        for args, option in (
            (["--grid", "--tolerances", "0"], "--tolerances"),
            (["--grid", "--tolerances", "-1"], "--tolerances"),
            (["--grid", "--tolerances", "1,nan"], "--tolerances"),  # the bad one last: checked before the first
            (["--grid", "--tolerances", "1,inf"], "--tolerances"),
            (["--grid", "--tolerances", "1,10.5"], "--tolerances"),
            (["--grid", "--tolerances", "one"], "--tolerances"),
            (["--grid", "--seeds", "5-1"], "--seeds"),
            (["--tolerance", "nan"], "--tolerance"),
            (["--tolerance", "0"], "--tolerance"),
            (["--hour-effect", "nan"], "--hour-effect"),
        ):
            out = CliRunner().invoke(main, ["simulate", *args, "--grid-cache", str(tmp_path)])  # as `gov` runs it
            assert out.exit_code == 2, (args, out.output)
            lines = out.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("gov: error: ") and option in lines[0], (args, out.stderr)
    for bad in (0.0, -1.0, float("nan"), 11.0):
        with pytest.raises(ValueError, match="tolerance"):
            SimConfig(tolerance=bad)
    with pytest.raises(ValueError, match="hour_effect"):
        SimConfig(hour_effect=float("nan"))


def _fake_simulation(calls: list[tuple[int, float, float]]) -> object:
    def fake(server: object, seed: int, tolerance: float, users: int, days: int, hour_effect: float) -> SimData:
        calls.append((seed, tolerance, hour_effect))
        return replace(_sim(seed, tolerance), users=users, days=days, hour_effect=hour_effect)

    return fake


def test_a_corrupt_saved_simulation_is_simulated_again_and_said_so(tmp_path: Path) -> None:
    calls: list[tuple[int, float, float]] = []
    path = cache_path(tmp_path, 11, 0.9, 2000, 14, 0.5)
    path.write_text("junk\n", encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grid_mod, "simulate_data", _fake_simulation(calls))
        out = CliRunner().invoke(simulate, ["--grid", "--seeds", "11", "--tolerances", "0.9", "--users", "2000",
                                            "--days", "14", "--grid-cache", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert calls == [(11, 0.9, 0.5)]
    stale = [line for line in out.stderr.splitlines() if str(path) in line]
    assert len(stale) == 1 and "simulating it again" in stale[0], out.stderr
    assert "Traceback" not in out.output and "2 of 2 cells agree" in out.stdout
    assert SimData.from_json(json.loads(path.read_text(encoding="utf-8"))).seed == 11  # replaced by a good one


def test_a_saved_simulation_is_reused_only_for_its_own_hour_effect_and_code(tmp_path: Path) -> None:
    calls: list[tuple[int, float, float]] = []
    saved = _sim()
    cache_path(tmp_path, 11, 0.9, 2000, 14, 0.5).write_text(json.dumps(saved.as_json()), encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grid_mod, "simulate_data", _fake_simulation(calls))
        assert load_or_simulate(tmp_path, None, 11, 0.9, 2000, 14, hour_effect=0.5) == saved
        assert calls == []
        # another hour effect: another file, simulated with that hour effect
        assert load_or_simulate(tmp_path, None, 11, 0.9, 2000, 14, hour_effect=0.9).hour_effect == 0.9
        assert calls == [(11, 0.9, 0.9)]
        # a file of this name holding other settings, or made by other code, is not reused
        stale: list[str] = []
        for other in (replace(saved, hour_effect=0.2), replace(saved, code="older"), replace(saved, tolerance=0.9001)):
            path = cache_path(tmp_path, 11, 0.9, 2000, 14, 0.5)
            path.write_text(json.dumps(other.as_json()), encoding="utf-8")
            again = load_or_simulate(tmp_path, None, 11, 0.9, 2000, 14, hour_effect=0.5,
                                     on_stale=lambda p, why: stale.append(why))
            assert again.code == code_version() and again.hour_effect == 0.5
        assert stale == ["saved with other settings", "saved by other code", "saved with other settings"]
        assert len(calls) == 4
