"""The `gov` command group: a thin shell over the library.

Data goes to stdout, messages to stderr; a failure is one line on stderr, ``gov: error: …``,
and exit 1, or exit 2 for a usage error (a bad option or combination of options), checked
before any work starts. Every option can come from a GOV_* environment variable (shown in
--help).

Each command lives in the module of its concern and is imported only when it runs:
`gov decide` loads neither Alembic, the simulator, the benches nor the web server, and
`gov --help` lists every command from :data:`COMMANDS` without importing any of them.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from gov.errors import GovError, one_line

# name: ("module:attribute", one-line help shown by `gov --help`). The help is the
# command's own first docstring line; tests/unit/test_cli_startup.py keeps them equal.
COMMANDS: dict[str, tuple[str, str]] = {
    "bench": (
        "gov.lab.bench.cli:bench",
        "Measure decisions per second: gov's decide against a SELECT 1 floor and the seeds' Redis scripts.",
    ),
    "check": (
        "gov.cli.ops:check",
        'Exit 1 with a one-line reason when something needs an operator (for cron); print ok otherwise.',
    ),
    "db": ("gov.cli.db:db", 'Schema migrations and the embedded server.'),
    "decide": ("gov.cli.send:decide", 'Decide allow or suppress for one message; print the verdict as JSON.'),
    "dispatch": (
        "gov.cli.delivery:dispatch",
        'Deliver the outbox through Web Push (loops until interrupted unless --once).',
    ),
    "policy": ("gov.cli.policy:policy_group", 'Show and apply the policy (tiers, windows, caps, quiet hours).'),
    "prune": ("gov.cli.ops:prune", 'Delete what no window can see any more, in small batches (run from cron).'),
    "release": ("gov.cli.delivery:release", 'Release deferred, quiet-held and collapsed messages whose time has come.'),
    "report": (
        "gov.cli.ops:report",
        'Reports for analysts: fatigue by send position (or by weekly volume), revocation suspects.',
    ),
    "segments": (
        "gov.cli.segments:segments",
        "User segments: classify users as engaged, casual or dormant from the policy's rules.",
    ),
    "send": ("gov.cli.send:send", 'Send one message through the governor; print {"sent": …} as JSON.'),
    "send-campaign": (
        "gov.cli.send:send_campaign",
        'Send one message to a whole audience, decided in batches; gov dispatch delivers it.',
    ),
    "serve": (
        "gov.cli.ops:serve",
        'Serve the HTTP API: /internal/send, /events, /users/{id}/preferences, /healthz, /metrics.',
    ),
    "simulate": (
        "gov.lab.simulate.cli:simulate",
        "Play the seeds' story — four teams sending on one Tuesday — through gov on a simulation clock.",
    ),
    "soak": ("gov.lab.soak:soak", 'Hold a load of senders, a runner and a releaser; then check nothing was lost.'),
    "subscribe": (
        "gov.cli.send:subscribe",
        "Store a browser's PushSubscription JSON (FILE, or - for stdin) for a user.",
    ),
    "user": ("gov.cli.users:user", "A user's own settings: time zone, quiet hours, lower caps, segment."),
    "vapid": ("gov.cli.delivery:vapid", "VAPID keys: the server's identity towards push services."),
}


def load(name: str) -> click.Command:
    """The command ``name`` of :data:`COMMANDS`, imported now."""
    import importlib

    module, _, attribute = COMMANDS[name][0].partition(":")
    command: click.Command = getattr(importlib.import_module(module), attribute)
    return command


class _Main(click.Group):
    """Loads a command on first use, lists all without loading them, and turns gov's own
    errors into one line on stderr and exit 1, and click's usage errors into one line
    and exit 2 (no traceback, no usage block: a cron mail or a log shows the cause)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        if name not in self.commands:
            self.add_command(load(name), name)
        return self.commands[name]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_) for name, (_, help_) in sorted(COMMANDS.items())]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        # The pool logs each failed connection attempt as a warning (three, with a traceback's
        # worth of text, before its timeout); a command ends with one line of its own instead.
        logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
        try:
            return super().invoke(ctx)
        except GovError as exc:
            click.echo(f"gov: error: {one_line(str(exc)) or type(exc).__name__}", err=True)
            sys.exit(1)
        except click.ClickException as exc:  # a usage error (2) or a file click could not open (1)
            where = exc.ctx.command_path if isinstance(exc, click.UsageError) and exc.ctx is not None else None
            hint = f" (see {where} --help)" if where else ""
            click.echo(f"gov: error: {one_line(exc.format_message())}{hint}", err=True)
            sys.exit(exc.exit_code)


@click.group(cls=_Main, context_settings={"auto_envvar_prefix": "GOV", "show_default": True})
@click.version_option(package_name="gov")
def main() -> None:
    """gov: the send-rate governor for web push, in PostgreSQL."""
