"""A policy change fills what a prune deleted in a budget whose window grew.

Revision ID: 0045_backfill_every_budget
Revises: 0044_poison_inputs
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0045_backfill_every_budget"
down_revision = "0044_poison_inputs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0045_backfill_every_budget.sql")


def downgrade() -> None:
    run_sql_file("migrations/0045_backfill_every_budget.down.sql")
