"""The released SQL surface kept: every dropped gov.*_vN back as a wrapper over its successor.

Revision ID: 0025_sql_surface
Revises: 0024_send_batch
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0025_sql_surface"
down_revision = "0024_send_batch"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0025_sql_surface.sql")


def downgrade() -> None:
    run_sql_file("migrations/0025_sql_surface.down.sql")
