"""A leaner decision: the policy compiled at apply time, one pass per budget, send rows only for capped budgets.

Revision ID: 0015_lean_decision
Revises: 0014_fatigue_marginal
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0015_lean_decision"
down_revision = "0014_fatigue_marginal"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0015_lean_decision.sql")


def downgrade() -> None:
    run_sql_file("migrations/0015_lean_decision.down.sql")
