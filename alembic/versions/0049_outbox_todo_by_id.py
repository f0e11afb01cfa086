"""The outbox rows still to do, indexed by id (the claim of given rows).

Revision ID: 0049_outbox_todo_by_id
Revises: 0048_segments_together
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0049_outbox_todo_by_id"
down_revision = "0048_segments_together"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0049_outbox_todo_by_id.sql")


def downgrade() -> None:
    run_sql_file("migrations/0049_outbox_todo_by_id.down.sql")
