"""The best hours: gov.best_hours_v1, gov.hour_curves_v1 and the view gov.hour_curve (issue 30, item 1).

Revision ID: 0029_best_hours
Revises: 0026_shard_placement
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0029_best_hours"
down_revision = "0028_release_order"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0029_best_hours.sql")


def downgrade() -> None:
    run_sql_file("migrations/0029_best_hours.down.sql")
