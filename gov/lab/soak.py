"""`gov soak`: hold a production-like load for a while, then prove that nothing was lost.

    gov soak [--seconds 60] [--senders 16] [--users 2000] [--database-url URL]

For ``--seconds``, ``--senders`` sender processes call :meth:`gov.Governor.send` as fast
as they can (a mixed-tier workload, ``deliver=False``), while a runner process
(:class:`gov.delivery.runner.Dispatcher`) delivers the outbox to a loopback push service this
command starts, and a releaser process (:class:`gov.hold.release.Releaser`) hands held messages
back to the decision. Then the senders stop, what is due drains, and a short report
says what happened and whether every check passed:

* **errors** must be 0: sender exceptions, errors the runner or releaser logged, requests
  the (strict) push service refused, outbox rows that failed;
* **lost messages** must be 0: every verdict a sender got is a row in ``gov.messages``,
  and the conservation check (``gov.message_states_v1``) finds every message in exactly
  one state, none still in flight after the drain;
* **over-cap users** must be 0: a scan of ``gov.sends`` (:func:`gov.ops.integrity.over_cap`) finds no user
  over any cap in any window, and no message spent a budget twice (:func:`gov.ops.integrity.spend_mismatches`);
* **memory** stays flat: each gov process's RSS at the end is at most 1.5 × its RSS after
  the warm-up, plus 20 MB.

The exit status is non-zero when any check fails. The run happens in a scratch database
``gov_soak_<random>`` created on the server of ``--database-url`` (needs CREATEDB; no
existing database is touched) and dropped afterwards, or, with no URL, on a throwaway
embedded PostgreSQL in a temporary directory. The scratch database gets a policy with
windows of seconds (:data:`SOAK_POLICY`, or ``--policy FILE``) so that caps bind, deferrals
come due and collapses are released within the run.

The checks live in :mod:`gov.ops.integrity`; the fault-injection tests run them after
each fault, too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import queue
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import click
import psycopg

from gov import policy as policy_mod
from gov.cli.common import option
from gov.db import translate_errors
from gov.ops.integrity import check_integrity
from gov.testing.postgres import scratch_database

log = logging.getLogger("gov.lab.soak")

SUBJECT = "mailto:soak@example.com"  # the VAPID subject of the soak's own throwaway key
RSS_GROWTH_FACTOR = 1.5  # memory is "flat" when end RSS <= start RSS × this + RSS_SLACK_BYTES
RSS_SLACK_BYTES = 20 * 1024 * 1024
READY_TIMEOUT_S = 120.0  # seconds for every child process to import gov and connect
POLL_S = 0.25  # seconds between drain polls and RSS samples

#: The soak's policy: the default policy's shape with windows of seconds, so that within
#: a minute caps bind for every tier, deferrals come due, collapses are released and the
#: budget scan has many full windows to check.
SOAK_POLICY = """\
# gov soak: the default policy's shape, with windows of seconds.
[tiers.P0]
exempt = true
ttl = "1h"
urgency = "high"

[tiers.P1]
windows = [{ window = "10s", cap = 2 }]
on_exceed = "defer"
defer_max = "10s"
consumes = ["P1"]
ttl = "1h"

[tiers.P2]
windows = [{ window = "10s", cap = 1 }, { window = "60s", cap = 3 }]
on_exceed = "drop"
consumes = ["P1", "P2"]
ttl = "1h"
urgency = "low"

[tiers.P3]
windows = [{ window = "30s", cap = 1 }]
on_exceed = "collapse"
consumes = ["P1", "P2", "P3"]
ttl = "1h"
urgency = "very-low"

[topics]
"*" = [{ window = "30s", cap = 2 }]

[global]
windows = [{ window = "30s", cap = 3 }]

