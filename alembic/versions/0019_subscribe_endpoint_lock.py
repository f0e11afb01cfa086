"""Two users subscribing one endpoint at once leave it to one: a lock on the endpoint.

Revision ID: 0019_subscribe_endpoint_lock
Revises: 0018_prune_horizon
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0019_subscribe_endpoint_lock"
down_revision = "0018_prune_horizon"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0019_subscribe_endpoint_lock.sql")


def downgrade() -> None:
    run_sql_file("migrations/0019_subscribe_endpoint_lock.down.sql")
