"""`gov soak`, short: 4 senders for about 10 s, a runner and a releaser; every check must pass.

The full run (60 s, 16 senders) is for the command line and CI's smoke run; this one
proves the command and its checks work, on the test server (a scratch database there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from gov import policy
from gov.lab.soak import SOAK_POLICY
from gov.ops.integrity import check_integrity, over_cap, spend_mismatches
from gov.testing.postgres import TemplateDatabases


def soak(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOV_")}
    return subprocess.run(
        [sys.executable, "-m", "gov.lab.soak", *args], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.slow
def test_a_short_soak_loses_nothing(pg_server: str) -> None:
    run = soak("--seconds", "10", "--senders", "4", "--users", "200", "--database-url", pg_server, "--json")
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    report: dict[str, Any] = json.loads(run.stdout)
    assert report["ok"] is True
    assert report["errors"] == 0, report["error_messages"]
    assert report["lost"] == 0, report["lost_detail"]
    assert report["over_cap_users"] == 0, report["over_cap_detail"]
    assert report["spend_mismatches"] == 0
    assert report["decisions"] > 0 and report["deliveries"] > 0
    assert report["drained"] is True
    # every tier was exercised, and caps bound: some verdicts were suppressions of each verb
    verdicts = report["verdicts"]
    assert {k.split(":")[0] for k in verdicts} == {"P0", "P1", "P2", "P3"}, verdicts
    assert {"P1:defer", "P2:drop", "P3:collapse"} <= set(verdicts), verdicts
    assert report["states"].get("delivered", 0) > 0 and report["states"].get("collapsed", 0) > 0, report["states"]
    roles = {m["role"] for m in report["memory"]}
    assert {"runner", "releaser", "sender 1", "sender 4"} <= roles
    for m in report["memory"]:
        if m["role"] != "soak (main)":
            assert m["flat"] is not False, m


def test_the_text_report_and_a_failing_check(pg_server: str) -> None:
    run = soak("--seconds", "2", "--senders", "1", "--users", "20", "--database-url", pg_server)
    assert run.returncode == 0, run.stderr[-3000:]
    for line in ("decisions", "deliveries", "errors", "lost messages", "over-cap users", "memory", "result: OK"):
        assert line in run.stdout, run.stdout
    # a soak that cannot run is a failure, said in one line
    bad = soak("--seconds", "2", "--database-url", "postgresql://nobody@127.0.0.1:1/none")
    assert bad.returncode != 0 and "error" in bad.stderr.lower(), bad.stderr[-2000:]


def test_the_budget_scan_finds_a_user_over_a_cap(databases: TemplateDatabases) -> None:
    """The scan the soak and the fault tests rely on: exact at the cap, and it finds one over."""
    url = databases.clone()
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            with conn.transaction():
                policy.apply(conn, policy.parse_policy(SOAK_POLICY), SOAK_POLICY)
            # P2: 1 per 10 s. Two rows 10 s apart are fine (the window is open at its old end),
            # two rows 9.999 s apart are one over.
            rows = [
                ("ok", "P2", "00:00:00", "a"), ("ok", "P2", "00:00:10", "b"),
                ("over", "P2", "00:00:00", "a"), ("over", "P2", "00:00:09.999", "b"),
                ("topic", "topic:x", "00:00:00", "a"), ("topic", "topic:x", "00:00:01", "b"),
                ("topic", "topic:x", "00:00:02", "c"),
            ]
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO gov.sends (user_id, budget, sent_at, message_id)"
                    " VALUES (%s, %s, ('2026-01-01 ' || %s || '+00')::timestamptz, %s)",
                    rows,
                )
            found = {(o.user_id, o.budget, o.window_ms, o.used, o.cap) for o in over_cap(conn)}
            assert found == {("over", "P2", 10_000, 2, 1), ("topic", "topic:x", 30_000, 3, 2)}, found
            # a user's own lower cap is the one that counts
            conn.execute("INSERT INTO gov.user_caps (user_id, scope, window_ms, cap) VALUES ('ok', 'P2', 10000, 0)")
            assert ("ok", "P2", 10_000, 1, 0) in {(o.user_id, o.budget, o.window_ms, o.used, o.cap)
                                                   for o in over_cap(conn)}
            # a segment's windows replace the tier's: in a segment allowed 3 per 10 s, 'over' is within
            conn.execute("INSERT INTO gov.segment_caps (tier, segment, window_ms, cap)"
                         " VALUES ('P2', 'loose', 10000, 3)")
            conn.execute("INSERT INTO gov.users (user_id, segment) VALUES ('over', 'loose')")
            assert "over" not in {o.user_id for o in over_cap(conn)}
            conn.execute("UPDATE gov.segment_caps SET cap = 1")
            assert ("over", "P2", 10_000, 2, 1) in {(o.user_id, o.budget, o.window_ms, o.used, o.cap)
                                                     for o in over_cap(conn)}
            # and those rows spent without any decision: the spend check names them
            assert {(u, m) for u, m, *_ in spend_mismatches(conn)} >= {("over", "a"), ("over", "b")}
        assert not check_integrity(url, datetime(2025, 1, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)).ok
    finally:
        databases.drop(url)


@pytest.mark.parametrize("seconds", ["0", "-1"])
def test_bad_options_are_refused(seconds: str) -> None:
    run = soak("--seconds", seconds)
    assert run.returncode == 2 and "--seconds" in run.stderr
