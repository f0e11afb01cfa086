"""The claim of given rows and of any due rows as two statements, each planned once per session.

Revision ID: 0039_claim_plans
Revises: 0038_shard_decisions
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0039_claim_plans"
down_revision = "0038_shard_decisions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0039_claim_plans.sql")


def downgrade() -> None:
    run_sql_file("migrations/0039_claim_plans.down.sql")
