"""gov.on_citus() inlined: a lone expression instead of a sub-select planned per call.

Revision ID: 0050_on_citus_inlined
Revises: 0049_outbox_todo_by_id
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0050_on_citus_inlined"
down_revision = "0049_outbox_todo_by_id"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0050_on_citus_inlined.sql")


def downgrade() -> None:
    run_sql_file("migrations/0050_on_citus_inlined.down.sql")