[quiet_hours]
jitter = "1s"
"""

# What a sender sends: (tier, weight). P0 is exempt from every cap, so it stays rare, as
# transactional messages are; the rest is spread over the capped tiers.
WORKLOAD: tuple[tuple[str, int], ...] = (("P0", 2), ("P1", 38), ("P2", 40), ("P3", 20))
TOPICS: tuple[str | None, ...] = ("sale", "news", "tips", None)

# ---------------------------------------------------------------- a scratch database


def apply_policy(dsn: str, text: str, name: str = "soak policy") -> None:
    """Validate and store ``text`` as the policy of ``dsn``."""
    parsed = policy_mod.parse_policy(text, name)
    with translate_errors(), psycopg.connect(dsn) as conn, conn.transaction():
        policy_mod.apply(conn, parsed, text)


# ---------------------------------------------------------------- memory


def rss_of(pid: int) -> tuple[int | None, int | None]:
    """(resident set size, peak resident set size) of a process in bytes; None if unknown.

    Linux's /proc gives both (VmRSS, VmHWM); elsewhere psutil gives the current RSS.
    """
    try:
        fields = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
        )
        return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        pass
    try:
        import psutil

        return int(psutil.Process(pid).memory_info().rss), None
    except Exception:  # no psutil, or the process is gone
        return None, None


@dataclass
class Memory:
    """RSS of one process: after the warm-up, at the end, and the highest seen."""

    role: str
    pid: int
    start: int | None = None
    end: int | None = None
    peak: int | None = None

    def sample(self, warm: bool) -> None:
        rss, hwm = rss_of(self.pid)
        if not rss:  # unknown, or an exited process not yet reaped
            return
        if warm and self.start is None:
            self.start = rss
        if warm:
            self.end = rss
        self.peak = max(x for x in (self.peak, rss, hwm) if x is not None)

    def final(self, rss: int | None, peak: int | None) -> None:
        """The process's own last word (its RSS just before it reported), after its last sample."""
        if rss and self.start is not None:
            self.end = rss
        self.peak = max((x for x in (self.peak, rss, peak) if x), default=None)

    @property
    def flat(self) -> bool | None:
        """True when the end is within the growth allowance of the start; None if unmeasured."""
        if self.start is None or self.end is None:
            return None
        return self.end <= self.start * RSS_GROWTH_FACTOR + RSS_SLACK_BYTES


# ---------------------------------------------------------------- the child processes


class _ErrorCounter(logging.Handler):
    """Counts records at ERROR and above, keeping the first few for the report."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.count = 0
        self.first: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if len(self.first) < 5:
            self.first.append(record.getMessage())


def _own_memory() -> dict[str, int | None]:
    """This process's RSS and peak RSS, for its final report."""
    import resource

    rss, peak = rss_of(os.getpid())
    if peak is None:
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = maxrss if sys.platform == "darwin" else maxrss * 1024  # bytes on macOS, KiB elsewhere
    return {"rss": rss, "peak": peak}


