"""The hold's and the releaser's reads planned once per session on one server.

Revision ID: 0037_release_plan
Revises: 0036_claim_plan
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0037_release_plan"
down_revision = "0036_claim_plan"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0037_release_plan.sql")


def downgrade() -> None:
    run_sql_file("migrations/0037_release_plan.down.sql")
