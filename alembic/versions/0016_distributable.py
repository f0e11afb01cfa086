"""A schema that distributes: keys that lead with user_id, queues and campaigns by shard, gov.distribute_v1.

Revision ID: 0016_distributable
Revises: 0015_lean_decision
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0016_distributable"
down_revision = "0015_lean_decision"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0016_distributable.sql")


def downgrade() -> None:
    run_sql_file("migrations/0016_distributable.down.sql")
