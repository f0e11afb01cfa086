"""`gov segments`: classify users into the policy's rule-based segments."""

from __future__ import annotations

import json

import click

from gov.cli.common import connect, option, parse_at, url_option


@click.group("segments")
def segments() -> None:
    """User segments: classify users as engaged, casual or dormant from the policy's rules.

    A policy may give a tier other windows per segment ([tiers.P2.segments.dormant]);
    `gov user set --segment NAME` puts a user in a segment of the app's own.
    """


@segments.command("refresh")
@option("--at", default=None, help="Classify as of this ISO 8601 time instead of the database clock.")
@option("--json", "as_json", is_flag=True, help="Print JSON instead of one line per segment.")
@url_option
def segments_refresh(at: str | None, as_json: bool, database_url: str | None) -> None:
    """Set every user's segment from the policy's [segments] rules, in one statement.

    Every user with a subscription or a decision becomes engaged (a click within
    engaged_within), dormant (no click for dormant_after, and known that long) or
    casual. Users the app put in a segment of its own name are left alone.
    """
    from gov import segments as segments_mod

    when = parse_at(at)
    with connect(database_url) as conn:
        rows = segments_mod.refresh(conn, when)
    if as_json:
        click.echo(json.dumps({r.segment: {"users": r.users, "changed": r.changed} for r in rows},
                              separators=(",", ":")))
        return
    for r in rows:
        click.echo(f"{r.segment}\t{r.users}\t{r.changed} changed")
    click.echo(f"gov: {sum(r.users for r in rows)} user(s) classified", err=True)
