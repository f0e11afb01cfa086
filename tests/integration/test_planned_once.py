"""Small functions the decision calls plan their statements once per session, not per call.

A SQL function the planner cannot inline (a body with a sub-select or a FROM clause) plans
its statement again on every call: gov.on_citus() cost about 80 µs that way, twice in every
batch gov serve decides, and gov.local_instant 0.13 ms, once or twice for every user inside
quiet hours with a time zone (docs/performance.md, stop 50; migrations 0050 and 0052).

The measure is PostgreSQL's own, as in test_claim_plan.py: with ``debug_print_plan`` every
plan the server makes is sent to the client as a log message, so the plans made over many
calls are counted without timing anything.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

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


@pytest.mark.parametrize("expression", [
    "gov.distributed()",  # gov.on_citus() inside it
    "gov.local_instant(timestamp '2026-03-29 02:30', 'Europe/Berlin',"
    " timestamptz '2026-03-28 12:00+00' + i * interval '1 s')",
], ids=["distributed", "local_instant"])
def test_a_function_the_decision_calls_plans_once_per_session(db_url: str, expression: str) -> None:
    plans = _plans_over_calls(db_url, expression)
    # the DO block's own statements, and each function statement's first five plans (the plan
    # cache tries custom plans five times before it settles): a dozen or so, not one per call
    # (a SQL function that is not inlined: 48 here)
    assert plans < CALLS // 2, plans
