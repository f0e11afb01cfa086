"""A decision on a Citus cluster runs statements Citus can cache: policy reads bound to local copies.

Revision ID: 0034_cluster_statements
Revises: 0030_best_slot
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0034_cluster_statements"
down_revision = "0030_best_slot"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0034_cluster_statements.sql")


def downgrade() -> None:
    run_sql_file("migrations/0034_cluster_statements.down.sql")
