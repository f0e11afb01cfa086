"""The fatigue report buckets a user who unsubscribed by the sends received before leaving.

Revision ID: 0008_fatigue_leavers
Revises: 0007_record_batch
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0008_fatigue_leavers"
down_revision = "0007_record_batch"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0008_fatigue_leavers.sql")


def downgrade() -> None:
    run_sql_file("migrations/0008_fatigue_leavers.down.sql")
