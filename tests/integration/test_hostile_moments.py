"""Moments and margins that would poison a budget are refused in SQL, writing nothing:
a decision at infinity once wrote send rows that sat in every later window of the user's,
and a prune with a negative margin deleted rows a window still reads."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from gov.queries import q

T0 = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)


def _count(conn: psycopg.Connection[Any], table: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM gov.{table}").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("moment", ["infinity", "-infinity"])
def test_a_decision_at_an_infinite_moment_is_refused_and_writes_nothing(
    conn: psycopg.Connection[Any], moment: str
) -> None:
    for sql in ("SELECT * FROM gov.decide_v1('u1', 'm', 'P3', NULL, NULL, %s::timestamptz)",
                "SELECT * FROM gov.send_v1('u1', 'm', 'P2', NULL, NULL, '{\"title\": \"t\"}', NULL, NULL,"
                " %s::timestamptz)"):
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(sql, (moment,))
        assert caught.value.sqlstate == "GV001", caught.value
    # the set path (a batch of plain users) refuses it too
    params = {"shard_key": None, "user_ids": ["a", "b"], "message_ids": ["m", "m"], "tiers": ["P2", "P2"],
              "topics": [None, None], "campaign_ids": [None, None], "contents": ['{"title": "t"}'] * 2,
              "collapse_keys": [None, None], "ttls": [None, None], "now": moment}
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(q("send_batch"), params)
    assert caught.value.sqlstate == "GV001", caught.value
    assert (_count(conn, "sends"), _count(conn, "messages")) == (0, 0)
    # the user's budget is untouched: the first P3 of the week is allowed
    row = conn.execute("SELECT allowed FROM gov.decide_v1('u1', 'now', 'P3', NULL, NULL, %s)", (T0,)).fetchone()
    assert row == (True,)


@pytest.mark.parametrize(("sql", "arg"), [
    ("SELECT gov.prune_sends_v1(1000, %s::interval, %s)", "-8 days"),
    ("SELECT gov.prune_history_v1(1000, %s::interval, %s)", "-1 day"),
])
def test_a_prune_with_a_negative_margin_is_refused_and_deletes_nothing(
    conn: psycopg.Connection[Any], sql: str, arg: str
) -> None:
    for k in range(3):  # two allowed P2 sends and a refusal (its suppression row: history)
        conn.execute("SELECT * FROM gov.decide_v1('u1', %s, 'P2', NULL, NULL, %s)", (f"m{k}", T0))
    before = (_count(conn, "sends"), _count(conn, "push_suppressions"))
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(sql, (arg, T0))
    assert caught.value.sqlstate == "GV003", caught.value
    assert (_count(conn, "sends"), _count(conn, "push_suppressions")) == before
    row = conn.execute("SELECT allowed FROM gov.decide_v1('u1', 'm3', 'P2', NULL, NULL, %s)", (T0,)).fetchone()
    assert row == (False,)  # still at the cap
