"""`gov bench` as a user runs it: every contender on every workload, and the lock variant's race.

No timing is asserted anywhere: on a shared machine a figure proves nothing. What is
asserted is that every line was measured and that each workload produced the verdicts
it is built to produce.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gov.lab.bench import decisions
from gov.lab.bench.redis_lua import REDIS_CONTENDERS
from gov.testing.postgres import TemplateDatabases

REDIS = shutil.which("redis-server") is not None and importlib.util.find_spec("redis") is not None


def bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # gov.lab.bench.cli on its own, so the test does not depend on the command's registration
    full_env = {k: v for k, v in os.environ.items() if k != "GOV_DATABASE_URL"} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "gov.lab.bench.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )


def gov_schemas(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'gov'").fetchone()
    assert row is not None
    return int(row[0])


def test_bench_smoke(pg_server: str, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    before = gov_schemas(pg_server)
    r = bench(
        "--seconds", "1", "--connections", "2", "--users", "200", "--json", str(out),
        env={"GOV_DATABASE_URL": pg_server},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "decisions/s" in r.stdout and "× floor" in r.stdout

    report = json.loads(out.read_text())
    settings: dict[str, Any] = report["settings"]
    assert settings["connections"] == 2 and settings["users"] == 200 and settings["history"] == 0
    expected = {"select1", "gov", *(REDIS_CONTENDERS if REDIS else ())}
    lines = {(f["contender"], f["workload"]): f for f in report["results"]}
    assert set(lines) == {(c, w) for c in expected for w in ("fresh", "saturated", "mixed")}

    for (contender, workload), f in lines.items():
        assert f["decisions"] > 0 and f["decisions_per_s"] > 0, f
        assert 0 < f["p50_ms"] <= f["p99_ms"], f
        if contender == "select1":
            assert f["allowed"] is None and f["suppressed"] is None and f["x_floor"] == 1.0
            continue
        assert f["x_floor"] > 0 and f["allowed"] + f["suppressed"] == f["decisions"], f
        if workload == "fresh":
            assert f["suppressed"] == 0, f  # never-seen users: every decision allowed
        elif workload == "saturated":
            assert f["allowed"] == 0, f  # users at their cap: every decision suppressed
        else:
            # P2 allows 2 / 24 h: never more than two per user of the population
            assert 0 < f["allowed"] <= 2 * 200, f

    # the scratch database is gone, and the server's own database was never given a gov schema
    with psycopg.connect(pg_server, autocommit=True) as conn:
        left = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (settings["database"],)).fetchall()
    assert left == []
    assert gov_schemas(pg_server) == before


def test_unreachable_database_is_one_line() -> None:
    r = bench("--seconds", "1", "--database-url", "postgresql://gov@127.0.0.1:1/nowhere?connect_timeout=2")
    assert r.returncode == 1
    # progress lines may come first; the error is one line, the last, with no traceback
    errors = [line for line in r.stderr.splitlines() if not line.startswith("gov bench: ")]
    assert errors == [r.stderr.splitlines()[-1]], r.stderr
    assert errors[0].startswith("gov: error: cannot reach the database server"), r.stderr
    assert r.stdout == ""


def test_row_lock_variant_gives_exactly_two_of_twenty(databases: TemplateDatabases) -> None:
    url = databases.clone()
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            replaced = decisions.install_lock_variant(conn, "row")
            assert replaced is not None
            row = conn.execute("SELECT prosrc FROM pg_proc WHERE oid = to_regproc(%s)", (replaced,)).fetchone()
            assert row is not None and "FOR UPDATE" in row[0] and "pg_advisory_xact_lock" not in row[0]
            assert decisions.race(url, racers=20, rounds=5) == [2] * 5
            # one P1 and one P2 row per allowed decision: nothing leaked by the refusals
            spent = conn.execute("SELECT budget, count(*) FROM gov.sends GROUP BY budget ORDER BY budget").fetchall()
        assert spent == [("P1", 10), ("P2", 10)]  # no global cap in the default policy: no global rows
    finally:
        databases.drop(url)


def test_row_lock_variant_refuses_a_schema_without_the_lock_line(monkeypatch: pytest.MonkeyPatch) -> None:
    unlocked = [
        (name, text.replace(decisions.ADVISORY_LOCK_LINE, "NULL;")) for name, text in decisions.canonical_schema()
    ]
    monkeypatch.setattr(decisions, "canonical_schema", lambda: unlocked)
    with pytest.raises(decisions.BenchError, match="expected one function"):
        decisions.row_lock_variant()


def _delivery_bench(pg_server: str, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gov.cli", "bench", "--delivery", *args, "--json", str(out),
         "--database-url", pg_server],
        capture_output=True, text=True, timeout=180,
    )


def test_delivery_bench_smoke(tmp_path: Path, pg_server: str) -> None:
    """Counting push service (Node.js, own process): both contenders deliver everything; the
    service's own rate, the CPU per message and the load are reported. No figure is judged."""
    out = tmp_path / "delivery.json"
    result = _delivery_bench(pg_server, out, "--messages", "60", "--workers", "2", "--processes", "2")
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    naive, gov, command, *seeds = report["figures"]
    assert naive["contender"] == "naive pywebpush loop"
    assert gov["contender"].startswith("gov dispatch (2 processes × 2 workers")
    assert command["contender"].startswith("the whole command `gov dispatch --once`")
    # the seeds' sender (Node web-push) runs, or the report says why it could not
    assert [f["contender"].split(":")[0] for f in seeds] == ["the seeds' sender"] or \
        any("seeds' sender" in n and "skipped" in n for n in report["notes"]), report["notes"]
    for f in (naive, gov, command, *seeds):
        assert f["delivered"] == 60 and f["per_second"] > 0 and f["cpu_ms_per_message"] > 0, f
    if seeds:
        assert "the whole command against the seeds' sender" in result.stdout
    assert report["service"] == "count" and report["service_per_second"] > 0
    assert len(report["load_before"]) == len(report["load_after"]) == 3
    for words in ("messages/s", "client CPU ms/msg", "push service alone", "requests/s", "load average"):
        assert words in result.stdout, words


