"""Refuse inputs that would poison state: future prunes and moments, long leases, bad content.

Revision ID: 0044_poison_inputs
Revises: 0043_held_siblings
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0044_poison_inputs"
down_revision = "0043_held_siblings"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0044_poison_inputs.sql")


def downgrade() -> None:
    run_sql_file("migrations/0044_poison_inputs.down.sql")
