"""The clocked loop: the story's messages through the governor, the releaser and the runner.

Time is a simulation clock, never slept: every ``tick`` (five simulated minutes) the
messages the teams planned in that interval go through :meth:`Governor.send` at their own
moment, then the releaser runs at the tick's end on the same clock, then gov's runner
(:class:`gov.delivery.runner.Dispatcher`) delivers what the tick queued, and each delivered
message meets its user, who displays, clicks, closes or unsubscribes (recorded by
``gov.record_event_v1``, the function behind :func:`gov.analytics.events.record_event`, a
tick's events in one statement). Deferrals, quiet hours, collapses and expiries are the
real ones, and every allowed message is encrypted, VAPID-signed, sent to a loopback
:class:`gov.testing.PushService` and verified and decrypted there.

Where the time goes: a delivery costs about 2 ms of Python CPU (pywebpush's encryption,
requests, the push service's parsing, signature check and decryption). The runners and
the push services therefore run in child processes of their own, and a tick's delivery
overlaps the next tick's sends (see :class:`Engine`).

Determinism: every decision touches one user's rows only, so sends run in parallel
*lanes* partitioned by user (each user's messages stay in order, in one lane); engagement
draws are keyed by (seed, user, message); outcomes (as the runners' records wrote them,
or read back) are taken in a fixed order, and users react in tick order. Thread and
process scheduling change timings, never results.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from gov import policy as policy_mod
from gov.db import translate_errors
from gov.delivery.vapid import generate_keypair
from gov.errors import GovError
from gov.governor import Governor, batch_doc_params, send_row
from gov.hold.release import Releaser
from gov.lab.simulate.model import CURVE_TOP, EngineStats, SimConfig
from gov.lab.simulate.story import (
    DAY,
    KINDS,
    SEGMENTS,
    Planned,
    SimUser,
    Story,
    expected,
    hour_factor,
    population,
    react,
    shown_at,
)
from gov.lab.simulate.summary import Summary, collect
from gov.message import Message
from gov.queries import q
from gov.testing.postgres import scratch_database
from gov.users import set_quiet_hours, set_segment, set_time_zone

Row = tuple[str, int]  # an outbox row by the outbox's key: (user id, outbox id)
#: Messages one statement decides at most. Each holds its user's advisory lock until the
#: statement's transaction commits, and PostgreSQL's shared lock table has room for about
#: max_locks_per_transaction x max_connections locks (6,400 by default): a 20,000-user
#: campaign in one statement ended "out of shared memory". Governor.send_many's own batch.
STATEMENT_MAX = 500
Fate = tuple[Any, ...]  # what became of an outbox row: (id, user id, message id, subscription id, state)

CHILD_SCRIPT = Path(__file__).with_name("_children.py")
#: A cap no simulated user can reach: the governor is "off" while every code path stays on.
UNREACHABLE_CAP = 1_000_000_000
WEEK = timedelta(days=7)
TELEMETRY_THREADS = 3  # background writers of the users' events
SHARE_FROM = 64  # outbox rows of a tick from which they are shared out among the runners


class SimulationError(GovError):
    """The simulation could not run (no database server, no CREATEDB, a bad policy file)."""


@dataclass
class RunOutcome:
    """One run: its database (kept or already dropped) and the engine's counters."""

    label: str
    governed: bool
    stats: EngineStats
    summary: Summary  # collected before the database is dropped
    kept_url: str | None = None


