"""The claim planned once per session on one server (gov.claim_local from gov.claim_statement).

Revision ID: 0036_claim_plan
Revises: 0035_campaign_at_best
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0036_claim_plan"
down_revision = "0035_campaign_at_best"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0036_claim_plan.sql")


def downgrade() -> None:
    run_sql_file("migrations/0036_claim_plan.down.sql")
