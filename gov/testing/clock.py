"""A clock a test moves by hand: pass it as ``clock=`` to Governor, Dispatcher or
Releaser, and time passes only when the test says so (no sleeping, no flaky timing)."""

from __future__ import annotations

from datetime import datetime, timedelta


class Clock:
    """Returns ``now`` when called; :meth:`advance` moves it forward."""

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("give the clock a zone-aware start (gov compares instants)")
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kw: float) -> None:
        """Move forward by ``timedelta(**kw)``, e.g. ``clock.advance(minutes=5)``."""
        self.now += timedelta(**kw)
