"""The user's lock is one lock wherever a decision runs on a Citus cluster.

Revision ID: 0021_cluster_user_lock
Revises: 0020_campaign_set
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0021_cluster_user_lock"
down_revision = "0020_campaign_set"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0021_cluster_user_lock.sql")


def downgrade() -> None:
    run_sql_file("migrations/0021_cluster_user_lock.down.sql")
