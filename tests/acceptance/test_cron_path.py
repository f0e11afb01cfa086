"""The cron path (issue 31, item 4): `gov dispatch --once` and `gov release --once` on an
empty queue do one connection's work and nothing else.

No wall-clock time is asserted (a shared machine proves nothing); what is asserted is what
costs the time: the processes forked, the database connections opened, the delivery code
imported. docs/performance.md ("The cron path") has the measurements.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

# Runs `gov ARGS…` in this interpreter and reports, on its last stderr line, the forks and
# connections it made and whether it loaded the runner (HTTP, encryption: most of the cost)
# or the pool package (one connection needs none).
PROBE = """
import json, os, sys
import psycopg

PARENT = os.getpid()  # a forked runner ends in os._exit; this guard is for any other child
forks, connections = [], []
real_fork = os.fork
def counting_fork():
    forks.append(1)
    return real_fork()
os.fork = counting_fork
real_connect = psycopg.Connection.connect.__func__
def counting_connect(cls, *args, **kwargs):
    connections.append(1)
    return real_connect(cls, *args, **kwargs)
psycopg.Connection.connect = classmethod(counting_connect)
psycopg.connect = psycopg.Connection.connect  # the module's alias, as the pool calls the class's

from gov.cli.main import main
try:
    main(sys.argv[1:], prog_name="gov")
    code = 0
except SystemExit as exc:
    code = exc.code
if os.getpid() == PARENT:
    print(json.dumps({"code": code, "forks": len(forks), "connections": len(connections),
                      "runner": "gov.delivery.runner" in sys.modules, "pywebpush": "pywebpush" in sys.modules,
                      "pool": "psycopg_pool" in sys.modules}),
          file=sys.stderr)
"""


def run(env: dict[str, str], *args: str) -> tuple[dict[str, Any], str]:
    r = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env, timeout=120)
    report = json.loads(r.stderr.strip().splitlines()[-1])
    assert report["code"] == 0, r.stderr
    return report, r.stdout


def vapid_env(tmp_path: Path, url: str) -> dict[str, str]:
    key = tmp_path / "vapid.pem"
    made = subprocess.run([sys.executable, "-m", "gov.cli", "vapid", "generate", str(key)],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOV_")}
    return {**env, "GOV_DATABASE_URL": url, "GOV_VAPID_PRIVATE_KEY": str(key),
            "GOV_VAPID_SUBJECT": "mailto:ops@example.com"}


def test_dispatch_once_on_an_empty_outbox_forks_nothing_and_opens_one_connection(db_url: str, tmp_path: Path) -> None:
    report, out = run(vapid_env(tmp_path, db_url), "dispatch", "--once", "--processes", "2")
    assert json.loads(out) == {"attempts": 0, "outcomes": {}}
    assert report == {"code": 0, "forks": 0, "connections": 1, "runner": False, "pywebpush": False, "pool": False}


def test_dispatch_once_still_takes_a_due_row_and_a_lapsed_lease(
    db_url: str, tmp_path: Path, conn: psycopg.Connection[Any]
) -> None:
    env = vapid_env(tmp_path, db_url)
    conn.execute("SELECT gov.subscribe_v2('u', 'https://push.example/u', 'k', 'a')")
    conn.execute("SELECT * FROM gov.send_v1('u', 'm1', 'P1', NULL, NULL, '{\"title\": \"t\"}', NULL, NULL)")
    # the endpoint's name does not resolve: the attempt fails, which proves it was made
    report, out = run(env, "dispatch", "--once", "--processes", "1")
    assert json.loads(out)["attempts"] == 1 and report["runner"] and report["forks"] == 0
    # a row whose runner died: still 'sending', its lease run out, its next attempt later
    conn.execute("SELECT * FROM gov.send_v1('u', 'm2', 'P1', NULL, NULL, '{\"title\": \"t\"}', NULL, NULL)")
    conn.execute("UPDATE gov.outbox SET state = 'sending', lease_until = now() - interval '1 minute', "
                 "next_attempt_at = now() + interval '1 hour' WHERE message_id = 'm2'")
    report, out = run(env, "dispatch", "--once", "--processes", "1")
    assert json.loads(out)["attempts"] == 1, out


def test_release_once_on_an_empty_queue_opens_one_connection_and_no_runner(db_url: str, tmp_path: Path) -> None:
    report, out = run(vapid_env(tmp_path, db_url), "release", "--once")
    assert json.loads(out) == {"released": {}, "delivered": 0}
    assert report == {"code": 0, "forks": 0, "connections": 1, "runner": False, "pywebpush": False, "pool": False}
