"""`gov check`, `gov prune`, `gov report` and `gov serve`: operating gov and reading what it did."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from gov.cli.common import FiniteRange, check_output_path, dsn, duration, option, parse_at, url_option
from gov.cli.common import console as make_console
from gov.errors import GovError


@click.command()
@option("--margin", default="1h", help="Keep send rows this long past the longest window.")
@option("--keep-history", default="180d", help="Keep suppressions and delivery attempts this long.")
@option("--batch", type=click.IntRange(1, 1_000_000), default=5000, help="Rows per delete transaction.")
@url_option
def prune(margin: str, keep_history: str, batch: int, database_url: str | None) -> None:
    """Delete what no window can see any more, in small batches (run from cron)."""
    from datetime import timedelta

    from gov.db import Source
    from gov.ops.maintenance import prune as run_prune
    from gov.policy import parse_duration

    try:
        margin_td = timedelta(milliseconds=parse_duration(margin, "--margin"))
        keep_td = timedelta(milliseconds=parse_duration(keep_history, "--keep-history"))
    except ValueError as exc:
        raise GovError(str(exc)) from None
    source = Source(dsn(database_url), pool_size=1)
    try:
        result = run_prune(source, margin=margin_td, keep_history=keep_td, batch=batch)
    finally:
        source.close()
    click.echo(json.dumps({"sends": result.sends, "history": result.history}))



# ---------------------------------------------------------------- gov report


@click.group("report")
def report() -> None:
    """Reports for analysts: fatigue by send position (or by weekly volume), revocation suspects."""


@report.command("fatigue")
@option("--by", "by", type=click.Choice(["position", "volume"]), default="position",
        help="position: the marginal measure, per send by the sends already received that week, per user "
        "segment; volume: the seeds' weekly report, users bucketed by weekly volume (capped at 8).")
@option("--since", default=None, help="The window: 28d (by position) or 7d (by volume) unless given; 24h, 90m…")
@option("--segment", default=None, help="By volume only: a campaign id prefix, engagement counts only its messages.")
@option("--min-events", type=click.IntRange(1), default=None,
        help="By position: clicks and unsubscribes a tested group of positions must hold (thin top positions "
        "merge); default 20.")
@option("--at", default=None, help="End the window at this ISO 8601 time instead of now.")
@option("--html", "html_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
        help="Also write a self-contained HTML page with charts to this file.")
@option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@url_option
def report_fatigue(
    by: str, since: str | None, segment: str | None, min_events: int | None, at: str | None,
    html_file: Path | None, as_json: bool, database_url: str | None,
) -> None:
    """Fatigue: what one more send costs in unsubscribes and earns in clicks, with the crossover.

    By position (the default): every accepted send by the sends the user had already
    received in the 7 days before it, per send, overall and per user segment, with 95 %
    intervals; the crossover is where unsubscribes overtake clicks for good. By volume:
    the seeds' weekly report, users bucketed by how many sends they received.
    """
    check_output_path(html_file, "--html")
    if by == "volume":
        if min_events is not None:
            raise GovError("--min-events belongs to --by position")
        _report_by_volume(since or "7d", segment, at, html_file, as_json, database_url)
        return
    if segment is not None:
        raise GovError("--segment (a campaign prefix) belongs to --by volume; --by position shows every user segment")
    from gov.analytics import marginal

    result = marginal.marginal_report(
        dsn(database_url), since=duration(since or "28d", "--since"), now=parse_at(at),
        min_events=min_events or marginal.DEFAULT_MIN_EVENTS,
    )
    if as_json:
        click.echo(json.dumps(result.as_json(), separators=(",", ":")))
    else:
        console = make_console()
        console.print(f"Marginal fatigue by send position ({marginal.window_text(result)})")
        for measure in result.segments:
            console.print(marginal.marginal_table(measure))
        if not result.segments:
            console.print("no accepted sends in the window")
    if html_file is not None:
        _write_page(html_file, marginal.marginal_html(result))


def _write_page(path: Path, page: str) -> None:
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise GovError(f"cannot write {path}: {exc.strerror}") from None
    click.echo(f"gov: report written to {path}", err=True)


def _report_by_volume(
    since: str, segment: str | None, at: str | None, html_file: Path | None, as_json: bool, database_url: str | None
) -> None:
    """The four fatigue signals by trailing-window send volume, with the crossover bucket."""
    from gov.analytics import report as report_mod

    window = duration(since, "--since")
    when = parse_at(at)
    url = dsn(database_url)
    result = report_mod.fatigue_report(url, since=window, segment=segment or None, now=when)
    if as_json:
        click.echo(json.dumps(result.as_json(), separators=(",", ":")))
    else:
        console = make_console()
        console.print(report_mod.fatigue_table(result))
        if not result.rows:
            console.print("no accepted sends in the window")
    if html_file is not None:
        suspects = len(report_mod.revocation_suspects(url, since=window, now=when))
        _write_page(html_file, report_mod.fatigue_html(result, suspects=suspects))


@report.command("suspects")
@option("--since", default="7d", help="The trailing window: 7d, 24h…")
@option("--min-accepted", type=click.IntRange(1), default=3, help="Accepted sends without a display to suspect.")
@option("--at", default=None, help="End the window at this ISO 8601 time instead of now.")
@url_option
def report_suspects(since: str, min_accepted: int, at: str | None, database_url: str | None) -> None:
    """Users whose sends are accepted but never displayed: revoked permission or an OS mute."""
    from rich.table import Table

    from gov.analytics import report as report_mod

    rows = report_mod.revocation_suspects(
        dsn(database_url), since=duration(since, "--since"), min_accepted=min_accepted, now=parse_at(at)
    )
    table = Table(title=f"Revocation suspects ({len(rows)})", title_justify="left")
    for name in ("user", "accepted", "first accepted", "last accepted", "last display", "live endpoints"):
        table.add_column(name)
    for s in rows:
        table.add_row(
            s.user_id, str(s.accepted), s.first_accepted_at.isoformat(timespec="seconds"),
            s.last_accepted_at.isoformat(timespec="seconds"),
            s.last_display_at.isoformat(timespec="seconds") if s.last_display_at else "never",
            str(s.live_subscriptions),
        )
    make_console().print(table)


# ---------------------------------------------------------------- gov check


@click.command("check")
@option("--stuck-after", default="15m", help="Alarm on outbox leases expired longer ago than this.")
@option("--at", default=None, help="Check as of this ISO 8601 time instead of now.")
@option("--json", "as_json", is_flag=True, help="Print every check as JSON on stdout.")
@option("--conservation", "conservation_since", default=None,
        help="Also prove every message decided in this trailing window (e.g. 7d) is in exactly one state.")
@url_option
def check(
    stuck_after: str, at: str | None, as_json: bool, conservation_since: str | None, database_url: str | None
) -> None:
    """Exit 1 with a one-line reason when something needs an operator (for cron); print ok otherwise.

    Checks: a P0 (exempt) suppression ever; outbox rows stuck in sending; a push service
    answering 401/403 in the last hour; held messages overdue (no releaser running); and
    with --conservation, that no message is in two states or none.
    """
    from gov.ops import health

    window = duration(stuck_after, "--stuck-after")
    url = dsn(database_url)
    now = parse_at(at)
    checks = health.run_checks(url, now=now, stuck_after=window)
    if conservation_since is not None:
        checks.append(health.conservation_check(url, since=duration(conservation_since, "--conservation"), now=now))
    if as_json:
        click.echo(json.dumps([{"check": c.name, "ok": c.ok, "detail": c.detail} for c in checks]))
    failure = health.summary(checks)
    if failure is not None:
        click.echo(f"gov: check failed: {failure}", err=True)
        sys.exit(1)
    if not as_json:
        click.echo("ok")


# ---------------------------------------------------------------- gov serve


@click.command("serve")
@option("--host", envvar="GOV_SERVE_HOST", default="127.0.0.1", help="Address to listen on (loopback by default).")
@option("--port", envvar="GOV_SERVE_PORT", type=click.IntRange(0, 65535), default=8080,
        help="Port to listen on (0: any free port, announced on stderr).")
@option("--pool-size", envvar="GOV_SERVE_POOL_SIZE", type=click.IntRange(1, 256), default=4,
        help="Database connections of the routes other than /internal/send (per process).")
@option("--workers", envvar="GOV_SERVE_WORKERS", type=click.IntRange(1, 64), default=1,
        help="Server processes, each with its own socket on the port (the kernel spreads new "
        "connections over them) and its own pools.")
@option("--batch-window-ms", envvar="GOV_SERVE_BATCH_WINDOW_MS", type=FiniteRange(0, 1000), default=1.0,
        help="How long a send may wait for others to be decided with it in one statement, while the "
        "database is busy with another batch (0: only those already waiting).")
@option("--batch-max", envvar="GOV_SERVE_BATCH_MAX", type=click.IntRange(1, 1000), default=64,
        help="Sends decided together at most (every user lock of a batch is held until it commits).")
@option("--batch-concurrency", envvar="GOV_SERVE_BATCH_CONCURRENCY", type=click.IntRange(1, 256), default=2,
        help="Batches decided at once per process, one database connection each (more: smaller batches; "
        "one: a batch waiting on a user's lock holds up every send).")
@option("--header-timeout", envvar="GOV_SERVE_HEADER_TIMEOUT", type=FiniteRange(0.1, 3600), default=10.0,
        help="Seconds a connection has to send a request's headers, from connecting or from the request's "
        "first byte; past it the connection is closed.")
@option("--body-timeout", envvar="GOV_SERVE_BODY_TIMEOUT", type=FiniteRange(0.1, 3600), default=15.0,
        help="Seconds a request's whole body has to arrive after its headers; past it the answer is 408 and "
        "the connection is closed.")
@option("--max-connections", envvar="GOV_SERVE_MAX_CONNECTIONS", type=click.IntRange(1, None), default=None,
        help="Connections held at once per process; one more is closed at once. Default: 4096, or less to stay "
        "below the open-file limit (ulimit -n); a value that would reach it is refused.")
@option("--access-log", is_flag=True, help="Log every request.")
@option("--demo", is_flag=True, envvar="GOV_SERVE_DEMO",
        help="Also serve /demo: subscribe this browser and send it a test notification (needs GOV_API_TOKEN).")
@url_option
def serve(host: str, port: int, pool_size: int, workers: int, batch_window_ms: float, batch_max: int,
          batch_concurrency: int, header_timeout: float, body_timeout: float, max_connections: int | None,
          access_log: bool, demo: bool, database_url: str | None) -> None:
    """Serve the HTTP API: /internal/send, /events, /users/{id}/preferences, /healthz, /metrics.

    Needs GOV_API_TOKEN (the bearer token of /internal and /users); refuses to start
    without it. With GOV_VAPID_PRIVATE_KEY set it also delivers at once; without, allowed
    messages wait in the outbox for `gov dispatch`. GOV_METRICS_TOKEN, if set, is a
    scrape-only bearer token for /metrics (which also takes GOV_API_TOKEN). It serves the
    service worker (/gov-sw.js) and the page helper (/gov.js); browsers subscribe at
    POST /subscriptions with a token the app signs under GOV_SUBSCRIBE_SECRET (or the file
    GOV_SUBSCRIBE_SECRET_FILE names). Beacons (POST /events) must echo the token each push
    carries, made under GOV_BEACON_SECRET (or the file GOV_BEACON_SECRET_FILE names; set it
    for the runners too; GOV_BEACON_SECRET_PREVIOUS is still accepted during a rotation):
    without it they are refused (501). --demo adds a page at /demo. What one client may hold
    is bounded: the header and body timeouts, 16 KiB and 100 headers a request (431), and
    --max-connections per process.
    """
    try:
        from gov.http import app as serve_mod
    except ImportError as exc:  # fastapi, pydantic and uvicorn are dependencies of gov: a broken install
        raise GovError(
            f"gov serve needs fastapi, pydantic and uvicorn (dependencies of gov; reinstall it): {exc}"
        ) from None

    from gov.delivery.beacon import keys_from_env
    from gov.http.tokens import secret_from_env

    token = os.environ.get(serve_mod.ENV_TOKEN)
    subscribe_secret = secret_from_env()
    beacon_keys = keys_from_env()
    signer = None
    if os.environ.get("GOV_VAPID_PRIVATE_KEY"):
        from gov.delivery.vapid import VapidSigner

        signer = VapidSigner.from_env()
    metrics_token = os.environ.get(serve_mod.ENV_METRICS_TOKEN) or None
    # every setting before the database is touched or a process forked: one line if wrong
    serve_mod.check_settings(token, metrics_token, workers=workers, batch_window_ms=batch_window_ms,
                             batch_max=batch_max, batch_concurrency=batch_concurrency, header_timeout=header_timeout,
                             body_timeout=body_timeout, max_connections=max_connections, pool_size=pool_size)
    serve_mod.serve(
        dsn(database_url, check_schema=True), token=token, host=host, port=port, signer=signer, pool_size=pool_size,
        access_log=access_log, metrics_token=metrics_token, subscribe_secret=subscribe_secret,
        beacon_keys=beacon_keys, demo=demo, workers=workers, batch_window_ms=batch_window_ms, batch_max=batch_max,
        batch_concurrency=batch_concurrency, header_timeout=header_timeout, body_timeout=body_timeout,
        max_connections=max_connections,
    )
