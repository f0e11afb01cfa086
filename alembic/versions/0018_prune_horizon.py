"""gov prune keeps the send rows a segment's (or a user's) longer window still reads.

Revision ID: 0018_prune_horizon
Revises: 0017_record_batch_set
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0018_prune_horizon"
down_revision = "0017_record_batch_set"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0018_prune_horizon.sql")


def downgrade() -> None:
    run_sql_file("migrations/0018_prune_horizon.down.sql")
