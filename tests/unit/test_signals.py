"""gov.ops.signals: a SIGTERM handler that sets the stop event cannot deadlock the process."""

from __future__ import annotations

import subprocess
import sys

# The main thread holds the event's lock, as it does on the way into and out of
# event.wait(timeout) (a runner's idle poll), when the handler runs: the handler must return,
# and the event be set once the lock is free. Run in a child, so a handler that blocks (as
# event.set() there does) fails this test by its timeout instead of hanging the suite.
CHILD = """
import signal, threading
from gov.ops.signals import setting
stop = threading.Event()
handler = setting(stop)
with stop._cond:
    handler(signal.SIGTERM, None)
    assert not stop.is_set()
print("set" if stop.wait(10) else "never set")
"""


def test_the_handler_returns_while_the_interrupted_thread_holds_the_events_lock() -> None:
    try:
        done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        raise AssertionError("the signal handler blocked on the event's lock") from None
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "set"

