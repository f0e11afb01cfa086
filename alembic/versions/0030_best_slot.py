"""The release capacity: the policy's [release] per_minute, counted per shard and minute (issue 30, item 2).

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
    run_sql_file("migrations/0030_best_slot.sql")


def downgrade() -> None:
    run_sql_file("migrations/0030_best_slot.down.sql")
    op.execute("DROP TABLE gov.release_minutes")
    op.execute("ALTER TABLE gov.settings DROP COLUMN release_per_minute")
