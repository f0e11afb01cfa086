"""The marginal fatigue measure: gov.fatigue_marginal_v1 and gov.wilson_interval_v1.

Revision ID: 0014_fatigue_marginal
Revises: 0013_segment_caps
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0014_fatigue_marginal"
down_revision = "0013_segment_caps"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0014_fatigue_marginal.sql")


def downgrade() -> None:
    run_sql_file("migrations/0014_fatigue_marginal.down.sql")
