"""The metrics read of `gov serve` (/metrics): gov.metrics_v1 and BRIN indexes on the time columns.

Revision ID: 0011_metrics
Revises: 0010_runner_fencing
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0011_metrics"
down_revision = "0010_runner_fencing"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0011_metrics.sql")


def downgrade() -> None:
    run_sql_file("migrations/0011_metrics.down.sql")
