"""Segments: gov.users.segment, one per user at most.

Revision ID: 0012_segments
Revises: 0011_metrics
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0012_segments"
down_revision = "0011_metrics"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0012_segments.sql")


def downgrade() -> None:
    run_sql_file("migrations/0012_segments.down.sql")