def _child_logging() -> _ErrorCounter:
    counter = _ErrorCounter()
    logging.basicConfig(level=logging.WARNING, format="%(processName)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().addHandler(counter)
    return counter


def _signer(key_path: str) -> Any:
    from gov.delivery.vapid import VapidSigner

    return VapidSigner.from_env({"GOV_VAPID_PRIVATE_KEY": key_path, "GOV_VAPID_SUBJECT": SUBJECT})


def _message(rng: random.Random, users: int, sender: int, seq: int) -> Any:
    from gov.message import Message

    tier = rng.choices([t for t, _ in WORKLOAD], weights=[w for _, w in WORKLOAD])[0]
    return Message(
        user_id=f"soak-{rng.randrange(users):05d}",
        id=f"s{sender}-{seq}",
        tier=tier,
        topic=rng.choice(TOPICS) if tier == "P2" else None,
        collapse_key="digest" if tier == "P3" else None,
        title=f"soak {tier}",
        body="a message of the soak",
        url="https://soak.example/m",
        ttl=600 if tier == "P0" else 3600,
    )


def _sender_main(index: int, dsn: str, users: int, seconds: float, seed: int, start: Any, results: Any) -> None:
    """One sender: gov.send as fast as it can until its time is up; reports its verdicts."""
    from gov.governor import Governor

    counter = _child_logging()
    rng = random.Random(seed * 1000 + index)
    verdicts: Counter[str] = Counter()
    errors: list[str] = []
    error_count = 0
    with Governor(dsn, pool_size=1, pool_timeout=30.0) as gov:
        results.put(("ready", f"sender {index + 1}", os.getpid()))
        start.wait()
        deadline = time.monotonic() + seconds
        seq = 0
        while time.monotonic() < deadline:
            message = _message(rng, users, index, seq)
            seq += 1
            try:
                result = gov.send(message, deliver=False)
            except Exception as exc:  # every error counts; none is retried
                error_count += 1
                if len(errors) < 5:
                    errors.append(f"{type(exc).__name__}: {exc}")
                continue
            d = result.decision
            verdicts[f"{message.tier}:{'allowed' if d.allowed else d.action}"] += 1
    results.put(
        ("done", f"sender {index + 1}", {"verdicts": dict(verdicts), "errors": error_count + counter.count,
                                         "error_messages": errors + counter.first, **_own_memory()})
    )


def _runner_main(dsn: str, key_path: str, start: Any, stop: Any, results: Any) -> None:
    """The runner: a Dispatcher draining the outbox into the loopback push service."""
    from gov.delivery.runner import Dispatcher

    counter = _child_logging()
    with Dispatcher(dsn, _signer(key_path), workers=8, timeout_s=5.0, lease_s=30.0, allow_loopback_http=True) as runner:
        results.put(("ready", "runner", os.getpid()))
        start.wait()
        runner.run_forever(stop, idle_s=0.1)
    results.put(("done", "runner", {"errors": counter.count, "error_messages": counter.first, **_own_memory()}))


def _releaser_main(dsn: str, key_path: str, start: Any, stop: Any, results: Any) -> None:
    """The releaser: hands due deferrals and collapses back to the decision, and delivers them."""
    from gov.delivery.runner import Dispatcher
    from gov.hold.release import Releaser

    counter = _child_logging()
    with Dispatcher(dsn, _signer(key_path), workers=2, timeout_s=5.0, lease_s=30.0, allow_loopback_http=True) as runner:
        releaser = Releaser(runner.source, dispatcher=runner, batch=200)
        results.put(("ready", "releaser", os.getpid()))
        start.wait()
        releaser.run_forever(stop, idle_s=0.2)
    results.put(("done", "releaser", {"errors": counter.count, "error_messages": counter.first, **_own_memory()}))


# ---------------------------------------------------------------- the run


@dataclass
class SoakReport:
    """What a soak did and whether each check passed."""

    seconds: float
    senders: int
    users: int
    decisions: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)
    deliveries: int = 0
    delivered_rows: int = 0
    errors: int = 0
    error_messages: list[str] = field(default_factory=list)
    lost: int = 0
    lost_detail: list[str] = field(default_factory=list)
    states: dict[str, int] = field(default_factory=dict)
    over_cap_users: int = 0
    over_cap_detail: list[str] = field(default_factory=list)
    spend_mismatches: int = 0
    memory: list[dict[str, Any]] = field(default_factory=list)
    memory_flat: bool = True
    drained: bool = True
    drain_s: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            self.errors == 0
            and self.lost == 0
            and self.over_cap_users == 0
            and self.spend_mismatches == 0
            and self.memory_flat
            and self.drained
            and self.decisions > 0
        )

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def text(self) -> str:
        mb = 1024 * 1024

        def fmt(v: int | None) -> str:
            return f"{v / mb:7.1f}" if v is not None else "    n/a"

        allowed = sum(n for k, n in self.verdicts.items() if k.endswith(":allowed"))
        lines = [
            f"gov soak: {self.seconds:g} s, {self.senders} senders, {self.users} users",
            f"  decisions       {self.decisions:>9}  ({self.decisions / self.seconds:.0f}/s; "
            f"{allowed} allowed, {self.decisions - allowed} suppressed)",
            f"  deliveries      {self.deliveries:>9}  (accepted by the push service; {self.delivered_rows} outbox rows"
            " delivered)",
            f"  errors          {self.errors:>9}" + (f"  {self.error_messages[:3]}" if self.error_messages else ""),
            f"  lost messages   {self.lost:>9}" + (f"  {self.lost_detail[:3]}" if self.lost_detail else ""),
            f"  over-cap users  {self.over_cap_users:>9}"
            + (f"  {self.over_cap_detail[:3]}" if self.over_cap_detail else ""),
            f"  spend mismatch  {self.spend_mismatches:>9}",
            f"  drained         {'yes' if self.drained else 'NO':>9}  ({self.drain_s:.1f} s after the senders stopped)",
            "  states          " + ", ".join(f"{k} {v}" for k, v in sorted(self.states.items())),
            "  memory (RSS MB)   start     end    peak",
        ]
        for m in self.memory:
            verdict = {True: "flat", False: "GREW", None: "unmeasured"}[m["flat"]]
            lines.append(f"    {m['role']:<13} {fmt(m['start'])} {fmt(m['end'])} {fmt(m['peak'])}  {verdict}")
        lines.append("result: " + ("OK" if self.ok else "FAILED"))
        return "\n".join(lines)


