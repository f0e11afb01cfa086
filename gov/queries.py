"""Named SQL statements, loaded once from ``sql/queries*.sql`` (one file per concern).

Python never holds SQL literals of its own: every statement the package sends is a
named block in that file, so the SQL is reviewed (and grepped) in one place.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import LiteralString, cast

_NAME = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def sql_dir() -> Path:
    """Where the SQL lives: packaged as gov/_sql in a wheel, ./sql in a checkout."""
    packaged = Path(__file__).parent / "_sql"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "sql"


def parse(text: str) -> dict[str, LiteralString]:
    """Split a queries file into ``{name: statement}``; duplicate names are an error."""
    parts = _NAME.split(text)
    statements: dict[str, LiteralString] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
        statement = "\n".join(lines).strip().rstrip(";").strip()
        if not statement:
            raise ValueError(f"query {name!r} is empty")
        if name in statements:
            raise ValueError(f"query {name!r} is defined twice")
        # The file is part of the package, not input: it is as literal as source code.
        statements[name] = cast(LiteralString, statement)
    return statements


@cache
def queries() -> dict[str, LiteralString]:
    statements: dict[str, LiteralString] = {}
    for path in sorted(sql_dir().glob("queries*.sql")):
        for name, statement in parse(path.read_text(encoding="utf-8")).items():
            if name in statements:
                raise ValueError(f"query {name!r} is defined twice ({path.name})")
            statements[name] = statement
    return statements


def q(name: str) -> LiteralString:
    """The named statement; a typo is a KeyError at first use, caught by the loader test."""
    return queries()[name]
