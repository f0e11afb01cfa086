"""gov.shard_relation reads a shard only where Citus places it, and holds it against a move.

Revision ID: 0026_shard_placement
Revises: 0025_sql_surface
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0026_shard_placement"
down_revision = "0025_sql_surface"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0026_shard_placement.sql")


def downgrade() -> None:
    run_sql_file("migrations/0026_shard_placement.down.sql")
