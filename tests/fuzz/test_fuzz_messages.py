"""Messages with hostile ids, user ids, topics and payloads, through a real database.

Property: ``Governor.decide``/``send`` either refuse with a clear ``gov.InvalidInput``
and write nothing, or return a verdict whose rows are exactly one full decision (the
spend of every consumed budget, or one suppression); asking again returns the same
verdict as a repeat and writes nothing. Nothing else is ever raised.

And: no SQL text is ever built from values in gov's own code (an AST scan of gov/).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from gov import Governor, InvalidInput, Message
from gov.testing.postgres import TemplateDatabases
from tests.fuzz import FUZZ, NASTY, any_text

TABLES = ("messages", "sends", "push_suppressions", "message_content", "outbox", "deferred", "subscriptions", "users")
PACKAGE = Path(__file__).resolve().parents[2] / "gov"


@pytest.fixture(scope="module")
def fuzz_url(databases: TemplateDatabases) -> Iterator[str]:
    url = databases.clone()
    yield url
    databases.drop(url)


@pytest.fixture(scope="module")
def fuzz_gov(fuzz_url: str) -> Iterator[Governor]:
    with Governor(fuzz_url, pool_size=1) as g:
        yield g


@pytest.fixture(scope="module")
def fuzz_conn(fuzz_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(fuzz_url, autocommit=True) as c:
        yield c


def counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """Rows in every table a decision or a send writes (the module's database is only this test's)."""
    row = conn.execute(
        "SELECT " + ", ".join(f"(SELECT count(*) FROM gov.{t})" for t in TABLES)  # names from the constant above
    ).fetchone()
    assert row is not None
    return dict(zip(TABLES, row, strict=True))


def spends(conn: psycopg.Connection[Any], tier: str, topic: str | None) -> int | None:
    """How many budgets an allowed message of ``tier`` spends (None: exempt): one row per budget
    some cap of the policy reads (a consumed tier's windows, its segments', a topic cap, a global
    cap), read from the policy tables as the TOML set them, not from the compiled rules."""
    row = conn.execute(
        "SELECT t.exempt,"
        " (SELECT count(*) FROM gov.tier_consumes c WHERE c.tier = t.tier"
        "   AND (EXISTS (SELECT 1 FROM gov.caps x WHERE x.scope = c.consumes)"
        "        OR EXISTS (SELECT 1 FROM gov.segment_caps x WHERE x.tier = c.consumes))),"
        " %s::text IS NOT NULL AND EXISTS (SELECT 1 FROM gov.caps x WHERE x.scope = 'topic'),"
        " EXISTS (SELECT 1 FROM gov.caps x WHERE x.scope = 'global')"
        " FROM gov.tiers t WHERE t.tier = %s",
        (topic, tier),
    ).fetchone()
    assert row is not None
    return None if row[0] else int(row[1]) + int(row[2]) + int(row[3])


tiers = st.one_of(
    st.sampled_from(["P0", "P1", "P2", "P3", "P4", "P9", "p1", "P10", "", " P1", "P1\x00", "P1 "]),
    st.text(max_size=4),
)
maybe_text = st.one_of(st.none(), any_text)
ids = st.one_of(any_text, st.none(), st.integers(), st.just(b"bytes"))
ttls = st.one_of(st.none(), st.integers(-10, 3_000_000), st.sampled_from([True, 1.5, "60", 2**70]))

NO_NUL = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")

# Hostile, but within the rules: quotes, backslashes, SQL, format strings, any script.
valid_text = st.one_of(
    st.sampled_from([t for t in NASTY if "\x00" not in t and t.strip() and len(t) <= 256]),
    st.text(NO_NUL, min_size=1, max_size=60).filter(str.strip),
    st.text(NO_NUL, min_size=200, max_size=256).filter(str.strip),
)
regulars = st.sampled_from(["user0", "user1", "user2"])  # decided often: their caps bind
users = st.one_of(valid_text, regulars, regulars)


@FUZZ
@given(user=users, mid=valid_text, tier=st.sampled_from(["P0", "P1", "P1", "P2", "P2", "P3", "P7"]),
       topic=st.one_of(st.none(), valid_text), campaign=st.one_of(st.none(), valid_text), title=valid_text,
       collapse=st.one_of(st.none(), valid_text), send=st.booleans())
def test_hostile_text_is_decided_whole(
    fuzz_gov: Governor, fuzz_conn: psycopg.Connection[Any], user: str, mid: str, tier: str, topic: str | None,
    campaign: str | None, title: str, collapse: str | None, send: bool,
) -> None:
    check_message(fuzz_gov, fuzz_conn, send, user_id=user, id=mid, tier=tier, topic=topic, campaign_id=campaign,
                  title=title, body=title, url=title, collapse_key=collapse, ttl=3600)


@FUZZ
@given(user=ids, mid=ids, tier=tiers, topic=maybe_text, campaign=maybe_text, title=maybe_text, body=maybe_text,
       url=maybe_text, collapse=maybe_text, ttl=ttls, send=st.booleans())
def test_malformed_messages_are_refused_clearly(
    fuzz_gov: Governor, fuzz_conn: psycopg.Connection[Any], user: Any, mid: Any, tier: Any, topic: Any,
    campaign: Any, title: Any, body: Any, url: Any, collapse: Any, ttl: Any, send: bool,
) -> None:
    check_message(fuzz_gov, fuzz_conn, send, user_id=user, id=mid, tier=tier, topic=topic, campaign_id=campaign,
                  title=title, body=body, url=url, collapse_key=collapse, ttl=ttl)


def check_message(fuzz_gov: Governor, fuzz_conn: psycopg.Connection[Any], send: bool, **fields: Any) -> None:
    """The property: a clear refusal that writes nothing, or one whole decision (and a repeat writes nothing)."""
    before = counts(fuzz_conn)

    def call(message: Message) -> Any:
        return fuzz_gov.send(message, deliver=False).decision if send else fuzz_gov.decide(message)

    try:
        message = Message(**fields)
        verdict = call(message)
    except InvalidInput as exc:
        event(f"refused: {type(exc).__name__}")
        text = str(exc)
        assert text.strip() and len(text) < 1000, f"an unclear refusal: {text[:200]!r}"
        assert counts(fuzz_conn) == before, "a refused message wrote something"
        return
    event("allowed" if verdict.allowed else f"suppressed: {verdict.action}")
    after = counts(fuzz_conn)
    delta = {t: after[t] - before[t] for t in TABLES}
    if verdict.repeated:  # hypothesis drew a (user, id) it had drawn before
        assert not any(delta.values()), delta
        return
    spent = spends(fuzz_conn, message.tier, message.topic)
    if message.tier == "P0":
        assert verdict.allowed, "P0 is never suppressed"
    if verdict.allowed:
        expected_spend = 0 if spent is None else spent
        assert (delta["messages"], delta["sends"], delta["push_suppressions"]) == (1, expected_spend, 0), delta
    else:
        assert (delta["messages"], delta["sends"], delta["push_suppressions"]) == (1, 0, 1), delta
        assert verdict.action in ("drop", "defer", "collapse") and verdict.reason
    if send:
        held = verdict.action in ("defer", "collapse") or verdict.reason in ("defer_expired", "ttl_expired")
        assert (delta["message_content"], delta["deferred"], delta["outbox"]) == (1, int(held), 0), delta
    else:
        assert (delta["message_content"], delta["deferred"], delta["outbox"]) == (0, 0, 0), delta

    # asked again: the first verdict, marked as a repeat, and nothing written
    again = call(message)
    assert again.repeated and (again.allowed, again.reason) == (verdict.allowed, verdict.reason)
    assert counts(fuzz_conn) == after


@pytest.mark.parametrize("field", ["user_id", "id", "topic", "campaign_id", "collapse_key", "title", "body", "url"])
def test_a_lone_surrogate_is_refused_clearly(fuzz_gov: Governor, fuzz_conn: psycopg.Connection[Any],
                                             field: str) -> None:
    before = counts(fuzz_conn)
    fields: dict[str, Any] = {"user_id": "surrogate-user", "id": f"surrogate-{field}", "tier": "P1", "title": "t"}
    fields[field] = "a\ud800b"
    with pytest.raises(InvalidInput):
        fuzz_gov.send(Message(**fields), deliver=False)
    assert counts(fuzz_conn) == before


# ---------------------------------------------------------------- no SQL built from values

# Calls that send SQL text: its first argument must be a statement, never text built at run time.
SQL_SINKS = {"execute", "executemany", "copy", "text", "SQL", "stream"}


def _built_string(node: ast.AST) -> str | None:
    """Why ``node`` is SQL text built from values at run time, or None when it is not."""
    if isinstance(node, ast.JoinedStr):
        return "an f-string"
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        sides = (node.left, node.right)
        if any(isinstance(s, (ast.Constant, ast.JoinedStr)) and isinstance(getattr(s, "value", ""), str)
               for s in sides) or any(_built_string(s) for s in sides):
            return "string concatenation" if isinstance(node.op, ast.Add) else "%-formatting"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == "format" and not _is_sql_composable(node.func.value):
            return "str.format()"
        if node.func.attr == "join" and isinstance(node.func.value, ast.Constant):
            return "str.join()"
    return None


def _is_sql_composable(node: ast.AST) -> bool:
    """psycopg.sql.SQL(<a statement>): its .format() quotes identifiers and literals properly."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, (ast.Attribute, ast.Name))
        and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "SQL"
        and bool(node.args)
        and _built_string(node.args[0]) is None
    )


