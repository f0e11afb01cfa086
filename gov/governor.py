"""The governor: one decision per message, one SQL call per decision."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gov.db import Source
from gov.message import Decision, Message
from gov.queries import q


class Governor:
    """Decides allow or suppress for messages, against the policy stored in PostgreSQL.

    ``source`` is a DSN, a psycopg ``Connection`` or ``ConnectionPool``, or a SQLAlchemy
    ``Engine`` or ``Connection``. Given a connection, every decision happens in *your*
    transaction: it commits or rolls back with your own work, and gov never commits it
    (the user's lock is held until you do). Otherwise each decision commits on its own.

    ``clock``, when given, is called for the decision time instead of the database's
    clock: the simulation clock of tests and ``gov simulate``. Hosts' clocks never enter
    a window otherwise (invariant 2).
    """

    def __init__(
        self,
        source: Any,
        *,
        pool_size: int = 4,
        pool_timeout: float = 5.0,
        clock: Any = None,
    ) -> None:
        self.source = Source(source, pool_size=pool_size, pool_timeout=pool_timeout)
        self.clock = clock

    def decide(self, message: Message, *, at: datetime | None = None) -> Decision:
        """Allow or suppress ``message``; record the spend or the suppression atomically."""
        if not isinstance(message, Message):
            raise TypeError(f"decide() takes a gov.Message, got {type(message).__name__}")
        now = at if at is not None else (self.clock() if self.clock is not None else None)
        with self.source.connection() as conn:
            row = conn.execute(
                q("decide"),
                {
                    "user_id": message.user_id,
                    "message_id": message.id,
                    "tier": message.tier,
                    "topic": message.topic,
                    "campaign_id": message.campaign_id,
                    "now": now,
                },
            ).fetchone()
        assert row is not None  # the function always returns one row
        return Decision(*row)

    def close(self) -> None:
        """Close the pool gov opened for a DSN; a pool or connection you gave stays open."""
        self.source.close()

    def __enter__(self) -> Governor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
