"""The named-statement loader."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gov.queries import parse, queries

PACKAGE = Path(__file__).resolve().parents[2] / "gov"


def test_parse_splits_named_statements() -> None:
    text = "-- name: a\n-- a comment\nSELECT 1;\n\n-- name: b\nSELECT %(x)s\n"
    assert parse(text) == {"a": "SELECT 1", "b": "SELECT %(x)s"}


@pytest.mark.parametrize("text", ["-- name: a\n-- only a comment\n", "-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n"])
def test_parse_refuses_empty_or_duplicate(text: str) -> None:
    with pytest.raises(ValueError):
        parse(text)


def test_every_name_used_in_python_exists() -> None:
    """A typo in q("…") would fail at run time only: catch every call here."""
    names = set(queries())
    used = set()
    for path in PACKAGE.rglob("*.py"):
        used |= set(re.findall(r"\bq\(\"([a-z_0-9]+)\"\)", path.read_text()))
    assert used, "no q() calls found: the scan is broken"
    assert used <= names, f"unknown query names: {sorted(used - names)}"
