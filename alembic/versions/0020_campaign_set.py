"""A campaign batch decides its plain users together: one statement for all of them.

Revision ID: 0020_campaign_set
Revises: 0019_subscribe_endpoint_lock
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0020_campaign_set"
down_revision = "0019_subscribe_endpoint_lock"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0020_campaign_set.sql")


def downgrade() -> None:
    run_sql_file("migrations/0020_campaign_set.down.sql")
