"""``gov bench --http``: gov serve's ``POST /internal/send`` against the seeds' own send path over HTTP.

Contenders, each a server in a process of its own on 127.0.0.1, each with a store of its own:

* ``seeds_server``: seed 001's send path (``policy.js``, ``governor.js``, ``send.js``: one
  ``CHECK_AND_COMMIT`` per consumed tier, stopping at the first refusal) behind a plain
  ``node:http`` server (``seed_server/server.js``, shipped here), on a private redis-server.
  Its one dependency (ioredis, ``seed_server/package.json``) is installed with npm into a
  cache directory the first time; without node or npm, or when the install fails, this
  contender is skipped with one line saying why, and gov is measured all the same.
* ``gov_serve``: ``python -m gov.cli serve --port 0`` of the gov this bench runs, on a scratch
  database migrated to head with the default policy, without a VAPID key (it records and
  does not deliver, as the seeds' server does not), with ``--serve-arg`` appended.
* ``gov_serve_baseline`` (``--http-baseline DIR``): the same command of another gov checkout
  (``PYTHONPATH=DIR``, e.g. a git worktree of an older commit), on a database of its own that
  the checkout's own ``gov db upgrade`` migrated (a checkout refuses another schema revision).

The load, identical for every contender: ``connections`` keep-alive connections, one request
in flight on each, every request a P2 send ``{"userId","tier","id","title"}`` for a random user
of ``users`` with a message id never used before. The client is ``wrk`` when it is installed
(a Lua script builds each body, sets the bearer token and checks each answer), else a Python
client (asyncio protocols, raw HTTP/1.1). Either is first measured against a server that
answers every request with a canned 200 at once (Python asyncio protocols, in a process of
its own), so a reader can see that the client is not what limits the figures.

Before the rounds, each contender's store is filled: each user's first two P2 sends, in user
order, all allowed (the allowed path, timed once, by the Python client). Every user is then
at the P2 cap, so every timed send is refused, and a run measures the same work per request
however fast its contender is; from empty stores a faster server would spend less of its run
on the allowed path and look faster still. Each round then runs every contender once for
``seconds``, in reverse order every other round (what ran before a contender evens out).

Every answer must be 200 with a verdict (``{"sent":true}`` or ``{"sent":false,"action","reason"}``);
anything else is counted. Afterwards gov's database is checked (:func:`gov.ops.integrity.check_integrity`:
no user over a cap in any window, every message in one state, every budget spent once; a
baseline's, by the cap scan alone), and every contender's allowed answers are bounded by the
cap (two per user); a cap exceeded fails the bench.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Any

from gov.lab.bench.decisions import BenchError
from gov.lab.bench.node import node_modules
from gov.lab.bench.report import percentile

SEED_SERVER_DIR = Path(__file__).with_name("seed_server")
CONTENDERS = ("seeds_server", "gov_serve", "gov_serve_baseline")
CLIENTS = ("auto", "wrk", "python")
TIER = "P2"  # a marketing send: it spends the P1 and the P2 budgets, three windows
P2_CAP_24H = 2  # the seeds' and gov's default: what bounds a user's allowed P2 sends in a day
USER_PREFIX = "bench-u"
FILL_TIMEOUT = 900.0  # seconds the fill may take (gov serve at 200 requests/s: 20,000 sends)
START_TIMEOUT = 60.0  # seconds a server may take to announce its port
ANSWER_GRACE = 30.0  # seconds past a run's end before a request still unanswered is an error
VERDICT_ACTIONS = ("drop", "defer", "collapse")


# ---------------------------------------------------------------- figures


@dataclass(frozen=True)
class Run:
    """One timed run of one contender: what the client counted and measured."""

    requests: int  # answered, whatever the status
    seconds: float
    p50_ms: float
    p99_ms: float
    statuses: dict[str, int]  # every status other than 200, and "no answer" (a connection lost)
    invalid: int  # 200 whose body is not a verdict
    allowed: int
    refused: int

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def non_200(self) -> int:
        return sum(self.statuses.values())

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "per_second": round(self.per_second, 1), "non_200": self.non_200}


@dataclass
class HttpReport:
    """A whole ``gov bench --http``: the runs of every contender, the client's ceiling, the checks."""

    contenders: list[str]
    runs: dict[str, list[Run]]
    fills: dict[str, Run]  # each contender's fill: each user's first sends, all allowed
    client: str
    ceiling: Run
    ceiling_server: str
    skipped: dict[str, str] = field(default_factory=dict)
    checks: dict[str, str] = field(default_factory=dict)  # contender -> what was checked, and the result
    failures: list[str] = field(default_factory=list)  # a cap exceeded: the bench fails
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    settings: dict[str, Any] = field(default_factory=dict)
    # contender -> per round, server CPU µs a request: (its server process or processes, its
    # store: PostgreSQL's whole server, or redis-server), None where it cannot be read
    cpu: dict[str, list[tuple[float | None, float | None]]] = field(default_factory=dict)

    def cpu_median(self, contender: str, part: int) -> float | None:
        values = [x for r in self.cpu.get(contender, []) if (x := r[part]) is not None]
        return float(statistics.median(values)) if values else None

    def median(self, contender: str, attribute: str = "per_second") -> float:
        values = [getattr(r, attribute) for r in self.runs.get(contender, [])]
        return float(statistics.median(values)) if values else 0.0

    def ratio(self, contender: str, reference: str) -> float | None:
        """Median over rounds of (this round's rate / ``reference``'s in the same round): each
        pair ran seconds apart under the same background load, so noise moves it least."""
        theirs = self.runs.get(reference)
        if not theirs:
            return None
        ratios = [m.per_second / t.per_second for m, t in zip(self.runs[contender], theirs, strict=True)
                  if t.per_second > 0]
        return statistics.median(ratios) if ratios else None

    def x_seeds(self, contender: str) -> float | None:
        return self.ratio(contender, "seeds_server")

    def x_baseline(self, contender: str) -> float | None:
        """× the baseline checkout's gov serve (with --http-baseline): the "N × today's" figure."""
        return self.ratio(contender, "gov_serve_baseline")

    def as_json(self) -> dict[str, Any]:
        return {
            "settings": self.settings,
            "client": self.client,
            "ceiling": {"server": self.ceiling_server, **self.ceiling.as_json()},
            "contenders": {
                c: {
                    "per_second_median": round(self.median(c), 1),
                    "p50_ms_median": round(self.median(c, "p50_ms"), 3),
                    "p99_ms_median": round(self.median(c, "p99_ms"), 3),
                    "non_200": sum(r.non_200 for r in self.runs[c]),
                    "invalid": sum(r.invalid for r in self.runs[c]),
                    "allowed": sum(r.allowed for r in self.runs[c]),
                    "refused": sum(r.refused for r in self.runs[c]),
                    "x_seeds_server": None if (x := self.x_seeds(c)) is None else round(x, 4),
                    "x_baseline": None if (b := self.x_baseline(c)) is None else round(b, 4),
                    "rounds": [r.as_json() for r in self.runs[c]],
                    "cpu_us_per_request": [
                        {"server": None if a is None else round(a, 1), "store": None if b is None else round(b, 1)}
                        for a, b in self.cpu.get(c, [])
                    ],
                    "fill": self.fills[c].as_json(),
                    "check": self.checks.get(c),
                }
                for c in self.contenders
            },
            "skipped": self.skipped,
            "failures": self.failures,
            "load_before": list(self.load_before),
            "load_after": list(self.load_after),
            "cpus": os.cpu_count(),
        }


