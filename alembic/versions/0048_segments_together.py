"""Users in a segment with windows of its own are decided together.

Revision ID: 0048_segments_together
Revises: 0047_holding_tiers_batched
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0048_segments_together"
down_revision = "0047_holding_tiers_batched"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0048_segments_together.sql")


def downgrade() -> None:
    run_sql_file("migrations/0048_segments_together.down.sql")
