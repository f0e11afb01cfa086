"""`gov user`: a user's own time zone, quiet hours and lower caps."""

from __future__ import annotations

import click

from gov.cli.common import connect, option, url_option
from gov.errors import GovError


@click.group("user")
def user() -> None:
    """A user's own settings: time zone, quiet hours, lower caps."""


@user.command("set")
@option("--user", "user_id", required=True, help="The subscriber's stable user id.")
@option("--tz", default=None, help="IANA time zone (e.g. Europe/Berlin); quiet hours apply in it.")
@option("--quiet", default=None, help='Quiet hours in local time, e.g. "22:00-08:00"; "default" for the policy\'s.')
@option("--cap", "caps", multiple=True, help='A lower cap, SCOPE:WINDOW=N, e.g. "P2:24h=1" (repeatable).')
@url_option
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
    with connect(database_url) as conn, conn.transaction():
        if tz is not None:
            users.set_time_zone(conn, user_id, tz)
        if quiet is not None:
            users.set_quiet_hours(conn, user_id, quiet_window)
        for scope, window_ms, cap in parsed_caps:
            users.set_user_cap(conn, user_id, scope, window_ms, cap)
    click.echo(f"gov: user {user_id} updated", err=True)
