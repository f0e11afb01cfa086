"""Record a runner's batch of delivery attempts in one call.

Revision ID: 0007_record_batch
Revises: 0006_queue_analytics
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0007_record_batch"
down_revision = "0006_queue_analytics"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0007_record_batch.sql")


def downgrade() -> None:
    run_sql_file("migrations/0007_record_batch.down.sql")
