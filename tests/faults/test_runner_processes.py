"""`gov dispatch --processes N`: a parent and its runner processes (gov.processes).

* ``--once`` with two processes drains the outbox, every row delivered once, and exits 0
  with the summed figures;
* SIGTERM to the parent stops every child, which finish their batch; exit 0;
* a parent killed by SIGKILL leaves no runner behind (the children die with it);
* a child that fails makes the parent exit non-zero.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gov import Governor, Message
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


@pytest.mark.parametrize("once", [True, False])
def test_a_failing_runner_process_fails_the_command(key_path: Path, tmp_path: Path, once: bool) -> None:
    # nothing listens there: every runner process fails at its first claim
    env = gov_env("postgresql://gov@127.0.0.1:9/none?connect_timeout=2", key_path)
    args = ["dispatch", "--processes", "2", "--idle", "0.05", *(["--once"] if once else [])]
    with GovProcess(args, env, tmp_path, "failing") as runner:
        code = runner.wait(120)  # the looping parent too stops by itself
    assert code != 0 and "a runner process failed" in runner.stderr(), runner.stderr()
