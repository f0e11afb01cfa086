"""`gov policy`: show, apply and replay (what-if) the policy."""

from __future__ import annotations

import json
from pathlib import Path

import click

from gov.cli.common import check_output_path, connect, dsn, duration, option, parse_at, read_text_input, url_option
from gov.cli.common import console as make_console
from gov.errors import GovError


@click.group("policy")
def policy_group() -> None:
    """Show and apply the policy (tiers, windows, caps, quiet hours)."""


@policy_group.command("show")
@url_option
def policy_show(database_url: str | None) -> None:
    """Print the stored policy as TOML."""
    from gov import policy

    with connect(database_url) as conn:
        click.echo(policy.load_stored(conn).to_toml(), nl=False)


@policy_group.command("apply")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path, allow_dash=True))
@option("--dry-run", is_flag=True, help="Print the diff only; change nothing.")
@option("--drop-held", is_flag=True,
        help="If the policy removes a tier whose messages are held or queued, drop them (reason tier_removed).")
@option("--drop-user-caps", is_flag=True,
        help="If the policy takes away a window users' own caps lower, remove those caps (else it is refused).")
@url_option
def policy_apply(file: Path, dry_run: bool, drop_held: bool, drop_user_caps: bool, database_url: str | None) -> None:
    """Load a TOML policy FILE, print its diff against the stored one, and store it."""
    from gov import policy

    text, name = read_text_input(file)
    new = policy.parse_policy(text, name)
    for warning in new.warnings():
        click.echo(f"gov: warning: {warning}", err=True)
    with connect(database_url) as conn:
        delta = policy.diff(policy.load_stored(conn), new)
        click.echo(delta or "# no change\n", nl=False)
        retired = policy.apply(conn, new, text, name=name, drop_held=drop_held, drop_user_caps=drop_user_caps)
        if dry_run:
            conn.rollback()
            click.echo("gov: dry run, nothing applied", err=True)
            return
    for r in retired:
        if isinstance(r, policy.OrphanedCaps):
            click.echo(f"gov: users' own caps removed: {r.describe()}", err=True)
        else:
            click.echo(f"gov: tier {r.tier} removed: {r.held} held and {r.queued} queued message(s) dropped", err=True)
    click.echo("gov: policy applied", err=True)



@policy_group.command("whatif")
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
    from gov.analytics import whatif as whatif_mod

    text, name = read_text_input(file)
    candidate = policy.parse_policy(text, name)
    result = whatif_mod.whatif(
        dsn(database_url), candidate, text, since=duration(since, "--since"), now=parse_at(at)
    )
    if as_json:
        click.echo(json.dumps(result.as_json(), separators=(",", ":")))
        return
    console = make_console()
    total = result.total
    console.print(
        f"Replayed {total.messages} decision(s) of the last {since} under {name}: allowed {total.allowed} → "
        f"{total.would_allow}, {total.extra_suppressed} extra suppression(s), {total.freed} freed"
        " (a replay: nothing was written)."
    )
    console.print(
        "History before the window: every allowed message in gov.messages spends the budgets FILE has it "
        "spend, so a cap the live policy lacks (global, a topic, a tier's) counts the sends before the window "
        "too, as far back as gov.messages keeps them (decisions write send rows only for capped budgets)."
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


@policy_group.command("suggest")
@option("--since", default="28d", help="The window of accepted sends the measure reads.")
@option("--at", default=None, help="End the window at this ISO 8601 time instead of now.")
@option("--min-events", type=click.IntRange(1), default=None,
        help="Clicks and unsubscribes a tested group of positions must hold (thin top positions merge); default 20.")
@option("--out", "out_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
        help="Write the suggested policy to this file instead of stdout.")
@url_option
def policy_suggest(
    since: str, at: str | None, min_events: int | None, out_file: Path | None, database_url: str | None
) -> None:
    """Suggest weekly caps just below each crossover the fatigue measure confirms; change nothing.

    Prints the suggested policy as TOML (or writes it to --out), and on stderr what changed
    and why, and its diff against the stored policy. Try it with `gov policy whatif FILE`;
    apply it with `gov policy apply FILE`.
    """
    check_output_path(out_file, "--out")
    from gov import policy
    from gov.analytics import marginal
    from gov.analytics.suggest import suggest

    url = dsn(database_url)
    report = marginal.marginal_report(
        url, since=duration(since, "--since"), now=parse_at(at), min_events=min_events or marginal.DEFAULT_MIN_EVENTS
    )
    with connect(database_url) as conn:
        stored = policy.load_stored(conn)
    result = suggest(stored, report)
    for line in result.changes:
        click.echo(f"gov: {line}", err=True)
    for line in result.unchanged:
        click.echo(f"gov: unchanged, {line}", err=True)
    text = result.policy.to_toml()
    delta = policy.diff(stored, result.policy, "stored", "suggested")
    click.echo(delta or "# no change suggested\n", nl=False, err=True)
    if out_file is None:
        click.echo(text, nl=False)
        return
    try:
        out_file.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise GovError(f"cannot write {out_file}: {exc.strerror}") from None
    click.echo(f"gov: suggested policy written to {out_file}", err=True)
