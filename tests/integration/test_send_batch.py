"""gov.send_batch_v1 (what `gov serve` sends for the requests that arrive together) gives
every message what gov.send_v1 gives it alone, row for row, whatever the mix: users of
every kind, several messages of one user in a batch, repeated ids, every tier."""

from __future__ import annotations

import logging
import random
from datetime import time, timedelta
from typing import Any

import psycopg
import pytest

from gov import Governor, Message
from gov import policy as policy_mod
from gov.aio import AsyncGovernor
from gov.queries import q
from gov.testing import PushService
from gov.users import set_quiet_hours, set_segment, set_time_zone
from tests.aio import run_async
from tests.integration.test_campaign_set import (
    CONTENT,
    DEFERRED,
    KINDS,
    MESSAGES,
    OUTBOX,
    POLICY,
    SENDS,
    SUPPRESSIONS,
    T0,
    populate,
    rows,
)

KINDS_OF_MESSAGE = (
    dict(tier="P2", campaign_id="spring", title="Flash sale", ttl=3600),
    dict(tier="P2", topic="news", title="Headline"),
    dict(tier="P2", topic="tips", title="Tip"),
    dict(tier="P0", title="We are down", body="Sorry"),
    dict(tier="P1", title="Your cart"),
    dict(tier="P3", title="For you", collapse_key="recs"),
)


def said(result: Any) -> tuple[Any, ...]:
    d = result.decision
    return d.allowed, d.action, d.reason, d.used, d.cap, d.retry_after_ms, d.repeated, len(result.outbox_ids)


def test_a_batch_of_unrelated_messages_gives_each_what_send_gives_it_alone(
    db_url: str, conn: psycopg.Connection[Any], push: PushService, caplog: pytest.LogCaptureFixture
) -> None:
    with conn.transaction():
        policy_mod.apply(conn, policy_mod.parse_policy(POLICY), POLICY)
    users = [f"{i:03d}" for i in range(2 * KINDS * 4)]
    with Governor(db_url, allow_loopback_http=True, pool_size=2) as governor:
        for prefix in ("a", "b"):
            for u in users:
                populate(governor, conn, prefix + u, int(u))
                for _ in range(int(u) % 3):  # none, one or two browsers
                    governor.subscribe(prefix + u, push.subscribe().info)
        rng = random.Random(27)
        plan: list[list[tuple[str, int, int]]] = []  # per round: (user, kind of message, id number)
        for _ in range(4):
            picks = [(u, rng.randrange(len(KINDS_OF_MESSAGE)), rng.randrange(6)) for u in users]
            picks += [(u, rng.randrange(len(KINDS_OF_MESSAGE)), rng.randrange(6)) for u in rng.sample(users, 40)]
            rng.shuffle(picks)  # several messages of one user, apart in the batch; ids that repeat
            plan.append(picks)

        def message(prefix: str, user: str, kind: int, n: int) -> Message:
            return Message(user_id=prefix + user, id=f"m{n}-{kind}", **KINDS_OF_MESSAGE[kind])  # type: ignore[arg-type]

        alone: list[tuple[Any, ...]] = []
        for round_no, picks in enumerate(plan):
            at = T0 + timedelta(hours=3 * round_no)
            alone += [said(governor.send(message("a", *p), at=at, deliver=False)) for p in picks]

    async def batched() -> list[tuple[Any, ...]]:
        out: list[tuple[Any, ...]] = []
        async with AsyncGovernor(db_url, pool_size=2) as aio:
            for round_no, picks in enumerate(plan):
                at = T0 + timedelta(hours=3 * round_no)
                for start in range(0, len(picks), 37):  # batches of 37, the last one shorter
                    results = await aio.send_batch([message("b", *p) for p in picks[start : start + 37]], at=at)
                    out += [said(r) for r in results]
        return out

    with caplog.at_level(logging.WARNING, logger="gov.aio"):
        together = run_async(batched())
    assert together == alone
    # each batch was decided as one statement: none failed and fell back to one by one
    assert not [r for r in caplog.records if getattr(r, "action", None) == "batch_split"]
    reasons = {r[2] for r in alone}
    assert reasons >= {None, "cap_3600000ms", "topic_cap_86400000ms", "global_cap_86400000ms", "quiet_hours",
                       "topic_opt_out"}, reasons
    assert {r[1] for r in alone} >= {None, "drop", "defer", "collapse"}
    assert any(r[6] for r in alone)  # repeats were among them
    for sql in (MESSAGES, SUPPRESSIONS, SENDS, CONTENT, OUTBOX, DEFERRED):
        assert rows(conn, sql, "a") == rows(conn, sql, "b"), sql


