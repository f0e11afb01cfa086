"""The seeds' Redis contenders: their Lua scripts verbatim, and the send paths that call them.

Three ways the seeds spend a P2 decision's budgets (P1 then P2, as ``CONSUMES`` orders them):

* ``redis_one_call``: the parent guide's ``CHECK_AND_COMMIT`` with every window of every
  consumed tier in one ``EVALSHA``; one round trip, atomic, nothing to roll back.
* ``redis_per_tier``: the parent guide's send path (``for (const tier of CONSUMES[msg.tier])
  checkAndCommit(...)``): one ``CHECK_AND_COMMIT`` per consumed tier, two round trips, and
  P1 stays committed when P2 then refuses (PERFORMANCE.md: it burns P1 slots).
* ``redis_per_tier_logged``: the same send path with the seed's Step 4 as well: a refused
  message is written to a ``push_suppressions`` table of the seed's shape in PostgreSQL
  (``ctx.log.suppression``, one autocommitted INSERT), as the guide's ``send()`` does.
  gov writes that row too, so this is the seed's path doing the same work.
* ``redis_per_window``: the caps page's ``allowAll``: the ``SLIDING_WINDOW`` script once per
  window (three round trips), then one pipelined ``ZREM`` per committed window on a refusal.

Keys follow the parent guide, ``freq:{user}:{tier}:{window_ms}``, for all three, so one
prefill serves them all. Scripts are loaded once (``SCRIPT LOAD``) and called by SHA.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

# The caps page (seed 000): one window per call, returns {ok, used, retry_after_ms}.
SLIDING_WINDOW = """
local key      = KEYS[1]
local now      = tonumber(ARGV[1])
local windowMs = tonumber(ARGV[2])
local cap      = tonumber(ARGV[3])
local member   = ARGV[4]

redis.call('ZREMRANGEBYSCORE', key, 0, now - windowMs)
local used = redis.call('ZCARD', key)
if used >= cap then
  -- score of the oldest surviving entry tells us when a slot frees up
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  local freeAt = tonumber(oldest[2]) + windowMs
  return {0, used, freeAt - now}
end
redis.call('ZADD', key, now, member)
redis.call('PEXPIRE', key, windowMs)
return {1, used + 1, 0}
"""

# The parent guide (seed 001): every window passed as a key, all checked before any commit.
CHECK_AND_COMMIT = """
local now = tonumber(ARGV[1])
local member = ARGV[2]
local n = (#KEYS)
for i = 1, n do
  local windowMs = tonumber(ARGV[2 + i])
  local cap = tonumber(ARGV[2 + n + i])
  redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, now - windowMs)
  if redis.call('ZCARD', KEYS[i]) >= cap then
    return {0, i}
  end
end
for i = 1, n do
  local windowMs = tonumber(ARGV[2 + i])
  redis.call('ZADD', KEYS[i], now, member)
  redis.call('PEXPIRE', KEYS[i], windowMs)
end
return {1, 0}
"""

REDIS_CONTENDERS = ("redis_one_call", "redis_per_tier", "redis_per_tier_logged", "redis_per_window")


@dataclass(frozen=True)
class TierWindows:
    """One consumed tier and its windows, ``(window_ms, cap)`` each, as the policy stores them."""

    tier: str
    windows: tuple[tuple[int, int], ...]


def key(user_id: str, tier: str, window_ms: int) -> str:
    """The parent guide's key: ``freq:${userId}:${tier}:${w.ms}``."""
    return f"freq:{user_id}:{tier}:{window_ms}"


def load_scripts(client: Any) -> dict[str, str]:
    """``SCRIPT LOAD`` both scripts once; the SHAs every worker then calls."""
    return {
        "sliding_window": str(client.script_load(SLIDING_WINDOW)),
        "check_and_commit": str(client.script_load(CHECK_AND_COMMIT)),
    }


