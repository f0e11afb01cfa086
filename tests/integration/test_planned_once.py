"""Small functions the decision calls cost no statement, or no plan, per call.

gov.on_citus() was an EXISTS over pg_extension: PL/pgSQL ran it through the executor on
every call, about 75 µs, twice in every batch gov serve decides (migration 0050 made it a
lone expression). gov.local_instant was a SQL function with a FROM clause, which PostgreSQL
15 plans again on every call, 0.13 ms, once or twice for every user inside quiet hours with
a time zone (migration 0052 made it PL/pgSQL). docs/performance.md, stop 50.

The measures are PostgreSQL's own: with ``debug_print_plan`` every plan the server makes,
and with auto_explain every statement a function runs, is sent to the client as a log
message, so they are counted without timing anything.
"""

from __future__ import annotations

from typing import Any

import psycopg

CALLS = 40


def _plans_over_calls(db_url: str, expression: str) -> int:
    """How many plans the server made while one PL/pgSQL loop evaluated ``expression`` CALLS times."""
    with psycopg.connect(db_url, autocommit=True) as c:
        plans: list[str] = []

        def count(d: Any) -> None:
            if (d.message_primary or "").startswith("plan:"):
                plans.append(d.message_detail or "")

        c.add_notice_handler(count)
        c.execute("SET debug_print_plan = on")
        c.execute("SET client_min_messages = log")
        c.execute(f"DO $$ BEGIN FOR i IN 1..{CALLS} LOOP PERFORM {expression}; END LOOP; END $$")
        c.execute("RESET client_min_messages")
    return len(plans)


def test_local_instant_plans_once_per_session(db_url: str) -> None:
    # (PostgreSQL 18 caches a SQL function's plans too: there this holds either way; the
    # PostgreSQL 15 tier is the one that tells)
    plans = _plans_over_calls(db_url, "gov.local_instant(timestamp '2026-03-29 02:30', 'Europe/Berlin',"
                                      " timestamptz '2026-03-28 12:00+00' + i * interval '1 s')")
    # the DO block's own statements, and each function statement's first five plans (the plan
    # cache tries custom plans five times before it settles): a dozen or so, not one per call
    # (a SQL function that is not inlined: 48 here)
    assert plans < CALLS // 2, plans


def test_on_one_server_the_cluster_check_runs_no_statement(db_url: str) -> None:
    """gov.distributed() (twice in every batch, once in every single send) asks gov.on_citus(),
    which is a lone expression PL/pgSQL evaluates itself. As an EXISTS over pg_extension it was
    a statement run through the executor on every call: about 75 µs each on PostgreSQL 15 and 18
    alike. auto_explain logs every statement a function runs; this one must log none."""
    with psycopg.connect(db_url, autocommit=True) as c:
        logged: list[str] = []
        c.add_notice_handler(lambda d: logged.append(d.message_primary or ""))
        c.execute("LOAD 'auto_explain'")
        for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_nested_statements = on",
                        "client_min_messages = log"):
            c.execute(f"SET {setting}")
        for _ in range(10):
            assert c.execute("SELECT gov.distributed()").fetchone() == (False,)
        c.execute("RESET client_min_messages")
    nested = [p for p in logged if "SELECT gov.distributed()" not in p]
    assert nested == [], nested
