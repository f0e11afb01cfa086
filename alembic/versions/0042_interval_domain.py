"""The interval functions answer NULL outside their domain.

Revision ID: 0042_interval_domain
Revises: 0041_finite_moments
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0042_interval_domain"
down_revision = "0041_finite_moments"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0042_interval_domain.sql")


def downgrade() -> None:
    run_sql_file("migrations/0042_interval_domain.down.sql")