def _counting_push_service(public_key: str) -> Any:
    """A loopback push service that counts answers instead of keeping every request."""
    from gov.testing.push_service import PushService, Received

    class CountingPushService(PushService):
        # PushService keeps every request for tests to inspect; a soak would grow without
        # bound, so this one keeps counts and the first few refusals only.
        def __init__(self) -> None:
            super().__init__(expected_public_key=public_key, hang_s=1.0)
            self.statuses: Counter[int | None] = Counter()
            self.refusals: list[str] = []

        def _record(self, record: Received) -> None:
            with self._lock:
                self.statuses[record.status] += 1
                if (record.status is None or record.status >= 300) and len(self.refusals) < 5:
                    self.refusals.append(f"{record.status} {record.reason}")

    return CountingPushService()


def _db_now(dsn: str) -> datetime:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def _backlog(dsn: str) -> tuple[int, int]:
    """(outbox rows still to deliver, held messages already due)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM gov.outbox WHERE state IN ('pending', 'sending')),"
            "       (SELECT count(*) FROM gov.deferred WHERE state = 'waiting' AND release_at <= clock_timestamp())"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def run_soak(
    database_url: str | None,
    *,
    seconds: float = 60.0,
    senders: int = 16,
    users: int = 2000,
    policy_text: str = SOAK_POLICY,
    drain_timeout_s: float = 120.0,
    seed: int = 1,
    progress: Any = None,
) -> SoakReport:
    """Run a soak and return its report (see the module's docstring)."""
    from gov.delivery.vapid import generate_keypair
    from gov.governor import Governor

    say = progress or (lambda _msg: None)
    report = SoakReport(seconds=seconds, senders=senders, users=users)
    ctx = multiprocessing.get_context("spawn")  # no fork: this process runs threads (the push service)
    with contextlib.ExitStack() as stack:
        dsn = stack.enter_context(scratch_database(database_url, "gov_soak"))
        apply_policy(dsn, policy_text)
        keydir = stack.enter_context(tempfile.TemporaryDirectory(prefix="gov-soak-key-"))
        key_path = os.path.join(keydir, "vapid.pem")
        public_key = generate_keypair(key_path)
        push = stack.enter_context(_counting_push_service(public_key))

        say(f"subscribing {users} users")
        with Governor(dsn, pool_size=1, allow_loopback_http=True) as gov:
            for i in range(users):
                gov.subscribe(f"soak-{i:05d}", push.subscribe().info)

        start, stop = ctx.Event(), ctx.Event()
        results = ctx.Queue()
        procs = [
            ctx.Process(target=_sender_main, args=(i, dsn, users, seconds, seed, start, results), name=f"sender-{i}")
            for i in range(senders)
        ]
        procs.append(ctx.Process(target=_runner_main, args=(dsn, key_path, start, stop, results), name="runner"))
        procs.append(ctx.Process(target=_releaser_main, args=(dsn, key_path, start, stop, results), name="releaser"))
        for p in procs:
            p.start()
        memory: dict[str, Memory] = {}

        def kill_all() -> None:
            for p in procs:
                if p.is_alive():
                    p.kill()
                p.join(timeout=10)
            results.close()
            results.join_thread()

        stack.callback(kill_all)
        say(f"starting {senders} senders, a runner and a releaser")
        deadline = time.monotonic() + READY_TIMEOUT_S
        while len(memory) < len(procs):
            try:
                _kind, role, pid = results.get(timeout=1.0)
            except queue.Empty:
                dead = [p.name for p in procs if not p.is_alive()]
                if dead:
                    raise click.ClickException(f"the soak's {', '.join(dead)} exited before starting") from None
                if time.monotonic() > deadline:
                    raise click.ClickException("the soak's processes did not start in time") from None
                continue
            memory[role] = Memory(role, pid)
        memory["soak (main)"] = Memory("soak (main)", os.getpid())

        since = _db_now(dsn) - timedelta(seconds=1)
        start.set()
        began = time.monotonic()
        warmup = min(5.0, seconds / 5)
        say(f"running for {seconds:g} s")
        senders_done = [p for p in procs if p.name.startswith("sender")]
        while any(p.is_alive() for p in senders_done):
            warm = time.monotonic() - began >= warmup
            for m in memory.values():
                m.sample(warm)
            time.sleep(POLL_S)  # sampling real processes, not simulated time
            if time.monotonic() - began > seconds + 60:
                raise click.ClickException("the senders did not stop in time")

        # drain: what is due is delivered, what is held and due is released
        say("draining")
        stopped = time.monotonic()
        quiet_polls = 0
        while quiet_polls < 2:
            for role in ("runner", "releaser", "soak (main)"):
                memory[role].sample(True)
            outbox, due = _backlog(dsn)
            quiet_polls = quiet_polls + 1 if outbox == 0 and due == 0 else 0
            if time.monotonic() - stopped > drain_timeout_s:
                report.drained = False
                break
            time.sleep(POLL_S)  # waiting for real processes to finish real work
        report.drain_s = time.monotonic() - stopped
        stop.set()

        done: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + 60
        while len(done) < len(procs) and time.monotonic() < deadline:
            try:
                kind, role, payload = results.get(timeout=1.0)
            except queue.Empty:
                if not any(p.is_alive() for p in procs):
                    break
                continue
            if kind == "done":
                done[role] = payload
                memory[role].final(payload.get("rss"), payload.get("peak"))
        for p in procs:
            p.join(timeout=30)
        missing = sorted(set(memory) - set(done) - {"soak (main)"})
        if missing:
            report.errors += len(missing)
            report.error_messages.append(f"no report from {', '.join(missing)} (crashed?)")

        # the figures
        verdicts: Counter[str] = Counter()
        for role, payload in done.items():
            verdicts.update(payload.get("verdicts", {}))
            report.errors += int(payload["errors"])
            report.error_messages += [f"{role}: {m}" for m in payload["error_messages"]]
        report.verdicts = dict(sorted(verdicts.items()))
        report.decisions = sum(verdicts.values())
        report.deliveries = sum(n for status, n in push.statuses.items() if status is not None and status < 300)
        refused = sum(n for status, n in push.statuses.items() if status is None or status >= 300)
        if refused:
            report.errors += refused
            report.error_messages += [f"push service refused: {r}" for r in push.refusals]

        until = _db_now(dsn) + timedelta(days=1)
        integrity = check_integrity(dsn, since, until)
        with psycopg.connect(dsn) as conn:
            recorded = conn.execute("SELECT count(*) FROM gov.messages").fetchone()
            rows = conn.execute("SELECT state, count(*) FROM gov.outbox GROUP BY state").fetchall()
        by_state: dict[str, int] = {state: int(n) for state, n in rows}
        report.states = integrity.states
        report.delivered_rows = int(by_state.get("delivered", 0))
        failed_rows = by_state.get("failed", 0) + by_state.get("expired", 0)
        if failed_rows:
            report.errors += failed_rows
            report.error_messages.append(f"{failed_rows} outbox rows failed or expired: {by_state}")
        recorded_n = int(recorded[0]) if recorded else 0
        if recorded_n != report.decisions:
            report.lost += abs(report.decisions - recorded_n)
            report.lost_detail.append(f"senders got {report.decisions} verdicts, gov.messages holds {recorded_n}")
        if integrity.inconsistent:
            report.lost += len(integrity.inconsistent)
            report.lost_detail += [str(r) for r in integrity.inconsistent[:5]]
        in_flight = integrity.states.get("in_flight", 0)
        if in_flight:
            report.lost += in_flight
            report.lost_detail.append(f"{in_flight} messages still in flight after the drain")
        report.over_cap_users = len({o.user_id for o in integrity.over_cap})
        report.over_cap_detail = [str(o) for o in integrity.over_cap[:5]]
        report.spend_mismatches = len(integrity.spend_mismatches)
        order = {"runner": 1, "releaser": 2, "soak (main)": 3}
        report.memory = [
            {**asdict(m), "flat": m.flat}
            for m in sorted(memory.values(), key=lambda m: (order.get(m.role, 0), len(m.role), m.role))
        ]
        # the soak's own process holds the push service and the checks: reported, not judged
        report.memory_flat = all(m.flat is not False for m in memory.values() if m.role != "soak (main)")
    return report


@click.command("soak")
@option("--seconds", type=click.FloatRange(1), default=60.0, show_default=True, help="How long the load is held.")
@option("--senders", type=click.IntRange(1, 256), default=16, show_default=True,
              help="Concurrent sender processes.")
@option("--users", type=click.IntRange(1, 1_000_000), default=2000, show_default=True,
              help="Distinct users (each with one endpoint).")
@option("--policy", "policy_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Policy TOML for the scratch database (default: the soak's windows of seconds).")
@option("--drain-timeout", type=click.FloatRange(1), default=120.0, show_default=True,
              help="Seconds to wait for the outbox and due deferrals to drain.")
@option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@option("--database-url", envvar="GOV_DATABASE_URL", show_envvar=True, default=None,
              help="A server to create the scratch database on (needs CREATEDB). Default: embedded, temporary.")
def soak(
    seconds: float, senders: int, users: int, policy_file: Path | None, drain_timeout: float, as_json: bool,
    database_url: str | None,
) -> None:
    """Hold a load of senders, a runner and a releaser; then check nothing was lost."""
    text = policy_file.read_text(encoding="utf-8") if policy_file else SOAK_POLICY

    def progress(msg: str) -> None:
        click.echo(f"gov soak: {msg}", err=True)

    report = run_soak(
        database_url, seconds=seconds, senders=senders, users=users, policy_text=text,
        drain_timeout_s=drain_timeout, progress=progress,
    )
    if as_json:
        click.echo(json.dumps(report.as_json(), default=str))
    else:
        click.echo(report.text())
    if not report.ok:
        sys.exit(1)


def _main() -> None:
    # `python -m gov.lab.soak`: gov's own errors as one line, as the gov command line does
    from gov.errors import GovError, one_line

    try:
        soak(standalone_mode=True)
    except GovError as exc:
        click.echo(f"gov: error: {one_line(str(exc)) or type(exc).__name__}", err=True)
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    _main()


__all__ = [
    "SOAK_POLICY",
    "SoakReport",
    "run_soak",
    "soak",
]
