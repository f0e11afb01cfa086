"""Analytics: push_events telemetry, the fatigue report, analysts' views, health checks, what-if.

Revision ID: 0003_analytics
Revises: 0002_delivery
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0003_analytics"
down_revision = "0002_delivery"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0003_analytics.sql")


def downgrade() -> None:
    run_sql_file("migrations/0003_analytics.down.sql")
