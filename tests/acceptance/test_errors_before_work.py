"""Configuration errors are one line, checked before any work (issue 31, item 3).

The real `gov` in a subprocess: a bad option or a missing secret of `dispatch`, `serve`,
`bench` and `simulate` is refused before a process is forked, a server started or a
database touched, as exactly one line `gov: error: …` on stderr (exit 2 for usage), and
`gov bench` without redis-py runs without the Redis contenders instead of failing.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from gov.lab.bench.redis_lua import REDIS_CONTENDERS

# a database no check could reach: an error naming anything but the option proves the
# option was not checked first
NOWHERE = "postgresql://gov@127.0.0.1:1/none?connect_timeout=1"


def gov(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gov.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def clean_env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("GOV_")}, **extra}


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gov: error:"), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def vapid_env(tmp_path: Path, url: str) -> dict[str, str]:
    key = tmp_path / "vapid.pem"
    r = gov("vapid", "generate", str(key), env=clean_env())
    assert r.returncode == 0, r.stderr
    return clean_env(GOV_DATABASE_URL=url, GOV_VAPID_PRIVATE_KEY=str(key), GOV_VAPID_SUBJECT="mailto:ops@example.com")


def test_dispatch_with_a_lease_shorter_than_the_timeout_is_one_line_before_any_fork(
    db_url: str, tmp_path: Path
) -> None:
    env = vapid_env(tmp_path, db_url)
    for processes in ("1", "2"):  # two would fork two runners that each refused (two tracebacks)
        r = gov("dispatch", "--once", "--lease", "2", "--processes", processes, env=env)
        assert r.returncode == 2, (r.stdout, r.stderr)
        line = one_line(r)
        assert "--lease" in line and "shorter than the lease 2 s" in line, line
        assert r.stdout == ""  # no summary of a drain that never ran
    # before the database too: an unreachable one is not what it complains about
    r = gov("dispatch", "--once", "--lease", "2", env={**env, "GOV_DATABASE_URL": NOWHERE})
    assert r.returncode == 2 and "--lease" in one_line(r)


def test_usage_errors_of_the_long_commands_are_one_line(tmp_path: Path) -> None:
    env = clean_env(GOV_DATABASE_URL=NOWHERE, GOV_DATA_DIR=str(tmp_path / "data"))
    broken = tmp_path / "broken.toml"
    broken.write_text("[tiers.P0\nexempt = true\n")
    no_p0 = tmp_path / "no_p0.toml"
    no_p0.write_text('[tiers.P1]\nwindows = [{ window = "1h", cap = 1 }]\non_exceed = "drop"\n')
    for args, option in (
        (["dispatch", "--once", "--workers", "0"], "--workers"),
        (["release", "--once", "--batch", "0"], "--batch"),
        (["simulate", "--html", str(tmp_path / "no" / "such" / "dir.html")], "--html"),
        # os.access says yes to root here; no one can create a file in /proc
        (["simulate", "--html", "/proc/gov-summary.html"], "--html"),
        (["simulate", "--policy", str(broken)], "--policy"),
        (["simulate", "--policy", str(no_p0)], "--policy"),
        (["bench", "--json", str(tmp_path)], "--json"),
        (["serve", "--port", "70000"], "--port"),
        # click's float range lets nan and inf through: a nan idle was a busy loop, inf a traceback
        (["release", "--idle", "nan"], "--idle"),
        (["dispatch", "--idle", "inf"], "--idle"),
        (["dispatch", "--once", "--lease", "nan"], "--lease"),
        # a lease is what a dead runner's rows wait for: gov.claim_outbox_v3 takes a day at most
        (["dispatch", "--once", "--lease", "90000"], "--lease"),
        (["serve", "--batch-window-ms", "nan"], "--batch-window-ms"),
        # a report or a suggestion computed, printed, then "cannot write": checked first
        (["report", "fatigue", "--html", str(tmp_path / "no" / "such" / "dir.html")], "--html"),
        (["policy", "suggest", "--out", str(tmp_path / "no" / "such" / "dir.toml")], "--out"),
    ):
        r = gov(*args, env=env)
        assert r.returncode == 2, (args, r.stderr)
        assert option in one_line(r), (args, r.stderr)
    assert not (tmp_path / "data").exists(), "a command started an embedded server before refusing"


def test_serve_without_its_token_refuses_before_touching_the_database(tmp_path: Path) -> None:
    r = gov("serve", "--port", "0", env=clean_env(GOV_DATABASE_URL=NOWHERE))
    assert r.returncode == 1
    assert "GOV_API_TOKEN" in one_line(r)


def test_bench_without_redis_py_runs_without_the_redis_contenders(pg_server: str, tmp_path: Path) -> None:
    # redis-server "on PATH" (never started: without redis-py nothing may try to) and a redis
    # module that fails to import, as when gov was installed without its dev extra
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "redis.py").write_text("raise ImportError('No module named redis (test shim)')\n")
    fake_server = shim / "redis-server"
    fake_server.write_text("#!/bin/sh\necho 'the bench started redis-server' >&2\nexit 1\n")
    fake_server.chmod(fake_server.stat().st_mode | stat.S_IXUSR)
    path = os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = clean_env(GOV_DATABASE_URL=pg_server, PYTHONPATH=path, PATH=f"{shim}{os.pathsep}{os.environ['PATH']}")
    probe = subprocess.run([sys.executable, "-c", "import redis"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0, "the shim did not hide redis-py"
    r = gov("bench", "--seconds", "0.3", "--connections", "1", "--users", "20", "--workload", "fresh",
            env=env, timeout=180)
    assert r.returncode == 0, r.stderr
    hints = [line for line in r.stderr.splitlines() if "redis-py is not installed" in line]
    assert len(hints) == 1 and "pip install 'gov[dev]'" in hints[0], r.stderr
    assert "the bench started redis-server" not in r.stderr
    assert "select1" in r.stdout
    assert not any(name in r.stdout for name in REDIS_CONTENDERS), r.stdout
