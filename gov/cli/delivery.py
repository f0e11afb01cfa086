"""`gov dispatch`, `gov release` and `gov vapid`: what was allowed, delivered."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from gov.cli.common import FiniteRange, checked_connection, dsn, option, parse_at, url_option
from gov.cli.common import signer as load_signer


@click.group("vapid")
def vapid() -> None:
    """VAPID keys: the server's identity towards push services."""


@vapid.command("generate")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
def vapid_generate(path: Path) -> None:
    """Write a new private key to PATH (mode 0600); print the applicationServerKey."""
    from gov.delivery.vapid import generate_keypair

    click.echo(generate_keypair(path))
    click.echo(f"gov: private key written to {path}; set GOV_VAPID_PRIVATE_KEY={path}", err=True)



def deadlines_or_usage_error(lease: float, timeout: float) -> None:
    """``--lease`` and ``--timeout`` as a runner would check them, as a usage error (exit 2)."""
    from gov.delivery.deadlines import check_deadlines
    from gov.errors import ConfigurationError

    try:
        check_deadlines(lease, timeout)
    except ConfigurationError as exc:
        raise click.UsageError(f"--timeout/--lease: {exc}") from None


@click.command()
@option("--once", is_flag=True, help="Deliver what is due now, then exit (for cron and tests).")
@option("--workers", type=click.IntRange(1, 256), default=8, help="Concurrent HTTP requests per process.")
@option("--processes", type=click.IntRange(1, 256), default=None, show_default="the machine's cores",
        help="Runner processes, each with its own workers, connections and name; SIGTERM stops them all.")
@option("--lease", type=FiniteRange(0.1), default=60.0, help="Seconds a claimed row stays this runner's.")
@option("--timeout", type=FiniteRange(0.1), default=10.0,
        help="Seconds for a whole attempt (connect, send, read); shorter than --lease.")
@option("--batch", type=click.IntRange(1, 10_000), default=None,
        show_default="as many as the workers can attempt in one lease, at most 4 each",
        help="Rows claimed (and recorded) together; rows with no time left in the lease go back unsent.")
@option("--idle", type=FiniteRange(0.01, 86_400), default=1.0, help="Seconds between polls when idle.")
@option("--metrics-port", type=click.IntRange(0, 65535), default=None,
        help="Serve this runner's Prometheus metrics on http://127.0.0.1:PORT/metrics (0: any free port).")
@url_option
def dispatch(
    once: bool, workers: int, processes: int | None, lease: float, timeout: float, batch: int | None, idle: float,
    metrics_port: int | None, database_url: str | None,
) -> None:
    """Deliver the outbox through Web Push (loops until interrupted unless --once).

    Exits non-zero if a runner process fails.
    """
    import os

    from gov.delivery.beacon import keys_from_env

    # Every check before the first fork: a bad option in a forked runner is a traceback per
    # process and a misleading "a runner process failed" (issue 31).
    deadlines_or_usage_error(lease, timeout)
    signer = load_signer()
    beacon_keys = keys_from_env()  # a weak secret stops it here, in one line, before any process starts
    # The cron path: one connection reads the schema revision and, with --once, whether
    # anything is due at all; an empty outbox then costs no runner (no HTTP and encryption
    # code imported, no pool, no fork). The probe asks the claim's own condition, so it
    # never says "nothing" while a claim would find a row.
    with checked_connection(database_url) as (url, conn):
        due = not once or outbox_due(conn)
    if metrics_port is not None:
        # a port that cannot be served is a setting error, queue or no queue; and before the
        # processes start: the server sums them all (gov.ops.metrics.expose)
        from gov.ops.metrics import expose

        exposed = expose(metrics_port, processes=processes or os.cpu_count() or 1)
        click.echo(f"gov: metrics on http://127.0.0.1:{exposed.port}/metrics", err=True)
    if not due:
        click.echo(json.dumps({"attempts": 0, "outcomes": {}}))
        return
    if beacon_keys is None:  # (said once a runner starts, after the schema check: an error stays one line)
        click.echo("gov: no beacon secret (GOV_BEACON_SECRET): pushes carry no beacon token, "
                   "so gov serve refuses their beacons", err=True)

    from gov.delivery.processes import run_dispatchers
    from gov.delivery.runner import Dispatcher

    count = processes or os.cpu_count() or 1
    if count > 1:
        from gov.delivery.push import preload

        preload()  # once, in the parent: the forked runners share it
    result = run_dispatchers(
        lambda: Dispatcher(url, signer, workers=workers, batch=batch, lease_s=lease, timeout_s=timeout,
                           beacon_keys=beacon_keys),
        count, once=once, idle_s=idle,
    )
    if once:
        click.echo(json.dumps({"attempts": result.attempts, "outcomes": result.outcomes}))
    if not result.ok:
        click.echo(f"gov: error: a runner process failed (exit codes {result.exit_codes})", err=True)
        sys.exit(1)


def outbox_due(conn: Any) -> bool:
    """Whether any outbox row is due for a claim now (``gov dispatch --once`` asks first)."""
    from gov.queries import q

    row = conn.execute(q("outbox_due")).fetchone()
    return bool(row and row[0])


class DispatcherWhenNeeded:
    """A :class:`~gov.delivery.runner.Dispatcher` built at its first use: a release that
    queues nothing imports no HTTP or encryption code and opens no pool for it."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._runner: Any = None

    def run_once(self, **kwargs: Any) -> Any:
        if self._runner is None:
            self._runner = self._make()
        return self._runner.run_once(**kwargs)

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()


@click.command()
@option("--once", is_flag=True, help="Release what is due now, then exit (for cron).")
@option("--batch", type=click.IntRange(1, 10_000), default=200, help="Held messages per transaction.")
@option("--at", default=None, help="Release as of this ISO 8601 time (a simulation clock) instead of now.")
@option("--dispatch/--no-dispatch", default=True, help="Deliver what is released at once (needs the VAPID key).")
@option("--idle", type=FiniteRange(0.01, 86_400), default=5.0, help="Seconds between rounds when looping.")
@url_option
def release(once: bool, batch: int, at: str | None, dispatch: bool, idle: float, database_url: str | None) -> None:
    """Release deferred, quiet-held and collapsed messages whose time has come."""
    import signal
    import threading

    from gov.hold.release import Releaser
    from gov.ops.signals import setting

    when = parse_at(at, decides=True)
    clock = (lambda: when) if when is not None else None
    signer = load_signer() if dispatch else None  # a missing key is refused before any work

    def make_dispatcher() -> Any:
        from gov.delivery.runner import Dispatcher

        assert signer is not None  # made only when there is one
        return Dispatcher(url, signer, workers=4, clock=clock)

    runner = DispatcherWhenNeeded(make_dispatcher) if signer is not None else None
    try:
        if once:
            # the schema check and the release on one connection (autocommit: each batch
            # is its own transaction, as through a pool)
            with checked_connection(database_url) as (url, conn):
                stats = Releaser(conn, dispatcher=runner, batch=batch, clock=clock).run_once()
            click.echo(json.dumps({"released": dict(stats.outcomes), "delivered": stats.delivered}))
            return
        url = dsn(database_url, check_schema=True)
        releaser = Releaser(url, dispatcher=runner, batch=batch, clock=clock)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, setting(stop))  # (not stop.set: gov.ops.signals)
        try:
            releaser.run_forever(stop, idle_s=idle)
        except KeyboardInterrupt:
            stop.set()
    finally:
        if runner is not None:
            runner.close()
