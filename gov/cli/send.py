"""`gov decide`, `gov send`, `gov send-campaign` and `gov subscribe`: messages into the governor."""

from __future__ import annotations

import json
from typing import Any

import click

from gov.cli.common import dsn, duration, option, parse_at, read_stream, url_option
from gov.cli.common import signer as load_signer
from gov.errors import GovError
from gov.message import MAX_TTL_S


@click.command()
@option("--user", "user_id", required=True, help="The subscriber's stable user id.")
@option("--tier", required=True, help="Priority tier: P0 (transactional) to P3 (digest).")
@option("--id", "message_id", required=True, help="The message's stable id (idempotency key).")
@option("--topic", default=None, help="Topic, for per-topic caps.")
@option("--campaign", default=None, help="Campaign id, logged with a suppression.")
@option("--at", default=None, help="Decide at this ISO 8601 time instead of the database clock.")
@url_option
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
    when = parse_at(at, decides=True)
    with Governor(dsn(database_url), pool_size=1) as gov:
        verdict = gov.decide(message, at=when)
    click.echo(json.dumps(verdict.as_json(), separators=(",", ":")))



@click.command()
@option("--user", "user_id", required=True, help="The subscriber's stable user id.")
@click.argument("file", type=click.File("rb"), default="-")
@url_option
def subscribe(user_id: str, file: Any, database_url: str | None) -> None:
    """Store a browser's PushSubscription JSON (FILE, or - for stdin) for a user."""
    from gov.governor import Governor

    data = read_stream(file, "the subscription")
    with Governor(dsn(database_url), pool_size=1) as gov:
        sub_id = gov.subscribe(user_id, data)
    click.echo(json.dumps({"subscription_id": sub_id}))



@click.command()
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
@url_option
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
    when = parse_at(at, decides=True)
    signer = load_signer() if deliver else None
    with Governor(dsn(database_url), pool_size=2, signer=signer) as gov:
        result = gov.send(message, at=when, deliver=deliver)
    click.echo(json.dumps(result.as_json(), separators=(",", ":")))



@click.command("send-campaign")
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
@option(
    "--connections", type=click.IntRange(1, 64), default=4,
    help="Slices of the audience (in user order) decided at once, one connection each.",
)
@option(
    "--at", default=None,
    help="Decide at this ISO 8601 time instead of the database clock; or 'best': decide every user now "
         "and deliver each at the best hour of their estimate within --within.",
)
@option("--within", default=None, help="With --at best: how long a delivery may wait for its hour (default 24h, "
                                       "at most 7d).")
@url_option
def send_campaign(
    users_file: Any, tier: str, message_id: str, title: str, body: str | None, url: str | None,
    topic: str | None, collapse_key: str | None, ttl: int | None, campaign: str | None, batch: int,
    connections: int, at: str | None, within: str | None, database_url: str | None,
) -> None:
    """Send one message to a whole audience, decided in batches; gov dispatch delivers it."""
    from collections import Counter
    from datetime import timedelta

    from gov.governor import Governor
    from gov.message import Message

    best_within = None
    if at == "best":
        try:
            best_within = duration(within or "24h", "--within")
        except GovError as exc:
            raise click.UsageError(str(exc)) from None
        if best_within > timedelta(days=7):
            raise click.UsageError(f"--within: at most 7d, got {within}")
        at = None
    elif within is not None:
        raise click.UsageError("--within goes with --at best")
    when = parse_at(at, decides=True)

    template = Message(
        user_id="-", id=message_id, tier=tier, topic=topic, campaign_id=campaign,
        title=title, body=body, url=url, collapse_key=collapse_key, ttl=ttl,
    )
    template.content()
    user_ids = [line.strip() for line in read_stream(users_file, "--users").splitlines() if line.strip()]
    with Governor(dsn(database_url), pool_size=connections) as gov:
        results = gov.send_many(template, user_ids, at=when, batch=batch, connections=connections,
                                best_within=best_within)
    outcome = Counter("sent" if r.sent else f"{r.decision.action}:{r.decision.reason}" for _, r in results)
    summary: dict[str, Any] = {"users": len(results), **dict(sorted(outcome.items()))}
    if best_within is not None:  # how the deliveries were timed: the campaign's spread over its window
        timing = Counter(r.timing or "now" for _, r in results if r.sent)
        summary["timing"] = dict(sorted(timing.items()))
        slots = [r.deliver_at for _, r in results if r.deliver_at is not None]
        if slots:
            summary["deliver_from"], summary["deliver_until"] = min(slots).isoformat(), max(slots).isoformat()
    click.echo(json.dumps(summary))
