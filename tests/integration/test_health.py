"""`gov check`: the named checks of gov.health_v1, and the command cron runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from click.testing import CliRunner

from gov import Governor, Message
from gov.cli import main
from gov.ops.health import run_checks, summary

T = datetime(2026, 7, 26, 12, 0, tzinfo=UTC)


def gov_check(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gov.cli", "check", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, "GOV_DATABASE_URL": db_url},
    )


def plant_p0_suppression(conn: psycopg.Connection[Any]) -> None:
    # structurally impossible through gov: planted by hand, as a misclassification would show up
    conn.execute(
        "INSERT INTO gov.push_suppressions (user_id, message_id, tier, blocked_by, action, created_at) "
        "VALUES ('u42', 'otp-1', 'P0', 'cap_86400000ms', 'drop', %s)",
        (T,),
    )


def test_clean_database_passes(db_url: str, governor: Governor) -> None:
    for i in range(3):  # ordinary suppressions are no alarm
        governor.decide(Message(user_id="u", id=f"m{i}", tier="P2"))
    result = gov_check(db_url)
    assert (result.returncode, result.stdout, result.stderr) == (0, "ok\n", "")


def test_a_p0_suppression_fails_with_one_line(db_url: str, conn: psycopg.Connection[Any]) -> None:
    plant_p0_suppression(conn)
    result = gov_check(db_url)
    assert result.returncode == 1 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("gov: check failed: p0_suppressions: 1 suppression(s) of exempt tier(s) P0")
    assert "otp-1" in line and "u42" in line


def test_every_check_by_name(conn: psycopg.Connection[Any]) -> None:
    checks = run_checks(conn, now=T)
    assert [(c.name, c.ok) for c in checks] == [
        ("p0_suppressions", True), ("outbox_stuck", True), ("push_auth", True), ("deferred_overdue", True),
        ("held_failed", True), ("outbox_failed", True),
    ]
    assert summary(checks) is None


def test_stuck_outbox_rows(conn: psycopg.Connection[Any]) -> None:
    (sub,) = conn.execute(  # type: ignore[misc]
        "INSERT INTO gov.subscriptions (user_id, endpoint, p256dh, auth) VALUES ('u', 'https://p.example/1', 'k', 'a') "
        "RETURNING id"
    ).fetchone()
    conn.execute(
        "INSERT INTO gov.outbox (user_id, message_id, subscription_id, state, next_attempt_at, lease_until, "
        "created_at) VALUES ('u', 'm', %s, 'sending', %s, %s, %s)",
        (sub, T - timedelta(hours=1), T - timedelta(minutes=30), T - timedelta(hours=1)),
    )
    failed = {c.name: c for c in run_checks(conn, now=T)}["outbox_stuck"]
    assert not failed.ok and "1 outbox row(s) stuck" in failed.detail and "gov dispatch" in failed.detail
    assert {c.name: c.ok for c in run_checks(conn, now=T, stuck_after=timedelta(hours=1))}["outbox_stuck"]


def test_push_service_refusing_our_key(conn: psycopg.Connection[Any]) -> None:
    (sub,) = conn.execute(  # type: ignore[misc]
        "INSERT INTO gov.subscriptions (user_id, endpoint, p256dh, auth) VALUES ('u', 'https://p.example/1', 'k', 'a') "
        "RETURNING id"
    ).fetchone()
    (outbox,) = conn.execute(  # type: ignore[misc]
        "INSERT INTO gov.outbox (user_id, message_id, subscription_id, next_attempt_at, created_at) "
        "VALUES ('u', 'm', %s, %s, %s) RETURNING id",
        (sub, T, T),
    ).fetchone()
    conn.execute(
        "INSERT INTO gov.delivery_attempts (outbox_id, user_id, message_id, subscription_id, origin, worker, outcome, "
        "status, attempted_at) VALUES (%s, 'u', 'm', %s, 'https://fcm.googleapis.com', 'w', 'unauthorized', 403, %s)",
        (outbox, sub, T - timedelta(minutes=10)),
    )
    checks = run_checks(conn, now=T)
    line = summary(checks)
    assert line is not None and line.startswith("push_auth: 1 attempt(s) answered 401/403")
    assert "https://fcm.googleapis.com" in line
    # an hour later it is history, not an alarm
    assert summary(run_checks(conn, now=T + timedelta(hours=1))) is None


def test_json_lists_every_check_and_still_fails(db_url: str, conn: psycopg.Connection[Any]) -> None:
    plant_p0_suppression(conn)
    result = gov_check(db_url, "--json", "--stuck-after", "5m")
    assert result.returncode == 1
    rows = json.loads(result.stdout)
    assert [(r["check"], r["ok"]) for r in rows] == [
        ("p0_suppressions", False), ("outbox_stuck", True), ("push_auth", True), ("deferred_overdue", True),
        ("held_failed", True), ("outbox_failed", True),
    ]
    bad = CliRunner().invoke(main, ["check", "--stuck-after", "soon"], env={"GOV_DATABASE_URL": db_url})
    assert bad.exit_code == 1 and bad.stderr.startswith("gov: error: --stuck-after")


def test_overdue_deferrals(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "INSERT INTO gov.deferred (user_id, message_id, tier, kind, blocked_by, enqueued_at, planned_at, release_at)"
        " VALUES ('u', 'late', 'P1', 'defer', 'cap_86400000ms', %s, %s, %s)",
        (T - timedelta(hours=3), T - timedelta(hours=1), T - timedelta(hours=1)),
    )
    checks = {c.name: c for c in run_checks(conn, now=T)}
    assert not checks["deferred_overdue"].ok
    assert "is gov release running?" in checks["deferred_overdue"].detail
    assert "late" in checks["deferred_overdue"].detail
    # not yet overdue by the threshold: fine
    assert all(c.ok for c in run_checks(conn, now=T - timedelta(minutes=50)))


def test_check_conservation_passes_then_fails_on_a_plant(db_url: str, conn: psycopg.Connection[Any]) -> None:
    from gov import Governor, Message

    with Governor(db_url) as g:
        for i in range(3):
            g.decide(Message(user_id="u", id=f"m{i}", tier="P2"))
    ok = gov_check(db_url, "--conservation", "1d")
    assert ok.returncode == 0 and ok.stdout.strip() == "ok", ok.stderr
    conn.execute("INSERT INTO gov.sends SELECT 'u', 'P2', now(), 'm2'")  # a suppressed message that spent
    bad = gov_check(db_url, "--conservation", "1d")
    assert bad.returncode == 1
    assert "conservation: 1 message(s) inconsistent, first m2 of user u" in bad.stderr


def test_a_failed_delivery_is_an_alarm(conn: psycopg.Connection[Any]) -> None:
    (sub,) = conn.execute(  # type: ignore[misc]
        "INSERT INTO gov.subscriptions (user_id, endpoint, p256dh, auth) VALUES ('u', 'https://p.example/1', 'k', 'a') "
        "RETURNING id"
    ).fetchone()
    conn.execute(
        "INSERT INTO gov.outbox (user_id, message_id, subscription_id, state, next_attempt_at, last_status, "
        "last_error, created_at, finished_at) VALUES ('u', 'big', %s, 'failed', %s, 413, 'payload too large', %s, %s)",
        (sub, T, T - timedelta(hours=1), T - timedelta(hours=1)),
    )
    checks = {c.name: c for c in run_checks(conn, now=T)}
    assert not checks["outbox_failed"].ok
    assert "big" in checks["outbox_failed"].detail and "payload too large" in checks["outbox_failed"].detail
    later = {c.name: c for c in run_checks(conn, now=T + timedelta(days=2))}
    assert later["outbox_failed"].ok  # an alarm for a day, not forever
