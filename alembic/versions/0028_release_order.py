"""The release order is earliest deadline first: the slot goes to the held message that needs it soonest.

Revision ID: 0028_release_order
Revises: 0026_shard_placement
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0028_release_order"
down_revision = "0026_shard_placement"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0028_release_order.sql")


def downgrade() -> None:
    run_sql_file("migrations/0028_release_order.down.sql")
