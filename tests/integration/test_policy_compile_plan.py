"""Compiling the policy never pays for JIT compilation.

The policy tables hold a few rows and carry no statistics, so the planner costs the compile
statement's cross joins at about 144 million: far over ``jit_above_cost``, and on a server
built with LLVM every ``gov policy apply`` spent about 0.8 s compiling a statement that runs
in a millisecond (docs/performance.md, stop 50).

The measure is PostgreSQL's own: auto_explain sends the plan of every statement the function
runs to the client as a log message, and a plan that was JIT-compiled says so. Nothing is
timed. On a server without JIT (the embedded one has no LLVM) there is nothing to see.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest


def _plans_of_compile(c: psycopg.Connection[Any]) -> list[str]:
    plans: list[str] = []
    c.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
    c.execute("LOAD 'auto_explain'")
    for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_nested_statements = on",
                    "auto_explain.log_analyze = on", "client_min_messages = log",
                    # every statement would be JIT-compiled, whatever it costs
                    "jit = on", "jit_above_cost = 0"):
        c.execute(f"SET {setting}")
    with c.transaction(force_rollback=True):
        c.execute("SELECT gov.compile_policy_v1()")
    c.execute("RESET client_min_messages")
    return plans


def test_the_policy_compile_is_never_jit_compiled(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as c:
        row = c.execute("SELECT pg_jit_available()").fetchone()
        if not (row and row[0]):
            pytest.skip("this server has no JIT provider (no LLVM): nothing could be JIT-compiled")
        plans = _plans_of_compile(c)
        # the control: with jit_above_cost 0 a statement outside the function is compiled
        c.execute("LOAD 'auto_explain'")
        c.execute("SET auto_explain.log_min_duration = 0")
        c.execute("SET client_min_messages = log")
        c.execute("SET jit_above_cost = 0")
        control: list[str] = []
        c.add_notice_handler(lambda d: control.append(d.message_primary or ""))
        c.execute("SELECT count(*) FROM gov.tiers").fetchall()
    compiled = [p for p in plans if "compiled_rules" in p]
    assert compiled, plans  # auto_explain saw the compile's statements
    assert not any("JIT:" in p for p in compiled), compiled
    assert any("JIT:" in p for p in control), control