@dataclass(frozen=True)
class HttpBenchConfig:
    database_url: str | None  # a server to create scratch databases on; None: an embedded one
    seconds: float = 10.0
    rounds: int = 1
    users: int = 2000
    connections: int = 16
    client: str = "auto"  # auto (wrk when installed) | wrk | python
    serve_args: tuple[str, ...] = ()
    baseline: Path | None = None
    baseline_serve_args: tuple[str, ...] = ()


# ---------------------------------------------------------------- child servers


class ChildServer:
    """A server in a child process, bound to 127.0.0.1, that announces its port on one line.

    In a session of its own: Ctrl-C interrupts the bench alone, which then stops every child
    in order (a server dying of the same SIGINT first would fail the run's requests).

    Its output (stdout and stderr as one stream) is read by a thread: the announcement gives
    the port, the last lines explain a failure, and a pipe nobody reads would block the child.
    """

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], announce: str,
                 cwd: str | None = None) -> None:
        self.name = name
        self._tail: deque[str] = deque(maxlen=20)
        self._announced = threading.Event()
        self._pattern = re.compile(announce)
        self.port = 0
        self._proc = subprocess.Popen(
            list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True, cwd=cwd,
        )
        self._reader = threading.Thread(target=self._read, name=f"gov-bench-{name}", daemon=True)
        self._reader.start()
        try:
            if not self._announced.wait(START_TIMEOUT) or not self.port:
                why = "exited" if self._proc.poll() is not None else f"did not announce a port in {START_TIMEOUT:g} s"
                raise BenchError(f"{name} {why}: {self.last_words()}")
        except BaseException:
            self.close()
            raise

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._tail.append(line.rstrip())
            if not self.port and (m := self._pattern.search(line)):
                self.port = int(m.group(1))
                self._announced.set()
        self._announced.set()  # end of output: the child is gone

    @property
    def pid(self) -> int:
        return self._proc.pid

    def last_words(self) -> str:
        """The child's last lines of output, as one line."""
        return " / ".join(line for line in self._tail if line.strip())[-400:] or "no output"

    def check_alive(self) -> None:
        if self._proc.poll() is not None:
            raise BenchError(f"{self.name} exited ({self._proc.returncode}) during the bench: {self.last_words()}")

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._reader.join(5)
        if self._proc.stdout:
            self._proc.stdout.close()


def _child_env(**extra: str) -> dict[str, str]:
    """The bench's environment without any GOV_ variable, plus ``extra``.

    A server is given exactly what it needs: no VAPID key (no delivery), no subscribe or
    metrics secret, no database URL but its scratch one.
    """
    return {k: v for k, v in os.environ.items() if not k.startswith("GOV_")} | extra


def _python_path(*first: str) -> str:
    return os.pathsep.join([*first, *filter(None, [os.environ.get("PYTHONPATH")])])


def own_tree() -> str:
    """The directory the running gov package is imported from: its children run the same code."""
    import gov

    return str(Path(gov.__file__).resolve().parent.parent)


