"""Alembic environment for gov: runs the frozen SQL of each revision.

The connection comes from ``config.attributes["connection"]`` (gov.migrate passes
one), else from GOV_DATABASE_URL. The version table lives outside the gov schema
(public.gov_alembic_version), so downgrading past the first revision can drop the
schema whole.
"""

from __future__ import annotations

import os

from sqlalchemy import create_engine

from alembic import context
from gov.db import sqlalchemy_url

VERSION_TABLE = "gov_alembic_version"


def run_migrations_online() -> None:
    config = context.config
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, version_table=VERSION_TABLE, transaction_per_migration=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = os.environ.get("GOV_DATABASE_URL") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("set GOV_DATABASE_URL to the database to migrate")
    engine = create_engine(sqlalchemy_url(url))
    with engine.connect() as conn:
        context.configure(connection=conn, version_table=VERSION_TABLE, transaction_per_migration=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("gov migrations run online only (they execute PL/pgSQL files)")
run_migrations_online()
