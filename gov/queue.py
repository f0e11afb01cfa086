"""The releaser: hands held messages back to the decision when their time comes.

Run it from cron (``bin/gov-release``, i.e. ``gov release --once``) or as a loop. Each
batch is one transaction: rows are taken with SKIP LOCKED, decided again through the
same decision function, and either queued for delivery, held again, or closed with
their outcome. A releaser that dies mid-batch rolls back: nothing is lost, and nothing
is released twice, however many releasers run.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gov.db import Source
from gov.queries import q

log = logging.getLogger("gov.queue")

DEFAULT_BATCH = 200  # held messages per transaction: short transactions, few round trips


@dataclass
class ReleaseStats:
    """What a release run did: counts by outcome, and the outbox rows it queued."""

    outcomes: Counter[str] = field(default_factory=Counter)
    outbox_ids: list[int] = field(default_factory=list)
    delivered: int = 0

    @property
    def handled(self) -> int:
        return sum(self.outcomes.values())


class Releaser:
    """Releases due deferrals. With ``dispatcher``, delivers what it released at once."""

    def __init__(
        self,
        source: Any,
        *,
        dispatcher: Any = None,
        batch: int = DEFAULT_BATCH,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.source = source if isinstance(source, Source) else Source(source, pool_size=2)
        self.dispatcher = dispatcher
        self.batch = batch
        self.clock = clock

    def release_batch(self) -> list[tuple[str, str, str, str | None, list[int]]]:
        """One transaction: up to ``batch`` due messages, each decided again now."""
        now = self.clock() if self.clock is not None else None
        return self.source.execute(q("release_due"), {"limit": self.batch, "now": now})  # type: ignore[return-value]

    def run_once(self) -> ReleaseStats:
        """Release everything due now; deliver it when a dispatcher was given."""
        stats = ReleaseStats()
        while True:
            rows = self.release_batch()
            for _user, _message, state, outcome, ids in rows:
                stats.outcomes[outcome if state != "waiting" else "waiting"] += 1
                stats.outbox_ids.extend(ids)
            if len(rows) < self.batch:
                break
        if self.dispatcher is not None and stats.outbox_ids:
            done = self.dispatcher.run_once(ids=stats.outbox_ids)
            stats.delivered = done.outcomes.get("delivered", 0)
        return stats

    def run_forever(self, stop: threading.Event, idle_s: float = 5.0) -> None:
        while not stop.is_set():
            try:
                stats = self.run_once()
                if stats.handled:
                    log.info("released %s", dict(stats.outcomes), extra={"action": "release"})
            except Exception:  # a database restart must not end the loop
                log.exception("release round failed; retrying", extra={"action": "release_error"})
            stop.wait(idle_s)