def start_gov_serve(name: str, tree: str, dsn: str, token: str, serve_args: Sequence[str] = ()) -> ChildServer:
    """``python -m gov.cli serve --port 0`` of the checkout at ``tree``, on ``dsn``, without a VAPID key."""
    argv = [sys.executable, "-m", "gov.cli", "serve", "--host", "127.0.0.1", "--port", "0", *serve_args]
    env = _child_env(GOV_DATABASE_URL=dsn, GOV_API_TOKEN=token, PYTHONPATH=_python_path(tree))
    # cwd=tree: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH,
    # so a bench run from one checkout would otherwise serve that checkout as the baseline
    return ChildServer(name, argv, env, r"gov: serving on http://127\.0\.0\.1:(\d+)", cwd=tree)


def start_seed_server(node: str, node_modules: Path, redis_url: str, token: str) -> ChildServer:
    env = _child_env(NODE_PATH=str(node_modules), REDIS_URL=redis_url, SEED_API_TOKEN=token)
    return ChildServer("seeds_server", [node, str(SEED_SERVER_DIR / "server.js"), "0"], env, r"^listening (\d+)")


def start_canned_server() -> tuple[ChildServer, str]:
    """A server answering every request 200 ``{"sent":true}`` at once, for the client's ceiling.

    Python asyncio protocols, not node:http: measured on this 2-core machine, it answers
    wrk two to three times faster than a canned node:http server, which would show
    node:http's limit rather than the client's.
    """
    argv = [sys.executable, "-c", "from gov.lab.bench.http import canned_server_main; canned_server_main()"]
    env = _child_env(PYTHONPATH=_python_path(own_tree()))
    return ChildServer("canned server", argv, env, r"^listening (\d+)"), "a canned 200 from an asyncio server"


def canned_server_main() -> None:
    """The canned server's process: every request on a connection answered 200, keep-alive."""
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n{\"sent\":true}"

    class Canned(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            self.transport = transport
            self.buffer = bytearray()

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
                head = bytes(self.buffer[:end]).lower()
                length = _content_length(head)
                if len(self.buffer) < end + 4 + length:
                    return
                del self.buffer[: end + 4 + length]
                self.transport.write(answer)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Canned, "127.0.0.1", 0)
        print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
        await server.serve_forever()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())


# ---------------------------------------------------------------- the seeds' server's dependency


def seed_server_modules(progress: Callable[[str], None]) -> tuple[Path | None, str]:
    """The seeds' server's node_modules (see :func:`node_modules`)."""
    return node_modules(SEED_SERVER_DIR, "bench-seed-server", "the seeds' server's dependency", progress)


# ---------------------------------------------------------------- the answers