def test_plain_messages_of_a_batch_are_decided_together(db_url: str, conn: psycopg.Connection[Any]) -> None:
    """The set path is taken (not only the one-by-one loop): its users are locked once and
    decided in one statement, which the statement counters show as a single call of
    gov.decide_together and no gov.decide_core for them."""
    with psycopg.connect(db_url, autocommit=True) as c, c.transaction():  # the counters of this transaction
        c.execute("SET LOCAL track_functions = 'pl'")
        params = {
            "shard_key": None, "user_ids": [f"p{i}" for i in range(30)], "message_ids": ["m"] * 30,
            "tiers": ["P2"] * 30, "topics": [None] * 30, "campaign_ids": [None] * 30,
            "contents": ['{"title": "t"}'] * 30, "collapse_keys": [None] * 30, "ttls": [None] * 30, "now": T0,
        }
        got = c.execute(q("send_batch"), params).fetchall()
        assert len(got) == 30 and all(r[1] for r in got)
        calls = dict(c.execute("SELECT funcname, calls FROM pg_stat_xact_user_functions"
                               " WHERE schemaname = 'gov'").fetchall())
    assert calls.get("decide_together") == 1, calls
    assert "decide_core" not in calls, calls


def test_users_with_a_time_zone_are_decided_together_outside_their_quiet_hours_only(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """A time zone changes a decision only through quiet hours: at 12:00 UTC Berlin's users
    (14:00 local) are decided together, Auckland's (00:00 local, inside 22:00–08:00) one by
    one, and held for quiet hours as gov.send_v1 holds them."""
    with conn.transaction():
        for i in range(10):
            set_time_zone(conn, f"tz{i}", "Europe/Berlin" if i % 2 else "Pacific/Auckland")
            set_quiet_hours(conn, f"tz{i}", (time(22), time(8)))
    with psycopg.connect(db_url, autocommit=True) as c, c.transaction():
        c.execute("SET LOCAL track_functions = 'pl'")
        params = {
            "shard_key": None, "user_ids": [f"tz{i}" for i in range(10)], "message_ids": ["m"] * 10,
            "tiers": ["P2"] * 10, "topics": [None] * 10, "campaign_ids": [None] * 10,
            "contents": ['{"title": "t"}'] * 10, "collapse_keys": [None] * 10, "ttls": [None] * 10, "now": T0,
        }
        got = {r[0]: r[1:4] for r in c.execute(q("send_batch"), params).fetchall()}
        calls = dict(c.execute("SELECT funcname, calls FROM pg_stat_xact_user_functions"
                               " WHERE schemaname = 'gov'").fetchall())
    assert {n: v for n, v in got.items() if n % 2 == 0} == {n: (True, None, None) for n in (2, 4, 6, 8, 10)}
    assert {n: v for n, v in got.items() if n % 2 == 1} == {n: (False, "defer", "quiet_hours") for n in (1, 3, 5, 7, 9)}
    assert calls.get("decide_together") == 1, calls
    assert calls.get("decide_core") == 5, calls  # Auckland's five, and no one else


def test_messages_of_tiers_that_hold_are_decided_together_and_held_as_send_holds_them(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """P3 (collapse, one a week): the first batch is allowed together; the second, blocked by
    the weekly cap, is decided together too and each message held by gov.hold (no
    gov.decide_core); the third finds a group waiting for every user, so gov.send_v1 decides
    each alone (its gov.absorb_group and gov.release_owed have work to do)."""
    users = [f"h{i}" for i in range(10)]

    def batch(n: int) -> tuple[set[tuple[Any, ...]], dict[str, int]]:
        # a connection of its own each: the counters may still hold an earlier transaction's calls
        with psycopg.connect(db_url, autocommit=True) as c, c.transaction():
            c.execute("SET LOCAL track_functions = 'pl'")
            params = {
                "shard_key": None, "user_ids": users, "message_ids": [f"d{n}"] * 10, "tiers": ["P3"] * 10,
                "topics": [None] * 10, "campaign_ids": [None] * 10, "contents": ['{"title": "t"}'] * 10,
                "collapse_keys": ["recs"] * 10, "ttls": [None] * 10, "now": T0 + timedelta(hours=n),
            }
            got = {r[1:4] for r in c.execute(q("send_batch"), params).fetchall()}
            calls = dict(c.execute("SELECT funcname, calls FROM pg_stat_xact_user_functions"
                                   " WHERE schemaname = 'gov'").fetchall())
        return got, calls

    got, calls = batch(1)
    assert got == {(True, None, None)}
    assert calls.get("decide_together") == 1 and "decide_core" not in calls, calls
    got, calls = batch(2)
    assert got == {(False, "collapse", "cap_604800000ms")}
    assert calls.get("decide_together") == 1 and "decide_core" not in calls, calls
    assert calls.get("hold") == 10, calls
    got, calls = batch(3)
    assert got == {(False, "collapse", "cap_604800000ms")}
    assert calls.get("decide_core") == 10 and "decide_together" not in calls, calls
    waiting = conn.execute("SELECT user_id, message_id, stands_for FROM gov.deferred WHERE state = 'waiting'"
                           " ORDER BY user_id").fetchall()
    assert waiting == [(u, "d3", 2) for u in sorted(users)]


def test_users_of_a_segment_with_windows_of_its_own_are_decided_together_by_its_windows(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """POLICY gives the dormant segment one P2 a week: its users' second P2 is refused by that
    window (the default allows one an hour), decided together, with no gov.decide_core."""
    with conn.transaction():
        policy_mod.apply(conn, policy_mod.parse_policy(POLICY), POLICY)
        for i in range(10):
            set_segment(conn, f"s{i}", "dormant" if i % 2 else "casual")

    def batch(n: int) -> tuple[dict[int, tuple[Any, ...]], dict[str, int]]:
        with psycopg.connect(db_url, autocommit=True) as c, c.transaction():
            c.execute("SET LOCAL track_functions = 'pl'")
            params = {
                "shard_key": None, "user_ids": [f"s{i}" for i in range(10)], "message_ids": [f"m{n}"] * 10,
                "tiers": ["P2"] * 10, "topics": [None] * 10, "campaign_ids": [None] * 10,
                "contents": ['{"title": "t"}'] * 10, "collapse_keys": [None] * 10, "ttls": [None] * 10,
                "now": T0 + timedelta(hours=2 * n),
            }
            got = {r[0]: r[1:6] for r in c.execute(q("send_batch"), params).fetchall()}
            calls = dict(c.execute("SELECT funcname, calls FROM pg_stat_xact_user_functions"
                                   " WHERE schemaname = 'gov'").fetchall())
        return got, calls

    got, calls = batch(1)
    assert set(got.values()) == {(True, None, None, None, None)}
    assert calls.get("decide_together") == 1 and "decide_core" not in calls, calls
    got, calls = batch(2)
    assert calls.get("decide_together") == 1 and "decide_core" not in calls, calls
    dormant = {n: v for n, v in got.items() if n % 2 == 0}  # ordinal n is user s{n-1}
    casual = {n: v for n, v in got.items() if n % 2 == 1}
    assert set(dormant.values()) == {(False, "drop", "cap_604800000ms", 1, 1)}, dormant
    assert set(casual.values()) == {(True, None, None, None, None)}, casual
    segments = conn.execute("SELECT DISTINCT segment FROM gov.push_suppressions WHERE message_id = 'm2'").fetchall()
    assert segments == [("dormant",)]
