"""One runner per row: a fencing token on outbox claims, and a 410 that ends the endpoint's other rows.

Revision ID: 0010_runner_fencing
Revises: 0009_hold_release
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0010_runner_fencing"
down_revision = "0009_hold_release"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0010_runner_fencing.sql")


def downgrade() -> None:
    run_sql_file("migrations/0010_runner_fencing.down.sql")
