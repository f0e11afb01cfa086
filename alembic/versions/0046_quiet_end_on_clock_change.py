"""Quiet hours end when the user's clock reads their end, also on the nights the clocks change.

Revision ID: 0046_quiet_end_on_clock_change
Revises: 0045_backfill_every_budget
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0046_quiet_end_on_clock_change"
down_revision = "0045_backfill_every_budget"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0046_quiet_end_on_clock_change.sql")


def downgrade() -> None:
    run_sql_file("migrations/0046_quiet_end_on_clock_change.down.sql")
