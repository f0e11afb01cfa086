"""gov.decide_v1 in PL/pgSQL: a SQL function is planned again on every call before PostgreSQL 18.

Revision ID: 0022_decide_plpgsql
Revises: 0021_cluster_user_lock
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0022_decide_plpgsql"
down_revision = "0021_cluster_user_lock"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0022_decide_plpgsql.sql")


def downgrade() -> None:
    run_sql_file("migrations/0022_decide_plpgsql.down.sql")
