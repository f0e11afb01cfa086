"""Campaign decisions in bulk, pruning, and the conservation check.

Revision ID: 0005_operations
Revises: 0004_queue
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0005_operations"
down_revision = "0004_queue"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0005_operations.sql")


def downgrade() -> None:
    run_sql_file("migrations/0005_operations.down.sql")
