"""A delegated decision on the user's own shard tables (Citus; nothing on one server).

Revision ID: 0038_shard_decisions
Revises: 0037_release_plan
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0038_shard_decisions"
down_revision = "0037_release_plan"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0038_shard_decisions.sql")


def downgrade() -> None:
    run_sql_file("migrations/0038_shard_decisions.down.sql")
