"""The `gov` command line: a thin shell over the library.

Data goes to stdout, messages to stderr; a failure is one line on stderr and exit 1.
Every option can come from a GOV_* environment variable (shown in --help).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from gov.cli_common import dsn as _dsn
from gov.cli_common import option, read_stream, read_text_input
from gov.cli_common import parse_at as _parse_at
from gov.cli_common import url_option as _url_option
from gov.errors import GovError
from gov.message import MAX_TTL_S

if TYPE_CHECKING:
    import psycopg

# Commands defined in other modules, imported only when run (or listed by --help): a
# command imports what it uses, so `gov dispatch --once` starts without alembic, the
# simulator or the web server. "name": "module:attribute".
_LAZY_MAIN = {
    "bench": "gov.bench.cli:bench",
    "check": "gov.cli_ops:check",
    "report": "gov.cli_ops:report",
    "serve": "gov.cli_ops:serve",
    "simulate": "gov.simulate.cli:simulate",
    "soak": "gov.soak:soak",
}
_LAZY_POLICY = {"whatif": "gov.cli_ops:whatif"}
_LAZY_DB = {"grant-analyst": "gov.cli_ops:grant_analyst"}


class _Group(click.Group):
    """Turns gov's own errors into one line on stderr and exit 1 (no traceback), and
    imports the commands named in ``lazy`` ({name: "module:attribute"}) on first use."""

    def __init__(self, *args: Any, lazy: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is None and name in self.lazy:
            import importlib

            module, _, attribute = self.lazy[name].partition(":")
            command = getattr(importlib.import_module(module), attribute)
            self.add_command(command, name)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GovError as exc:
            click.echo(f"gov: error: {exc}", err=True)
            sys.exit(1)


@contextmanager
def _connect(url: str | None) -> Iterator[psycopg.Connection[Any]]:
    import psycopg

    from gov.db import translate_errors

    with translate_errors(), psycopg.connect(_dsn(url)) as conn:
        yield conn


@click.group(cls=_Group, lazy=_LAZY_MAIN, context_settings={"auto_envvar_prefix": "GOV", "show_default": True})
@click.version_option(package_name="gov")
def main() -> None:
    """gov: the send-rate governor for web push, in PostgreSQL."""


# ---------------------------------------------------------------- gov db


@main.group(cls=_Group, lazy=_LAZY_DB)
def db() -> None:
    """Schema migrations and the embedded server."""


@db.command("upgrade")
@_url_option
def db_upgrade(database_url: str | None) -> None:
    """Migrate the database to the newest schema (and apply the default policy if none)."""
    from gov import migrate
    from gov.db import resolve_url, translate_errors

    with translate_errors():
        migrate.upgrade(resolve_url(database_url))
    click.echo(f"gov: schema at {migrate.head()}", err=True)


@db.command("check")
@_url_option
def db_check(database_url: str | None) -> None:
    """Exit non-zero while migrations are pending."""
    from gov import migrate
    from gov.db import resolve_url, translate_errors

    with translate_errors():
        todo = migrate.pending(resolve_url(database_url))
    if todo:
        click.echo(f"gov: {len(todo)} migration(s) pending: {', '.join(todo)}; run `gov db upgrade`", err=True)
        sys.exit(1)
    click.echo(f"gov: schema at {migrate.head()}, nothing pending", err=True)


@db.command("stop")
def db_stop() -> None:
    """Stop the embedded PostgreSQL under $GOV_DATA_DIR, if it runs."""
    from gov.db import stop_embedded

    click.echo("gov: embedded server stopped" if stop_embedded() else "gov: no embedded server running", err=True)


# ---------------------------------------------------------------- gov policy


@main.group("policy", cls=_Group, lazy=_LAZY_POLICY)
def policy_group() -> None:
    """Show and apply the policy (tiers, windows, caps, quiet hours)."""


@policy_group.command("show")
@_url_option
def policy_show(database_url: str | None) -> None:
    """Print the stored policy as TOML."""
    from gov import policy

    with _connect(database_url) as conn:
        click.echo(policy.load_stored(conn).to_toml(), nl=False)


@policy_group.command("apply")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path, allow_dash=True))
@option("--dry-run", is_flag=True, help="Print the diff only; change nothing.")
@option("--drop-held", is_flag=True,
        help="If the policy removes a tier whose messages are held or queued, drop them (reason tier_removed).")
@_url_option
def policy_apply(file: Path, dry_run: bool, drop_held: bool, database_url: str | None) -> None:
    """Load a TOML policy FILE, print its diff against the stored one, and store it."""
    from gov import policy

    text, name = read_text_input(file)
    new = policy.parse_policy(text, name)
    for warning in new.warnings():
        click.echo(f"gov: warning: {warning}", err=True)
    with _connect(database_url) as conn:
        delta = policy.diff(policy.load_stored(conn), new)
        click.echo(delta or "# no change\n", nl=False)
        retired = policy.apply(conn, new, text, name=name, drop_held=drop_held)
        if dry_run:
            conn.rollback()
            click.echo("gov: dry run, nothing applied", err=True)
            return
    for r in retired:
        click.echo(f"gov: tier {r.tier} removed: {r.held} held and {r.queued} queued message(s) dropped", err=True)
    click.echo("gov: policy applied", err=True)


# ---------------------------------------------------------------- gov decide


@main.command()
@option("--user", "user_id", required=True, help="The subscriber's stable user id.")
@option("--tier", required=True, help="Priority tier: P0 (transactional) to P3 (digest).")
@option("--id", "message_id", required=True, help="The message's stable id (idempotency key).")
@option("--topic", default=None, help="Topic, for per-topic caps.")
@option("--campaign", default=None, help="Campaign id, logged with a suppression.")
@option("--at", default=None, help="Decide at this ISO 8601 time instead of the database clock.")
@_url_option
def decide(
    user_id: str,
    tier: str,
    message_id: str,
    topic: str | None,
    campaign: str | None,
    at: str | None,
    database_url: str | None,
) -> None:
    """Decide allow or suppress for one message; print the verdict as JSON."""
    from gov.governor import Governor
    from gov.message import Message

    message = Message(user_id=user_id, id=message_id, tier=tier, topic=topic, campaign_id=campaign)
    when = _parse_at(at)
    with Governor(_dsn(database_url), pool_size=1) as gov:
        verdict = gov.decide(message, at=when)
    click.echo(json.dumps(verdict.as_json(), separators=(",", ":")))


# ---------------------------------------------------------------- delivery


def _signer() -> Any:
    from gov.vapid import VapidSigner

    # checked once at start: a sender with no or a wrong key refuses to start
    return VapidSigner.from_env()


@main.command()
@option("--user", "user_id", required=True, help="The subscriber's stable user id.")
@click.argument("file", type=click.File("rb"), default="-")
@_url_option
def subscribe(user_id: str, file: Any, database_url: str | None) -> None:
    """Store a browser's PushSubscription JSON (FILE, or - for stdin) for a user."""
    from gov.governor import Governor

    data = read_stream(file, "the subscription")
    with Governor(_dsn(database_url), pool_size=1) as gov:
        sub_id = gov.subscribe(user_id, data)
    click.echo(json.dumps({"subscription_id": sub_id}))


