"""A runner's accepted attempts recorded in one statement per batch (one server).

Revision ID: 0017_record_batch_set
Revises: 0016_distributable
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0017_record_batch_set"
down_revision = "0016_distributable"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0017_record_batch_set.sql")


def downgrade() -> None:
    run_sql_file("migrations/0017_record_batch_set.down.sql")
