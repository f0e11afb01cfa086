"""Where the bench's decisions ran, on a Citus cluster: Citus's own counters of single-shard
and multi-shard executions (``citus_stat_counters``), taken around each gov run only.

A decision pushed down to the worker that holds its user is one single-shard execution;
anything that had to touch several shards is a multi-shard one. On a server without
Citus there is nothing to route, and the bench says so.
"""

from __future__ import annotations

from typing import Any

from psycopg import sql


class Routing:
    """Counts single- and multi-shard executions over the runs it is told about."""

    def __init__(self, admin: Any) -> None:
        self.admin = admin
        (self.on,) = admin.execute("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')").fetchone()
        self.single = self.multi = 0
        if self.on:
            # every session the clients open from now on counts (the counters are off by default)
            admin.execute(sql.SQL("ALTER DATABASE {} SET citus.enable_stat_counters = on").format(
                sql.Identifier(admin.info.dbname)))

    def before(self) -> None:
        if self.on:
            self.admin.execute("SELECT citus_stat_counters_reset(0)")

    def after(self) -> None:
        if self.on:
            row = self.admin.execute(
                "SELECT query_execution_single_shard, query_execution_multi_shard FROM citus_stat_counters"
                " WHERE name = current_database()"
            ).fetchone()
            self.single += int(row[0])
            self.multi += int(row[1])

    def summary(self) -> str:
        if not self.on:
            return "one server (no Citus): every decision is local"
        total = self.single + self.multi
        share = 100.0 * self.single / total if total else 0.0
        return (f"Citus: {self.single:,} single-shard and {self.multi:,} multi-shard executions during the gov "
                f"runs; single-shard share = {share:.1f} %")
