"""The best hours from reach: gov.hour_curves_v2, gov.best_hours_v2, and the timing reads them.

Revision ID: 0053_best_hours_from_reach
Revises: 0052_local_instant_planned_once
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0053_best_hours_from_reach"
down_revision = "0052_local_instant_planned_once"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0053_best_hours_from_reach.sql")


def downgrade() -> None:
    run_sql_file("migrations/0053_best_hours_from_reach.down.sql")
