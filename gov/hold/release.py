"""The releaser: hands held messages back to the decision when their time comes.

Run it from cron (``bin/gov-release``, i.e. ``gov release --once``) or as a loop. Each
batch is one call (``gov.release_due_v2``, one shard's rows) and one transaction: rows are taken with
SKIP LOCKED, decided again through the same decision function, and either queued for
delivery, held again, or closed with their outcome. Each row is handled in its own
subtransaction, so an error in one (a tier the policy no longer defines, anything
raised) ends that row ``failed`` with the error text and the rest of the batch goes
on. A releaser never waits for a user's lock: a row whose user is busy (a decision
under way) is left due for the next round, so releasers and senders never deadlock.
A releaser that dies mid-batch rolls back: nothing is lost, and nothing is released
twice, however many releasers run.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from gov.db import Source
from gov.queries import q

log = logging.getLogger("gov.hold.release")

DEFAULT_BATCH = 200  # held messages per transaction: short transactions, few round trips
BUSY_PAUSE_S = 0.05  # seconds to wait before trying rows whose user was busy again
BUSY_ROUNDS = 40  # rounds of only-busy rows (about 2 s) before leaving them to the next run


@dataclass
class ReleaseStats:
    """What a release run did: counts by outcome, and the outbox rows it queued.

    ``outbox_rows`` names each row by the outbox's key, (user id, outbox id): looking rows
    up by id alone would scan the whole key index.

    ``busy`` counts rows left due because their user's lock was held elsewhere until the
    end of the run (a long transaction of the application's own); the next run takes them.
    """

    outcomes: Counter[str] = field(default_factory=Counter)
    outbox_rows: list[tuple[str, int]] = field(default_factory=list)
    delivered: int = 0
    busy: int = 0

    @property
    def outbox_ids(self) -> list[int]:
        return [i for _, i in self.outbox_rows]

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
        # the shards this releaser walks (one, None, on a single server; sql/schema/70_scale_out.sql)
        self._shard_keys: list[str | None] | None = None
        self._shard_at = random.randrange(1 << 16)

    def release_batch(self) -> list[tuple[str, str, str, str | None, list[int]]]:
        """One transaction: up to ``batch`` due messages of one shard, each decided again now.

        The shard is the next in this releaser's walk with a row it could handle (one
        shard on a single server); when every shard's due rows are busy, those busy rows.
        """
        now = self.clock() if self.clock is not None else None
        if self._shard_keys is None:
            ((keys,),) = self.source.execute(q("shard_keys"), {})
            self._shard_keys = list(keys)
        busy: list[tuple[str, str, str, str | None, list[int]]] = []
        for step in range(len(self._shard_keys)):
            at = (self._shard_at + step) % len(self._shard_keys)
            rows = self.source.execute(
                q("release_due"), {"shard_key": self._shard_keys[at], "limit": self.batch, "now": now}
            )
            if any(row[2] != "busy" for row in rows):
                self._shard_at = at + 1  # the next batch starts at the next shard
                return rows
            busy += rows
        return busy

    def run_once(self) -> ReleaseStats:
        """Release everything due now, whatever the batch size; deliver it when a dispatcher was given.

        Batches run until one handles nothing: every handled row either ends or is held
        again for a later moment, so the loop ends once nothing due is left.
        """
        stats = ReleaseStats()
        busy_rounds = 0
        self._shard_keys = None  # read again each run: a cluster may have split or moved shards
        while True:
            rows = self.release_batch()
            handled = busy = 0
            for user, _message, state, outcome, ids in rows:
                if state == "busy":
                    busy += 1
                    continue
                handled += 1
                # a row that is neither waiting nor failed always carries its outcome
                stats.outcomes[state if state in ("waiting", "failed") else cast(str, outcome)] += 1
                stats.outbox_rows.extend((user, i) for i in ids)
            if handled:
                busy_rounds = 0
                continue
            if not busy:
                break
            busy_rounds += 1
            if busy_rounds >= BUSY_ROUNDS:
                stats.busy = busy
                log.warning("%s held message(s) left due: their users' locks stayed taken", busy,
                            extra={"action": "release_busy"})
                break
            time.sleep(BUSY_PAUSE_S)  # a sender holds the user for a moment: try again shortly
        if self.dispatcher is not None and stats.outbox_rows:
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
