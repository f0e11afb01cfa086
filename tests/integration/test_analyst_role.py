"""The analyst role reads what analysts need and nothing else, writes nothing; the queries
of docs/analysts.md run as written; gov.analytics.tables matches the database."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import errors, sql
from sqlalchemy.dialects import postgresql

from gov import Governor, Message, policy
from gov.analytics import tables as analytics
from gov.cli.db import grant_analyst_role
from gov.db import sqlalchemy_url
from gov.testing import PushService
from gov.users import set_segment
from tests.integration.test_report import seed_fatigue, seed_suppressions

DOC = Path(__file__).resolve().parents[2] / "docs" / "analysts.md"
SECRET_COLUMNS = ("endpoint", "p256dh", "auth")
# the analysts' relations: declared in gov.analytics.tables column for column
OWN = {"push_events", "campaign_shortfall", "suppressions_daily", "revocation_suspects"}


@pytest.fixture
def analyst(conn: psycopg.Connection[Any]) -> Iterator[str]:
    """A fresh role name (roles are cluster-wide: unique per test), dropped afterwards."""
    role = f"gov_analyst_{secrets.token_hex(4)}"
    yield role
    conn.execute("RESET ROLE")
    exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    if exists:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def as_role(conn: psycopg.Connection[Any], role: str) -> None:
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))


@pytest.fixture
def seeded(db_url: str) -> datetime:
    now = datetime.now(UTC).replace(microsecond=0)
    with PushService() as push, Governor(db_url, allow_loopback_http=True, pool_size=2) as gov:
        seed_fatigue(gov, push, now)
        seed_suppressions(gov, now)
        # a busy account: the seventh P1 of the day waits in the deferral queue
        for i in range(7):
            gov.send(Message(user_id="busy", id=f"mention-{i}", tier="P1", title="@you"), deliver=False,
                     at=now - timedelta(hours=20) + timedelta(hours=3 * (i == 6), minutes=i))
        # a dormant user held to the policy's dormant P2 window: one a week
        with psycopg.connect(db_url, autocommit=True) as c, c.transaction():
            text = policy.default_policy_text() + (
                '\n[tiers.P2.segments.dormant]\nwindows = [{ window = "7d", cap = 1 }]\n'
            )
            policy.apply(c, policy.parse_policy(text), text)
            set_segment(c, "sleepy", "dormant")
        for i in range(2):
            gov.decide(Message(user_id="sleepy", id=f"winback-{i}", tier="P2"), at=now - timedelta(hours=2 - i))
    return now


def test_grant_analyst_creates_the_role_once(db_url: str, analyst: str, conn: psycopg.Connection[Any]) -> None:
    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gov.cli", "db", "grant-analyst", analyst],
            capture_output=True, text=True, timeout=60, env={**os.environ, "GOV_DATABASE_URL": db_url},
        )

    first = run()
    assert first.returncode == 0, first.stderr
    assert f"role {analyst} created (NOLOGIN)" in first.stderr
    assert conn.execute("SELECT rolcanlogin FROM pg_roles WHERE rolname = %s", (analyst,)).fetchone() == (False,)
    second = run()  # idempotent
    assert second.returncode == 0 and "created" not in second.stderr and "granted" in second.stderr


def test_reads_what_analysts_need_writes_nothing(
    seeded: datetime, analyst: str, conn: psycopg.Connection[Any]
) -> None:
    assert grant_analyst_role(conn, analyst) is True
    relations = conn.execute(
        "SELECT tablename, true FROM pg_tables WHERE schemaname = 'gov' "
        "UNION ALL SELECT viewname, false FROM pg_views WHERE schemaname = 'gov' ORDER BY 1"
    ).fetchall()
    columns = dict(
        conn.execute(
            "SELECT table_name, min(column_name) FROM information_schema.columns WHERE table_schema = 'gov' "
            "GROUP BY table_name"
        ).fetchall()
    )
    as_role(conn, analyst)
    for query in (
        "SELECT count(*) FROM gov.push_suppressions",
        "SELECT count(*) FROM gov.push_events",
        "SELECT count(*) FROM gov.messages",
        "SELECT count(*) FROM gov.sends",
        "SELECT count(*) FROM gov.caps",
        "SELECT count(*) FROM gov.campaign_shortfall",
        "SELECT count(*) FROM gov.suppressions_daily",
        "SELECT count(*) FROM gov.revocation_suspects",
        "SELECT count(*) FROM gov.hour_curve",
        "SELECT count(*) FROM gov.best_hours_v1('a1')",
        "SELECT count(*) FROM gov.best_hours_v2('a1')",
        "SELECT count(*) FROM gov.hour_curves_v2()",
        "SELECT count(*) FROM gov.fatigue_report_v1()",
        "SELECT id, user_id, created_at, retired_at, retired_reason FROM gov.subscriptions",
    ):
        row = conn.execute(query).fetchone()
        assert row is not None and row[0], query  # readable, and the seed put rows there
    for column in (*SECRET_COLUMNS, "*"):
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(sql.SQL("SELECT {} FROM gov.subscriptions").format(
                sql.SQL("*") if column == "*" else sql.Identifier(column)
            ))
    for private in ("outbox", "message_content", "delivery_attempts", "users", "user_caps", "user_topic_optouts"):
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(sql.SQL("SELECT count(*) FROM gov.{}").format(sql.Identifier(private)))
    assert len(relations) >= 15
    for name, is_table in relations:
        rel = sql.SQL("gov.{}").format(sql.Identifier(name))
        col = sql.Identifier(columns[name])
        statements = [
            sql.SQL("INSERT INTO {} DEFAULT VALUES").format(rel),
            sql.SQL("UPDATE {} SET {} = {}").format(rel, col, col),
            sql.SQL("DELETE FROM {}").format(rel),
        ]
        if is_table:
            statements.append(sql.SQL("TRUNCATE {}").format(rel))
        for statement in statements:
            # a table refuses on privilege; a view may refuse earlier (it is not updatable): refused either way
            with pytest.raises(errors.InsufficientPrivilege if is_table else psycopg.Error):
                conn.execute(statement)
    # and no write through a function either (they run as the caller)
    for call in (
        "SELECT * FROM gov.decide_v1('x', 'y', 'P0')",
        "SELECT gov.record_event_v1('a1', 'a1-m0', 'click')",
        "SELECT gov.subscribe_v2('x', 'https://p.example/1', 'k', 'a')",
    ):
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(call)
    conn.execute("RESET ROLE")
    assert conn.execute("SELECT count(*) FROM gov.messages WHERE user_id = 'x'").fetchone() == (0,)


def doc_queries() -> list[str]:
    return re.findall(r"```sql\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.DOTALL)


def test_every_query_in_the_analysts_doc_runs_as_the_analyst(
    seeded: datetime, analyst: str, conn: psycopg.Connection[Any]
) -> None:
    queries = doc_queries()
    assert len(queries) >= 10, "the doc's sql blocks were not found"
    grant_analyst_role(conn, analyst)
    as_role(conn, analyst)
    for query in queries:
        rows = conn.execute(query.encode()).fetchall()  # bytes: the doc's text is not a format string
        assert rows, f"no rows from the doc's query (the seed should give every one some):\n{query}"


def _pg_type(col: sa.Column[Any]) -> str:
    compiled = col.type.compile(dialect=postgresql.dialect()).lower()
    return {"varchar(4)": "character varying", "varchar(10)": "character varying"}.get(compiled, compiled)


def test_sqlalchemy_tables_match_the_database(seeded: datetime, db_url: str, analyst: str,
                                              conn: psycopg.Connection[Any]) -> None:
    catalog: dict[str, list[tuple[str, str]]] = {}
    for table, column, data_type in conn.execute(
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = 'gov' ORDER BY table_name, ordinal_position"
    ).fetchall():
        catalog.setdefault(table, []).append((column, data_type))
    for table in analytics.metadata.tables.values():
        declared = [(c.name, _pg_type(c)) for c in table.columns]
        names = {c for c, _ in declared}
        actual = catalog[table.name]
        if table.name in OWN:
            assert declared == actual, table.name
        else:  # others' tables may grow: what is declared must exist, as declared, in order
            assert declared == [a for a in actual if a[0] in names], table.name
    assert not {c.name for c in analytics.subscriptions.columns} & set(SECRET_COLUMNS)
    grant_analyst_role(conn, analyst)
    engine = sa.create_engine(sqlalchemy_url(db_url))
    try:
        with engine.connect() as c:
            c.connection.driver_connection.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(analyst)))
            for table in analytics.ANALYST_RELATIONS:
                c.execute(sa.select(table).limit(3)).all()
            report = c.execute(analytics.fatigue_report(now=seeded)).all()
            assert [r.bucket for r in report] == [1, 2, 3, 8] and report[2].crossover
            digest = c.execute(analytics.fatigue_report(now=seeded, segment="digest-")).all()
            assert [r.accepted for r in digest] == [4, 4, 4, 1]
            suspects = c.execute(analytics.revocation_suspects_since(min_accepted=5, now=seeded)).all()
            assert [s.user_id for s in suspects] == ["d1"]
            sd = analytics.suppressions_daily
            daily = c.execute(sa.select(sd.c.suppressed).where(sd.c.tier == "P2")).scalar_one()
            assert daily == 3  # seed_suppressions' two and the dormant user's second win-back
            ssd = analytics.segment_suppressions_daily
            by_segment = c.execute(sa.select(ssd.c.segment, ssd.c.blocked_by).where(ssd.c.tier == "P2")
                                   .where(ssd.c.segment.is_not(None))).all()
            assert [tuple(r) for r in by_segment] == [("dormant", "cap_604800000ms")]
    finally:
        engine.dispose()


def test_a_bad_role_name_is_refused(conn: psycopg.Connection[Any]) -> None:
    from gov.errors import GovError

    with pytest.raises(GovError, match="invalid role name"):
        grant_analyst_role(conn, "")
    with pytest.raises(GovError, match="invalid role name"):
        grant_analyst_role(conn, "x" * 64)