class SimClock:
    """The simulation clock every gov component is given."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


Progress = Callable[[int, int, EngineStats], None]

# ---------------------------------------------------------------- child processes
#
# The Python work of a delivery is large: pywebpush encrypts, requests builds the POST,
# the push service parses it, verifies the VAPID signature and decrypts the payload. In
# one process all of it would queue for one interpreter lock, so the push services and
# gov's runners each get processes of their own. Plain subprocesses speaking JSON lines
# on stdin/stdout, not multiprocessing: spawn would re-import the caller's main module.


class _Child:
    """A child process running an entry point of ``_children.py``, one JSON line in, one out."""

    def __init__(self, entry: str, first: Any) -> None:
        self._process = subprocess.Popen(
            # by path, not as gov.lab.simulate._children: importing the package would import this
            # engine and through it alembic and SQLAlchemy, about a CPU-second per child
            [sys.executable, str(CHILD_SCRIPT), entry],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,  # line-buffered: one command, one answer
        )
        self._lock = threading.Lock()
        try:
            self._send(first)
            self.hello: Any = self._receive()
        except Exception:
            self.close()
            raise

    def _send(self, value: Any) -> None:
        assert self._process.stdin is not None
        try:
            self._process.stdin.write(json.dumps(value) + "\n")
            self._process.stdin.flush()
        except OSError as exc:
            raise SimulationError(f"a simulation helper process failed: {exc}") from None

    def _receive(self) -> Any:
        assert self._process.stdout is not None
        answer = self._process.stdout.readline()
        if not answer:
            raise SimulationError(f"a simulation helper process exited (status {self._process.poll()})")
        return json.loads(answer)

    def call(self, command: str, argument: Any = None) -> Any:
        with self._lock:
            self._send([command, argument])
            return self._receive()

    def close(self) -> None:
        if self._process.poll() is None:
            with contextlib.suppress(OSError, ValueError, SimulationError):
                self._send(["stop", None])
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:  # our own child, by handle: never by name
                self._process.kill()
                self._process.wait(timeout=5)
        for stream in (self._process.stdin, self._process.stdout):
            if stream is not None:
                stream.close()


class PushHost(_Child):
    """The loopback push service from :mod:`gov.testing`, in a child process."""

    def __init__(self, public_key: str) -> None:
        super().__init__("push_host_main", public_key)
        self.origin: str = self.hello

    def subscribe(self, n: int) -> list[dict[str, Any]]:
        """``n`` new browser subscriptions (PushSubscription JSON)."""
        return list(self.call("subscribe", n))

    def stats(self) -> tuple[int, int]:
        """(requests received, requests verified, decrypted and accepted)."""
        received, accepted = self.call("stats")
        return int(received), int(accepted)


@dataclass(frozen=True)
class Delivered:
    """What a tick's deliver stage left: rows still in flight, and who had unsubscribed once
    its users had reacted (taken here, before the next stage's users react)."""

    pending: list[Row]
    unsubscribed: frozenset[int]


def what_became(reported: list[Fate] | None, keys: Sequence[Row],
                read_back: Callable[[list[Row]], list[Fate]]) -> list[Fate]:
    """What became of the outbox rows ``keys`` after the runners' drain, in a fixed order
    (user, message, subscription; by code point, whatever the server's collation), so the
    engagement draws never depend on which worker delivered first.

    A row the runners ``reported`` has the state its record wrote ('released': pending
    again, unsent); the rows they did not claim (not due yet, or ended meanwhile), could
    not vouch for (``reported`` is None) or found taken ('stale') are ``read_back`` from
    the outbox. (Reading every row back cost a statement on the deliver stage's critical
    path each tick: docs/performance.md, stop 49.)
    """
    rows = [(*r[:4], "pending" if r[4] == "released" else r[4]) for r in reported or () if r[4] != "stale"]
    known = {r[0] for r in rows}
    unknown = [(u, i) for u, i in keys if i not in known]
    if unknown:
        rows += read_back(unknown)
    return sorted(rows, key=lambda r: (r[1], r[2], r[3]))


class Runners:
    """gov's runner in ``n`` child processes; a tick's outbox rows are shared out among them."""

    def __init__(self, n: int, dsn: str, key_path: Path, workers: int, now: datetime) -> None:
        self._children: list[_Child] = []
        self._turn = 0
        # two ticks' deliveries may be in flight (Engine): a child serves one at a time
        self._free: list[threading.Lock] = []
        self._turn_lock = threading.Lock()
        try:
            for _ in range(n):
                setup = {"dsn": dsn, "key": str(key_path), "workers": workers, "now": now.isoformat()}
                self._children.append(_Child("runner_main", setup))
                self._free.append(threading.Lock())
        except Exception:
            self.close()
            raise

    def run(self, now: datetime, ids: Sequence[int]) -> list[Fate] | None:
        """Deliver the outbox rows ``ids`` as of ``now``, in parallel; return each claimed row as
        (id, user, message, subscription, state), the state its record wrote, or None when
        a runner could not vouch for its rows (see ``_children.runner_main``)."""
        if not ids:
            return []
        # Each runner's share costs a claim and a record call of fixed cost (about 2 ms
        # each in PostgreSQL; the claim's statement is planned on about a third of its
        # calls, 3.3 ms a plan, docs/performance.md stop 40) and a round trip to the
        # child. Most ticks queue a few rows: they go to one runner, in turn, whose
        # workers take them at once; a campaign's tick is shared out.
        # Which runner delivers a row changes no outcome (read back in a fixed order).
        n = len(self._children)
        if len(ids) < SHARE_FROM:
            with self._turn_lock:  # the next runner in turn, or the first free one after it
                self._turn = (self._turn + 1) % n
                turn = self._turn
            mine = next((k for k in ((turn + j) % n for j in range(n)) if self._free[k].acquire(blocking=False)),
                        None)
            if mine is None:
                self._free[turn].acquire()
                mine = turn
            held, busy = [mine], [(self._children[mine], list(ids))]
        else:
            held = list(range(n))
            for k in held:  # in index order, the one order every taker of several uses: no cycle
                self._free[k].acquire()
            parts = [list(ids[i::n]) for i in range(n)]
            busy = [(child, part) for child, part in zip(self._children, parts, strict=True) if part]
        try:
            for child, part in busy:  # all start, then all are awaited
                child._send(["run", [now.isoformat(), part]])
            answers = [child._receive() for child, _ in busy]
        finally:
            for k in held:
                self._free[k].release()
        if any(rows is None for _, rows in answers):
            return None
        return [tuple(row) for _, rows in answers for row in rows]

    def close(self) -> None:
        for child in self._children:
            child.close()


# ---------------------------------------------------------------- databases


def ungoverned(policy: policy_mod.Policy) -> policy_mod.Policy:
    """``policy`` with the governor effectively off: every cap unreachable, no quiet hours.

    Tiers, verbs, consumption and TTLs stay as they are, so the messages take the very
    same code path; only nothing is ever over a cap or inside quiet hours.
    """

    def lift(windows: tuple[policy_mod.Window, ...]) -> tuple[policy_mod.Window, ...]:
        return tuple(policy_mod.Window(w.window_ms, UNREACHABLE_CAP) for w in windows)

    return replace(
        policy,
        tiers={name: replace(t, windows=lift(t.windows)) for name, t in policy.tiers.items()},
        topics={topic: lift(ws) for topic, ws in policy.topics.items()},
        global_windows=lift(policy.global_windows),
        quiet_start=None,
        quiet_end=None,
    )


def load_policy(config: SimConfig) -> tuple[policy_mod.Policy, str]:
    """The policy to simulate and its text (raises PolicyError for a bad file)."""
    if config.policy_text is None:
        return policy_mod.default_policy(), policy_mod.default_policy_text()
    return policy_mod.parse_policy(config.policy_text, config.policy_name), config.policy_text


def _apply_policy(dsn: str, config: SimConfig, governed: bool) -> None:
    chosen, text = load_policy(config)
    if not governed:
        chosen = ungoverned(chosen)
        text = chosen.to_toml()
    with translate_errors(), psycopg.connect(dsn) as conn, conn.transaction():
        policy_mod.apply(conn, chosen, text)


# ---------------------------------------------------------------- the loop


@dataclass
class _Reader:
    """Per-user memory of the engagement model: what they received this week."""

    received: dict[int, deque[datetime]] = field(default_factory=dict)

    def volume(self, user: int, now: datetime) -> int:
        times = self.received.setdefault(user, deque())
        while times and times[0] <= now - WEEK:
            times.popleft()
        return len(times)

    def add(self, user: int, at: datetime) -> None:
        self.received.setdefault(user, deque()).append(at)


def send_series(gov: Governor, messages: Sequence[tuple[Message, datetime]]) -> list[tuple[str, list[int]]]:
    """(action, outbox ids) of each message, decided in order, each at its own moment, in one
    statement (``sim_send_series``: ``gov.send_v1`` for each, the call behind
    :meth:`Governor.send`, without a round trip and a commit each). The simulation's sends
    are mostly alone at their instant (a batch needs one moment): 15,858 of 25,222 in the
    default run. One server only: a Citus cluster delegates a bare function call."""
    if not messages:
        return []
    doc = json.dumps([[*send_row(m), at.isoformat()] for m, at in messages], separators=(",", ":"))
    rows = gov.source.execute(q("sim_send_series"), {"batch": doc})
    if len(rows) != len(messages):
        raise GovError(f"sim_send_series answered {len(rows)} verdicts for {len(messages)} messages")
    return [(action, list(ids)) for action, ids in rows]


def _record_event_fn() -> Callable[..., Any] | None:
    """gov.analytics.events' check of one event, or None without telemetry."""
    try:
        from gov.analytics.events import check_event
    except ImportError:  # telemetry not installed: simulate without events
        return None
    return check_event


#: One engagement event to record: (user, message, event, subscription, when).
Event = tuple[str, str, str, int, datetime]


class _Telemetry:
    """Records the users' events (gov.record_event_v1, a tick's at once), off the tick's critical path.

    Nothing in the simulation reads the events back until the summary, and each is its
    own row (no order between them matters), so they are written by a few background
    threads while the ticks go on; :meth:`drain` waits for all of them.
    """

    def __init__(self, check_event: Callable[..., Any], threads: int) -> None:
        self._check_event = check_event
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="gov-sim-events")
        self._threads = threads
        self._futures: list[Future[int]] = []
        self.recorded = 0

    def _write(self, gov: Governor, events: list[Event]) -> int:
        # record_event's own checks for each event, then gov.record_event_v1 for all of them
        # in one statement: the very rows record_event writes, one round trip per chunk
        for user_id, message_id, event, subscription_id, _ in events:
            self._check_event(user_id, message_id, event, subscription_id)
        with translate_errors():
            gov.source.execute(q("sim_record_events"), {
                "user_ids": [e[0] for e in events], "message_ids": [e[1] for e in events],
                "events": [e[2] for e in events], "subscription_ids": [e[3] for e in events],
                "ats": [e[4] for e in events],
            })
        return len(events)

    def record(self, gov: Governor, events: list[Event]) -> None:
        for part in range(self._threads):
            chunk = events[part :: self._threads]
            if chunk:
                self._futures.append(self._pool.submit(self._write, gov, chunk))
        if len(self._futures) > 1000:  # collect what is done (and raise what failed)
            done = [f for f in self._futures if f.done()]
            self.recorded += sum(f.result() for f in done)
            self._futures = [f for f in self._futures if not f.done()]

    def flush(self) -> None:
        """Wait for every event recorded so far to be written (the writers stay)."""
        self.recorded += sum(f.result() for f in self._futures)
        self._futures = []

    def drain(self) -> int:
        """Wait for every event to be written; return how many were."""
        self.flush()
        self._pool.shutdown(wait=True)
        return self.recorded


