"""A campaign delivered at each user's best hour (issue 30, item 2): gov.send_many_best_v1.

Revision ID: 0035_campaign_at_best
Revises: 0034_cluster_statements
"""

from __future__ import annotations

from alembic import op
from gov.migrate import run_sql_file

revision = "0035_campaign_at_best"
down_revision = "0034_cluster_statements"
branch_labels = None
depends_on = None


# The DDL each in a statement of its own: Citus forwards DDL on a distributed table to the
# workers as the query text it came in, and a text of several statements is refused there
# (see 0028_release_order.py).
def upgrade() -> None:
    op.execute("ALTER TABLE gov.message_content ADD COLUMN timing text")
    op.execute(
        "ALTER TABLE gov.message_content ADD CONSTRAINT message_content_timing_known"
        " CHECK (timing IN ('best', 'explore'))"
    )
    run_sql_file("migrations/0035_campaign_at_best.sql")


def downgrade() -> None:
    run_sql_file("migrations/0035_campaign_at_best.down.sql")
    op.execute("ALTER TABLE gov.message_content DROP COLUMN timing")
