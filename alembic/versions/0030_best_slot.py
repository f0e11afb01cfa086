"""The release capacity ([release] per_minute) and the timing in the hold ([timing]) (issue 30, item 2).

Revision ID: 0030_best_slot
Revises: 0029_best_hours
"""

from __future__ import annotations

from alembic import op
from gov.migrate import run_sql_file

revision = "0030_best_slot"
down_revision = "0029_best_hours"
branch_labels = None
depends_on = None


# The DDL each in a statement of its own: Citus forwards DDL on a distributed (or
# reference) table to the workers as the query text it came in, and a text of several
# statements is refused there (see 0028_release_order.py).
def upgrade() -> None:
    op.execute("ALTER TABLE gov.settings ADD COLUMN release_per_minute integer")
    op.execute(
        "ALTER TABLE gov.settings ADD CONSTRAINT settings_release_per_minute_positive"
        " CHECK (release_per_minute IS NULL OR release_per_minute > 0)"
    )
    op.execute(
        "CREATE TABLE gov.release_minutes ("
        " user_id text NOT NULL, minute timestamptz NOT NULL, used integer NOT NULL,"
        " CONSTRAINT release_minutes_pkey PRIMARY KEY (user_id, minute),"
        " CONSTRAINT release_minutes_used_not_negative CHECK (used >= 0))"
    )
    op.execute("ALTER TABLE gov.settings ADD COLUMN timing_enabled boolean NOT NULL DEFAULT false")
    op.execute("ALTER TABLE gov.settings ADD COLUMN timing_p1_max_delay_ms bigint NOT NULL DEFAULT 3600000")
    op.execute("ALTER TABLE gov.settings ADD COLUMN timing_explore double precision NOT NULL DEFAULT 0.05")
    op.execute(
        "ALTER TABLE gov.settings ADD CONSTRAINT settings_timing_p1_max_delay_not_negative"
        " CHECK (timing_p1_max_delay_ms >= 0)"
    )
    op.execute(
        "ALTER TABLE gov.settings ADD CONSTRAINT settings_timing_explore_share"
        " CHECK (timing_explore >= 0 AND timing_explore <= 1)"
    )
    op.execute("ALTER TABLE gov.deferred ADD COLUMN timing text")
    op.execute(
        "ALTER TABLE gov.deferred ADD CONSTRAINT deferred_timing_known CHECK (timing IN ('best', 'explore'))"
    )
    op.execute(
        "CREATE TABLE gov.timing_curves ("
        " segment text NOT NULL, hour integer NOT NULL, estimate double precision NOT NULL,"
        " refreshed_at timestamptz NOT NULL,"
        " CONSTRAINT timing_curves_pkey PRIMARY KEY (segment, hour),"
        " CONSTRAINT timing_curves_hour_of_day CHECK (hour BETWEEN 0 AND 23))"
    )
    run_sql_file("migrations/0030_best_slot.sql")


def downgrade() -> None:
    run_sql_file("migrations/0030_best_slot.down.sql")
    op.execute("DROP TABLE gov.timing_curves")
    op.execute("ALTER TABLE gov.deferred DROP COLUMN timing")
    for column in ("timing_explore", "timing_p1_max_delay_ms", "timing_enabled"):
        op.execute(f"ALTER TABLE gov.settings DROP COLUMN {column}")
    op.execute("DROP TABLE gov.release_minutes")
    op.execute("ALTER TABLE gov.settings DROP COLUMN release_per_minute")
