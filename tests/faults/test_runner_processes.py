"""`gov dispatch --processes N`: a parent and its runner processes (gov.delivery.processes).

* ``--once`` with two processes drains the outbox, every row delivered once, and exits 0
  with the summed figures;
* SIGTERM to the parent stops every child, which finish their batch; exit 0;
* a parent killed by SIGKILL leaves no runner behind (the children die with it);
* a child that fails makes the parent exit non-zero.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from gov import Governor, Message
from gov.testing import PushService
from tests.faults import GovProcess, gov_env, scalar, wait_for


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found.update(int(c) for c in f.read().split())
    except OSError:
        pass
    return found


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].startswith("Z")  # a zombie has ended
    except OSError:
        return True


def _queue(db_url: str, push: Any, users: int) -> None:
    with Governor(db_url, allow_loopback_http=True, pool_size=1) as gov:
        for i in range(users):
            gov.subscribe(f"p{i:03d}", push.subscribe(f"p{i:03d}").info)
        gov.send_many(Message(user_id="-", id="m1", tier="P0", title="hi"), [f"p{i:03d}" for i in range(users)])


def test_once_with_two_processes_drains_everything_once(
    db_url: str, key_path: Path, make_push: Any, tmp_path: Path
) -> None:
    push = make_push()
    _queue(db_url, push, 60)
    with GovProcess(["dispatch", "--once", "--processes", "2", "--workers", "2", "--batch", "8"],
                    gov_env(db_url, key_path), tmp_path, "once") as runner:
        assert runner.wait(120) == 0, runner.stderr()
    assert json.loads(runner.stdout()) == {"attempts": 60, "outcomes": {"delivered": 60}}
    sent = Counter(r.endpoint for r in push.received)
    assert len(sent) == 60 and set(sent.values()) == {1} and all(r.status == 201 for r in push.received)
    assert scalar(db_url, "SELECT count(*) FROM gov.outbox WHERE state <> 'delivered'") == 0
    pids = scalar(db_url, "SELECT array_agg(DISTINCT split_part(worker, ':', 2)) FROM gov.delivery_attempts")
    # one name per process (host:pid:…), none the parent's; who got which batch is the race's
    assert 1 <= len(pids) <= 2 and str(runner.pid) not in pids, pids


def test_sigterm_stops_every_runner_process(db_url: str, key_path: Path, tmp_path: Path) -> None:
    with GovProcess(["dispatch", "--processes", "2", "--idle", "0.05"], gov_env(db_url, key_path),
                    tmp_path, "loop") as runner:
        children = wait_for(lambda: (c := _children(runner.pid)) and len(c) == 2 and c, 60, "two runner processes")
        time.sleep(0.5)  # polling the empty outbox
        assert runner.stop(timeout=30) == 0, runner.stderr()
    assert all(_gone(c) for c in children)


def test_a_parent_killed_takes_its_runners_with_it(db_url: str, key_path: Path, tmp_path: Path) -> None:
    with GovProcess(["dispatch", "--processes", "2", "--idle", "0.05"], gov_env(db_url, key_path),
                    tmp_path, "victim") as runner:
        children = wait_for(lambda: (c := _children(runner.pid)) and len(c) == 2 and c, 60, "two runner processes")
        runner.kill9()
    wait_for(lambda: all(_gone(c) for c in children), 10, "the runner processes to end with their parent")
    assert len(children) == 2 and all(_gone(c) for c in children)


@pytest.fixture
def runnerless_url(db_url: str, conn: psycopg.Connection[Any]) -> Iterator[str]:
    """The test database as a role that passes the parent's start-up schema check (it may read
    the migration version) but not a runner's work: it may claim nothing (a runner started with
    --once fails at its first claim) and hold one connection only (the second runner process
    cannot open its pool, which fails a looping runner, which would retry a refused claim)."""
    role = f"gov_no_claim_{secrets.token_hex(4)}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT 1").format(sql.Identifier(role)))
    conn.execute(sql.SQL("GRANT SELECT ON public.gov_alembic_version TO {}").format(sql.Identifier(role)))
    # and the parent's look at the outbox (`--once` starts runners only for a due row)
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA gov TO {}").format(sql.Identifier(role)))
    conn.execute(sql.SQL("GRANT SELECT ON gov.outbox TO {}").format(sql.Identifier(role)))
    parts = urlsplit(db_url)
    netloc = role + "@" + parts.netloc.rpartition("@")[2]
    yield urlunsplit(parts._replace(netloc=netloc))
    conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
    conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.mark.parametrize("once", [True, False])
def test_a_failing_runner_process_fails_the_command(
    db_url: str, runnerless_url: str, key_path: Path, tmp_path: Path, once: bool, push: PushService
) -> None:
    with Governor(db_url, allow_loopback_http=True) as governor:  # one due row: --once starts its runners
        governor.subscribe("due", push.subscribe().info)
        governor.send(Message(user_id="due", id="m1", tier="P0", title="hi"), deliver=False)
    env = gov_env(runnerless_url, key_path)
    args = ["dispatch", "--processes", "2", "--idle", "0.05", *(["--once"] if once else [])]
    with GovProcess(args, env, tmp_path, "failing") as runner:
        code = runner.wait(120)  # the looping parent too stops by itself
    assert code != 0 and "a runner process failed" in runner.stderr(), runner.stderr()
