"""The simulation's child processes: the loopback push service and gov's runner.

Run by path (``python _children.py push_host_main``), never imported as part of
:mod:`gov.lab.simulate`: the package imports the engine and through it alembic and
SQLAlchemy, which a child never needs (about a CPU-second each, four children per run).
Plain subprocesses speaking JSON lines on stdin/stdout, not multiprocessing: spawn would
re-import the caller's main module.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

SUBJECT = "mailto:simulation@gov.example"


class _Clock:
    """The simulation clock the runner is given (set by each command)."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def _serve_lines(handle: Callable[[str, Any], Any]) -> None:
    """The child's loop: one JSON command per line in, one JSON answer per line out."""
    try:
        for line in sys.stdin:
            command, argument = json.loads(line)
            if command == "stop":
                break
            print(json.dumps(handle(command, argument)), flush=True)
    except KeyboardInterrupt:  # the parent was interrupted too; it cleans up
        pass


def push_host_main() -> None:
    """Child process: a gov.testing PushService (its origin is the first answer)."""
    from gov.testing import PushService

    public_key = json.loads(sys.stdin.readline())
    with PushService(expected_public_key=public_key) as service:
        print(json.dumps(service.origin), flush=True)

        def handle(command: str, argument: Any) -> Any:
            if command == "subscribe":
                return [service.subscribe().info for _ in range(argument)]
            received = service.received  # "stats"
            return [len(received), sum(1 for r in received if r.status is not None and 200 <= r.status < 300)]

        _serve_lines(handle)


def runner_main() -> None:
    """Child process: gov's runner (gov.delivery.runner.Dispatcher) on the simulation clock."""
    from gov.delivery.runner import Dispatcher
    from gov.delivery.vapid import VapidSigner

    setup = json.loads(sys.stdin.readline())
    signer = VapidSigner.from_env({"GOV_VAPID_PRIVATE_KEY": setup["key"], "GOV_VAPID_SUBJECT": SUBJECT})
    clock = _Clock(datetime.fromisoformat(setup["now"]))
    workers = int(setup["workers"])
    # a large claim: one tick's rows are claimed at once, so no worker idles between batches
    # allow_loopback_http: the simulated push service is on 127.0.0.1 over plain HTTP, on purpose
    with Dispatcher(
        setup["dsn"], signer, workers=workers, batch=512, clock=clock, allow_loopback_http=True
    ) as runner:
        print(json.dumps("ready"), flush=True)

        def handle(command: str, argument: Any) -> Any:
            """"run": deliver these outbox rows as of now; answer the attempts made and each
            claimed row's (id, user, message, subscription, recorded state), or None for the
            rows when they took several batches (a later batch's 404/410 may end a row an
            earlier one recorded: the parent then reads the rows back)."""
            now, ids = argument
            clock.now = datetime.fromisoformat(now)
            attempts = 0
            rows: list[Any] | None = []
            for start in range(0, len(ids), runner.batch):
                stats = runner.run_once(ids=ids[start : start + runner.batch])
                attempts += stats.attempts
                rows = None if start else [[r.outbox_id, r.user_id, r.message_id, r.subscription_id, r.state]
                                           for r in stats.rows]
            return [attempts, rows]

        _serve_lines(handle)


if __name__ == "__main__":
    {"push_host_main": push_host_main, "runner_main": runner_main}[sys.argv[1]]()