def _assignments(scope: ast.AST) -> dict[str, list[ast.AST]]:
    found: dict[str, list[ast.AST]] = {}
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, []).append(node.value)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            value = node.value if node.value is not None else ast.Constant(None)
            if isinstance(node, ast.AugAssign):
                # text += value: a statement grown at run time, whatever it started as
                value = ast.BinOp(ast.Constant(""), node.op, node.value)
            found.setdefault(node.target.id, []).append(value)
    return found


def sql_built_from_values(source: str, filename: str = "<source>") -> list[str]:
    """Every call that sends SQL text built at run time (f-string, +, %, .format, .join),
    directly or through a variable assigned in the same function or module."""
    tree = ast.parse(source, filename)
    module_vars = _assignments(tree)
    problems = []
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    scopes: list[ast.AST] = [tree, *functions]
    seen: set[int] = set()
    for scope in reversed(scopes):  # innermost functions first: their own variables win
        local_vars = _assignments(scope) if scope is not tree else {}
        for node in ast.walk(scope):
            if id(node) in seen or not isinstance(node, ast.Call) or not node.args:
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name not in SQL_SINKS:
                continue
            seen.add(id(node))
            arg = node.args[0]
            why = _built_string(arg)
            if why is None and isinstance(arg, ast.Name):
                for value in local_vars.get(arg.id, module_vars.get(arg.id, [])):
                    if (why := _built_string(value)) is not None:
                        break
            if why is not None:
                problems.append(f"{filename}:{node.lineno}: {name}() gets SQL built with {why}")
    return problems


