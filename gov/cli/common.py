"""What every `gov` command module shares: env-var options, the database URL, times,
input files, the VAPID signer and the console.

Imports nothing heavy: :mod:`gov.cli.main` loads a command's module only when it runs.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

import click

from gov.errors import GovError

if TYPE_CHECKING:
    import psycopg

F = TypeVar("F", bound=Callable[..., Any])


def option(*args: Any, **kwargs: Any) -> Callable[[F], F]:
    """A click option whose GOV_* environment variable is shown in --help."""
    kwargs.setdefault("show_envvar", True)
    return click.option(*args, **kwargs)


def url_option(fn: F) -> F:
    return option(
        "--database-url",
        envvar="GOV_DATABASE_URL",
        help="PostgreSQL URL. Without one, an embedded server under $GOV_DATA_DIR (./.gov) is used.",
    )(fn)


def dsn(url: str | None, *, check_schema: bool = False) -> str:
    """The database to use. The embedded default (no URL given, none in the environment,
    which click passes as ``url``) is ours: it is brought to head on first use. A database
    named by the user is never migrated behind their back; with ``check_schema`` (the
    long-running commands: dispatch, release, serve) it must be at this code's head, or
    the command refuses with one line naming both revisions (gov.SchemaMismatch)."""
    if url is not None and not check_schema:
        from gov.db import resolve_url

        return resolve_url(url)
    with checked_connection(url) as (resolved, _conn):
        return resolved


@contextmanager
def checked_connection(url: str | None) -> Iterator[tuple[str, psycopg.Connection[Any]]]:
    """The database to use (as :func:`dsn` with ``check_schema``) and one autocommit
    connection to it, on which its revision was read: the cron path (``gov dispatch
    --once``, ``gov release --once``) checks the schema and does its work on that one
    connection. Alembic is imported only when the embedded server needs migrating."""
    import psycopg

    from gov.db import resolve_url, translate_errors
    from gov.schema_version import check_head, code_head, revision_of

    with translate_errors():
        resolved = resolve_url(url)
        with psycopg.connect(resolved, autocommit=True) as conn:
            have = revision_of(conn)
            if have != code_head():
                if url is not None:
                    check_head(have)  # raises: not ours to migrate
                from gov import migrate

                migrate.upgrade(resolved)
            yield resolved, conn


class FiniteRange(click.FloatRange):
    """A click.FloatRange that refuses nan and inf too: the range lets both through (a
    nan idle made a busy loop, an inf one a traceback)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


#: How far a decision's ``--at`` may lie ahead of this machine's clock: the skew between hosts.
AT_SKEW = timedelta(minutes=5)


def parse_at(value: str | None, *, decides: bool = False) -> datetime | None:
    """``--at``: an explicit, zone-aware ISO 8601 time instead of the database clock.

    For a command that decides (``decides``), not in the future: a decision spends its
    budget at its moment, so one dated ahead holds a slot of the user's until then (a
    typo of 9999 for 2026, for ever). Reports and checks may look at any moment.
    """
    if value is None:
        return None
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise GovError(f"--at: not an ISO 8601 time: {value!r}") from None
    if at.tzinfo is None:
        raise GovError(f"--at: give a time zone offset (e.g. {value}Z or {value}+00:00)")
    if decides and at > datetime.now(UTC) + AT_SKEW:
        raise GovError(f"--at {value}: in the future; a decision spends its budget at its moment, so one "
                       "dated ahead would hold the slot until then (to deliver later: --at best --within D)")
    return at


def duration(value: str, what: str) -> timedelta:
    """A policy-style duration ("7d", "15m") as a timedelta; bad input is a GovError."""
    from gov.policy import parse_duration

    try:
        return timedelta(milliseconds=parse_duration(value, what))
    except ValueError as exc:
        raise GovError(str(exc)) from None


def check_output_path(path: Path | None, option_name: str) -> None:
    """A file the command writes at its end, checked at its start: a long run (a bench, a
    simulation) must not end in "cannot write" after minutes of work. A usage error."""
    if path is None:
        return
    import os

    where = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise click.BadParameter(f"{path} is a directory", param_hint=f"'{option_name}'")
    if not where.is_dir():
        raise click.BadParameter(f"{where} is not a directory", param_hint=f"'{option_name}'")
    if not os.access(path if path.exists() else where, os.W_OK):
        raise click.BadParameter(f"{path} is not writable", param_hint=f"'{option_name}'")
    # os.access says yes to root, and to files of /proc or /sys no one can create: open it
    # (appending writes nothing), and remove what the probe created
    existed = path.exists()
    try:
        with path.open("ab"):
            pass
    except OSError as exc:
        raise click.BadParameter(f"{path} is not writable ({exc.strerror})", param_hint=f"'{option_name}'") from None
    if not existed:
        path.unlink(missing_ok=True)


def read_stream(stream: IO[bytes], what: str) -> str:
    """A binary stream's whole text as UTF-8; anything else is a one-line GovError."""
    try:
        return stream.read().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GovError(f"{what}: not UTF-8 text (byte {exc.start} of the input)") from None


def read_text_input(file: Path) -> tuple[str, str]:
    """A FILE argument's text and its name for messages; ``-`` reads stdin."""
    if str(file) == "-":
        return read_stream(sys.stdin.buffer, "<stdin>"), "<stdin>"
    try:
        with file.open("rb") as stream:
            return read_stream(stream, str(file)), str(file)
    except OSError as exc:
        raise GovError(f"cannot read {file}: {exc.strerror}") from None


@contextmanager
def connect(url: str | None) -> Iterator[psycopg.Connection[Any]]:
    """One connection to the database the command was given (errors become GovError)."""
    import psycopg

    from gov.db import translate_errors

    with translate_errors(), psycopg.connect(dsn(url)) as conn:
        yield conn


def signer() -> Any:
    """The VAPID signer from the environment, checked once at start: a sender with no or
    a wrong key refuses to start."""
    from gov.delivery.vapid import VapidSigner

    return VapidSigner.from_env()


def console() -> Any:
    """A rich console; a pipe or a file gets a wide table rather than rich's 80 columns."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 160, highlight=False)
