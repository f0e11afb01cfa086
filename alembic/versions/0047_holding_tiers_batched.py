"""A send batch decides the messages of tiers that hold (defer, collapse) together too.

Revision ID: 0047_holding_tiers_batched
Revises: 0046_quiet_end_on_clock_change
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0047_holding_tiers_batched"
down_revision = "0046_quiet_end_on_clock_change"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0047_holding_tiers_batched.sql")


def downgrade() -> None:
    run_sql_file("migrations/0047_holding_tiers_batched.down.sql")