BAD = '''
def f(conn, user, table, names):
    conn.execute(f"SELECT * FROM t WHERE u = '{user}'")
    conn.execute("SELECT * FROM t WHERE u = '" + user + "'")
    conn.execute("SELECT * FROM t WHERE u = '%s'" % user)
    conn.execute("SELECT * FROM {}".format(table))
    query = f"DELETE FROM {table}"
    cur.executemany(query, [])
    conn.execute(sql.SQL(f"SELECT {user}"))
    conn.execute(", ".join(names))
    statement = "SELECT 1"
    statement += user
    conn.execute(statement)
'''

GOOD = '''
from psycopg import sql
QUERY = "SELECT 1"
def g(conn, user, name, statement):
    conn.execute("SELECT * FROM t WHERE u = %s", (user,))
    conn.execute(q("decide"), {"user_id": user})
    conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(name)))
    conn.execute(sql.SQL(q("create_analyst_role")).format(role=sql.Identifier(name)))
    conn.execute(QUERY)
    conn.execute(statement)
    log.info("x %s" % user)
'''


def test_the_scan_finds_sql_built_from_values() -> None:
    """The scan itself: every way of building SQL text is caught; parameters are not flagged."""
    assert len(sql_built_from_values(BAD)) == 8, sql_built_from_values(BAD)
    assert sql_built_from_values(GOOD) == []


def test_no_sql_is_built_from_values_in_gov() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 10, "the scan found no sources"
    problems = [p for path in files for p in sql_built_from_values(path.read_text(encoding="utf-8"), str(path))]
    assert problems == [], "\n".join(problems)
