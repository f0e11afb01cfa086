"""Deferral queue, quiet hours, collapse and the releaser; decide_core shared by both.

Revision ID: 0004_queue
Revises: 0003_analytics
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0004_queue"
down_revision = "0003_analytics"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0004_queue.sql")


def downgrade() -> None:
    run_sql_file("migrations/0004_queue.down.sql")
