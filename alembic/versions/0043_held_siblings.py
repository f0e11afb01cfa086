"""A row handed back unsent may be held back: an endpoint's rows after one it failed to answer.

Revision ID: 0043_held_siblings
Revises: 0042_interval_domain
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0043_held_siblings"
down_revision = "0042_interval_domain"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0043_held_siblings.sql")


def downgrade() -> None:
    run_sql_file("migrations/0043_held_siblings.down.sql")
