"""Stopping a loop from a signal handler without the handler's classic deadlock."""

from __future__ import annotations

import _thread
import threading
from collections.abc import Callable
from types import FrameType


def setting(event: threading.Event) -> Callable[[int, FrameType | None], None]:
    """A signal handler that sets ``event``.

    Python runs a handler in the main thread between two bytecodes, and that thread may be
    holding the event's own lock at that moment: ``event.wait(timeout)`` (a runner's idle
    poll, every ``--idle`` seconds) holds it on the way in and out. ``event.set()`` called
    there waits for that lock for ever, and the process never stops (a looping ``gov
    dispatch`` that ignored SIGTERM under load). So the handler only starts a thread that
    sets it, with ``_thread`` rather than ``threading.Thread`` (whose start takes another
    lock the main thread may hold); the main thread sees the event set a moment later.
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        _thread.start_new_thread(event.set, ())

    return handler
