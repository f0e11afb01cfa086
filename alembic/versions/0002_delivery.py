"""Delivery: subscriptions, message content, the outbox, attempts, gov.send_v1.

Revision ID: 0002_delivery
Revises: 0001_foundation
"""

from __future__ import annotations

from gov.migrate import run_sql_file

revision = "0002_delivery"
down_revision = "0001_foundation"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("migrations/0002_delivery.sql")


def downgrade() -> None:
    run_sql_file("migrations/0002_delivery.down.sql")
