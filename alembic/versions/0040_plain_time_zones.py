"""A user with a time zone, outside their quiet hours, is decided together with the plain ones.

Revision ID: 0040_plain_time_zones
Revises: 0039_claim_plans
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0040_plain_time_zones"
down_revision = "0039_claim_plans"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0040_plain_time_zones.sql")


def downgrade() -> None:
    run_sql_file("migrations/0040_plain_time_zones.down.sql")
