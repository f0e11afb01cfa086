"""`gov db stop` stops the embedded server, or says why it does not.

The embedded library stops its server only when the process asking is the last that
holds a handle on it. A `gov serve` stopped by SIGTERM ends without letting go of its
handle, and `gov db stop` used to print "embedded server stopped" while PostgreSQL kept
running (an outside probe found it). A process that is gone no longer counts; one that
runs keeps its server, and the command names it and fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

START = "from gov.db import embedded_url; embedded_url(); print('up', flush=True)"


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GOV_DATABASE_URL"}
    env["GOV_DATA_DIR"] = str(tmp_path / "gov-data")
    return env


def _postmaster(tmp_path: Path) -> int | None:
    pid_file = tmp_path / "gov-data" / "pgdata" / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().splitlines()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return pid


def _stop(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gov.cli", "db", "stop"], env=env, capture_output=True, text=True,
                          timeout=60)


def _stopped(tmp_path: Path) -> bool:
    for _ in range(100):  # pg_ctl stop -w has returned; the process may take a moment to be reaped
        if _postmaster(tmp_path) is None:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_a_handle_left_by_a_killed_process_does_not_keep_the_server_running(tmp_path: Path) -> None:
    env = _env(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", START + "; import time; time.sleep(120)"], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "up"
        assert _postmaster(tmp_path) is not None
        # a live holder (a running gov serve): not stopped, and said so
        r = _stop(env)
        assert r.returncode == 1 and f"in use by process {holder.pid}" in r.stderr, r.stderr
        assert "\n" not in r.stderr.strip() and _postmaster(tmp_path) is not None
        # killed as a service manager stops it: its handle stays behind
        holder.send_signal(signal.SIGTERM)
        holder.wait(timeout=30)
        r = _stop(env)
        assert r.returncode == 0 and "stopped" in r.stderr, r.stderr
        assert _stopped(tmp_path), "gov db stop said stopped; PostgreSQL still runs"
    finally:
        holder.kill()
        holder.wait(timeout=30)
        if holder.stdout is not None:
            holder.stdout.close()
        _stop(env)
