"""Foundation: policy tables, sends, messages, suppressions and gov.decide_v1.

Revision ID: 0001_foundation
Revises:
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0001_foundation"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0001_foundation.sql")


def downgrade() -> None:
    run_sql_file("migrations/0001_foundation.down.sql")
