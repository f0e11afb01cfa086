"""Segment caps: a tier's windows per user segment, the [segments] rules, gov segments refresh.

Revision ID: 0013_segment_caps
Revises: 0012_segments
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0013_segment_caps"
down_revision = "0012_segments"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0013_segment_caps.sql")


def downgrade() -> None:
    run_sql_file("migrations/0013_segment_caps.down.sql")
