"""The release order is earliest deadline first: the slot goes to the held message that needs it soonest.

Revision ID: 0028_release_order
Revises: 0026_shard_placement
"""

from __future__ import annotations

from alembic import op
from gov.migrate import run_sql_file

revision = "0028_release_order"
down_revision = "0026_shard_placement"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0028_release_order.sql")


def downgrade() -> None:
    run_sql_file("migrations/0028_release_order.down.sql")
    # On its own: Citus forwards a DROP INDEX on a distributed table to the workers as the
    # query text it came in, and a text of several statements is refused there
    # ("cannot insert multiple commands into a prepared statement").
    op.execute("DROP INDEX gov.deferred_waiting_user")