class RedisDecider:
    """One contender's decision for one client connection; ``decide`` returns allowed."""

    def __init__(
        self,
        client: Any,
        contender: str,
        shas: dict[str, str],
        consumes: Sequence[TierWindows],
        log_suppression: Callable[[str, str, str], None] | None = None,
    ) -> None:
        """``log_suppression(user_id, message_id, blocked_by)``: the seed's Step 4,
        required by (and only used by) ``redis_per_tier_logged``."""
        if contender not in REDIS_CONTENDERS:
            raise ValueError(f"unknown Redis contender {contender!r}")
        if (contender == "redis_per_tier_logged") != (log_suppression is not None):
            raise ValueError("redis_per_tier_logged, and only it, logs suppressions")
        self.log_suppression = log_suppression
        self.client = client
        self.consumes = tuple(consumes)
        self.sliding = shas["sliding_window"]
        self.check_and_commit = shas["check_and_commit"]
        self.decide = {
            "redis_one_call": self._one_call,
            "redis_per_tier": self._per_tier,
            "redis_per_tier_logged": self._per_tier,
            "redis_per_window": self._per_window,
        }[contender]

    def _one_call(self, user_id: str, member: str) -> bool:
        windows = [(t.tier, ms, cap) for t in self.consumes for ms, cap in t.windows]
        keys = [key(user_id, tier, ms) for tier, ms, _ in windows]
        now = time.time_ns() // 1_000_000  # the seed passes Date.now()
        ok, _ = self.client.evalsha(
            self.check_and_commit,
            len(keys),
            *keys,
            now,
            member,
            *(ms for _, ms, _ in windows),
            *(cap for _, _, cap in windows),
        )
        return int(ok) == 1

    def _per_tier(self, user_id: str, member: str) -> bool:
        for t in self.consumes:
            keys = [key(user_id, t.tier, ms) for ms, _ in t.windows]
            now = time.time_ns() // 1_000_000
            ok, blocked = self.client.evalsha(
                self.check_and_commit,
                len(keys),
                *keys,
                now,
                member,
                *(ms for ms, _ in t.windows),
                *(cap for _, cap in t.windows),
            )
            if int(ok) != 1:
                if self.log_suppression is not None:
                    # the seed's window index is 1-based over this tier's windows
                    ms = t.windows[int(blocked) - 1][0]
                    self.log_suppression(user_id, member, f"cap_{ms}ms")
                # the seed returns here: the tiers already passed keep their slot
                return False
        return True

    def _per_window(self, user_id: str, member: str) -> bool:
        committed: list[str] = []
        for t in self.consumes:
            for ms, cap in t.windows:
                k = key(user_id, t.tier, ms)
                now = time.time_ns() // 1_000_000
                ok, _, _ = self.client.evalsha(self.sliding, 1, k, now, ms, cap, member)
                if int(ok) != 1:
                    if committed:
                        # allowAll's Promise.all(zrem …): one pipelined round trip
                        pipe = self.client.pipeline(transaction=False)
                        for c in committed:
                            pipe.zrem(c, member)
                        pipe.execute()
                    return False
                committed.append(k)
        return True


def prefill(client: Any, users: int, per_user: int, consumes: Sequence[TierWindows], age_ms: int) -> None:
    """Give users ``u0 … u{users-1}`` ``per_user`` entries in every window key, ``age_ms`` old.

    The same state ``per_user`` allowed decisions would leave, written in pipelined
    batches so a 10,000-user prefill takes well under a second.
    """
    now = time.time_ns() // 1_000_000
    pipe = client.pipeline(transaction=False)
    for n in range(users):
        for t in consumes:
            for ms, _ in t.windows:
                k = key(f"u{n}", t.tier, ms)
                pipe.zadd(k, {f"pre-{j}": now - age_ms + j for j in range(per_user)})
                pipe.pexpire(k, ms)
        if n % 1000 == 999:
            pipe.execute()
    pipe.execute()


def redis_server_path() -> str | None:
    """``redis-server`` on PATH, or None."""
    return shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pong(address: tuple[str, int] | str, timeout: float = 0.2) -> bool:
    """Whether a Redis server answers PING at ``address`` (host and port, or a Unix socket path).

    A plain socket, not redis-py: the private server also serves ``gov bench --http``'s
    Node.js contender, which must not need a Python Redis client.
    """
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(address)
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@dataclass(frozen=True)
class RedisEndpoints:
    """Where the private redis-server answers: a loopback port and a Unix socket."""

    tcp_url: str
    unix_url: str
    pid: int | None = None  # the redis-server process (gov bench --http counts its CPU)

    def url(self, unix: bool) -> str:
        return self.unix_url if unix else self.tcp_url


@contextlib.contextmanager
def own_redis_server(binary: str, *, startup_timeout: float = 10.0) -> Iterator[RedisEndpoints]:
    """A private ``redis-server`` on a free loopback port (and a Unix socket) for the block.

    Never the machine's own Redis: the bench FLUSHDBs between runs. The socket lets the
    Redis clients use the same transport as PostgreSQL's (the embedded server listens on a
    Unix socket only), so transport is not what the figures compare. Persistence is off
    (no RDB snapshot, no AOF): the Redis figures are for a store that loses its windows on
    restart, so compare them with gov's ``async`` line as much as with the durable one.
    """
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="gov-bench-redis-") as tmp:
        sock = f"{tmp}/redis.sock"
        proc = subprocess.Popen(
            [
                binary,
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--unixsocket", sock,
                "--unixsocketperm", "700",
                "--save", "",
                "--appendonly", "no",
                "--dir", tmp,
                "--loglevel", "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # not Ctrl-C's to stop: the bench does, after its clients
        )  # fmt: skip
        try:
            endpoints = RedisEndpoints(f"redis://127.0.0.1:{port}/0", f"unix://{sock}?db=0", proc.pid)
            deadline = time.monotonic() + startup_timeout
            while True:
                if proc.poll() is not None:
                    err = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace").strip()
                    raise RuntimeError(f"redis-server exited at startup ({proc.returncode}): {err[-200:]}")
                if _pong(("127.0.0.1", port)) and _pong(sock):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not answer on port {port}")
                time.sleep(0.05)  # polling a child's startup, not a test waiting for time
            yield endpoints
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stderr:
                proc.stderr.close()