def test_delivery_bench_correctness_pass_on_the_verifying_service(tmp_path: Path, pg_server: str) -> None:
    """--verify: gov.testing.PushService checks every VAPID token and decrypts every payload;
    it counts only what it accepted, so both contenders' requests were right."""
    out = tmp_path / "verified.json"
    result = _delivery_bench(pg_server, out, "--messages", "24", "--workers", "2", "--processes", "2", "--verify")
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["service"] == "verify" and report["service_per_second"] is None
    assert [f["delivered"] for f in report["figures"]] == [24, 24, 24]  # naive, forked runners, the command


@pytest.mark.skipif(not REDIS, reason="redis-server or redis-py missing")
def test_the_seeds_logged_send_path_writes_one_row_per_refusal() -> None:
    """redis_per_tier_logged is the seed's send() with its Step 4: every refused message,
    and only those, leaves one suppression row naming the window that blocked it."""
    import redis

    from gov.lab.bench.redis_lua import RedisDecider, TierWindows, load_scripts, own_redis_server, redis_server_path

    binary = redis_server_path()
    assert binary is not None
    consumes = (TierWindows("P1", ((86_400_000, 6),)), TierWindows("P2", ((86_400_000, 2), (604_800_000, 5))))
    logged: list[tuple[str, str, str]] = []
    with own_redis_server(binary) as server, redis.Redis.from_url(server.url(False)) as client:
        decider = RedisDecider(client, "redis_per_tier_logged", load_scripts(client), consumes,
                               lambda *row: logged.append(row))  # fmt: skip
        verdicts = [decider.decide("u1", f"m{i}") for i in range(4)]
        plain = RedisDecider(client, "redis_per_tier", load_scripts(client), consumes)
        assert plain.decide("u1", "m9") is False
    assert verdicts == [True, True, False, False]
    assert logged == [("u1", "m2", "cap_86400000ms"), ("u1", "m3", "cap_86400000ms")]


HTTP_CLIENTS = ["python", *(["wrk"] if shutil.which("wrk") else [])]


@pytest.mark.parametrize("client", HTTP_CLIENTS)
def test_http_bench_smoke(pg_server: str, tmp_path: Path, client: str) -> None:
    """gov serve and the seeds' node:http server (when node, npm and redis-server are there)
    answer the same load: every answer a 200 verdict, every user filled to the cap and then
    refused, gov's database consistent. No figure is judged."""
    out = tmp_path / "http.json"
    r = bench(
        "--http", "--seconds", "1", "--rounds", "1", "--users", "50", "--http-connections", "4",
        "--http-client", client, "--json", str(out),
        env={"GOV_DATABASE_URL": pg_server, "GOV_DATA_DIR": str(tmp_path / "data")},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert report["settings"]["users"] == 50 and report["settings"]["connections"] == 4
    assert report["client"].startswith(client)
    assert report["ceiling"]["per_second"] > 0 and report["ceiling"]["non_200"] == 0
    for words in ("requests/s", "× seeds' server", "p50 ms", "p99 ms", "non-200", "load average", "ceiling"):
        assert words in r.stdout, words

    contenders: dict[str, Any] = report["contenders"]
    if "seeds_server" in report["skipped"]:
        why = report["skipped"]["seeds_server"]
        assert f"seeds_server: skipped: {why}" in r.stdout
        if shutil.which("node") is None:
            assert why == "node is not on PATH"
        assert set(contenders) == {"gov_serve"}
    else:
        assert set(contenders) == {"seeds_server", "gov_serve"}
        assert contenders["gov_serve"]["x_seeds_server"] > 0
    for name, c in contenders.items():
        (run,) = c["rounds"]
        assert run["requests"] > 0 and run["per_second"] > 0 and 0 < run["p50_ms"] <= run["p99_ms"], (name, run)
        # every answer a 200 verdict: the fill's all allowed (two per user), the round's all refused
        assert c["non_200"] == 0 and c["invalid"] == 0 and c["fill"]["non_200"] == 0, (name, c)
        assert c["fill"]["allowed"] == 100 and c["fill"]["requests"] == 100, (name, c["fill"])
        assert c["allowed"] == 0 and c["refused"] == run["requests"], (name, c)
        # each round's server CPU a request, from the contender's own processes
        (cpu,) = c["cpu_us_per_request"]
        assert cpu["server"] is not None and cpu["server"] > 0, (name, cpu)
    assert "CPU µs/request: server + store" in r.stdout
    assert contenders["gov_serve"]["check"].startswith("ok: no user over a cap"), contenders["gov_serve"]
    assert contenders["gov_serve"]["x_baseline"] is None  # no --http-baseline
    assert report["failures"] == []
    # the scratch database is gone
    with psycopg.connect(pg_server, autocommit=True) as conn:
        left = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                            (report["settings"]["databases"]["gov_serve"],)).fetchall()
    assert left == []


