"""Commands for analysts and operators (issue 5), attached to `gov` by :func:`register`:

    gov report fatigue [--since 7d] [--segment PREFIX] [--html FILE]
    gov report suspects [--since 7d] [--min-accepted 3]
    gov check [--stuck-after 15m]
    gov serve [--host 127.0.0.1] [--port 8080]
    gov policy whatif FILE [--since 7d]
    gov db grant-analyst ROLE

Also runnable on its own as ``python -m gov.cli_ops <args>`` (the whole `gov` CLI with
these commands attached).

This module does not import :mod:`gov.cli` at import time: ``gov/cli.py`` imports it
to register these commands. The shared helpers come from :mod:`gov.cli_common`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from gov.cli_common import dsn, duration, option, parse_at, read_text_input, url_option
from gov.errors import GovError

_dsn = dsn
_duration = duration
_parse_at = parse_at


def _console() -> Any:
    from rich.console import Console

    # a pipe or a file gets a wide table rather than rich's 80 columns
    return Console(width=None if sys.stdout.isatty() else 160, highlight=False)


# ---------------------------------------------------------------- gov report


@click.group("report")
def report() -> None:
    """Reports for analysts: fatigue by send volume, revocation suspects."""


@report.command("fatigue")
@option("--since", default="7d", help="The trailing window: 7d, 24h, 90m…")
@option("--segment", default=None, help="Campaign id prefix: engagement counts only its messages.")
@option("--at", default=None, help="End the window at this ISO 8601 time instead of now.")
@option("--html", "html_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
        help="Also write a self-contained HTML page with charts to this file.")
@option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@url_option
def report_fatigue(
    since: str, segment: str | None, at: str | None, html_file: Path | None, as_json: bool, database_url: str | None
) -> None:
    """The four fatigue signals by trailing-window send volume, with the crossover."""
    from gov import report as report_mod

    window = _duration(since, "--since")
    when = _parse_at(at)
    dsn = _dsn(database_url)
    result = report_mod.fatigue_report(dsn, since=window, segment=segment or None, now=when)
    if as_json:
        click.echo(json.dumps(result.as_json(), separators=(",", ":")))
    else:
        console = _console()
        console.print(report_mod.fatigue_table(result))
        if not result.rows:
            console.print("no accepted sends in the window")
    if html_file is not None:
        suspects = len(report_mod.revocation_suspects(dsn, since=window, now=when))
        try:
            html_file.write_text(report_mod.fatigue_html(result, suspects=suspects), encoding="utf-8")
        except OSError as exc:
            raise GovError(f"cannot write {html_file}: {exc.strerror}") from None
        click.echo(f"gov: report written to {html_file}", err=True)


@report.command("suspects")
@option("--since", default="7d", help="The trailing window: 7d, 24h…")
@option("--min-accepted", type=click.IntRange(1), default=3, help="Accepted sends without a display to suspect.")
@option("--at", default=None, help="End the window at this ISO 8601 time instead of now.")
@url_option
def report_suspects(since: str, min_accepted: int, at: str | None, database_url: str | None) -> None:
    """Users whose sends are accepted but never displayed: revoked permission or an OS mute."""
    from rich.table import Table

    from gov import report as report_mod

    rows = report_mod.revocation_suspects(
        _dsn(database_url), since=_duration(since, "--since"), min_accepted=min_accepted, now=_parse_at(at)
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
    _console().print(table)


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
    from gov import health

    window = _duration(stuck_after, "--stuck-after")
    dsn = _dsn(database_url)
    now = _parse_at(at)
    checks = health.run_checks(dsn, now=now, stuck_after=window)
    if conservation_since is not None:
        checks.append(health.conservation_check(dsn, since=_duration(conservation_since, "--conservation"), now=now))
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
@option("--pool-size", type=click.IntRange(1, 256), default=8, help="Database connections.")
@option("--access-log", is_flag=True, help="Log every request.")
@url_option
def serve(host: str, port: int, pool_size: int, access_log: bool, database_url: str | None) -> None:
    """Serve the HTTP API: /internal/send, /events, /users/{id}/preferences, /healthz, /metrics.

    Needs GOV_API_TOKEN (the bearer token of /internal and /users); refuses to start
    without it. With GOV_VAPID_PRIVATE_KEY set it also delivers at once; without, allowed
    messages wait in the outbox for `gov dispatch`. GOV_METRICS_TOKEN, if set, is a
    scrape-only bearer token for /metrics (which also takes GOV_API_TOKEN).
    """
    try:
        from gov import serve as serve_mod
    except ImportError as exc:  # starlette and uvicorn are dependencies of gov: a broken install
        raise GovError(f"gov serve needs starlette and uvicorn (dependencies of gov; reinstall it): {exc}") from None

    token = os.environ.get(serve_mod.ENV_TOKEN)
    signer = None
    if os.environ.get("GOV_VAPID_PRIVATE_KEY"):
        from gov.vapid import VapidSigner

        signer = VapidSigner.from_env()
    serve_mod.serve(
        _dsn(database_url, check_schema=True), token=token, host=host, port=port, signer=signer, pool_size=pool_size,
        access_log=access_log, metrics_token=os.environ.get(serve_mod.ENV_METRICS_TOKEN) or None,
    )


# ---------------------------------------------------------------- gov policy whatif


@click.command("whatif")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path, allow_dash=True))
@option("--since", default="7d", help="Replay the decisions of this trailing window.")
@option("--at", default=None, help="End the window at this ISO 8601 time instead of now.")
@option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@url_option
def whatif(file: Path, since: str, at: str | None, as_json: bool, database_url: str | None) -> None:
    """Replay the window's decisions under the policy in FILE; change nothing.

    Prints, per tier, topic and campaign, the messages allowed as recorded and under
    FILE, and the extra suppressions FILE would have caused (and those it would free).
    """
    from rich.table import Table

    from gov import policy
    from gov import whatif as whatif_mod

    text, name = read_text_input(file)
    candidate = policy.parse_policy(text, name)
    result = whatif_mod.whatif(
        _dsn(database_url), candidate, text, since=_duration(since, "--since"), now=_parse_at(at)
    )
    if as_json:
        click.echo(json.dumps(result.as_json(), separators=(",", ":")))
        return
    console = _console()
    total = result.total
    console.print(
        f"Replayed {total.messages} decision(s) of the last {since} under {name}: allowed {total.allowed} → "
        f"{total.would_allow}, {total.extra_suppressed} extra suppression(s), {total.freed} freed. Nothing changed."
    )
    for dim, title in (("tier", "tier"), ("topic", "topic"), ("campaign", "campaign"), ("reason", "replayed reason")):
        rows = result.by(dim)
        if not rows:
            continue
        table = Table(title=f"by {title}", title_justify="left")
        for col in (title, "messages", "allowed", "would allow", "extra suppressed", "freed"):
            table.add_column(col, justify="left" if col == title else "right")
        for r in rows:
            key = r.key if r.key is not None else ("(allowed)" if dim == "reason" else "(none)")
            table.add_row(key, str(r.messages), str(r.allowed), str(r.would_allow), str(r.extra_suppressed),
                          str(r.freed))
        console.print(table)


# ---------------------------------------------------------------- gov db grant-analyst


def grant_analyst_role(conn: Any, role: str) -> bool:
    """Give ``role`` read-only access for analysts; create it (NOLOGIN) if missing.

    Returns True when the role was created. Grants USAGE on schema gov and SELECT on the
    analysts' tables and views, and on gov.subscriptions only the columns id, user_id,
    created_at, retired_at, retired_reason (the endpoint is a capability URL, p256dh and
    auth are keys). Grants nothing else and revokes nothing; run it again after an
    upgrade that adds views. Runs in ``conn``'s transaction.
    """
    from psycopg import sql

    from gov.db import translate_errors
    from gov.queries import q

    if not isinstance(role, str) or not role or len(role) > 63 or "\x00" in role:
        raise GovError(f"invalid role name {role!r} (1 to 63 characters)")
    ident = sql.Identifier(role)
    with translate_errors(), conn.transaction():
        row = conn.execute(q("role_exists"), {"role": role}).fetchone()
        created = not (row and row[0])
        if created:
            conn.execute(sql.SQL(q("create_analyst_role")).format(role=ident))
        for name in ("grant_analyst_schema", "grant_analyst_select", "grant_analyst_subscription_columns"):
            conn.execute(sql.SQL(q(name)).format(role=ident))
    return created


@click.command("grant-analyst")
@click.argument("role")
@url_option
def grant_analyst(role: str, database_url: str | None) -> None:
    """Give ROLE read-only access to the analysts' tables and views (created NOLOGIN if missing).

    Log in as a member of it: GRANT ROLE TO alice; never as ROLE itself unless you give it LOGIN.
    """
    import psycopg

    from gov.db import translate_errors

    with translate_errors(), psycopg.connect(_dsn(database_url)) as conn:
        created = grant_analyst_role(conn, role)
    click.echo(f"gov: role {role} {'created (NOLOGIN) and ' if created else ''}granted read-only analyst access",
               err=True)


# ---------------------------------------------------------------- registration


def register(main: click.Group, policy_group: click.Group, db_group: click.Group) -> None:
    """Attach these commands: report, check and serve to `gov`; whatif to `gov policy`;
    grant-analyst to `gov db`. Attaching twice replaces, so it is harmless."""
    main.add_command(report)
    main.add_command(check)
    main.add_command(serve)
    policy_group.add_command(whatif)
    db_group.add_command(grant_analyst)


def run() -> None:
    """``python -m gov.cli_ops``: the `gov` command line with these commands attached."""
    from gov.cli import db, main, policy_group

    register(main, policy_group, db)
    main()


if __name__ == "__main__":  # pragma: no cover
    run()
