"""The bench's machinery: a scratch database, the workloads, the client processes, the timed runs.

Shape of one run (one contender on one workload):

1. the main process resets the contender's store (TRUNCATE or FLUSHDB), preloads history
   and prefills saturated users as the workload asks;
2. each of N client processes (spawned once, reused for every run) opens its own
   connection, warms it with one untimed call (so the statement is prepared and the
   script cached), and reports ready;
3. a barrier releases them together; each calls for ``seconds``, timing every call with
   ``perf_counter_ns`` and counting allowed and suppressed, then sends its latencies back.

Every contender sees the same users and the same message ids in the same order: the
sequence is a function of (workload, client index, call number) only.

The bench's own SQL lives here rather than in ``sql/queries_*.sql``: it is set-up for a
scratch database (truncate, prefill, history), never part of a decision.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import platform
import random
import re
import secrets
import signal
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection as Pipe
from typing import Any, LiteralString, cast

import psycopg
from psycopg import sql

from gov import policy as policy_mod
from gov.db import translate_errors
from gov.errors import GovError
from gov.lab.bench.redis_lua import (
    REDIS_CONTENDERS,
    RedisDecider,
    TierWindows,
    load_scripts,
    own_redis_server,
    prefill,
    redis_server_path,
)
from gov.lab.bench.report import Figures, Report, WorkerResult, aggregate
from gov.lab.bench.routing import Routing
from gov.lab.bench.server_cpu import CpuMeter, Node, target_nodes
from gov.queries import q, sql_dir

WORKLOADS = ("fresh", "saturated", "mixed")
LOCKS = ("advisory", "row")
GOV_CONTENDERS = ("gov", "gov_async", "gov_row", "gov_row_async")
CONTENDERS = ("select1", *GOV_CONTENDERS, *REDIS_CONTENDERS)
TIER = "P2"  # every decision: a marketing message, spending the P1 and P2 budgets (3 windows)
PREFILL_AGE_MS = 3_600_000  # saturated users' sends are an hour old: inside every window
READY_TIMEOUT = 120.0  # seconds a client may take to connect and warm up
RESULT_GRACE = 120.0  # seconds past the run's length before a silent client is an error

# ---------------------------------------------------------------- the bench's SQL

SELECT_1: LiteralString = "SELECT 1"
ASYNC_COMMIT: LiteralString = "SET synchronous_commit = off"
# CASCADE: tables that reference gov.messages (delivery, analytics) empty with it; this
# is the bench's scratch database, and every run starts from nothing.
RESET: LiteralString = "TRUNCATE gov.sends, gov.messages, gov.push_suppressions CASCADE"
# the row-lock variant writes gov.users; truncated too so every run starts from nothing
RESET_WITH_USERS: LiteralString = "TRUNCATE gov.sends, gov.messages, gov.push_suppressions, gov.users CASCADE"
CHECKPOINT: LiteralString = "CHECKPOINT"
# The seed's Step 4 table, as its guide writes it (user_id text: the bench's ids are not
# UUIDs), for redis_per_tier_logged; in the scratch database's public schema.
SEED_SUPPRESSIONS: LiteralString = """
CREATE TABLE seed_push_suppressions (
  id           BIGSERIAL PRIMARY KEY,
  user_id      TEXT        NOT NULL,
  message_id   TEXT        NOT NULL,
  tier         VARCHAR(4)  NOT NULL,
  blocked_by   TEXT        NOT NULL,
  action       VARCHAR(10) NOT NULL,
  campaign_id  TEXT,
  created_at   TIMESTAMPTZ NOT NULL DEFAULT NOW()
);
CREATE INDEX seed_suppressions_campaign ON seed_push_suppressions (campaign_id, blocked_by);
CREATE INDEX seed_suppressions_user_time ON seed_push_suppressions (user_id, created_at DESC)
"""
RESET_SEED_SUPPRESSIONS: LiteralString = "TRUNCATE seed_push_suppressions"
LOG_SEED_SUPPRESSION: LiteralString = (
    "INSERT INTO seed_push_suppressions (user_id, message_id, tier, blocked_by, action, campaign_id)"
    " VALUES (%s, %s, %s, %s, %s, NULL)"
)
SERVER_FACTS: LiteralString = (
    "SELECT current_setting('server_version'), current_setting('fsync'), current_setting('synchronous_commit')"
)
# What ``per_user`` allowed P2 decisions an hour ago would have left in gov.sends.
PREFILL: LiteralString = """
INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
SELECT 'u' || n, b, now() - (%(age_ms)s::bigint - k) * interval '1 millisecond', 'pre-' || k
  FROM generate_series(0, %(users)s::int - 1) AS n,
       unnest(%(budgets)s::text[]) AS b,
       generate_series(0, %(per_user)s::int - 1) AS k
