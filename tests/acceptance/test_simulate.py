"""`gov simulate` end to end: small runs on the test server, and one on the embedded default."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gov.lab.simulate import SimConfig, simulate
from gov.testing.postgres import TemplateDatabases


def gov_simulate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real command in a subprocess, as a user runs it (stdout: the summary)."""
    return subprocess.run(
        [sys.executable, "-m", "gov.lab.simulate.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=180,
    )


def assert_cost_adds_up(line: str) -> None:
    """The run's CPU on its last line: who spent it, and parts that add up to the whole."""
    found = re.search(r"CPU ([\d.]+) s on (\d+) cores, load [\d.]+ before: gov ([\d.]+) \(this process ([\d.]+), "
                      r"runners and push services ([\d.]+)\), PostgreSQL ([\d.]+)$", line)
    assert found, line
    total, _, gov, own, children, server = map(float, found.groups())
    assert abs(gov - own - children) <= 0.11 and abs(total - gov - server) <= 0.11, line
    # every delivery was encrypted by a runner and decrypted by a push service, every
    # decision made by the server: none of them can have cost nothing
    assert children > 0 and server > 0 and own > 0, line


@pytest.mark.slow
def test_one_seed_one_summary(pg_server: str) -> None:
    args = ("--users", "60", "--days", "3", "--seed", "7", "--database-url", pg_server)
    first, second = gov_simulate(*args), gov_simulate(*args)
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    assert first.stdout == second.stdout  # no wall time, nothing that depends on thread timing
    for heading in ("Per tier", "Per team", "Top blocking rules", "Sends per user in 3 days", "Fatigue by send volume"):
        assert heading in first.stdout
    assert "P0: " in first.stdout and "0 suppressed ✓" in first.stdout
    # the wall time and the rate are on stderr, on a line of their own
    assert "s wall" in first.stderr.splitlines()[-1] and "messages/s" in first.stderr.splitlines()[-1]
    assert_cost_adds_up(first.stderr.splitlines()[-1])
    other = gov_simulate("--users", "60", "--days", "3", "--seed", "8", "--database-url", pg_server)
    assert other.returncode == 0, other.stderr
    assert other.stdout != first.stdout  # the seed really drives the story


@pytest.fixture
def kept_run(pg_server: str, databases: TemplateDatabases) -> Iterator[tuple[Any, str]]:
    outcome = simulate(pg_server, SimConfig(users=60, days=3, seed=3), governed=True, keep=True)
    assert outcome.kept_url is not None
    yield outcome, outcome.kept_url
    databases.drop(outcome.kept_url)


def test_p0_is_all_delivered_and_the_queue_really_worked(kept_run: tuple[Any, str]) -> None:
    outcome, url = kept_run
    summary = outcome.summary
    assert summary.exempt.ok and summary.exempt.messages > 0 and summary.exempt.suppressed == 0
    with psycopg.connect(url) as conn:

        def one(query: str) -> Any:
            row = conn.execute(query).fetchone()  # type: ignore[arg-type]
            assert row is not None
            return row[0]

        # P0: never suppressed, never held, every endpoint it fanned out to delivered
        assert one("SELECT count(*) FROM gov.push_suppressions WHERE tier = 'P0'") == 0
        assert one("SELECT count(*) FROM gov.deferred WHERE tier = 'P0'") == 0
        assert one(
            "SELECT count(*) FROM gov.outbox o JOIN gov.messages m USING (user_id, message_id)"
            " WHERE m.tier = 'P0' AND o.state <> 'delivered'"
        ) == 0
        assert one(
            "SELECT count(*) FROM gov.messages m WHERE m.tier = 'P0' AND NOT EXISTS"
            " (SELECT 1 FROM gov.outbox o WHERE o.user_id = m.user_id AND o.message_id = m.message_id)"
        ) == 0
        # deferrals, quiet hours and collapses really happened, and really reached the push service
        assert one("SELECT count(*) FROM gov.deferred WHERE kind = 'quiet' AND state = 'released'") > 0
        assert one("SELECT count(*) FROM gov.deferred WHERE kind = 'collapse'") > 0  # digests held to collapse
        assert one("SELECT count(*) FROM gov.push_suppressions WHERE blocked_by LIKE 'cap_%'") > 0
        accepted = one("SELECT count(*) FROM gov.delivery_attempts WHERE outcome = 'accepted'")
        assert accepted == outcome.stats.push_decrypted > 0  # each one VAPID-verified and decrypted
        # synthetic engagement went through the telemetry API
        assert one("SELECT count(*) FROM gov.push_events WHERE event = 'display'") > 0
        assert one("SELECT count(*) FROM gov.push_events WHERE event = 'click'") > 0


@pytest.mark.slow
def test_compare_the_governor_lowers_p90_and_unsubscribes(pg_server: str, tmp_path: Path) -> None:
    page = tmp_path / "sim.html"
    r = gov_simulate("--users", "150", "--days", "7", "--seed", "1", "--compare", "--html", str(page),
                     "--database-url", pg_server)
    assert r.returncode == 0, r.stderr
    assert "Governed vs governor off" in r.stdout
    assert "The governor lowered both" in r.stdout, r.stdout
    assert "by reach (displayed at once, by hour of delivery" in r.stdout  # both estimates compared
    html = page.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and html.count("<svg") >= 4
    # self-contained: nothing fetched, nothing run
    assert "<script" not in html and "<link" not in html and "src=" not in html


def test_a_bad_policy_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "policy.toml"
    bad.write_text("[tiers.P2]\nwindows = [{ window = \"forever\", cap = 2 }]\n", encoding="utf-8")
    r = gov_simulate("--policy", str(bad), env={"GOV_DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none"})
    assert r.returncode == 2  # bad usage, as gov's other usage errors
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("gov: error:"), r.stderr


def test_the_embedded_default_needs_no_configuration(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GOV_DATABASE_URL"}
    env["GOV_DATA_DIR"] = str(tmp_path / "gov-data")  # never the developer's own ./.gov
    run = subprocess.run(
        [sys.executable, "-m", "gov.lab.simulate.cli", "--users", "20", "--days", "1"],
        capture_output=True, text=True, env=env, timeout=180, cwd=tmp_path,
    )
    try:
        assert run.returncode == 0, run.stderr
        assert "P0: " in run.stdout and "✓" in run.stdout
        # the scratch database is gone again; the server stays up for the next command
        listing = subprocess.run(
            [sys.executable, "-c",
             "import psycopg; from gov.db import embedded_url;"
             "print(psycopg.connect(embedded_url()).execute("
             "\"SELECT count(*) FROM pg_database WHERE datname LIKE 'gov_sim_%'\").fetchone()[0])"],
            capture_output=True, text=True, env=env, timeout=60,
        )
        assert listing.stdout.strip() == "0", listing.stderr
    finally:
        subprocess.run([sys.executable, "-m", "gov.cli", "db", "stop"], env=env, timeout=60, capture_output=True)


def _timed_holds(pg_server: str, databases: TemplateDatabases, warm_days: int) -> tuple[list[int], bool]:
    """The days (from the run's start) on which a 60-user, 3-day run with [timing] on held a
    message at a timed hour, and whether the timing was on at the end."""
    from gov import policy as policy_mod

    text = policy_mod.default_policy_text() + "\n[timing]\nenabled = true\n"
    config = SimConfig(users=60, days=3, seed=3, policy_text=text, policy_name="timing", warm_days=warm_days)
    outcome = simulate(pg_server, config, governed=True, keep=True)
    assert outcome.kept_url is not None
    try:
        with psycopg.connect(outcome.kept_url) as conn:
            days = [int(d) for (d,) in conn.execute(
                "SELECT DISTINCT floor(extract(epoch FROM d.enqueued_at - %s) / 86400) FROM gov.deferred d"
                " WHERE d.timing IS NOT NULL ORDER BY 1", (config.start,))]
            row = conn.execute("SELECT timing_enabled FROM gov.settings").fetchone()
    finally:
        databases.drop(outcome.kept_url)
    return days, bool(row and row[0])


@pytest.mark.slow
def test_a_warm_start_times_nothing_before_its_midnight(pg_server: str, databases: TemplateDatabases) -> None:
    """`--warm-days 2`: the same story holds nothing at a timed hour in its first two days
    (a cold start does, from the first), and the timing is on at the end."""
    cold, cold_on = _timed_holds(pg_server, databases, 0)
    assert cold_on and cold and cold[0] < 2  # the story does time holds early on
    warm, warm_on = _timed_holds(pg_server, databases, 2)
    assert warm_on and warm and min(warm) >= 2, warm


def test_warm_days_must_be_fewer_than_the_run_s_days_and_need_the_timing(tmp_path: Path) -> None:
    r = gov_simulate("--days", "3", "--warm-days", "3", env={"GOV_DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none"})
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == ("gov: error: Invalid value for '--warm-days': 3 is not fewer than the run's 3 days "
                                "(see gov simulate --help)"), r.stderr
    r = gov_simulate("--days", "3", "--warm-days", "1", env={"GOV_DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none"})
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == ("gov: error: Invalid value for '--warm-days': it needs a --policy whose [timing] is "
                                "enabled (see gov simulate --help)"), r.stderr
