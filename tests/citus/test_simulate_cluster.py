"""The same simulated traffic on one server and on the cluster gives the same answers: the
simulation's per-tier summary, the conservation check, the fatigue measure and the views."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from gov.lab.simulate.engine import RunOutcome, SimConfig, simulate
from gov.testing.postgres import admin, dbname_of, with_dbname

CONFIG = SimConfig(users=300, days=3, seed=1)

ANALYST_QUERIES = {
    "fatigue_marginal": "SELECT * FROM gov.fatigue_marginal_v1(interval '28 days', %(end)s, 100)",
    "fatigue_buckets": "SELECT * FROM gov.fatigue_report_v1(interval '7 days', %(end)s, NULL)",
    "states": "SELECT state, count(*) FROM gov.message_states_v1(%(start)s, %(end)s) GROUP BY 1 ORDER BY 1",
    "suppressions_daily": "SELECT * FROM gov.suppressions_daily",
    "deferral_outcomes": "SELECT * FROM gov.deferral_outcomes",
    "campaign_shortfall": "SELECT * FROM gov.campaign_shortfall",
    "segment_sizes": "SELECT * FROM gov.segment_sizes",
    "revocation_suspects": "SELECT * FROM gov.revocation_suspects_v1(interval '7 days', 3, %(end)s)",
}


@pytest.fixture
def runs(pg_server: str, citus_db: str) -> Iterator[tuple[RunOutcome, RunOutcome]]:
    one = simulate(pg_server, CONFIG, governed=True, keep=True, label="one server")
    try:
        cluster = simulate(citus_db, CONFIG, governed=True, keep=True, label="cluster")
        try:
            yield one, cluster
        finally:
            assert cluster.kept_url is not None
            admin(citus_db, "scratch_drop_database", dbname_of(cluster.kept_url))
    finally:
        assert one.kept_url is not None
        admin(pg_server, "scratch_drop_database", dbname_of(one.kept_url))


def _answers(url: str) -> dict[str, list[Any]]:
    params = {"start": CONFIG.start - timedelta(days=1), "end": CONFIG.end + timedelta(days=1)}
    with psycopg.connect(url, autocommit=True) as conn:
        # in one order whatever the server's: the views' ORDER BY leaves ties
        return {name: sorted(conn.execute(query, params).fetchall(), key=repr)
                for name, query in ANALYST_QUERIES.items()}


def test_the_cluster_answers_as_one_server_does(runs: tuple[RunOutcome, RunOutcome], citus_db: str) -> None:
    one, cluster = runs
    assert cluster.summary.by_tier == one.summary.by_tier
    assert cluster.summary.exempt == one.summary.exempt
    assert cluster.summary.exempt.suppressed == 0 and cluster.summary.exempt.all_delivered > 0
    assert cluster.summary.sends_per_user == one.summary.sends_per_user
    assert cluster.summary.events == one.summary.events
    assert cluster.summary.blocking == one.summary.blocking
    assert one.kept_url is not None and cluster.kept_url is not None
    theirs, ours = _answers(cluster.kept_url), _answers(one.kept_url)
    for name in ANALYST_QUERIES:
        assert theirs[name] == ours[name], name
    assert ours["fatigue_marginal"], "the measure had sends to group"
    # gov check --conservation on the cluster, from the shell as cron runs it, at the end of
    # the run (an hour later the messages still held would be overdue: no releaser runs)
    check = subprocess.run(
        [sys.executable, "-m", "gov.cli", "check", "--conservation", "30d", "--json",
         "--at", CONFIG.end.isoformat(), "--database-url", cluster.kept_url],
        capture_output=True, text=True, timeout=300,
    )
    assert check.returncode == 0, check
    checks = {c["check"]: c for c in json.loads(check.stdout)}
    assert checks["conservation"]["ok"], checks["conservation"]
    # and the database it checked is the cluster's: its tables are distributed
    with psycopg.connect(with_dbname(citus_db, dbname_of(cluster.kept_url))) as conn:
        assert conn.execute("SELECT count(*) FROM pg_dist_partition WHERE partmethod = 'h'").fetchone() == (13,)