@main.group()
def vapid() -> None:
    """VAPID keys: the server's identity towards push services."""


@vapid.command("generate")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
def vapid_generate(path: Path) -> None:
    """Write a new private key to PATH (mode 0600); print the applicationServerKey."""
    from gov.vapid import generate_keypair

    click.echo(generate_keypair(path))
    click.echo(f"gov: private key written to {path}; set GOV_VAPID_PRIVATE_KEY={path}", err=True)


@main.command()
@option("--user", "user_id", required=True, help="The subscriber's stable user id.")
@option("--tier", required=True, help="Priority tier: P0 (transactional) to P3 (digest).")
@option("--id", "message_id", required=True, help="The message's stable id (idempotency key).")
@option("--title", required=True, help="Notification title.")
@option("--body", default=None, help="Notification body.")
@option("--url", default=None, help="URL opened on click.")
@option("--topic", default=None, help="Topic, for per-topic caps.")
@option("--collapse-key", default=None, help="Messages with one key replace each other (tag and Topic).")
@option("--ttl", type=click.IntRange(1, MAX_TTL_S), default=None, help="Seconds the push service keeps it.")
@option("--campaign", default=None, help="Campaign id, logged with a suppression.")
@option("--at", default=None, help="Decide at this ISO 8601 time instead of the database clock.")
@option("--deliver/--no-deliver", default=True, help="Attempt delivery now (else leave it to gov dispatch).")
@_url_option
def send(
    user_id: str,
    tier: str,
    message_id: str,
    title: str,
    body: str | None,
    url: str | None,
    topic: str | None,
    collapse_key: str | None,
    ttl: int | None,
    campaign: str | None,
    at: str | None,
    deliver: bool,
    database_url: str | None,
) -> None:
    """Send one message through the governor; print {"sent": …} as JSON."""
    from gov.governor import Governor
    from gov.message import Message

    message = Message(
        user_id=user_id, id=message_id, tier=tier, topic=topic, campaign_id=campaign,
        title=title, body=body, url=url, collapse_key=collapse_key, ttl=ttl,
    )
    message.content()  # refuse a bad payload before touching the database
    when = _parse_at(at)
    signer = _signer() if deliver else None
    with Governor(_dsn(database_url), pool_size=2, signer=signer) as gov:
        result = gov.send(message, at=when, deliver=deliver)
    click.echo(json.dumps(result.as_json(), separators=(",", ":")))


