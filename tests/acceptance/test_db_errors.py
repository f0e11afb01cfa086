"""A database gov cannot work with is one line naming why (an outside probe found
tracebacks of 48 to 140 lines, and a pool timeout blamed for a missing database):
the real `gov` in a subprocess."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.acceptance.test_errors_before_work import clean_env, gov, one_line


def test_a_database_a_newer_gov_migrated_is_one_line(db_url: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("UPDATE public.gov_alembic_version SET version_num = '0999_from_the_future'")
    env = clean_env(GOV_DATABASE_URL=db_url)
    for command in (["db", "check"], ["db", "upgrade"]):
        r = gov(*command, env=env)
        assert r.returncode == 1, (command, r.stderr)
        line = one_line(r)
        assert "0999_from_the_future" in line and "newer gov" in line, line
    assert conn.execute("SELECT version_num FROM public.gov_alembic_version").fetchone() == ("0999_from_the_future",)


def test_a_database_that_does_not_exist_is_one_line_naming_it(db_url: str) -> None:
    missing = psycopg.conninfo.make_conninfo(db_url, dbname="gov_no_such_database")
    env = clean_env(GOV_DATABASE_URL=missing)
    for command in (["db", "check"], ["db", "upgrade"], ["decide", "--user", "u", "--tier", "P2", "--id", "m"]):
        r = gov(*command, env=env)
        assert r.returncode == 1, (command, r.stderr)
        assert "gov_no_such_database" in one_line(r) and "does not exist" in r.stderr, r.stderr
