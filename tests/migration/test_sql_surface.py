"""A released SQL function is a promise (invariant 16): sql/surface.txt lists the surface, and
every database keeps it after an upgrade from any release.

* every ``gov.*_vN`` function any migration file ever created is on the list (or retired
  on purpose, with the major release that retired it);
* at every released revision, the ``_vN`` functions it has are on the list with the same
  argument and result types: a released signature never changes;
* upgraded from every released revision to head, the database has every listed function
  with its listed argument and result types, and every listed view with its columns.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from gov import migrate
from gov.queries import sql_dir
from gov.testing.postgres import TemplateDatabases, admin, dbname_of, with_dbname

FUNCTIONS = """
    SELECT 'gov.' || p.proname || '(' || oidvectortypes(p.proargtypes) || ')', pg_get_function_result(p.oid)
      FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
     WHERE n.nspname = 'gov'"""
VIEW_COLUMNS = """
    SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)
      FROM pg_attribute a
     WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped"""
VERSIONED = re.compile(r"^gov\.\w+_v\d+\(")
CREATED = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+gov\.(\w+_v\d+)\s*\(", re.IGNORECASE)
FUNCTION_LINE = re.compile(r"^(gov\.\w+\(.*?\)) -> (.+)$")
VIEW_LINE = re.compile(r"^view (gov\.\w+)\((.*)\)$")
RETIRED_LINE = re.compile(r"^retired (\d+)\.0: (gov\.\w+\(.*?\)) -> (.+)$")


@dataclass(frozen=True)
class Surface:
    functions: dict[str, str]  # "gov.name(argument types)" -> result
    views: dict[str, str]  # "gov.name" -> "column type, ..."
    retired: dict[str, tuple[int, str]]  # "gov.name(argument types)" -> (major release, result)

    def names(self) -> set[str]:
        return {signature.partition("(")[0] for signature in [*self.functions, *self.retired]}


def parse(text: str) -> Surface:
    functions: dict[str, str] = {}
    views: dict[str, str] = {}
    retired: dict[str, tuple[int, str]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if m := RETIRED_LINE.match(line):
            retired[m[2]] = (int(m[1]), m[3])
        elif m := VIEW_LINE.match(line):
            views[m[1]] = m[2]
        elif m := FUNCTION_LINE.match(line):
            functions[m[1]] = m[2]
        else:
            raise AssertionError(f"sql/surface.txt line {number} is neither a function, a view nor retired: {raw!r}")
    return Surface(functions, views, retired)


def surface() -> Surface:
    return parse((sql_dir() / "surface.txt").read_text(encoding="utf-8"))


def released_functions(conn: psycopg.Connection[Any]) -> dict[str, str]:
    return {name: result for name, result in conn.execute(FUNCTIONS).fetchall() if VERSIONED.match(name)}


def test_the_list_parses_and_names_the_promised_functions() -> None:
    listed = surface()
    assert "gov.subscribe_v1(text, text, text, text)" in listed.functions  # issue 31
    assert listed.views, "the analysts' views are part of the surface"
    assert not listed.retired, "nothing is retired before 1.0"
    example = parse("retired 2.0: gov.x_v1(text) -> bigint\nview gov.v(a text)\ngov.y_v1() -> jsonb\n")
    assert example == Surface({"gov.y_v1()": "jsonb"}, {"gov.v": "a text"}, {"gov.x_v1(text)": (2, "bigint")})
    with pytest.raises(AssertionError, match="line 1"):
        parse("gov.broken_v1(text)\n")


def test_every_versioned_function_any_migration_created_is_listed() -> None:
    created = {
        f"gov.{name}": path.name
        for path in sorted((sql_dir() / "migrations").glob("*.sql"))
        for name in CREATED.findall(path.read_text(encoding="utf-8"))
    }
    assert "gov.subscribe_v1" in created and "gov.claim_outbox_v1" in created  # the scan reads the files
    missing = sorted(f"{name} ({where})" for name, where in created.items() if name not in surface().names())
    assert not missing, f"released functions missing from sql/surface.txt: {missing}"


@pytest.fixture(scope="module")
def upgraded_from_each_release(databases: TemplateDatabases) -> Iterator[dict[str, dict[str, Any]]]:
    """For each released revision: the _vN functions it had, then what head has after an
    upgrade from it. One database walks the revisions one by one; at each, a copy of it
    (CREATE DATABASE … TEMPLATE) is upgraded to head and dropped, so history is replayed
    once rather than once per revision."""
    found: dict[str, dict[str, Any]] = {}
    walker = databases.empty()
    try:
        for revision in migrate.revisions():
            migrate.upgrade(walker, revision)
            with psycopg.connect(walker) as conn:
                at_release = released_functions(conn)
            copy = with_dbname(walker, f"{dbname_of(walker)}_from_{revision[:4]}")
            admin(databases.admin_url, "scratch_create_from_template", dbname_of(copy), dbname_of(walker))
            try:
                migrate.upgrade(copy)
                with psycopg.connect(copy) as conn:
                    functions = dict(conn.execute(FUNCTIONS).fetchall())
                    views = {name: conn.execute(VIEW_COLUMNS, (name,)).fetchone()[0] for name in surface().views}
            finally:
                databases.drop(copy)
            found[revision] = {"at_release": at_release, "functions": functions, "views": views}
    finally:
        databases.drop(walker)
    yield found


def test_a_released_signature_never_changes(upgraded_from_each_release: dict[str, dict[str, Any]]) -> None:
    listed = surface()
    promised = {**listed.functions, **{sig: result for sig, (_, result) in listed.retired.items()}}
    changed = sorted(
        f"{revision}: {signature} -> {result}"
        for revision, seen in upgraded_from_each_release.items()
        for signature, result in seen["at_release"].items()
        if promised.get(signature) != result
    )
    assert not changed, f"released at these revisions but not so in sql/surface.txt: {changed}"


def test_after_an_upgrade_from_every_release_the_surface_answers(
    upgraded_from_each_release: dict[str, dict[str, Any]],
) -> None:
    listed = surface()
    assert set(upgraded_from_each_release) == set(migrate.revisions())
    for revision, seen in upgraded_from_each_release.items():
        broken = sorted(
            f"{signature} -> {result} (head has: {seen['functions'].get(signature, 'nothing')})"
            for signature, result in listed.functions.items()
            if seen["functions"].get(signature) != result
        )
        assert not broken, f"upgraded from {revision}, the released functions do not answer: {broken}"
        views = sorted(f"{name}({cols}) (head has: {seen['views'][name]})"
                       for name, cols in listed.views.items() if seen["views"][name] != cols)
        assert not views, f"upgraded from {revision}, the views differ: {views}"
        unlisted = sorted(s for s in seen["functions"] if VERSIONED.match(s) and s not in listed.functions)
        assert not unlisted, f"head has versioned functions missing from sql/surface.txt: {unlisted}"
