"""Migrations replay to exactly the canonical schema, and round-trip."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from gov import migrate
from gov.queries import sql_dir
from gov.testing.postgres import TemplateDatabases

# Everything that defines the gov schema, as text, order-independent.
CATALOG = {
    "columns": """
        SELECT table_name, column_name, data_type, is_nullable, column_default, ordinal_position
          FROM information_schema.columns WHERE table_schema = 'gov' ORDER BY 1, 6""",
    "constraints": """
        SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid)
          FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
         WHERE n.nspname = 'gov' ORDER BY 1, 2""",
    "indexes": """
        SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'gov' ORDER BY 1""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), md5(pg_get_functiondef(p.oid))
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'gov' ORDER BY 1, 2""",
    "views": """
        SELECT viewname, md5(definition) FROM pg_views WHERE schemaname = 'gov' ORDER BY 1""",
    "triggers": """
        SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(t.oid)
          FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'gov' AND NOT tgisinternal ORDER BY 1, 2""",
}


def catalog(url: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(url) as conn:
        return {name: conn.execute(query).fetchall() for name, query in CATALOG.items()}


@pytest.fixture
def empty_url(databases: TemplateDatabases) -> Iterator[str]:
    url = databases.empty()
    yield url
    databases.drop(url)


def test_migrated_schema_equals_canonical(databases: TemplateDatabases, empty_url: str) -> None:
    migrate.upgrade(empty_url)
    canonical = databases.empty()
    try:
        with psycopg.connect(canonical, autocommit=True) as conn:
            for part in sorted((sql_dir() / "schema").glob("*.sql")):
                conn.execute(part.read_text())
        migrated, expected = catalog(empty_url), catalog(canonical)
        for part in CATALOG:
            assert migrated[part] == expected[part], f"{part} differ between migrations and sql/schema/"
        assert migrated["functions"], "the catalog query found nothing: the comparison proves nothing"
    finally:
        databases.drop(canonical)


def test_upgrade_downgrade_upgrade(empty_url: str) -> None:
    migrate.upgrade(empty_url)
    first = catalog(empty_url)
    assert migrate.pending(empty_url) == []
    migrate.downgrade(empty_url, "base")
    assert migrate.current(empty_url) is None
    with psycopg.connect(empty_url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'gov'").fetchone() == (0,)
    assert migrate.head() in migrate.pending(empty_url)
    migrate.upgrade(empty_url)
    assert catalog(empty_url) == first


def test_upgrade_applies_default_policy_once(empty_url: str) -> None:
    migrate.upgrade(empty_url)
    with psycopg.connect(empty_url, autocommit=True) as conn:
        conn.execute("UPDATE gov.caps SET cap = 1 WHERE scope = 'P2' AND window_ms = 86400000")
    migrate.upgrade(empty_url)  # a second upgrade must not overwrite the operator's policy
    with psycopg.connect(empty_url) as conn:
        assert conn.execute(
            "SELECT cap FROM gov.caps WHERE scope = 'P2' AND window_ms = 86400000"
        ).fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM gov.policy_versions").fetchone() == (1,)


def test_the_upgrade_to_reach_rewrites_the_timings_prior_and_the_downgrade_restores_it(empty_url: str) -> None:
    """Migration 0053: gov.timing_curves held click rates (gov.hour_curves_v1); after the
    upgrade it holds the reach (gov.hour_curves_v2), so no hold blends the two scales; the
    downgrade writes click rates again. A database that never refreshed stays empty."""
    from tests.integration.test_best_hours import NOW, crowd, reach_crowd

    def prior(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
        return conn.execute("SELECT segment, hour, round(estimate::numeric, 12) FROM gov.timing_curves "
                            "ORDER BY 1, 2").fetchall()

    def estimates(conn: psycopg.Connection[Any], version: int) -> list[tuple[Any, ...]]:
        return conn.execute(f"SELECT coalesce(segment, ''), hour, round(estimate::numeric, 12) "
                            f"FROM gov.hour_curves_v{version}() ORDER BY 1, 2").fetchall()

    migrate.upgrade(empty_url, "0052_local_instant_planned_once")
    with psycopg.connect(empty_url, autocommit=True) as conn:
        assert prior(conn) == []
    migrate.upgrade(empty_url)
    with psycopg.connect(empty_url, autocommit=True) as conn:
        assert prior(conn) == []  # never refreshed: nothing written
    migrate.downgrade(empty_url, "0052_local_instant_planned_once")
    with psycopg.connect(empty_url, autocommit=True) as conn:
        crowd(conn, n=3, peak=20)  # clicks at 20:00 UTC
        reach_crowd(conn, n=3, peak=9)  # reachable at 09:00 UTC
        # the crowds' days moved to end yesterday (whole days: the hours stay), for the default window
        conn.execute("UPDATE gov.push_events SET created_at = created_at - ((%s::timestamptz AT TIME ZONE 'UTC')::date"
                     " - (now() AT TIME ZONE 'UTC')::date) * interval '1 day'", (NOW,))
        conn.execute("SELECT gov.refresh_timing_curves_v1()")
        clicks = prior(conn)
        assert clicks == estimates(conn, 1) and len(clicks) == 24
    migrate.upgrade(empty_url)
    with psycopg.connect(empty_url, autocommit=True) as conn:
        reach = prior(conn)
        assert reach == estimates(conn, 2) and reach != clicks
        assert max(reach, key=lambda r: r[2])[1] == 9
    migrate.downgrade(empty_url, "0052_local_instant_planned_once")
    with psycopg.connect(empty_url, autocommit=True) as conn:
        assert prior(conn) == estimates(conn, 1)
