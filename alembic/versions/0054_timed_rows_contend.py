"""The release order with timing on: a row timing placed later contends from its first slot (first_at).

Revision ID: 0054_timed_rows_contend
Revises: 0053_best_hours_from_reach
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0054_timed_rows_contend"
down_revision = "0053_best_hours_from_reach"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0054_timed_rows_contend.sql")


def downgrade() -> None:
    run_sql_file("migrations/0054_timed_rows_contend.down.sql")
