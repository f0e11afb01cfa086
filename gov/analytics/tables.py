"""SQLAlchemy Core tables for analysts: gov's analyst-facing tables and views, declared
(no reflection, so importing this module needs no database).

    import sqlalchemy as sa
    from gov.analytics import tables as ga

    daily = sa.select(ga.suppressions_daily).where(ga.suppressions_daily.c.tier == "P2")
    with engine.connect() as conn:
        rows = conn.execute(daily).all()
        report = conn.execute(ga.fatigue_report(segment="digest-")).all()

These are exactly what ``gov db grant-analyst`` lets a read-only role see: the
subscriptions table is declared with its non-secret columns only (the endpoint is a
capability URL and p256dh/auth are keys). ``docs/analysts.md`` defines every column.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy import BigInteger, Boolean, Column, Date, Integer, MetaData, Numeric, Table, Text
from sqlalchemy.dialects.postgresql import TIMESTAMP

metadata = MetaData(schema="gov")

_TZ = TIMESTAMP(timezone=True)

# ---------------------------------------------------------------- tables

push_events = Table(
    "push_events",
    metadata,
    Column("id", BigInteger, primary_key=True),
    Column("user_id", Text, nullable=False),
    Column("message_id", Text, nullable=False),
    Column("subscription_id", BigInteger),
    Column("event", Text, nullable=False),  # accepted | display | click | close | unsubscribe
    Column("created_at", _TZ, nullable=False),
)

push_suppressions = Table(
    "push_suppressions",
    metadata,
    Column("id", BigInteger, primary_key=True),
    Column("user_id", Text, nullable=False),
    Column("message_id", Text, nullable=False),
    Column("tier", sa.String(4), nullable=False),
    Column("blocked_by", Text, nullable=False),  # cap_<ms>ms | topic_cap_<ms>ms | global_cap_<ms>ms | quiet_hours
    Column("action", sa.String(10), nullable=False),  # drop | defer | collapse
    Column("campaign_id", Text),
    Column("topic", Text),
    Column("blocked_scope", Text),
    Column("used", Integer),
    Column("cap", Integer),
    Column("retry_after_ms", BigInteger),
    Column("created_at", _TZ, nullable=False),
    Column("segment", Text),  # the user's segment when decided (None: none)
)

messages = Table(
    "messages",
    metadata,
    Column("user_id", Text, primary_key=True),
    Column("message_id", Text, primary_key=True),
    Column("tier", Text, nullable=False),
    Column("topic", Text),
    Column("campaign_id", Text),
    Column("allowed", Boolean, nullable=False),
    Column("action", Text),
    Column("reason", Text),
    Column("used", Integer),
    Column("cap", Integer),
    Column("retry_after_ms", BigInteger),
    Column("decided_at", _TZ, nullable=False),
)

sends = Table(
    "sends",
    metadata,
    Column("user_id", Text, primary_key=True),
    Column("budget", Text, primary_key=True),  # a tier, 'global' or 'topic:<topic>'
    Column("sent_at", _TZ, primary_key=True),
    Column("message_id", Text, primary_key=True),
)

#: The non-secret columns only: what an analyst role may select.
subscriptions = Table(
    "subscriptions",
    metadata,
    Column("id", BigInteger, primary_key=True),
    Column("user_id", Text, nullable=False),
    Column("created_at", _TZ, nullable=False),
    Column("retired_at", _TZ),
    Column("retired_reason", Text),
)

tiers = Table(
    "tiers",
    metadata,
    Column("tier", Text, primary_key=True),
    Column("exempt", Boolean, nullable=False),
    Column("on_exceed", Text),
    Column("defer_max_ms", BigInteger),
    Column("default_ttl_s", Integer, nullable=False),
    Column("urgency", Text, nullable=False),
)

tier_consumes = Table(
    "tier_consumes",
    metadata,
    Column("tier", Text, primary_key=True),
    Column("consumes", Text, primary_key=True),
)

caps = Table(
    "caps",
    metadata,
    Column("scope", Text, primary_key=True),
    Column("topic", Text, primary_key=True),
    Column("window_ms", BigInteger, primary_key=True),
    Column("cap", Integer, nullable=False),
)

#: A tier's windows for one user segment's users: they replace the tier's own for them.
segment_caps = Table(
    "segment_caps",
    metadata,
    Column("tier", Text, primary_key=True),
    Column("segment", Text, primary_key=True),
    Column("window_ms", BigInteger, primary_key=True),
    Column("cap", Integer, nullable=False),
)

# ---------------------------------------------------------------- views (read only)

campaign_shortfall = Table(
    "campaign_shortfall",
    metadata,
    Column("campaign_id", Text),
    Column("blocked_by", Text),
    Column("suppressed", BigInteger),
    Column("users", BigInteger),
    Column("decided", BigInteger),
    Column("share", Numeric),
    Column("first_at", _TZ),
    Column("last_at", _TZ),
    info={"view": True},
)

suppressions_daily = Table(
    "suppressions_daily",
    metadata,
    Column("day", Date),
    Column("tier", sa.String(4)),
    Column("suppressed", BigInteger),
    Column("dropped", BigInteger),
    Column("deferred", BigInteger),
    Column("collapsed", BigInteger),
    Column("users", BigInteger),
    info={"view": True},
)

revocation_suspects = Table(
    "revocation_suspects",
    metadata,
    Column("user_id", Text),
    Column("accepted", BigInteger),
    Column("first_accepted_at", _TZ),
    Column("last_accepted_at", _TZ),
    Column("last_display_at", _TZ),
    Column("live_subscriptions", BigInteger),
    info={"view": True},
)

segment_suppressions_daily = Table(
    "segment_suppressions_daily",
    metadata,
    Column("day", Date),
    Column("tier", sa.String(4)),
    Column("segment", Text),
    Column("blocked_by", Text),
    Column("suppressed", BigInteger),
    Column("users", BigInteger),
    info={"view": True},
)

segment_sizes = Table(
    "segment_sizes",
    metadata,
    Column("segment", Text),
    Column("users", BigInteger),
    info={"view": True},
)

#: Everything declared here, by name: what `gov db grant-analyst` grants SELECT on.
ANALYST_RELATIONS = tuple(metadata.tables.values())

# ---------------------------------------------------------------- functions

FATIGUE_COLUMNS = (
    ("bucket", Integer),
    ("subscribers", BigInteger),
    ("accepted", BigInteger),
    ("displays", BigInteger),
    ("clicks", BigInteger),
    ("closes", BigInteger),
    ("unsubscribes", BigInteger),
    ("ctr", Numeric),
    ("unsubscribe_rate", Numeric),
    ("display_rate", Numeric),
    ("close_to_click", Numeric),
    ("crossover", Boolean),
)


def fatigue_report(
    since: timedelta = timedelta(days=7), now: datetime | None = None, segment: str | None = None
) -> sa.Select[tuple[object, ...]]:
    """``SELECT * FROM gov.fatigue_report_v1(since, now, segment) ORDER BY bucket`` as a SQLAlchemy select."""
    fn = sa.func.gov.fatigue_report_v1(
        sa.literal(since, sa.Interval()),
        sa.literal(now, _TZ),
        sa.literal(segment, Text()),
    ).table_valued(*(sa.column(name, type_()) for name, type_ in FATIGUE_COLUMNS))
    return sa.select(fn).order_by(fn.c.bucket)


def revocation_suspects_since(
    since: timedelta = timedelta(days=7), min_accepted: int = 3, now: datetime | None = None
) -> sa.Select[tuple[object, ...]]:
    """``gov.revocation_suspects_v1`` for another window or threshold than the view's."""
    fn = sa.func.gov.revocation_suspects_v1(
        sa.literal(since, sa.Interval()),
        sa.literal(min_accepted, Integer()),
        sa.literal(now, _TZ),
    ).table_valued(*(sa.column(c.name, c.type) for c in revocation_suspects.columns))
    return sa.select(fn)
