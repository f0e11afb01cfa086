"""Topic opt-outs in the decision, deferral outcomes view, deferred_overdue check.

Revision ID: 0006_queue_analytics
Revises: 0005_operations
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0006_queue_analytics"
down_revision = "0005_operations"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0006_queue_analytics.sql")


def downgrade() -> None:
    run_sql_file("migrations/0006_queue_analytics.down.sql")
