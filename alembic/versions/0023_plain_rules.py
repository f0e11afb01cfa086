"""gov.decide_core reads a plain user's rules without initialising the own-caps query.

Revision ID: 0023_plain_rules
Revises: 0022_decide_plpgsql
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0023_plain_rules"
down_revision = "0022_decide_plpgsql"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0023_plain_rules.sql")


def downgrade() -> None:
    run_sql_file("migrations/0023_plain_rules.down.sql")