"""
# Half the rows inside the 7-day window for users the workloads never decide for ('h…');
# half 8 to 38 days old for the workloads' own users ('u…'): rows a count must skip, the
# index hazard of PERFORMANCE.md. Multiplying by a prime spreads the times over the range.
HISTORY: LiteralString = """
INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
SELECT CASE WHEN mod(g, 2) = 0 THEN 'h' || mod(g / 2, %(others)s::bigint)
            ELSE 'u' || mod(g / 2, %(users)s::bigint) END,
       (%(budgets)s::text[])[1 + mod(g / 2, cardinality(%(budgets)s::text[]))],
       CASE WHEN mod(g, 2) = 0
            THEN now() - mod(g * 7919, 604800000) * interval '1 millisecond'
            ELSE now() - interval '8 days' - mod(g * 7919, 2592000000) * interval '1 millisecond' END,
       'hist-' || g
  FROM generate_series(1, %(rows)s::bigint) AS g
"""
# VACUUM as well as ANALYZE: a table autovacuum has visited, as a long-lived one would be.
ANALYZE_SENDS: LiteralString = "VACUUM (ANALYZE) gov.sends"

# ---------------------------------------------------------------- the lock-choice variant

ADVISORY_LOCK_LINE = "PERFORM pg_advisory_xact_lock(hashtextextended(p_user_id, 0));"
# PERFORM, not SELECT: a PL/pgSQL SELECT without INTO is an error.
ROW_LOCK_LINES = (
    "INSERT INTO gov.users (user_id) VALUES (p_user_id) ON CONFLICT DO NOTHING;",
    "PERFORM 1 FROM gov.users u WHERE u.user_id = p_user_id FOR UPDATE;",
)
_FUNCTION_HEAD = re.compile(r"^CREATE (?:OR REPLACE )?FUNCTION ([a-z_][a-z0-9_.]*)\(", re.MULTILINE)
_DOLLAR_TAG = re.compile(r"\$([A-Za-z_0-9]*)\$")


class BenchError(GovError):
    """The bench could not run; the message is one line for the terminal."""


def canonical_schema() -> list[tuple[str, str]]:
    """(file name, text) of the canonical schema: sql/schema/*.sql in name order, or sql/schema.sql."""
    parts = sorted((sql_dir() / "schema").glob("*.sql"))
    if not parts and (sql_dir() / "schema.sql").is_file():
        parts = [sql_dir() / "schema.sql"]
    if not parts:
        raise BenchError(f"no canonical schema under {sql_dir()} (schema/*.sql or schema.sql)")
    return [(p.name, p.read_text(encoding="utf-8")) for p in parts]


def schema_functions() -> Iterator[tuple[str, str, str]]:
    """(file name, function name, ``CREATE … FUNCTION … $tag$ … $tag$;``) for each function."""
    for file_name, text in canonical_schema():
        for head in _FUNCTION_HEAD.finditer(text):
            opening = _DOLLAR_TAG.search(text, head.end())
            if opening is None:
                raise BenchError(f"{file_name}: function {head.group(1)} has no dollar-quoted body")
            closing = text.find(opening.group(0), opening.end())
            end = text.find(";", closing) if closing >= 0 else -1
            if end < 0:
                raise BenchError(f"{file_name}: function {head.group(1)}: its body does not close")
            yield file_name, head.group(1), text[head.start() : end + 1]


def lock_source(lock: str) -> tuple[str, str]:
    """(function name, ``CREATE OR REPLACE`` source) of the decision taking the ``lock`` lock.

    The function is whichever decision function of the canonical schema (gov.decide*) takes
    the user's advisory lock (gov.decide_v1, or the body it delegates to); ``advisory`` is its text as is,
    ``row`` the same text with that line swapped for a row lock on gov.users, so the
    variant follows every other change to the function. Refuses loudly unless exactly one
    function holds the line exactly once: measuring an unlocked copy would be worse than nothing.
    """
    if lock not in LOCKS:
        raise BenchError(f"unknown lock variant {lock!r} (known: {', '.join(LOCKS)})")
    # the decision's own functions only: the releaser's (gov.release_owed) takes the same lock
    found = [(f, name, src) for f, name, src in schema_functions()
             if name.startswith("gov.decide") and ADVISORY_LOCK_LINE in src]
    if len(found) != 1:
        where = ", ".join(f"{name} ({f})" for f, name, _ in found) or "no function"
        raise BenchError(
            f"--lock: expected one function of the canonical schema to hold {ADVISORY_LOCK_LINE!r}; found {where}"
        )
    file_name, name, source = found[0]
    lines = source.splitlines()
    hits = [i for i, line in enumerate(lines) if line.strip() == ADVISORY_LOCK_LINE]
    if len(hits) != 1:
        raise BenchError(f"--lock: {name} ({file_name}) holds the advisory lock line {len(hits)} times, not once")
    if lock == "row":
        i = hits[0]
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        lines[i : i + 1] = [indent + line for line in ROW_LOCK_LINES]
    text = "\n".join(lines)
    if not text.startswith("CREATE OR REPLACE"):
        text = text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    return name, text


def row_lock_variant() -> tuple[str, str]:
    """(function name, source) of the decision with its advisory lock swapped for a gov.users row lock."""
    return lock_source("row")


def install_lock_variant(conn: psycopg.Connection[Any], lock: str) -> str:
    """In ``conn``'s (scratch) database, make the decision take ``lock``; returns the function replaced."""
    name, source = lock_source(lock)
    # The text is the package's own schema file, not input: as literal as source code.
    conn.execute(cast(LiteralString, source))
    return name


def gov_contender(lock: str, async_commit: bool) -> str:
    """The contender's name: gov, gov_async, gov_row, gov_row_async."""
    return "gov" + ("_row" if lock == "row" else "") + ("_async" if async_commit else "")


# ---------------------------------------------------------------- workloads


def message_sequence(workload: str, worker: int, users: int) -> Iterator[tuple[str, str]]:
    """(user id, message id) for every call of client ``worker``: the same for every contender.

    fresh: a user never seen, every time (the write path: all allowed).
    saturated, mixed: uniformly random users ``u0 … u{users-1}``; a new message id per call,
    so a repeat never takes the idempotent shortcut.
    """
    if workload not in WORKLOADS:
        raise BenchError(f"unknown workload {workload!r}")
    rng = random.Random(f"{workload}/{worker}")  # str seeds hash with SHA-512: stable across runs
    for k in itertools.count():
        user = f"f{worker}-{k}" if workload == "fresh" else f"u{rng.randrange(users)}"
        yield user, f"{workload}-{worker}-{k}"


def tier_windows(stored: policy_mod.Policy, tier: str = TIER) -> tuple[TierWindows, ...]:
    """The windows a ``tier`` decision must pass, per consumed tier, from the stored policy."""
    consumed = stored.tiers[tier].consumes
    return tuple(
        TierWindows(name, tuple((w.window_ms, w.cap) for w in stored.tiers[name].windows)) for name in consumed
    )


def decisions_to_cap(consumes: Sequence[TierWindows]) -> int:
    """How many allowed decisions fill the tightest window (2 for the default P2)."""
    return min(cap for t in consumes for _, cap in t.windows)


# ---------------------------------------------------------------- client processes


@dataclass(frozen=True)
class RunSpec:
    """Everything a client process needs for one timed run (pickled to it)."""

    contender: str
    workload: str
    seconds: float
    users: int
    dsn: str
    redis_url: str | None = None
    shas: dict[str, str] = field(default_factory=dict)
    consumes: tuple[TierWindows, ...] = ()
    on_exceed: str = "drop"  # the decided tier's verb, for the seed's suppression row


def _decider(spec: RunSpec) -> tuple[Callable[[str, str], bool | None], Callable[[], None]]:
    """The contender's one call per decision (allowed, or None for the floor) and its close."""
    if spec.contender in REDIS_CONTENDERS:
        import redis

        client = redis.Redis.from_url(spec.redis_url or "")
        if spec.contender != "redis_per_tier_logged":
            return RedisDecider(client, spec.contender, spec.shas, spec.consumes).decide, client.close
        # The seed's ctx.log.suppression: one autocommitted INSERT on its own connection.
        log_conn = psycopg.connect(spec.dsn, autocommit=True, prepare_threshold=0)

        def log(user_id: str, message_id: str, blocked_by: str) -> None:
            log_conn.execute(LOG_SEED_SUPPRESSION, (user_id, message_id, TIER, blocked_by, spec.on_exceed))

        def close_both() -> None:
            client.close()
            log_conn.close()

        return RedisDecider(client, spec.contender, spec.shas, spec.consumes, log).decide, close_both

    # As gov's own pool configures its connections: autocommit, prepared from the first call.
    conn = psycopg.connect(spec.dsn, autocommit=True, prepare_threshold=0)
    if spec.contender == "select1":

        def floor(user_id: str, message_id: str) -> None:
            conn.execute(SELECT_1).fetchone()

        return floor, conn.close

    if spec.contender.endswith("_async"):
        # The opt-in trade: a server crash may lose the decisions of the last moments
        # (up to 3 × wal_writer_delay, 600 ms by default), never corrupt any; a lost
        # allow leaves a spend uncounted, so a user may get one more than the cap.
        conn.execute(ASYNC_COMMIT)
    decide = q("decide")

    def gov(user_id: str, message_id: str) -> bool:
        # now=None: the database's clock, as Governor.decide without a simulation clock
        params = {"user_id": user_id, "message_id": message_id, "tier": TIER, "topic": None, "campaign_id": None,
                  "now": None}  # fmt: skip
        row = conn.execute(decide, params).fetchone()
        assert row is not None  # decide_v1 always returns one row
        return bool(row[0])

    return gov, conn.close


def _timed_run(index: int, spec: RunSpec, pipe: Pipe, barrier: Any) -> WorkerResult:
    call, close = _decider(spec)
    try:
        call(f"warm-{index}", f"warm-{spec.workload}-{index}")  # untimed: prepare, cache the plan
        pipe.send(("ready", None))
        barrier.wait(timeout=READY_TIMEOUT)
        perf = time.perf_counter_ns
        latencies = array("q")
        allowed = suppressed = 0
        start = end = perf()
        deadline = start + int(spec.seconds * 1e9)
        for user_id, message_id in message_sequence(spec.workload, index, spec.users):
            t0 = perf()
            verdict = call(user_id, message_id)
            end = perf()
            latencies.append(end - t0)
            if verdict is True:
                allowed += 1
            elif verdict is False:
                suppressed += 1
            if end >= deadline:
                break
        return WorkerResult(index, len(latencies), allowed, suppressed, end - start, latencies.tobytes())
    finally:
        close()


def worker_main(index: int, pipe: Pipe, barrier: Any) -> None:
    """A client process: run each RunSpec it is sent, until it is sent None."""
    # Ctrl-C belongs to the main process, which tears everything down in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        spec = pipe.recv()
        if spec is None:
            return
        try:
            result = _timed_run(index, spec, pipe, barrier)
        except Exception as exc:
            pipe.send(("error", f"client {index} ({spec.contender}, {spec.workload}): {_one_line(exc)}"))
            continue
        pipe.send(("done", result))


class ClientPool:
    """N spawned client processes, one connection each, released together by a barrier."""

    def __init__(self, n: int) -> None:
        # spawn: no inherited sockets or locks from the parent's connections
        ctx = multiprocessing.get_context("spawn")
        self.barrier = ctx.Barrier(n + 1)
        self.pipes: list[Pipe] = []
        self.procs: list[Any] = []
        for i in range(n):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(i, theirs, self.barrier), name=f"gov-bench-{i}", daemon=True)
            proc.start()
            theirs.close()
            self.pipes.append(ours)
            self.procs.append(proc)

    def _recv(self, i: int, timeout: float, expected: str) -> Any:
        pipe = self.pipes[i]
        if not pipe.poll(timeout):
            raise BenchError(f"client {i} did not answer within {timeout:.0f} s")
        try:
            kind, payload = pipe.recv()
        except (EOFError, OSError):
            raise BenchError(f"client {i} exited unexpectedly (exit code {self.procs[i].exitcode})") from None
        if kind == "error":
            raise BenchError(payload)
        if kind != expected:
            raise BenchError(f"client {i}: expected {expected!r}, got {kind!r}")
        return payload

    def run(self, spec: RunSpec) -> list[WorkerResult]:
        for pipe in self.pipes:
            pipe.send(spec)
        try:
            for i in range(len(self.pipes)):
                self._recv(i, READY_TIMEOUT, "ready")
        except BaseException:
            self.barrier.abort()  # release the clients already waiting, to fail fast
            raise
        self.barrier.wait(timeout=READY_TIMEOUT)
        return [self._recv(i, spec.seconds + RESULT_GRACE, "done") for i in range(len(self.pipes))]

    def close(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        for pipe in self.pipes:
            pipe.close()

    def __enter__(self) -> ClientPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------- databases


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _admin(url: str, statement: sql.Composed | LiteralString) -> None:
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise BenchError(f"cannot reach the database server: {_one_line(exc)}") from None
    with translate_errors(), conn:
        conn.execute(statement)


def _checkpoint(conn: psycopg.Connection[Any]) -> None:
    """Flush now, so a checkpoint forced by the previous run's writes does not land in this one."""
    with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
        conn.execute(CHECKPOINT)  # superuser or pg_checkpoint only; best effort otherwise


def reset_database(
    conn: psycopg.Connection[Any], cfg: BenchConfig, workload: str, consumes: Sequence[TierWindows]
) -> None:
    """Empty the decision tables, then load the run's history and saturated users."""
    conn.execute(RESET_WITH_USERS if cfg.lock != "advisory" else RESET)
    budgets = [t.tier for t in consumes] + ["global"]  # what an allowed P2 writes
    if cfg.history:
        conn.execute(
            HISTORY,
            {"rows": cfg.history, "users": cfg.users, "others": max(1000, cfg.history // 20), "budgets": budgets},
        )
    if workload == "saturated":
        conn.execute(
            PREFILL,
            {"users": cfg.users, "budgets": budgets, "per_user": decisions_to_cap(consumes), "age_ms": PREFILL_AGE_MS},
        )
    if cfg.history or workload == "saturated":
        conn.execute(ANALYZE_SENDS)
    _checkpoint(conn)


# ---------------------------------------------------------------- the run


@dataclass(frozen=True)
class BenchConfig:
    """What to measure; the CLI's options."""

    database_url: str | None = None
    connections: int = 8
    seconds: float = 10.0
    users: int = 10_000
    workloads: tuple[str, ...] = WORKLOADS
    history: int = 0
    durability: str = "durable"  # durable | async | both
    redis: bool | None = None  # None: when redis-server is on PATH
    lock: str = "advisory"  # advisory | row | both (the lock-choice measurement)
    rounds: int = 1  # timed runs per contender and workload, interleaved; figures are medians
    compare_url: str | None = None  # a second server (or a Citus coordinator) measured in the same rounds

    def gov_contenders(self) -> tuple[str, ...]:
        """gov's lines: one per lock variant and commit mode asked for."""
        locks = LOCKS if self.lock == "both" else (self.lock,)
        commits = {"durable": (False,), "async": (True,), "both": (False, True)}[self.durability]
        return tuple(gov_contender(lock, a) for lock in locks for a in commits)


def race(dsn: str, *, racers: int = 20, rounds: int = 1, prefix: str = "race") -> list[int]:
    """Allowed decisions per round when ``racers`` connections decide a P2 for one fresh user at once.

    The seeds' atomicity check (cap 2 / 24 h: every round must give 2), threads released
    by one barrier, each on its own connection; run against whatever gov.decide_v1 the
    database has, so it checks the lock variants too.
    """
    conns = [psycopg.connect(dsn, autocommit=True) for _ in range(racers)]
    try:
        counts = []
        for r in range(rounds):
            barrier = threading.Barrier(racers)
            verdicts: list[bool] = []
            user = f"{prefix}-{r}-{secrets.token_hex(3)}"
            threads = [
                threading.Thread(target=_racer, args=(c, user, f"m{i}", barrier, verdicts)) for i, c in enumerate(conns)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            if len(verdicts) != racers:
                raise BenchError(f"race round {r}: {racers - len(verdicts)} racers did not finish")
            counts.append(verdicts.count(True))
        return counts
    finally:
        for c in conns:
            c.close()


def _racer(
    conn: psycopg.Connection[Any], user: str, message_id: str, barrier: threading.Barrier, verdicts: list[bool]
) -> None:
    barrier.wait(timeout=30)
    params = {"user_id": user, "message_id": message_id, "tier": TIER, "topic": None, "campaign_id": None, "now": None}
    row = conn.execute(q("decide"), params).fetchone()
    verdicts.append(bool(row and row[0]))  # list.append is atomic under the GIL


def _redis_facts(url: str) -> dict[str, Any]:
    import redis
    import redis.utils

    with redis.Redis.from_url(url) as client:
        version = client.info("server").get("redis_version", "?")
    parser = "hiredis" if getattr(redis.utils, "HIREDIS_AVAILABLE", False) else "pure-Python parser"
    return {
        "redis": f"Redis {version}, a private server, persistence off",
        "redis_version": str(version),
        "redis_client": f"redis-py {redis.__version__} + {parser}",
    }


def _windows_text(consumes: Sequence[TierWindows]) -> str:
    return ", ".join(
        f"{t.tier} " + " and ".join(f"{cap}/{policy_mod.format_duration(ms)}" for ms, cap in t.windows)
        for t in consumes
    )


REDIS_HINT = "pip install 'gov[dev]' (or pip install redis hiredis)"


def redis_contenders(asked: bool | None, progress: Callable[[str], None]) -> str | None:
    """The redis-server to measure the seeds' Redis scripts on, or None not to: as
    ``asked`` (``--redis``/``--no-redis``), or by default whenever redis-server is on PATH
    and redis-py imports. Asked for and impossible is an error; by default a missing half
    skips the contenders, redis-py's with one line saying how to add it (it is a dev extra,
    not a dependency of gov)."""
    if asked is False:
        return None
    try:
        import redis  # noqa: F401
    except ImportError:
        client_missing = True
    else:
        client_missing = False
    binary = redis_server_path()
    if asked:
        if client_missing:
            raise BenchError(f"--redis: redis-py is not installed ({REDIS_HINT})")
        if binary is None:
            raise BenchError("--redis: redis-server is not on PATH")
        return binary
    if binary is None:
        return None
    if client_missing:
        progress(f"the Redis contenders are skipped: redis-server is on PATH but redis-py is not installed; "
                 f"to add them: {REDIS_HINT}")
        return None
    return binary


COMPARE_SUFFIX = "@compare"  # the --compare-url target's lines: select1@compare, gov@compare, …


@dataclass
class Target:
    """One server (or Citus cluster) the decisions are measured on, with its scratch database."""

    name: str  # primary | compare
    dsn: str
    admin: psycopg.Connection[Any]
    routing: Routing
    cpu: CpuMeter

    @property
    def suffix(self) -> str:
        return "" if self.name == "primary" else COMPARE_SUFFIX


def reach(url: str, what: str = "database server") -> None:
    """Fail fast, in one line, when ``url`` names no server gov can reach (before any client is spawned)."""
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:  # unreachable, refused, or not even a connection string
        raise BenchError(f"cannot reach the {what}: {_one_line(exc)}") from None
    with translate_errors(), conn:
        conn.execute(SELECT_1)


def _server_text(version: str, fsync: str, sync_commit: str, where: str, nodes: Sequence[Node]) -> str:
    cluster = f", Citus: {len(nodes)} nodes" if len(nodes) > 1 or nodes[0].role != "server" else ""
    return (f"PostgreSQL {version}, {where}{cluster}, a scratch database; fsync={fsync}, "
            f"synchronous_commit={sync_commit}")


def run(cfg: BenchConfig, progress: Callable[[str], None] = lambda _msg: None) -> Report:
    """Measure every contender on every workload of ``cfg``; ``progress`` hears each step.

    With ``cfg.compare_url`` the select1 floor and gov's lines are measured on that server
    too (``…@compare``), in the same rounds, and compared line by line with the primary's.
    """
    if cfg.connections < 1 or cfg.seconds <= 0 or cfg.users < 1 or cfg.history < 0 or cfg.rounds < 1:
        raise BenchError("connections, users and rounds must be at least 1, seconds above 0, history not negative")
    redis_binary = redis_contenders(cfg.redis, progress)
    use_redis = redis_binary is not None
    contenders = ("select1", *cfg.gov_contenders(), *(REDIS_CONTENDERS if use_redis else ()))
    # the compare target has no Redis of its own: the seeds' scripts are not a property of the server
    compare_contenders = ("select1", *cfg.gov_contenders())

    with contextlib.ExitStack() as stack:
        # fail fast, before any client is spawned
        if cfg.database_url:
            reach(cfg.database_url)
        if cfg.compare_url:
            reach(cfg.compare_url, "--compare-url server")
        progress("creating a scratch database" if cfg.database_url else "starting an embedded PostgreSQL")
        clients = stack.enter_context(ClientPool(cfg.connections))  # they spawn and import meanwhile
        from gov.testing.postgres import scratch_database  # here: the clients need no Alembic

        dsn = stack.enter_context(scratch_database(cfg.database_url, "gov_bench"))
        admin = stack.enter_context(psycopg.connect(dsn, autocommit=True))
        with translate_errors():
            # As migrated, unless the lock-choice measurement swaps the lock between runs.
            replaced = lock_source("advisory")[0] if cfg.lock != "advisory" else None
            stored = policy_mod.load_stored(admin)
            consumes = tier_windows(stored)
            on_exceed = stored.tiers[TIER].on_exceed or "drop"
            facts = admin.execute(SERVER_FACTS).fetchone()
        assert facts is not None
        version, fsync, sync_commit = facts
        targets = [Target("primary", dsn, admin, Routing(admin), CpuMeter(target_nodes(admin, dsn)))]
        # Redis clients use PostgreSQL's transport, so the comparison is not of sockets.
        unix = admin.info.host.startswith("/")
        settings: dict[str, Any] = {
            "server": _server_text(version, fsync, sync_commit,
                                   "the given server" if cfg.database_url else "embedded", targets[0].cpu.nodes),
            "server_version": version,
            "database": admin.info.dbname,  # dropped at the end
            "transport": "Unix socket" if unix else "TCP",
        }
        if cfg.compare_url:
            progress("creating a scratch database on --compare-url")
            other_dsn = stack.enter_context(scratch_database(cfg.compare_url, "gov_bench"))
            other = stack.enter_context(psycopg.connect(other_dsn, autocommit=True))
            with translate_errors():
                other_facts = other.execute(SERVER_FACTS).fetchone()
            assert other_facts is not None
            targets.append(Target("compare", other_dsn, other, Routing(other),
                                  CpuMeter(target_nodes(other, other_dsn))))
            settings |= {
                "compare_server": _server_text(str(other_facts[0]), str(other_facts[1]), str(other_facts[2]),
                                               "the --compare-url server", targets[1].cpu.nodes),
                "compare_database": other.info.dbname,
                "compare_transport": "Unix socket" if other.info.host.startswith("/") else "TCP",
            }
        for t in targets:
            settings[f"nodes{t.suffix}"] = ", ".join(f"{n.name} ({n.role}" + (f", postmaster {n.pid})" if n.pid
                                                     else f", {n.why_not})") for n in t.cpu.nodes)

        redis_url: str | None = None
        shas: dict[str, str] = {}
        redis_client: Any = None
        if use_redis:
            import redis

            assert redis_binary is not None
            progress("starting a private redis-server")
            redis_url = stack.enter_context(own_redis_server(redis_binary)).url(unix)
            redis_client = stack.enter_context(redis.Redis.from_url(redis_url))
            shas = load_scripts(redis_client)
            settings |= _redis_facts(redis_url)
            admin.execute(SEED_SUPPRESSIONS)
        else:
            settings["redis"] = "not measured (--no-redis, or no redis-server on PATH)"

        settings |= {
            "decision": f"{TIER}, spending {_windows_text(consumes)}",
            "connections": cfg.connections,
            "seconds": cfg.seconds,
            "rounds": cfg.rounds,
            "users": cfg.users,
            "history": cfg.history,
            "durability": cfg.durability,
            "lock": "advisory (as migrated)"
            if replaced is None
            else f"{cfg.lock}: gov = {replaced} as in sql/schema (advisory lock), "
            "gov_row = the same with a gov.users row lock instead",
            "clients": f"{cfg.connections} processes, Python {platform.python_version()}, "
            f"psycopg {psycopg.__version__}; {os.cpu_count()} CPUs",
        }
        report = Report(settings=settings)
        lines = {t.name: contenders if t.name == "primary" else compare_contenders for t in targets}

        # Other processes on the machine skew every figure: say how busy it was.
        load_before = os.getloadavg()[0]
        for workload in cfg.workloads:
            rounds: dict[str, list[list[WorkerResult]]] = {
                c + t.suffix: [] for t in targets for c in lines[t.name]
            }
            for r in range(cfg.rounds):
                # Target by target (in reverse every other round), each target's floor first,
                # then its contenders, in reverse every other round: a contender's place in the
                # sequence (what ran before it) evens out.
                for target in targets if r % 2 == 0 else targets[::-1]:
                    mine = lines[target.name]
                    rest = mine[1:] if r % 2 == 0 else mine[:0:-1]
                    for contender in (mine[0], *rest):
                        line = contender + target.suffix
                        progress(
                            f"{workload}: {line}" + (f" (round {r + 1} of {cfg.rounds})" if cfg.rounds > 1 else "")
                        )
                        if contender in REDIS_CONTENDERS:
                            redis_client.flushdb()
                            if contender == "redis_per_tier_logged":
                                admin.execute(RESET_SEED_SUPPRESSIONS)
                            if workload == "saturated":
                                prefill(redis_client, cfg.users, decisions_to_cap(consumes), consumes, PREFILL_AGE_MS)
                        elif contender != "select1":
                            with translate_errors():
                                if replaced is not None:
                                    install_lock_variant(target.admin,
                                                         "row" if contender.startswith("gov_row") else "advisory")
                                reset_database(target.admin, cfg, workload, consumes)
                        spec = RunSpec(contender, workload, cfg.seconds, cfg.users, target.dsn, redis_url, shas,
                                       consumes, on_exceed)
                        counted = contender.startswith("gov")
                        on_server = contender not in REDIS_CONTENDERS  # the server's CPU is theirs
                        if counted:
                            target.routing.before()
                        if on_server:
                            target.cpu.before()
                        rounds[line].append(clients.run(spec))
                        if on_server:
                            target.cpu.after(workload, line)
                        if counted:
                            target.routing.after()
            for target in targets:
                floor = rounds["select1" + target.suffix]
                for contender in lines[target.name]:
                    line = contender + target.suffix
                    figures = aggregate(line, workload, rounds[line], floor, decides=contender != "select1")
                    if target.name != "primary":
                        figures = compared_with(figures, next(f for f in report.figures
                                                              if f.contender == contender and f.workload == workload))
                    report.figures.append(replace(figures, target=target.name))
                    if contender not in REDIS_CONTENDERS:
                        report.server_cpu += target.cpu.per_decision(target.name, workload, line, figures.decisions)
        # before the timed runs only: during them it counts the bench's own processes
        report.settings["load_average"] = f"{load_before:.2f} (1 min, before the timed runs)"
        for t in targets:
            report.settings[f"routing{t.suffix}"] = t.routing.summary()
        return report


def compared_with(mine: Figures, primary: Figures) -> Figures:
    """``mine`` (a --compare-url line) with its ratios to the same line on the primary: compare / primary."""

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 3) if b > 0 else None

    return replace(mine, x_primary_rate=ratio(mine.decisions_per_s, primary.decisions_per_s),
                   x_primary_p50=ratio(mine.p50_ms, primary.p50_ms), x_primary_p99=ratio(mine.p99_ms, primary.p99_ms))
