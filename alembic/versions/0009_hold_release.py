"""Held messages: collapse that compresses, a releaser one bad row cannot stop.

Revision ID: 0009_hold_release
Revises: 0008_fatigue_leavers
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0009_hold_release"
down_revision = "0008_fatigue_leavers"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0009_hold_release.sql")


def downgrade() -> None:
    run_sql_file("migrations/0009_hold_release.down.sql")