def verdict_kind(body: bytes) -> str | None:
    """``allowed`` or ``refused`` for a body that is the seed's verdict, else None."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    if doc.get("sent") is True:
        return "allowed"
    if doc.get("sent") is False and doc.get("action") in VERDICT_ACTIONS and isinstance(doc.get("reason"), str):
        return "refused"
    return None


def _content_length(head: bytes) -> int:
    """The Content-Length of a lower-cased header block (0 without one)."""
    at = head.find(b"\r\ncontent-length:")
    if at < 0:
        return 0
    end = head.find(b"\r\n", at + 2)
    return int(head[at + 17: end if end >= 0 else len(head)])


# ---------------------------------------------------------------- the Python load client


class _Load:
    """One run of the Python client: the request stream, and the tally of the answers.

    Random users (``seed``) until told to stop; or, with ``per_user``, each user's
    ``per_user`` sends in user order, and then no more (the fill).
    """

    def __init__(self, port: int, token: str, users: int, id_prefix: str, seed: int, per_user: int = 0) -> None:
        self.head = (
            b"POST /internal/send HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: Bearer %s\r\n"
            b"Content-Type: application/json\r\nContent-Length: " % (port, token.encode())
        )
        self.body = b'{"userId":"' + USER_PREFIX.encode() + b'%d","tier":"' + TIER.encode() + b'","id":"' + (
            id_prefix.encode() + b'-%d","title":"bench"}')
        self.users = users
        self.random = random.Random(seed).randrange
        self.per_user = per_user
        self.total = users * per_user  # 0: no end but the clock
        self.sent = 0
        self.latencies = array("q")
        self.statuses: Counter[str] = Counter()
        self.invalid = self.allowed = self.refused = 0
        self.stopping = False
        self.open = 0
        self.last_answer = 0
        self.finished: asyncio.Future[None] | None = None

    def more(self) -> bool:
        return not self.stopping and (not self.total or self.sent < self.total)

    def request(self) -> bytes:
        user = self.sent // self.per_user if self.per_user else self.random(self.users)
        self.sent += 1
        body = self.body % (user, self.sent)
        return b"%s%d\r\n\r\n%s" % (self.head, len(body), body)

    def answered(self, status: int, body: bytes, latency_ns: int) -> None:
        self.latencies.append(latency_ns)
        self.last_answer = time.perf_counter_ns()
        if status != 200:
            self.statuses[str(status)] += 1
            return
        kind = verdict_kind(body)
        if kind == "allowed":
            self.allowed += 1
        elif kind == "refused":
            self.refused += 1
        else:
            self.invalid += 1

    def closed(self) -> None:
        """A connection is done (stopped after its last answer, or lost)."""
        self.open -= 1
        if self.open == 0 and self.finished is not None and not self.finished.done():
            self.finished.set_result(None)


class _Connection(asyncio.Protocol):
    """One keep-alive connection with one request in flight: the next is sent when the answer is read."""

    def __init__(self, load: _Load) -> None:
        self.load = load
        self.buffer = bytearray()
        self.sent_at = 0
        self.transport: asyncio.Transport | None = None
        self.done = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def send(self) -> None:
        assert self.transport is not None
        if not self.load.more():
            self.finish()
            return
        request = self.load.request()
        self.sent_at = time.perf_counter_ns()
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        # an answer comes whole or in pieces; never two at once (one request in flight)
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buffer[:end]).lower()
        total = end + 4 + _content_length(head)
        if len(self.buffer) < total:
            return
        self.load.answered(int(head[9:12]), bytes(self.buffer[end + 4: total]), time.perf_counter_ns() - self.sent_at)
        del self.buffer[:total]
        self.send()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done:
            # the server closed it with a request in flight: that request has no answer
            self.load.statuses["no answer"] += 1
            self.finish()

    def finish(self) -> None:
        if not self.done:
            self.done = True
            if self.transport is not None:
                self.transport.close()
            self.load.closed()


async def _python_run(port: int, token: str, connections: int, seconds: float | None, users: int, id_prefix: str,
                      seed: int = 0, per_user: int = 0) -> Run:
    """Random users for ``seconds``; or (``seconds`` None) each user's ``per_user`` sends."""
    loop = asyncio.get_running_loop()
    load = _Load(port, token, users, id_prefix, seed, per_user)
    # every connection open before the clock starts: connecting is not what is measured
    opened = [(await loop.create_connection(lambda: _Connection(load), "127.0.0.1", port))[1]
              for _ in range(connections)]
    load.open = len(opened)
    load.finished = loop.create_future()
    started = time.perf_counter_ns()
    load.last_answer = started
    for conn in opened:
        conn.send()
    stop = loop.call_later(seconds, lambda: setattr(load, "stopping", True)) if seconds is not None else None
    try:
        await asyncio.wait_for(load.finished, (seconds or FILL_TIMEOUT) + ANSWER_GRACE)
    except TimeoutError:
        raise BenchError(f"requests to port {port} unanswered {ANSWER_GRACE:g} s after the run ended") from None
    finally:
        if stop is not None:
            stop.cancel()
        for conn in opened:
            conn.finish()
    ordered = sorted(load.latencies)
    return Run(
        requests=len(ordered),
        seconds=(load.last_answer - started) / 1e9,
        p50_ms=percentile(ordered, 0.50) / 1e6,
        p99_ms=percentile(ordered, 0.99) / 1e6,
        statuses=dict(load.statuses),
        invalid=load.invalid,
        allowed=load.allowed,
        refused=load.refused,
    )


# ---------------------------------------------------------------- the wrk load client

WRK_SCRIPT = r"""
-- gov bench --http: each request a P2 send for a random user, with a message id of its own
-- and the bearer token; each answer tallied (status, verdict). Arguments: users user_prefix
-- id_prefix seed (user ids: user_prefix .. 0 to users - 1). The token comes from
-- $GOV_BENCH_TOKEN (not argv: ps shows argv).
local threads = {}
local next_id = 1

function setup(thread)
  thread:set("tid", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

function init(args)
  users = tonumber(args[1])
  user_prefix = args[2]
  id_prefix = args[3]
  math.randomseed(tonumber(args[4]) + tid)
  n = 0
  allowed = 0
  refused = 0
  invalid = 0
  statuses = {}
  headers = {["Content-Type"] = "application/json",
             ["Authorization"] = "Bearer " .. os.getenv("GOV_BENCH_TOKEN")}
end

function request()
  n = n + 1
  local body = string.format('{"userId":"%s%d","tier":"P2","id":"%s-%d-%d","title":"bench"}',
                             user_prefix, math.random(0, users - 1), id_prefix, tid, n)
  return wrk.format("POST", nil, headers, body)
end

function response(status, headers, body)
  if status ~= 200 then
    statuses[tostring(status)] = (statuses[tostring(status)] or 0) + 1
  elseif body:find('"sent":true', 1, true) then
    allowed = allowed + 1
  elseif body:find('"sent":false', 1, true) and body:find('"reason":"', 1, true)
     and (body:find('"action":"drop"', 1, true) or body:find('"action":"defer"', 1, true)
          or body:find('"action":"collapse"', 1, true)) then
    refused = refused + 1
  else
    invalid = invalid + 1
  end
end

function done(summary, latency, requests)
  local a, r, i, codes = 0, 0, 0, {}
  for _, thread in ipairs(threads) do
    a = a + thread:get("allowed")
    r = r + thread:get("refused")
    i = i + thread:get("invalid")
    for code, count in pairs(thread:get("statuses")) do
      codes[#codes + 1] = string.format('"%s":%d', code, count)
    end
  end
  local e = summary.errors
  io.write(string.format(
    'GOVBENCH {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"allowed":%d,"refused":%d,'
    .. '"invalid":%d,"statuses":{%s},"errors":{"connect":%d,"read":%d,"write":%d,"timeout":%d}}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), a, r, i,
    table.concat(codes, ","), e.connect, e.read, e.write, e.timeout))
end
"""


