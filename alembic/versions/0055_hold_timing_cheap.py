"""A hold with timing on asks quiet hours only as far as its answer needs; hour counts planned per call.

Revision ID: 0055_hold_timing_cheap
Revises: 0054_timed_rows_contend
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0055_hold_timing_cheap"
down_revision = "0054_timed_rows_contend"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0055_hold_timing_cheap.sql")


def downgrade() -> None:
    run_sql_file("migrations/0055_hold_timing_cheap.down.sql")
