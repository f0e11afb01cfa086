"""gov.compile_policy_v1() without JIT: a few rows costed in the millions.

Revision ID: 0051_compile_without_jit
Revises: 0050_on_citus_inlined
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0051_compile_without_jit"
down_revision = "0050_on_citus_inlined"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0051_compile_without_jit.sql")


def downgrade() -> None:
    run_sql_file("migrations/0051_compile_without_jit.down.sql")
