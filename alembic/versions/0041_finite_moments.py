"""Refuse a decision or a prune at a moment (or margin) that would poison a budget.

Revision ID: 0041_finite_moments
Revises: 0040_plain_time_zones
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0041_finite_moments"
down_revision = "0040_plain_time_zones"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0041_finite_moments.sql")


def downgrade() -> None:
    run_sql_file("migrations/0041_finite_moments.down.sql")