@main.command()
@option("--once", is_flag=True, help="Deliver what is due now, then exit (for cron and tests).")
@option("--workers", type=click.IntRange(1, 256), default=8, help="Concurrent HTTP requests per process.")
@option("--processes", type=click.IntRange(1, 256), default=None, show_default="the machine's cores",
        help="Runner processes, each with its own workers, connections and name; SIGTERM stops them all.")
@option("--lease", type=click.FloatRange(0.1), default=60.0, help="Seconds a claimed row stays this runner's.")
@option("--timeout", type=click.FloatRange(0.1), default=10.0,
        help="Seconds for a whole attempt (connect, send, read); shorter than --lease.")
@option("--batch", type=click.IntRange(1, 10_000), default=None,
        show_default="as many as the workers can attempt in one lease, at most 4 each",
        help="Rows claimed (and recorded) together; rows with no time left in the lease go back unsent.")
@option("--idle", type=click.FloatRange(0.01), default=1.0, help="Seconds between polls when idle.")
@option("--metrics-port", type=click.IntRange(0, 65535), default=None,
        help="Serve this runner's Prometheus metrics on http://127.0.0.1:PORT/metrics (0: any free port).")
@_url_option
def dispatch(
    once: bool, workers: int, processes: int | None, lease: float, timeout: float, batch: int | None, idle: float,
    metrics_port: int | None, database_url: str | None,
) -> None:
    """Deliver the outbox through Web Push (loops until interrupted unless --once).

    Exits non-zero if a runner process fails.
    """
    import os

    from gov.delivery import Dispatcher
    from gov.processes import run_dispatchers

    signer = _signer()
    dsn = _dsn(database_url, check_schema=True)
    count = processes or os.cpu_count() or 1
    if metrics_port is not None:  # before the processes start: the server sums them all (gov.metrics.expose)
        from gov.metrics import expose

        exposed = expose(metrics_port, processes=count)
        click.echo(f"gov: metrics on http://127.0.0.1:{exposed.port}/metrics", err=True)
    if count > 1:
        from gov.push import preload

        preload()  # once, in the parent: the forked runners share it
    result = run_dispatchers(
        lambda: Dispatcher(dsn, signer, workers=workers, batch=batch, lease_s=lease, timeout_s=timeout),
        count, once=once, idle_s=idle,
    )
    if once:
        click.echo(json.dumps({"attempts": result.attempts, "outcomes": result.outcomes}))
    if not result.ok:
        click.echo(f"gov: error: a runner process failed (exit codes {result.exit_codes})", err=True)
        sys.exit(1)


@main.command()
@option("--once", is_flag=True, help="Release what is due now, then exit (for cron).")
@option("--batch", type=click.IntRange(1, 10_000), default=200, help="Held messages per transaction.")
@option("--at", default=None, help="Release as of this ISO 8601 time (a simulation clock) instead of now.")
@option("--dispatch/--no-dispatch", default=True, help="Deliver what is released at once (needs the VAPID key).")
@option("--idle", type=click.FloatRange(0.01), default=5.0, help="Seconds between rounds when looping.")
@_url_option
def release(once: bool, batch: int, at: str | None, dispatch: bool, idle: float, database_url: str | None) -> None:
    """Release deferred, quiet-held and collapsed messages whose time has come."""
    import signal
    import threading

    from gov.delivery import Dispatcher
    from gov.queue import Releaser

    when = _parse_at(at)
    clock = (lambda: when) if when is not None else None
    dsn = _dsn(database_url, check_schema=True)
    runner = Dispatcher(dsn, _signer(), workers=4, clock=clock) if dispatch else None
    try:
        releaser = Releaser(runner.source if runner else dsn, dispatcher=runner, batch=batch, clock=clock)
        if once:
            stats = releaser.run_once()
            click.echo(json.dumps({"released": dict(stats.outcomes), "delivered": stats.delivered}))
            return
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            releaser.run_forever(stop, idle_s=idle)
        except KeyboardInterrupt:
            stop.set()
    finally:
        if runner is not None:
            runner.close()


