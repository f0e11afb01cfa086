"""`gov user`: a user's own time zone, quiet hours, lower caps and segment."""

from __future__ import annotations

import click

from gov.cli.common import connect, option, url_option
from gov.errors import GovError


@click.group("user")
def user() -> None:
    """A user's own settings: time zone, quiet hours, lower caps, segment."""


@user.command("set")
@option("--user", "user_id", required=True, help="The subscriber's stable user id.")
@option("--tz", default=None, help="IANA time zone (e.g. Europe/Berlin); quiet hours apply in it.")
@option("--quiet", default=None, help='Quiet hours in local time, e.g. "22:00-08:00"; "default" for the policy\'s.')
@option("--cap", "caps", multiple=True, help='A lower cap, SCOPE:WINDOW=N, e.g. "P2:24h=1" (repeatable).')
@option("--segment", default=None,
        help='Put the user in a segment (e.g. "vip"; "none" for none). A name other than engaged, casual or '
             "dormant is the app's own: `gov segments refresh` leaves the user alone.")
@url_option
def user_set(
    user_id: str, tz: str | None, quiet: str | None, caps: tuple[str, ...], segment: str | None,
    database_url: str | None,
) -> None:
    """Set a user's time zone, quiet hours, own (lower) caps and segment, all or nothing."""
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
    seen: set[tuple[str, int]] = set()
    for spec, (scope, window_ms, _) in zip(caps, parsed_caps, strict=True):
        if (scope, window_ms) in seen:  # the last one silently won: which did the operator mean?
            raise GovError(f"--cap {spec!r}: {scope} over that window is given twice; give each window once")
        seen.add((scope, window_ms))
    quiet_window = None if quiet in (None, "default") else users.parse_quiet(quiet)
    with connect(database_url) as conn, conn.transaction():
        if tz is not None:
            users.set_time_zone(conn, user_id, tz)
        if quiet is not None:
            users.set_quiet_hours(conn, user_id, quiet_window)
        for scope, window_ms, cap in parsed_caps:
            users.set_user_cap(conn, user_id, scope, window_ms, cap)
        if segment is not None:
            users.set_segment(conn, user_id, None if segment == "none" else segment)
    click.echo(f"gov: user {user_id} updated", err=True)
