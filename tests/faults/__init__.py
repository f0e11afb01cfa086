"""Fault injection: real processes, real PostgreSQL, a real push service, and a fault.

Helpers shared by the tests of this package: the gov processes under test (``gov
dispatch`` and ``gov release`` as subprocesses), polling with a deadline, a simulation
clock, and the checks every fault test ends with (conservation, exact budgets, no
double spend: :func:`assert_integrity`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from gov.lab.soak import apply_policy
from gov.ops.integrity import check_integrity

SUBJECT = "mailto:push-ops@example.com"

#: The default policy's shape with windows of about a second: caps bind at once, deferrals
#: come due and collapses are released while a test watches, and everything held
#: resolves within a couple of seconds of the last send (defer_max 1.5 s, windows <= 2 s).
FAULT_POLICY = """\
[tiers.P0]
exempt = true
ttl = "1h"
urgency = "high"

[tiers.P1]
windows = [{ window = "1s", cap = 2 }]
on_exceed = "defer"
defer_max = "1500ms"
consumes = ["P1"]
ttl = "1h"

[tiers.P2]
windows = [{ window = "1s", cap = 1 }, { window = "2s", cap = 2 }]
on_exceed = "drop"
consumes = ["P1", "P2"]
ttl = "1h"
urgency = "low"

[tiers.P3]
windows = [{ window = "1500ms", cap = 1 }]
on_exceed = "collapse"
consumes = ["P1", "P2", "P3"]
ttl = "1h"
urgency = "very-low"

[topics]
"*" = [{ window = "1500ms", cap = 2 }]

[global]
windows = [{ window = "1s", cap = 3 }]

[quiet_hours]
jitter = "100ms"
"""


def use_fault_policy(url: str) -> None:
    """Store :data:`FAULT_POLICY` as the policy of the database at ``url``."""
    apply_policy(url, FAULT_POLICY, "fault policy")


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail naming ``what`` after ``timeout`` s.

    Only for real processes and servers doing real work: simulated time is moved, not waited for.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def db_now(url: str) -> datetime:
    """The database's clock (the only clock the real runner and releaser use)."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def scalar(url: str, query: Any, params: Any = None) -> Any:
    """The first column of the first row of ``query`` (a literal statement; values as parameters)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


def assert_integrity(url: str, since: datetime) -> dict[str, int]:
    """Every fault test ends here: conservation over the whole period holds, no user is over
    any cap in any window, and every message spent exactly one row per consumed budget.
    Returns the messages by state."""
    result = check_integrity(url, since, db_now(url) + timedelta(days=1))
    assert result.ok, result.problems()
    return result.states


class GovProcess:
    """A `python -m gov.cli …` subprocess, its output in files (a pipe could fill up and
    block a looping process that logs)."""

    def __init__(self, args: list[str], env: dict[str, str], workdir: Path, name: str) -> None:
        self.name = name
        self.out_path = workdir / f"{name}.out"
        self.err_path = workdir / f"{name}.err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "gov.cli", *args], env=env, stdout=out, stderr=err)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def kill9(self) -> None:
        """kill -9: no cleanup, no goodbye to the database."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM (the loops finish their round and exit), then its exit status."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise AssertionError(f"{self.name} did not stop on SIGTERM within {timeout:g} s") from None

    def __enter__(self) -> GovProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait(timeout=10)


def gov_env(db_url: str, key_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a gov process: the database, the VAPID key, loopback endpoints."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOV_")}
    env.update(
        {
            "GOV_DATABASE_URL": db_url,
            "GOV_VAPID_PRIVATE_KEY": str(key_path),
            "GOV_VAPID_SUBJECT": SUBJECT,
            "GOV_ALLOW_LOOPBACK_HTTP": "1",
        }
    )
    env.update(extra)
    return env
