"""gov.send_batch_v1: many unrelated messages sent in one call and one transaction.

Revision ID: 0024_send_batch
Revises: 0023_plain_rules
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0024_send_batch"
down_revision = "0023_plain_rules"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0024_send_batch.sql")


def downgrade() -> None:
    run_sql_file("migrations/0024_send_batch.down.sql")