def test_compare_url_measures_both_targets_with_ratios_and_server_cpu(pg_server: str, tmp_path: Path) -> None:
    """--compare-url on a second scratch database of the same server: both targets' lines, the
    compare/primary ratios, and a positive server CPU per decision for each local node. No figure is judged."""
    out = tmp_path / "compare.json"
    r = bench(
        "--workload", "fresh", "--seconds", "1", "--rounds", "2", "--connections", "2", "--no-redis",
        "--compare-url", pg_server, "--json", str(out), env={"GOV_DATABASE_URL": pg_server},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    for words in ("gov@compare", "select1@compare", "compare/primary", "server CPU per decision", "µs / decision"):
        assert words in r.stdout, words
    report = json.loads(out.read_text())
    lines = {f["contender"]: f for f in report["results"]}
    assert set(lines) == {"select1", "gov", "select1@compare", "gov@compare"}
    assert report["settings"]["compare_database"] != report["settings"]["database"]
    for name, f in lines.items():
        assert f["decisions"] > 0 and f["decisions_per_s"] > 0, f
        if name.endswith("@compare"):
            assert f["target"] == "compare" and f["x_primary_rate"] > 0 and f["x_primary_p50"] > 0, f
            assert f["x_primary_p99"] > 0, f
        else:
            assert f["target"] == "primary" and f["x_primary_rate"] is None, f
    assert lines["gov@compare"]["suppressed"] == 0  # fresh users on the compare target too
    cpu = report["server_cpu"]
    assert {row["contender"] for row in cpu} == set(lines)
    for row in cpu:
        # the test server is on this machine: every node is counted, and spent something
        assert row["us_per_decision"] is not None and row["us_per_decision"] > 0, row
    # both scratch databases are gone
    with psycopg.connect(pg_server, autocommit=True) as conn:
        left = conn.execute("SELECT 1 FROM pg_database WHERE datname = ANY(%s)",
                            ([report["settings"]["database"], report["settings"]["compare_database"]],)).fetchall()
    assert left == []


def test_bad_compare_url_is_one_line_before_any_client(pg_server: str) -> None:
    for url in ("postgresql://gov@127.0.0.1:1/nowhere?connect_timeout=2", "not a url"):
        r = bench("--seconds", "1", "--no-redis", "--compare-url", url, env={"GOV_DATABASE_URL": pg_server})
        assert r.returncode in (1, 2), r.stderr
        lines = r.stderr.splitlines()
        assert lines and lines[-1].startswith("gov: error: cannot reach the --compare-url server"), r.stderr
        # nothing started: no progress line, no scratch database, no client
        assert [line for line in lines if line.startswith("gov bench: ")] == [], r.stderr
        assert r.stdout == ""


def test_the_baseline_gov_serve_is_given_its_own_arguments(pg_server: str, tmp_path: Path) -> None:
    """--baseline-serve-arg reaches the baseline's command line, and only with a baseline: an
    argument its gov serve refuses stops the bench with the baseline's one-line error."""
    root = Path(__file__).resolve().parents[2]  # this checkout, as its own baseline
    env = {"GOV_DATABASE_URL": pg_server, "GOV_DATA_DIR": str(tmp_path / "data")}
    r = bench("--http", "--seconds", "1", "--users", "5", "--http-client", "python", "--http-baseline", str(root),
              "--baseline-serve-arg=--no-such-option", env=env)
    assert r.returncode != 0
    last = r.stderr.splitlines()[-1]
    assert last.startswith("gov: error:") and "baseline" in last and "Traceback" not in r.stderr, r.stderr
    # without a baseline to give it to, a usage error before anything starts
    r = bench("--http", "--seconds", "1", "--users", "5", "--http-client", "python", "--baseline-serve-arg=--x",
              env=env)
    assert r.returncode == 2 and "--baseline-serve-arg" in r.stderr.splitlines()[-1], r.stderr
