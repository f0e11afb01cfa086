"""The mutation script's mutants still apply to the code as it is (tests/mutation/run.py).

A refactor that changes a mutated text would otherwise leave the script stopping with
"has 0 matches" the next time someone runs it, and the property it guards unchecked.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _mutants() -> list[Any]:
    spec = importlib.util.spec_from_file_location("gov_mutation_run", ROOT / "tests" / "mutation" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return list(module.MUTANTS)


@pytest.mark.parametrize("mutant", _mutants(), ids=lambda m: m.name)
def test_every_edit_of_the_mutant_matches_the_code(mutant: Any) -> None:
    for name, old, new, expected in mutant.edits:
        text = (ROOT / name).read_text()
        assert text.count(old) == expected, f"{mutant.name}: {name} no longer holds {old!r} {expected} time(s)"
        assert old != new
        if name.startswith("sql/migrations/"):
            # a later migration that defines the function again undoes the edit: mutate that one
            later = [m.name for m in sorted((ROOT / "sql" / "migrations").glob("*.sql"))
                     if not m.name.endswith(".down.sql") and m.name > Path(name).name and old in m.read_text()]
            assert not later, f"{mutant.name}: {name} is defined again by {later}; edit the last one"
    # pytest options (``-m citus``) stand among the tests: only paths are checked
    options = {t for i, t in enumerate(mutant.tests) if t.startswith("-")
               or (i and mutant.tests[i - 1] in ("-m", "-k"))}
    for test in mutant.tests:
        if test in options:
            continue
        path, _, function = test.partition("::")
        assert (ROOT / path).is_file(), f"{mutant.name}: {path} does not exist"
        if function:
            assert f"def {function}(" in (ROOT / path).read_text(), f"{mutant.name}: {test} does not exist"
