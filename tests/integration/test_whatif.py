"""`gov policy whatif`: replay the window under a candidate policy, and change nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql

from gov import Governor, Message, policy
from gov.analytics.whatif import WhatIf, whatif
from gov.cli import main
from gov.users import set_user_cap

T = datetime(2026, 7, 26, 12, 0, tzinfo=UTC)
TIGHTER = policy.default_policy_text().replace('{ window = "24h", cap = 2 }', '{ window = "24h", cap = 1 }')


def seed(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    """P2 traffic under the default policy (2 a day), recorded as: 6 allowed, 1 suppressed.

    u1: two P2 sends three days ago, an hour apart           → allowed, allowed
    u2: three P2 sends yesterday (campaign spring)          → allowed, allowed, suppressed
    u3: one P2 send just before the 7-day window, one 3 h later inside it → allowed, allowed
    u4: two P2 sends, but u4's own cap is 1 a day            → allowed, suppressed
    and a P0 for u1 (exempt: always allowed).
    """
    def p2(user: str, mid: str, at: datetime, **kw: Any) -> None:
        governor.decide(Message(user_id=user, id=mid, tier="P2", **kw), at=at)

    p2("u1", "u1-a", T - timedelta(days=3), topic="news")
    p2("u1", "u1-b", T - timedelta(days=3) + timedelta(hours=1), topic="news")
    for i in range(3):
        p2("u2", f"u2-{i}", T - timedelta(days=1) + timedelta(minutes=i), campaign_id="spring")
    p2("u3", "u3-old", T - timedelta(days=7, hours=1))
    p2("u3", "u3-new", T - timedelta(days=7) + timedelta(hours=2))
    set_user_cap(conn, "u4", "P2", 86_400_000, 1)
    p2("u4", "u4-a", T - timedelta(hours=5))
    p2("u4", "u4-b", T - timedelta(hours=4))
    governor.decide(Message(user_id="u1", id="otp", tier="P0"), at=T - timedelta(hours=2))


def snapshot(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, str | None]]:
    """Every gov table: its row count and an md5 of all its rows."""
    tables = [t for (t,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'gov' ORDER BY 1")]
    assert "sends" in tables and "push_suppressions" in tables
    out = {}
    for table in tables:
        query = sql.SQL("SELECT count(*), md5(string_agg(t::text, '|' ORDER BY t::text)) FROM gov.{} t").format(
            sql.Identifier(table)
        )
        out[table] = conn.execute(query).fetchone()  # type: ignore[assignment]
    return out


def rows(result: WhatIf, dimension: str) -> dict[str | None, tuple[int, int, int, int, int]]:
    return {r.key: (r.messages, r.allowed, r.would_allow, r.extra_suppressed, r.freed) for r in result.by(dimension)}


def test_tighter_p2_cap_gives_the_expected_extra_suppressions(
    governor: Governor, conn: psycopg.Connection[Any]
) -> None:
    seed(governor, conn)
    before = snapshot(conn)
    result = whatif(governor, policy.parse_policy(TIGHTER), TIGHTER, now=T)
    # u1-b, u2-1 and u3-new (u3-old, before the window, still fills its day) would be dropped
    assert rows(result, "total") == {None: (9, 7, 4, 3, 0)}
    assert rows(result, "tier") == {"P0": (1, 1, 1, 0, 0), "P2": (8, 6, 3, 3, 0)}
    assert rows(result, "topic") == {None: (7, 5, 3, 2, 0), "news": (2, 2, 1, 1, 0)}
    assert rows(result, "campaign") == {None: (6, 5, 3, 2, 0), "spring": (3, 2, 1, 1, 0)}
    assert rows(result, "reason") == {None: (4, 4, 4, 0, 0), "cap_86400000ms": (5, 3, 0, 3, 0)}
    assert snapshot(conn) == before


def test_the_same_policy_replays_every_recorded_verdict(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    seed(governor, conn)
    same = policy.default_policy_text()
    result = whatif(governor, policy.parse_policy(same), same, now=T)
    assert rows(result, "total") == {None: (9, 7, 7, 0, 0)}
    # and per message, straight from the SQL function (which needs no rollback around it)
    before = snapshot(conn)
    replayed = conn.execute(
        "SELECT message_id, was_allowed, would_allow, was_reason IS NOT DISTINCT FROM would_reason "
        "FROM gov.whatif_v1(interval '7 days', %s) ORDER BY decided_at",
        (T,),
    ).fetchall()
    assert [r[0] for r in replayed] == ["u3-new", "u1-a", "u1-b", "u2-0", "u2-1", "u2-2", "u4-a", "u4-b", "otp"]
    assert all(was == would and same_reason for _, was, would, same_reason in replayed)
    assert snapshot(conn) == before


def test_messages_decided_at_one_instant_replay_as_they_were_decided(
    governor: Governor, conn: psycopg.Connection[Any]
) -> None:
    """An outside probe: three P2 sends at one --at, c-first and b-second allowed and
    a-third dropped; by message id the replay allowed a-third and suppressed c-first."""
    at = T - timedelta(hours=1)
    for mid in ("c-first", "b-second", "a-third"):
        governor.decide(Message(user_id="tie", id=mid, tier="P2"), at=at)
    same = policy.default_policy_text()
    result = whatif(governor, policy.parse_policy(same), same, now=T)
    assert rows(result, "total") == {None: (3, 2, 2, 0, 0)}
    replayed = conn.execute("SELECT message_id, was_allowed, would_allow FROM gov.whatif_v1(interval '7 days', %s)",
                            (T,)).fetchall()
    assert sorted(replayed) == [("a-third", False, False), ("b-second", True, True), ("c-first", True, True)]


def test_a_looser_policy_frees_suppressions(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    seed(governor, conn)
    looser = policy.default_policy_text().replace('{ window = "24h", cap = 2 }', '{ window = "24h", cap = 3 }')
    result = whatif(governor, policy.parse_policy(looser), looser, now=T)
    # u2-2 is freed; u4-b stays suppressed by u4's own cap of 1
    assert rows(result, "total") == {None: (9, 7, 8, 0, 1)}


def test_an_empty_window(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    seed(governor, conn)
    result = whatif(governor, policy.parse_policy(TIGHTER), TIGHTER, since=timedelta(hours=1), now=T)
    assert result.total.messages == 0 and result.by("tier") == []
    with pytest.raises(ValueError, match="positive"):
        whatif(governor, policy.parse_policy(TIGHTER), TIGHTER, since=timedelta(0), now=T)


def test_cli_prints_the_replay_and_changes_nothing(
    db_url: str, governor: Governor, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    seed(governor, conn)
    before = snapshot(conn)
    candidate = tmp_path / "tight.toml"
    candidate.write_text(TIGHTER)
    runner = CliRunner()
    env = {"GOV_DATABASE_URL": db_url}
    out = runner.invoke(main, ["policy", "whatif", str(candidate), "--at", T.isoformat(), "--json"], env=env)
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["total"]["extra_suppressed"] == 3
    assert {r["key"]: r["extra_suppressed"] for r in data["tier"]} == {"P0": 0, "P2": 3}
    table = runner.invoke(main, ["policy", "whatif", str(candidate), "--at", T.isoformat()], env=env)
    assert table.exit_code == 0, table.output
    # the text wraps where the temporary directory's name ends: read it as words
    words = " ".join(table.stdout.split())
    assert "3 extra suppression(s)" in words and "nothing was written" in words
    assert "spring" in table.stdout and "news" in table.stdout
    broken = tmp_path / "broken.toml"
    broken.write_text("[tiers.P2]\non_exceed = \"maybe\"\n")
    refused = runner.invoke(main, ["policy", "whatif", str(broken)], env=env)
    assert refused.exit_code == 1 and "broken.toml:" in refused.stderr
    assert snapshot(conn) == before


def test_policy_suggest_without_a_crossover_suggests_the_stored_policy(db_url: str, tmp_path: Any) -> None:
    """No accepted sends, no crossover: the suggestion is the stored policy, and it says why."""
    out = tmp_path / "suggested.toml"
    result = CliRunner().invoke(main, ["policy", "suggest", "--out", str(out)], env={"GOV_DATABASE_URL": db_url})
    assert result.exit_code == 0, result.output
    assert "# no change suggested" in result.stderr and "unchanged, all users" in result.stderr
    assert policy.parse_policy(out.read_text()) == policy.default_policy()
    bad = CliRunner().invoke(main, ["policy", "suggest", "--since", "soon"], env={"GOV_DATABASE_URL": db_url})
    assert bad.exit_code == 1 and bad.stderr.startswith("gov: error: --since")