@main.command("send-campaign")
@option("--users", "users_file", type=click.File("rb"), required=True, help="User ids, one per line (- for stdin).")
@option("--tier", required=True, help="Priority tier: P0 (transactional) to P3 (digest).")
@option("--id", "message_id", required=True, help="The campaign message's stable id (one per user).")
@option("--title", required=True, help="Notification title.")
@option("--body", default=None, help="Notification body.")
@option("--url", default=None, help="URL opened on click.")
@option("--topic", default=None, help="Topic, for per-topic caps.")
@option("--collapse-key", default=None, help="Messages with one key replace each other.")
@option("--ttl", type=click.IntRange(1, MAX_TTL_S), default=None, help="Seconds the push service keeps it.")
@option("--campaign", default=None, help="Campaign id, logged with each suppression.")
@option("--batch", type=click.IntRange(1, 5000), default=500, help="Users per transaction.")
@option("--at", default=None, help="Decide at this ISO 8601 time instead of the database clock.")
@_url_option
def send_campaign(
    users_file: Any, tier: str, message_id: str, title: str, body: str | None, url: str | None,
    topic: str | None, collapse_key: str | None, ttl: int | None, campaign: str | None, batch: int,
    at: str | None, database_url: str | None,
) -> None:
    """Send one message to a whole audience, decided in batches; gov dispatch delivers it."""
    from collections import Counter

    from gov.governor import Governor
    from gov.message import Message

    template = Message(
        user_id="-", id=message_id, tier=tier, topic=topic, campaign_id=campaign,
        title=title, body=body, url=url, collapse_key=collapse_key, ttl=ttl,
    )
    template.content()
    user_ids = [line.strip() for line in read_stream(users_file, "--users").splitlines() if line.strip()]
    with Governor(_dsn(database_url), pool_size=1) as gov:
        results = gov.send_many(template, user_ids, at=_parse_at(at), batch=batch)
    outcome = Counter("sent" if r.sent else f"{r.decision.action}:{r.decision.reason}" for _, r in results)
    click.echo(json.dumps({"users": len(results), **dict(sorted(outcome.items()))}))


@main.command()
@option("--margin", default="1h", help="Keep send rows this long past the longest window.")
@option("--keep-history", default="180d", help="Keep suppressions and delivery attempts this long.")
@option("--batch", type=click.IntRange(1, 1_000_000), default=5000, help="Rows per delete transaction.")
@_url_option
def prune(margin: str, keep_history: str, batch: int, database_url: str | None) -> None:
    """Delete what no window can see any more, in small batches (run from cron)."""
    from datetime import timedelta

    from gov.db import Source
    from gov.maintenance import prune as run_prune
    from gov.policy import parse_duration

    try:
        margin_td = timedelta(milliseconds=parse_duration(margin, "--margin"))
        keep_td = timedelta(milliseconds=parse_duration(keep_history, "--keep-history"))
    except ValueError as exc:
        raise GovError(str(exc)) from None
    source = Source(_dsn(database_url), pool_size=1)
    try:
        result = run_prune(source, margin=margin_td, keep_history=keep_td, batch=batch)
    finally:
        source.close()
    click.echo(json.dumps({"sends": result.sends, "history": result.history}))


@main.group()
def user() -> None:
    """A user's own settings: time zone, quiet hours, lower caps."""


@user.command("set")
@option("--user", "user_id", required=True, help="The subscriber's stable user id.")
@option("--tz", default=None, help="IANA time zone (e.g. Europe/Berlin); quiet hours apply in it.")
@option("--quiet", default=None, help='Quiet hours in local time, e.g. "22:00-08:00"; "default" for the policy\'s.')
@option("--cap", "caps", multiple=True, help='A lower cap, SCOPE:WINDOW=N, e.g. "P2:24h=1" (repeatable).')
@_url_option
def user_set(user_id: str, tz: str | None, quiet: str | None, caps: tuple[str, ...], database_url: str | None) -> None:
    """Set a user's time zone, quiet hours and own (lower) caps, all or nothing."""
    from gov import users
    from gov.policy import parse_duration

    parsed_caps = []
    for spec in caps:
        scope, _, rest = spec.partition(":")
        window, _, number = rest.partition("=")
        try:
            parsed_caps.append((scope, parse_duration(window, "--cap window"), int(number)))
        except ValueError:
            raise GovError(f"--cap {spec!r}: expected SCOPE:WINDOW=N, e.g. P2:24h=1") from None
    quiet_window = None if quiet in (None, "default") else users.parse_quiet(quiet)
    with _connect(database_url) as conn, conn.transaction():
        if tz is not None:
            users.set_time_zone(conn, user_id, tz)
        if quiet is not None:
            users.set_quiet_hours(conn, user_id, quiet_window)
        for scope, window_ms, cap in parsed_caps:
            users.set_user_cap(conn, user_id, scope, window_ms, cap)
    click.echo(f"gov: user {user_id} updated", err=True)


if __name__ == "__main__":  # pragma: no cover
    main()
