"""``gov dispatch --processes N``: several runner processes under one parent.

Delivery costs interpreter time (encryption, building and parsing requests), and the
threads of one process share one interpreter lock: processes are how a runner uses more
than one core. Each child is a whole runner of its own (its own
:class:`~gov.delivery.runner.Dispatcher`, database connections, HTTP connection pools and worker
name ``host:pid:…``); they share the outbox the way separate ``gov dispatch`` commands do
(claims skip each other's rows; invariant 12 holds per row).

The parent only supervises:

* SIGTERM or SIGINT to the parent stops every child (each finishes its batch and records
  it); a child also dies with the parent (``PR_SET_PDEATHSIG`` on Linux), so a parent
  killed by SIGKILL leaves no runner behind to hold leases;
* with ``once``, every child drains what is due and exits; the parent sums their figures;
* the parent exits non-zero if any child fails; while looping, a child that dies stops
  the others, so that a supervisor restarts the whole runner.

Children are forked (the parent has loaded the code and the VAPID key; they start in
milliseconds), so this needs ``fork`` (Linux, macOS). With one process nothing is forked.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gov.ops.signals import setting

log = logging.getLogger("gov.delivery.processes")


@dataclass
class RunResult:
    """What the runner processes did: summed figures (``once``) and every child's exit code."""

    attempts: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    exit_codes: list[int] = field(default_factory=list)
    #: per child: (user CPU s, system CPU s) of its whole life, for benches
    cpu: list[tuple[float, float]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(code == 0 for code in self.exit_codes)


def run_dispatchers(
    make: Callable[[], Any], processes: int, *, once: bool, idle_s: float = 1.0,
    ready: Callable[[], None] | None = None,
) -> RunResult:
    """Run ``processes`` runners, each ``make()`` (a :class:`~gov.delivery.runner.Dispatcher`,
    built in the child), draining once or looping until SIGTERM/SIGINT.

    ``processes`` 1 runs in this process. Returns the summed figures and exit codes.
    """
    if processes < 1:
        raise ValueError("processes must be at least 1")
    if processes == 1:
        return _run_here(make, once, idle_s)
    ctx = multiprocessing.get_context("fork")
    parent = os.getpid()
    children: list[tuple[Any, multiprocessing.connection.Connection]] = []
    stop = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()
        for proc, _ in children:
            if proc.pid is not None and proc.exitcode is None:
                with contextlib.suppress(OSError):
                    os.kill(proc.pid, signal.SIGTERM)

    for sig in previous:
        signal.signal(sig, on_signal)
    result = RunResult()
    try:
        for _ in range(processes):
            if stop.is_set():
                break
            mine, theirs = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(make, once, idle_s, parent, theirs), daemon=False)
            proc.start()
            theirs.close()
            children.append((proc, mine))
        if ready is not None:
            ready()
        pending = {proc.sentinel: (proc, conn) for proc, conn in children}
        while pending:
            done = multiprocessing.connection.wait(list(pending), timeout=1.0)
            for sentinel in done:
                proc, conn = pending.pop(sentinel)
                proc.join()
                report = _receive(conn)
                result.exit_codes.append(proc.exitcode if proc.exitcode is not None else 1)
                if report is not None:
                    result.attempts += report["attempts"]
                    for outcome, n in report["outcomes"].items():
                        result.outcomes[outcome] = result.outcomes.get(outcome, 0) + n
                    result.cpu.append(report["cpu"])
                if proc.exitcode != 0 and not stop.is_set():
                    log.error("runner process %s exited with %s; stopping the others", proc.pid, proc.exitcode,
                              extra={"action": "runner_process_failed"})
                    on_signal(signal.SIGTERM, None)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for proc, conn in children:
            if proc.exitcode is None:  # only if the parent itself failed
                proc.terminate()
                proc.join(10)
            conn.close()
    return result


def _receive(conn: multiprocessing.connection.Connection) -> dict[str, Any] | None:
    try:
        return conn.recv() if conn.poll() else None
    except (EOFError, OSError):
        return None


def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)


def _child(make: Callable[[], Any], once: bool, idle_s: float, parent: int,
           conn: multiprocessing.connection.Connection) -> None:
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent forwards one SIGTERM for both
    result = _run_here(make, once, idle_s)
    times = os.times()
    conn.send({"attempts": result.attempts, "outcomes": result.outcomes, "cpu": (times.user, times.system)})
    conn.close()
    if not result.ok:
        sys.exit(1)


def _run_here(make: Callable[[], Any], once: bool, idle_s: float) -> RunResult:
    result = RunResult()
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, setting(stop))  # (not stop.set: gov.ops.signals)
    try:
        with make() as runner:
            if once:
                stats = runner.run_once(stop=stop)
                result.attempts, result.outcomes = stats.attempts, dict(stats.outcomes)
            else:
                try:
                    runner.run_forever(stop, idle_s=idle_s)
                except KeyboardInterrupt:
                    stop.set()
    finally:
        signal.signal(signal.SIGTERM, previous)
    times = os.times()
    result.cpu.append((times.user, times.system))
    result.exit_codes.append(0)
    return result
