"""gov.local_instant in PL/pgSQL: planned once per session, not on every call.

Revision ID: 0052_local_instant_planned_once
Revises: 0051_compile_without_jit
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0052_local_instant_planned_once"
down_revision = "0051_compile_without_jit"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0052_local_instant_planned_once.sql")


def downgrade() -> None:
    run_sql_file("migrations/0052_local_instant_planned_once.down.sql")