class Engine:
    """Runs one simulation into one (scratch) database.

    Each tick is two stages. *Send*: the messages planned in the interval go through
    ``Governor.send`` (in lanes by user), then the releaser runs at the tick's end.
    *Deliver*: the runner processes deliver what the tick queued, then the users react.
    The deliver stage of one tick runs in the background while the next tick sends: the
    two touch different rows (the outbox and the telemetry, against decisions and
    sends). The one thing sending needs from reacting, who has unsubscribed, it takes
    as of the tick before, so an unsubscribe takes effect one tick (five simulated
    minutes) later — however the threads are scheduled.

    Two ticks' deliver stages may overlap: a tick's runners start as soon as its sends
    are done, while the tick before is still delivering, and its users react once the
    tick before has reacted (reactions stay in tick order). Rows a deliver stage leaves
    in flight (a retry due later) are handed to the stage after next, the first one
    started after it ended, whatever the timing.
    """

    def __init__(self, dsn: str, config: SimConfig, *, governed: bool, progress: Progress | None = None) -> None:
        self.dsn = dsn
        self.config = config
        self.governed = governed
        self.progress = progress
        self.stats = EngineStats()
        self.users: list[SimUser] = population(config.users, config.seed)
        self.by_id = {u.user_id: u for u in self.users}
        self.story = Story(self.users, config.seed, config.start)
        self.clock = SimClock(config.start)
        self.unsubscribed: set[int] = set()  # written by the deliver stage only
        # of them, those whose unsubscribe shows after the end: not in the story (see _react)
        self.unsubscribed_after_end: set[int] = set()
        self.push: list[PushHost] = []
        self.reader = _Reader()
        self.record_event = _record_event_fn()
        self.stats.events_available = self.record_event is not None
        self._telemetry = _Telemetry(self.record_event, TELEMETRY_THREADS) if self.record_event else None

    # ------------------------------------------------------------ setup

    def _push_of(self, user: int) -> PushHost:
        return self.push[user % len(self.push)]

    def _subscribe_everyone(self, gov: Governor, pool: ThreadPoolExecutor) -> None:
        """Every user's browsers subscribe (on their push service), then time zones and quiet hours."""
        infos = {
            id(host): iter(host.subscribe(sum(u.endpoints for u in self.users if self._push_of(u.index) is host)))
            for host in self.push
        }
        browsers = [(u, [next(infos[id(self._push_of(u.index))]) for _ in range(u.endpoints)]) for u in self.users]

        def subscribe(items: list[tuple[SimUser, list[dict[str, Any]]]]) -> list[None]:
            for u, mine in items:
                for info in mine:
                    gov.subscribe(u.user_id, info)
            return []

        self._lanes(pool, browsers, lambda b: b[0].index, subscribe)
        checked: set[str] = set()
        with translate_errors(), psycopg.connect(self.dsn) as conn, conn.transaction():
            for u in self.users:
                if u.time_zone in checked:
                    # set_time_zone validates the zone against pg_timezone_names, ~10 ms a
                    # scan; once per distinct zone is enough, then the statement it runs
                    conn.execute(q("set_user_time_zone"), {"user_id": u.user_id, "tz": u.time_zone})
                elif u.time_zone is not None:
                    set_time_zone(conn, u.user_id, u.time_zone)
                    checked.add(u.time_zone)
                # a user's own quiet window is a quiet-hours rule too: off when the governor is
                if self.governed and u.quiet is not None:
                    set_quiet_hours(conn, u.user_id, u.quiet)
                set_segment(conn, u.user_id, u.segment)  # the app knows its segments and tells gov

    # ------------------------------------------------------------ running

    def run(self) -> EngineStats:
        """Play the whole story; return the engine's counters."""
        started = time.perf_counter()
        _apply_policy(self.dsn, self.config, self.governed)
        cfg = self.config
        with contextlib.ExitStack() as stack:
            keydir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gov-sim-")))
            key = keydir / "vapid.pem"
            public_key = generate_keypair(key)
            for _ in range(cfg.push_services):
                self.push.append(stack.enter_context(contextlib.closing(PushHost(public_key))))
            runners = stack.enter_context(
                contextlib.closing(Runners(cfg.runners, self.dsn, key, cfg.workers, self.clock.now))
            )
            # allow_loopback_http: the push service is on 127.0.0.1 over plain HTTP, on purpose.
            # Connections: the send lanes, the deliver stage, the event writers, the releaser.
            gov = stack.enter_context(
                Governor(self.dsn, clock=self.clock, allow_loopback_http=True,
                         pool_size=cfg.lanes + TELEMETRY_THREADS + 2)
            )
            releaser = Releaser(gov.source, clock=self.clock)
            send_pool = stack.enter_context(ThreadPoolExecutor(cfg.lanes, thread_name_prefix="gov-sim-send"))
            self._subscribe_everyone(gov, send_pool)
            try:
                self._loop(gov, releaser, runners, send_pool)
            finally:
                if self._telemetry is not None:
                    self.stats.events = self._telemetry.drain()
            for host in self.push:
                received, accepted = host.stats()
                self.stats.push_requests += received
                self.stats.push_decrypted += accepted
        self.stats.unsubscribed = len(self.unsubscribed - self.unsubscribed_after_end)
        self.stats.wall_s = time.perf_counter() - started
        return self.stats

    def _lanes(self, pool: ThreadPoolExecutor, items: Sequence[Any], user_of: Callable[[Any], int],
               work: Callable[[list[Any]], list[Any]]) -> list[Any]:
        """Run ``work`` over ``items`` split by user into lanes; each user's items stay in order."""
        lanes = self.config.lanes
        if len(items) < 4 * lanes:  # not worth a thread hop
            return work(list(items))
        split: list[list[Any]] = [[] for _ in range(lanes)]
        for item in items:
            split[user_of(item) % lanes].append(item)
        out: list[Any] = []
        for part in pool.map(work, [s for s in split if s]):
            out.extend(part)
        return out

    def _loop(self, gov: Governor, releaser: Releaser, runners: Runners, send_pool: ThreadPoolExecutor) -> None:
        cfg = self.config
        ticks = int((cfg.end - cfg.start) / cfg.tick)
        heap: list[tuple[datetime, int, str, Planned]] = []
        next_day = 0
        next_release: datetime | None = None  # the earliest release_at still waiting
        outbox_seen = 0  # the highest outbox id handed to the deliver stage so far
        # outbox rows are named by the outbox's key, (user id, outbox id), all the way to
        # sim_outbox_outcomes: by id alone it would scan the whole key index every tick
        gone: frozenset[int] = frozenset()  # who had unsubscribed as of the last finished deliver stage
        delivering: Future[Delivered] | None = None  # the previous tick's deliver stage

        (distributed,) = gov.source.execute(q("distributed"), {})[0]
        # [timing] on: the priors gov.best_slot reads are refreshed at every simulated
        # midnight, as the daily cron a deployment runs (gov.refresh_timing_curves_v1)
        (timing,) = gov.source.execute(q("sim_timing_enabled"), {})[0]
        warm = cfg.warm_days if timing else 0  # a warm start: [timing] off until that midnight
        if warm:
            gov.source.execute(q("sim_set_timing"), {"on": False})
        carry: list[Row] = []  # rows finished deliver stages left in flight, for the next stage started

        def send(items: list[Planned]) -> list[tuple[tuple[Row, ...], bool]]:
            """Decide a lane's messages in order: those planned for one instant in one call.

            ``gov.send_batch_v1`` gives each message the verdict it would get alone (a
            user's several messages in it are decided in their order), at one moment:
            the instant they share. A campaign's thousands of messages at 10:00 are then
            a few statements (STATEMENT_MAX each) instead of one each. The messages alone
            at their instant between such groups go together through :func:`send_series`,
            each at its own moment.
            """
            out: list[tuple[tuple[Row, ...], bool]] = []
            alone: list[Planned] = []  # messages each alone at their instant, not sent yet

            def send_alone() -> None:
                if alone:
                    verdicts = send_series(gov, [(p.message, p.at) for p in alone])
                    out.extend((tuple((p.message.user_id, i) for i in ids), action in ("defer", "collapse"))
                               for p, (action, ids) in zip(alone, verdicts, strict=True))
                    alone.clear()

            start = 0
            while start < len(items):
                end = start + 1
                while end < len(items) and items[end].at == items[start].at:
                    end += 1
                group = items[start:end]
                if distributed:  # a cluster delegates only a bare function call: one by one there
                    for p in group:
                        result = gov.send(p.message, at=p.at, deliver=False)
                        keys = tuple((p.message.user_id, i) for i in result.outbox_ids)
                        out.append((keys, result.decision.action in ("defer", "collapse")))
                elif len(group) == 1:
                    alone.append(group[0])
                    if len(alone) == STATEMENT_MAX:
                        send_alone()
                else:
                    send_alone()
                    at = group[0].at
                    for k in range(0, len(group), STATEMENT_MAX):
                        part = group[k : k + STATEMENT_MAX]
                        params = batch_doc_params([send_row(p.message) for p in part], at)
                        verdicts = sorted(gov.source.execute(q("send_batch_doc"), params), key=lambda r: r[0])
                        assert [r[0] for r in verdicts] == list(range(1, len(part) + 1)), "one verdict per message"
                        out.extend((tuple((p.message.user_id, i) for i in r[8]), r[2] in ("defer", "collapse"))
                                   for p, r in zip(part, verdicts, strict=True))
                start = end
            send_alone()
            return out

        with ThreadPoolExecutor(2, thread_name_prefix="gov-sim-deliver") as stage:
            for tick in range(1, ticks + 1):
                now = cfg.start + tick * cfg.tick
                while next_day < cfg.days and cfg.start + next_day * DAY < now:
                    for p in self.story.day(next_day):
                        if p.at < cfg.end:
                            heapq.heappush(heap, (*p.sort_key, p))
                            self.stats.planned += 1
                    next_day += 1
                    if timing and next_day > 1 and self._telemetry is not None:
                        # every event up to now written first, so the curves (and the
                        # simulation) do not depend on the writers' timing
                        if delivering is not None:
                            done = delivering.result()
                            carry, gone = carry + done.pending, done.unsubscribed
                            delivering = None
                        self._telemetry.flush()
                        gov.source.execute(q("sim_refresh_timing"), {"now": now})
                    if warm and next_day == warm + 1:  # the midnight ending the warm days, after the refresh
                        gov.source.execute(q("sim_set_timing"), {"on": True})
                due: list[Planned] = []
                while heap and heap[0][0] < now:
                    p = heapq.heappop(heap)[-1]
                    if p.user in gone:
                        self.stats.skipped += 1  # the teams stop sending to users who left
                    else:
                        due.append(p)
                self.stats.sent += len(due)
                results = self._lanes(send_pool, due, lambda p: p.user, send)
                queued = [row for rows, _ in results for row in rows]
                held = any(h for _, h in results)
                # the releaser's cron at the tick's end, on the same clock
                self.clock.now = now
                if next_release is not None and next_release <= now:
                    queued.extend(releaser.run_once().outbox_rows)
                    held = True
                if held:  # something entered or left the queue: when is the next release due?
                    (next_release,) = gov.source.execute(q("sim_next_release"), {})[0]
                if due:
                    # a send may have released held rows owed the slot first (gov.release_owed):
                    # their outbox rows were returned by no call, so look them up
                    known = set(queued)
                    queued.extend((u, i) for u, i in gov.source.execute(q("sim_new_outbox"),
                                                                         {"now": now, "after": outbox_seen})
                                  if (u, i) not in known)
                outbox_seen = max([outbox_seen, *(i for _, i in queued)])
                # this tick's deliveries start now; the next tick's sends wait for the tick
                # before to have reacted, as before (at most two deliver stages in flight)
                started = stage.submit(self._deliver, gov, runners, carry + queued, now, delivering)
                carry = []
                if delivering is not None:
                    done = delivering.result()
                    carry, gone = done.pending, done.unsubscribed
                delivering = started
                if self.progress is not None:
                    self.progress(tick, ticks, self.stats)
            if delivering is not None:
                delivering.result()

    # ------------------------------------------------------------ delivery and engagement

    def _deliver(self, gov: Governor, runners: Runners, keys: list[Row], now: datetime,
                 before: Future[Delivered] | None) -> Delivered:
        """Deliver the outbox rows ``keys`` as of ``now``, then, once the deliver stage
        ``before`` has reacted, users react; return the rows still in flight and who has
        unsubscribed so far."""
        # only rows this simulation queued: an idle tick costs no claim at all
        rows = what_became(runners.run(now, [i for _, i in keys]), keys, lambda unknown: gov.source.execute(
            q("sim_outbox_outcomes"), {"users": [u for u, _ in unknown], "ids": [i for _, i in unknown]})
        ) if keys else []
        if before is not None:
            before.result()
        if not keys:
            return Delivered([], frozenset(self.unsubscribed))
        pending: list[Row] = []
        messages: list[tuple[str, str, int]] = []  # (user, message, the endpoint the user looks at)
        group: list[tuple[Any, ...]] = []
        for row in [*rows, None]:
            if group and (row is None or (row[1], row[2]) != (group[0][1], group[0][2])):
                if any(r[4] in ("pending", "sending") for r in group):
                    pending.extend((r[1], r[0]) for r in group)  # a retry is due later: look again next tick
                else:
                    subs = [r[3] for r in group if r[4] == "delivered"]
                    if subs:
                        messages.append((group[0][1], group[0][2], subs[0]))
                group = []
            if row is not None:
                group.append(row)
        events = self._react(messages, now)
        if events and self._telemetry is not None:
            self._telemetry.record(gov, events)
        return Delivered(pending, frozenset(self.unsubscribed))

    def _react(self, items: list[tuple[str, str, int]], now: datetime) -> list[Event]:
        """Users react to what they received (in a fixed order); return the events to record.

        With an hour effect a notification may be displayed later than delivered (the
        browser was closed, story.shown_at): its display and reaction are recorded at
        that moment and its click probability read at that local hour. The reaction is
        still drawn now, on this week's volume as of the delivery, and an unsubscribe
        takes effect at once (the teams stop sending a tick later, as without the effect).

        The story ends at its end: a display after it, and its reaction, are neither
        recorded nor counted (the dice table, the truth: the send counts, as one whose TTL
        ran out before the browser opened), so every count of the summary, the marginal
        measure and ``gov report fatigue --at <end>`` see the same events. An unsubscribe
        that shows after the end still stops the teams sending to that user from the next
        tick, as every unsubscribe does: what gov is handed is what it was before the rule.
        """
        events: list[Event] = []
        amplitude = self.config.hour_effect
        for user_id, message_id, subscription_id in items:
            user = self.by_id[user_id]
            if user.index in self.unsubscribed:
                continue  # gone already: nothing shows up any more
            kind = KINDS[message_id.split("-", 1)[0]]
            volume = self.reader.volume(user.index, now)
            tolerance = SEGMENTS[user.segment] * self.config.tolerance
            shown = shown_at(self.config.seed, user, message_id, now, kind.ttl_s, amplitude)
            if shown is None:  # the push service dropped it at its TTL: the browser never opened in time
                displayed, outcome, shown = False, "ignore", now
                e_click, e_unsub = 0.0, 0.0
            else:
                hour = hour_factor(user, shown, amplitude)
                displayed, outcome = react(self.config.seed, user_id, message_id, kind, volume, tolerance, hour)
                e_click, e_unsub = expected(kind, volume, tolerance, hour)
                if shown > self.config.end:  # after the story's end: not in it
                    if outcome == "unsubscribe":
                        self.unsubscribed.add(user.index)  # the teams stop sending, as before the rule
                        self.unsubscribed_after_end.add(user.index)
                    displayed, outcome = False, "ignore"
                    e_click, e_unsub = 0.0, 0.0
            truth = self.stats.truth.setdefault((user.segment, volume), [0, 0.0, 0.0])
            truth[0] += 1
            truth[1] += e_click
            truth[2] += e_unsub
            self.reader.add(user.index, now)
            counts = self.stats.curve.setdefault(min(volume, CURVE_TOP), [0, 0, 0])  # sends, clicks, unsubscribes
            counts[0] += 1
            counts[1] += outcome == "click"
            counts[2] += outcome == "unsubscribe"
            # one device shows it: the report counts messages, not endpoints
            if displayed:
                events.append((user_id, message_id, "display", subscription_id, shown))
            if outcome != "ignore":
                events.append((user_id, message_id, outcome, subscription_id, shown))
            if outcome == "unsubscribe":
                self.unsubscribed.add(user.index)  # for good
        return events


def simulate(server_url: str, config: SimConfig, *, governed: bool, keep: bool = False,
             progress: Progress | None = None, label: str | None = None) -> RunOutcome:
    """One run in a fresh scratch database on ``server_url``; the summary is read before it is dropped."""
    label = label or ("governed" if governed else "governor off")
    with scratch_database(server_url, "gov_sim", keep=keep, durable=False) as dsn:
        engine = Engine(dsn, config, governed=governed, progress=progress)
        stats = engine.run()
        summary = collect(dsn, config, label=label, stats=stats)
    return RunOutcome(label, governed, stats, summary, kept_url=dsn if keep else None)