def wrk_path() -> str | None:
    return shutil.which("wrk")


def wrk_threads(connections: int) -> int:
    """Half the cores: on two, a second wrk thread takes the core the server needs (measured:
    the seeds' server 5,000–5,300 requests/s under one thread, 3,400–3,900 under two)."""
    return max(1, min(connections, (os.cpu_count() or 2) // 2))


def _wrk_run(wrk: str, script: Path, port: int, token: str, connections: int, seconds: float, users: int,
             id_prefix: str, seed: int) -> Run:
    threads = wrk_threads(connections)
    argv = [wrk, "-t", str(threads), "-c", str(connections), "-d", f"{max(1, round(seconds))}s",
            "--timeout", f"{ANSWER_GRACE:g}s", "-s", str(script), f"http://127.0.0.1:{port}/internal/send",
            "--", str(users), USER_PREFIX, id_prefix, str(seed)]
    try:
        # its own session, as the servers': on Ctrl-C the bench kills it (subprocess.run does)
        done = subprocess.run(argv, env=_child_env(GOV_BENCH_TOKEN=token), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=seconds + 2 * ANSWER_GRACE,
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        raise BenchError(f"wrk did not finish {2 * ANSWER_GRACE:g} s after its run") from None
    line = next((x for x in done.stdout.splitlines() if x.startswith("GOVBENCH ")), None)
    if done.returncode != 0 or line is None:
        said = " / ".join(x for x in (done.stderr + done.stdout).splitlines() if x.strip())[-300:]
        raise BenchError(f"wrk failed ({done.returncode}): {said or 'no output'}")
    doc = json.loads(line.removeprefix("GOVBENCH "))
    statuses = {str(k): int(v) for k, v in doc["statuses"].items()}
    lost = sum(int(v) for v in doc["errors"].values())
    if lost:
        statuses["no answer"] = lost  # connect, read, write errors and timeouts
    return Run(
        requests=int(doc["requests"]),
        seconds=int(doc["duration_us"]) / 1e6,
        p50_ms=int(doc["p50_us"]) / 1e3,
        p99_ms=int(doc["p99_us"]) / 1e3,
        statuses=statuses,
        invalid=int(doc["invalid"]),
        allowed=int(doc["allowed"]),
        refused=int(doc["refused"]),
    )


class LoadClient:
    """The one load client of a bench, wrk or Python: ``run(port, …)`` is one timed run."""

    def __init__(self, choice: str, token: str, connections: int, users: int, workdir: Path) -> None:
        if choice not in CLIENTS:
            raise BenchError(f"unknown load client {choice!r} (known: {', '.join(CLIENTS)})")
        self.wrk = wrk_path() if choice in ("auto", "wrk") else None
        if choice == "wrk" and self.wrk is None:
            raise BenchError("--http-client wrk: wrk is not on PATH (apt-get install wrk)")
        self.token = token
        self.connections = connections
        self.users = users
        self.script = workdir / "send.lua"
        if self.wrk is not None:
            self.script.write_text(WRK_SCRIPT, encoding="utf-8")
            version = subprocess.run([self.wrk, "-v"], capture_output=True, text=True).stdout.split()
            threads = wrk_threads(connections)
            self.name = f"wrk {version[1] if len(version) > 1 else ''}".strip() + f", {threads} thread(s)"
        else:
            self.name = "python (asyncio, keep-alive HTTP/1.1, one process)"

    def run(self, port: int, seconds: float, id_prefix: str) -> Run:
        """One timed run: random users for ``seconds``."""
        seed = secrets.randbits(31)
        if self.wrk is not None:
            return _wrk_run(self.wrk, self.script, port, self.token, self.connections, seconds, self.users,
                            id_prefix, seed)
        return asyncio.run(_python_run(port, self.token, self.connections, seconds, self.users, id_prefix, seed))

    def fill(self, port: int, id_prefix: str) -> Run:
        """Each user's first P2_CAP_24H sends, in user order: every one allowed, and every user then
        at the cap. Always the Python client: wrk stops on a clock, not after a count."""
        return asyncio.run(_python_run(port, self.token, self.connections, None, self.users, id_prefix,
                                       per_user=P2_CAP_24H))


# ---------------------------------------------------------------- databases


@contextlib.contextmanager
def _server(database_url: str | None) -> Iterator[str]:
    """The server the scratch databases go on: the one named, else a throwaway embedded one."""
    if database_url is not None:
        yield database_url
        return
    from gov.testing.postgres import embedded_server

    with embedded_server("gov_bench_http-pg-") as url:
        yield url


@contextlib.contextmanager
def baseline_database(server: str, checkout: Path, progress: Callable[[str], None]) -> Iterator[str]:
    """A new database on ``server`` migrated by ``checkout``'s own ``gov db upgrade``; dropped after."""
    from gov.testing.postgres import admin, with_dbname

    name = f"gov_bench_base_{secrets.token_hex(4)}"
    admin(server, "scratch_create_database", name)
    try:
        dsn = with_dbname(server, name)
        progress(f"migrating {name} with the baseline's gov db upgrade")
        done = subprocess.run(
            [sys.executable, "-m", "gov.cli", "db", "upgrade"],
            env=_child_env(GOV_DATABASE_URL=dsn, PYTHONPATH=_python_path(str(checkout))), cwd=str(checkout),
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600,
        )
        if done.returncode != 0:
            said = [x for x in (done.stderr or done.stdout).splitlines() if x.strip()]
            raise BenchError(f"the baseline's gov db upgrade failed: {said[-1] if said else done.returncode}")
        yield dsn
    finally:
        admin(server, "scratch_drop_database", name)


# Run by each gov checkout's own interpreter path (PYTHONPATH=tree), on its own database: the
# subscription code of the gov that serves it. Endpoints on loopback port 9 (discard), which
# nothing ever posts to: gov serve has no VAPID key and no runner drains the outbox.
SUBSCRIBE_SCRIPT = """
import json, sys
from gov import Governor
dsn, prefix, users = sys.argv[1], sys.argv[2], int(sys.argv[3])
keys = json.load(sys.stdin)
with Governor(dsn, pool_size=1, allow_loopback_http=True) as gov:
    for i in range(users):
        gov.subscribe(f"{prefix}{i}", {"endpoint": f"http://127.0.0.1:9/bench/{i}", "keys": keys[i % len(keys)]})
"""


def subscribe_users(tree: str, dsn: str, users: int) -> None:
    """One live endpoint for each of the bench's users, so an allowed send queues its outbox row
    (the work a real send does) rather than finding nobody to deliver to."""
    from gov.lab.bench.delivery import browser_keys

    done = subprocess.run(
        [sys.executable, "-c", SUBSCRIBE_SCRIPT, dsn, USER_PREFIX, str(users)],
        input=json.dumps(browser_keys(16)), env=_child_env(PYTHONPATH=_python_path(tree)), cwd=tree,
        capture_output=True, text=True, timeout=600,
    )
    if done.returncode != 0:
        said = [x for x in (done.stderr or done.stdout).splitlines() if x.strip()]
        raise BenchError(f"subscribing the bench's users failed: {said[-1] if said else done.returncode}")


def check_gov_database(dsn: str, since: datetime, full: bool) -> tuple[str, str | None]:
    """(what the check found, a failure or None) for one gov serve's database.

    ``full``: this gov's own integrity check (caps, conservation, spends), for the database
    this gov migrated; else only the scan for a user over a cap, which reads tables every
    schema has had (a baseline's schema may lack what the rest reads).
    """
    import psycopg

    from gov.ops.integrity import check_integrity, over_cap

    until = datetime.now(UTC) + timedelta(minutes=1)
    if full:
        result = check_integrity(dsn, since, until)
        if result.over_cap:
            return "over a cap", f"over cap: {result.over_cap[:3]}"
        if not result.ok:
            return "inconsistent", result.problems()[:300]
        counts = ", ".join(f"{n:,} {state}" for state, n in sorted(result.states.items()))
        return f"ok: no user over a cap; every message in one state ({counts}); budgets spent once", None
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            found = over_cap(conn)
    except psycopg.Error as exc:
        return f"not checked: {' '.join(str(exc).split())[:200]}", None
    if found:
        return "over a cap", f"over cap: {found[:3]}"
    return "ok: no user over a cap (scan of gov.sends)", None


# ---------------------------------------------------------------- the bench


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so every child is stopped on the way out (on the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_http_bench(cfg: HttpBenchConfig, progress: Callable[[str], None] = lambda _msg: None) -> HttpReport:
    """Start every contender, measure the client's ceiling, run the interleaved rounds, check the stores."""
    from gov.lab.bench.redis_lua import own_redis_server, redis_server_path
    from gov.testing.postgres import dbname_of, scratch_database

    if cfg.baseline is not None and not (cfg.baseline / "gov" / "cli" / "__init__.py").is_file():
        raise BenchError(f"--http-baseline {cfg.baseline}: not a gov checkout (no gov/cli/__init__.py there)")
    token = secrets.token_urlsafe(24)
    skipped: dict[str, str] = {}
    servers: dict[str, ChildServer] = {}
    dsns: dict[str, str] = {}
    started_at = datetime.now(UTC) - timedelta(seconds=1)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_sigterm_as_interrupt())
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gov-bench-http-")))
        client = LoadClient(cfg.client, token, cfg.connections, cfg.users, workdir)

        # the seeds' server: node, its dependency and a private redis-server, or one line why not
        endpoints = None
        node = shutil.which("node")
        modules, how = seed_server_modules(progress)
        redis_server = redis_server_path()
        if modules is None:
            skipped["seeds_server"] = how
        elif redis_server is None:
            skipped["seeds_server"] = "redis-server is not on PATH"
        else:
            assert node is not None
            endpoints = stack.enter_context(own_redis_server(redis_server))
            progress(f"starting the seeds' server (node:http + ioredis, {how})")
            servers["seeds_server"] = stack.enter_context(
                contextlib.closing(start_seed_server(node, modules, endpoints.tcp_url, token)))

        server = stack.enter_context(_server(cfg.database_url))
        progress("creating gov serve's scratch database")
        dsns["gov_serve"] = stack.enter_context(scratch_database(server, "gov_bench"))
        progress(f"subscribing {cfg.users:,} users (one endpoint each)")
        subscribe_users(own_tree(), dsns["gov_serve"], cfg.users)
        progress(f"starting gov serve ({' '.join(['--port', '0', *cfg.serve_args])})")
        servers["gov_serve"] = stack.enter_context(contextlib.closing(
            start_gov_serve("gov_serve", own_tree(), dsns["gov_serve"], token, cfg.serve_args)))
        if cfg.baseline is not None:
            dsns["gov_serve_baseline"] = stack.enter_context(baseline_database(server, cfg.baseline, progress))
            subscribe_users(str(cfg.baseline.resolve()), dsns["gov_serve_baseline"], cfg.users)
            progress(f"starting the baseline's gov serve ({cfg.baseline})")
            servers["gov_serve_baseline"] = stack.enter_context(contextlib.closing(
                start_gov_serve("gov_serve_baseline", str(cfg.baseline.resolve()), dsns["gov_serve_baseline"],
                                token, cfg.baseline_serve_args)))
        contenders = [c for c in CONTENDERS if c in servers]

        # the client alone, against a server that does nothing: the most it can measure
        canned, canned_name = start_canned_server()
        try:
            progress(f"the load client ({client.name}) against {canned_name}")
            ceiling = client.run(canned.port, min(cfg.seconds, 3.0), "ceiling")
        finally:
            canned.close()
        progress(f"the load client's ceiling: {ceiling.per_second:,.0f} requests/s")

        # Every store to the same steady state first, whatever the contender's speed: each user at
        # the P2 cap. Timed sends to a capped population meet users at their cap; without the fill
        # a faster contender would spend less of its run on the allowed path, and look faster still.
        fills: dict[str, Run] = {}
        for c in contenders:
            progress(f"filling {c}: {P2_CAP_24H} sends for each of {cfg.users:,} users")
            fills[c] = client.fill(servers[c].port, f"fill-{c}")
            servers[c].check_alive()
            progress(f"{c}: filled at {fills[c].per_second:,.0f} requests/s")

        # whose CPU each contender's rounds spend: its server process(es) and its store
        meters = {c: _Meter(servers[c].pid, _store_pid(c, dsns, endpoints)) for c in contenders}
        load_before = os.getloadavg()
        runs: dict[str, list[Run]] = {c: [] for c in contenders}
        cpu: dict[str, list[tuple[float | None, float | None]]] = {c: [] for c in contenders}
        for r in range(cfg.rounds):
            order = contenders if r % 2 == 0 else contenders[::-1]
            for c in order:
                progress(f"{c} (round {r + 1} of {cfg.rounds})")
                meters[c].start()
                result = client.run(servers[c].port, cfg.seconds, f"r{r}-{c}")
                cpu[c].append(meters[c].per_request(result.requests))
                servers[c].check_alive()
                runs[c].append(result)
                progress(f"{c}: {result.per_second:,.0f} requests/s, p99 {result.p99_ms:.2f} ms")
        load_after = os.getloadavg()

        for c in contenders:
            servers[c].close()  # nothing in flight while the stores are read
        checks: dict[str, str] = {}
        failures: list[str] = []
        for c in contenders:
            # every answer counted: the fill's and the rounds' together are bounded by the cap
            allowed = fills[c].allowed + sum(x.allowed for x in runs[c])
            if allowed > P2_CAP_24H * cfg.users:
                failures.append(f"{c}: {allowed:,} sends allowed to {cfg.users:,} users, over {P2_CAP_24H} each")
            if c in dsns:
                progress(f"checking {c}'s database")
                found, failure = check_gov_database(dsns[c], started_at, full=c == "gov_serve")
                checks[c] = found
                if failure is not None:
                    failures.append(f"{c}: {failure}")
            else:
                checks[c] = (f"answers: {allowed:,} allowed to {cfg.users:,} users in all "
                             f"(at most {P2_CAP_24H} each)")
        settings = {
            "tier": TIER,
            "users": cfg.users,
            "connections": cfg.connections,
            "seconds": cfg.seconds,
            "rounds": cfg.rounds,
            "serve_args": list(cfg.serve_args),
            "baseline": str(cfg.baseline) if cfg.baseline is not None else None,
            "baseline_serve_args": list(cfg.baseline_serve_args),
            "databases": {c: dbname_of(d) for c, d in dsns.items()},
        }
    return HttpReport(
        contenders=contenders, runs=runs, fills=fills, client=client.name, ceiling=ceiling, ceiling_server=canned_name,
        skipped=skipped, checks=checks, failures=failures, load_before=load_before, load_after=load_after,
        settings=settings, cpu=cpu,
    )


class _Meter:
    """A contender's server CPU over one timed run, from its processes' own counters
    (:func:`gov.lab.bench.server_cpu.server_ticks`: a process and its children): the ratio of
    two contenders' requests/s follows it on a machine whose cores they share with the client."""

    def __init__(self, server: int, store: int | None) -> None:
        self.server, self.store = server, store
        self._before: tuple[int | None, int | None] = (None, None)

    def _ticks(self) -> tuple[int | None, int | None]:
        from gov.lab.bench.server_cpu import server_ticks

        return server_ticks(self.server), None if self.store is None else server_ticks(self.store)

    def start(self) -> None:
        self._before = self._ticks()

    def per_request(self, requests: int) -> tuple[float | None, float | None]:
        """µs a request of each part since :meth:`start` (None where a count was unreadable)."""
        from gov.lab.bench.server_cpu import ticks_per_second

        tick_us = 1e6 / ticks_per_second()

        def per(before: int | None, after: int | None) -> float | None:
            return None if before is None or after is None or requests <= 0 else (after - before) * tick_us / requests

        after = self._ticks()
        return per(self._before[0], after[0]), per(self._before[1], after[1])


def _store_pid(contender: str, dsns: Mapping[str, str], redis: Any) -> int | None:
    """The store's process: redis-server for the seeds' server, else the postmaster of the
    contender's PostgreSQL (None when it is not on this machine)."""
    if contender == "seeds_server":
        return None if redis is None else redis.pid
    import psycopg

    from gov.lab.bench.server_cpu import postmaster_pid

    try:
        with psycopg.connect(dsns[contender], autocommit=True) as conn:
            return postmaster_pid(conn)[0]
    except psycopg.Error:
        return None


# ---------------------------------------------------------------- the table


def print_report(report: HttpReport, console: Any) -> None:
    """The table (one line per contender), the client's ceiling, the checks, the machine's load."""
    from rich.table import Table

    s = report.settings
    title = (f"POST /internal/send: {s['tier']} sends for {s['users']:,} random users, each at the cap, "
             f"{s['connections']} connections, {s['seconds']:g} s × {s['rounds']} interleaved round(s), medians")
    table = Table(title=title, title_justify="left")
    table.add_column("contender")
    baseline = "gov_serve_baseline" in report.contenders
    for column in ("requests/s", "× seeds' server", *(["× baseline"] if baseline else []), "p50 ms", "p99 ms",
                   "CPU µs/request: server + store", "non-200", "allowed", "rounds, requests/s", "fill requests/s"):
        table.add_column(column, justify="right")
    for c in report.contenders:
        runs = report.runs[c]
        ratios = [report.x_seeds(c), *([report.x_baseline(c)] if baseline else [])]
        table.add_row(
            c,
            f"{report.median(c):,.0f}",
            *("–" if x is None else f"{x:.3f}" for x in ratios),
            f"{report.median(c, 'p50_ms'):.2f}",
            f"{report.median(c, 'p99_ms'):.2f}",
            " + ".join("?" if x is None else f"{x:,.0f}" for x in (report.cpu_median(c, 0), report.cpu_median(c, 1))),
            f"{sum(r.non_200 for r in runs):,}",
            f"{sum(r.allowed for r in runs):,}",
            " ".join(f"{r.per_second:,.0f}" for r in runs),
            f"{report.fills[c].per_second:,.0f}",
        )
    console.print(table)
    if baseline and list(s.get("baseline_serve_args", [])) != list(s["serve_args"]):
        # the × baseline column then measures the command lines as much as the code
        own = " ".join(s["serve_args"]) or "(none)"
        theirs = " ".join(s.get("baseline_serve_args", [])) or "(none)"
        console.print(f"× baseline compares different command lines: gov serve {own}, the baseline's {theirs} "
                      "(--baseline-serve-arg gives the baseline the same)", highlight=False)
    for c, why in report.skipped.items():
        console.print(f"{c}: skipped: {why}", highlight=False)
    console.print("CPU µs/request: medians over the rounds of each contender's own processes (node; gov serve and "
                  "its workers) and of its store's (redis-server; the whole PostgreSQL server, its WAL writer and "
                  "checkpointer included), from /proc; ? where a store is not on this machine", highlight=False)
    console.print(f"fill (before the rounds, Python client): each user's first {P2_CAP_24H} sends in user order, "
                  "all allowed: the allowed path, measured once", highlight=False)
    ceiling = report.ceiling
    console.print(f"load client: {report.client}; its ceiling ({report.ceiling_server}): "
                  f"{ceiling.per_second:,.0f} requests/s, p50 {ceiling.p50_ms:.2f} ms, p99 {ceiling.p99_ms:.2f} ms",
                  highlight=False)
    for c in report.contenders:
        statuses: Counter[str] = Counter()
        for r in [report.fills[c], *report.runs[c]]:
            statuses.update(r.statuses)
        invalid = sum(r.invalid for r in [report.fills[c], *report.runs[c]])
        if statuses or invalid:
            shown = ", ".join(f"{n:,} × {status}" for status, n in statuses.most_common())
            console.print(f"{c}: answers other than a 200 verdict: {shown or 'none'}"
                          + (f"; {invalid:,} 200s whose body is not a verdict" if invalid else ""), highlight=False)
        expected = P2_CAP_24H * s["users"]
        if report.fills[c].allowed != expected:
            console.print(f"{c}: the fill allowed {report.fills[c].allowed:,} of {expected:,} sends: "
                          "not every user was at the cap in the rounds", highlight=False)
    for c, found in report.checks.items():
        console.print(f"check {c}: {found}", highlight=False)
    console.print("load average (1, 5, 15 min): before {} · after {} · {} cores".format(
        ", ".join(f"{x:.2f}" for x in report.load_before), ", ".join(f"{x:.2f}" for x in report.load_after),
        os.cpu_count()), highlight=False)
