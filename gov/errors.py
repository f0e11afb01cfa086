"""The package's own exceptions.

Driver errors are translated into these in one place (:mod:`gov.db`), so callers
never need to import psycopg to handle a refusal.
"""

from __future__ import annotations


def one_line(text: str) -> str:
    """An error's text as one line: its lines joined with "; ", the spaces in each collapsed.

    libpq's messages can be two lines (a refused connection names each address it tried):
    every ``gov: error: …`` is one line, for a log or a cron mail.
    """
    return "; ".join(" ".join(line.split()) for line in text.splitlines() if line.strip())


class GovError(Exception):
    """Base class of every error gov raises on purpose."""


class InvalidInput(GovError, ValueError):
    """Input was refused before (or instead of) recording anything."""


class InvalidMessage(InvalidInput):
    """A message is malformed: missing tier, unknown tier, empty id, oversize payload…"""


class InvalidSubscription(InvalidInput):
    """A PushSubscription JSON is malformed or points somewhere it must not."""


class PolicyError(InvalidInput):
    """A policy file or a per-user override was refused; nothing was changed."""


class ConfigurationError(GovError):
    """The process is not configured to run (missing VAPID key, no database…)."""


class DatabaseError(GovError):
    """The database failed or could not be reached."""


class ConnectionLost(DatabaseError):
    """The connection broke or the server is restarting; the call may be retried."""


class PoolTimeout(DatabaseError):
    """No database connection became free within the configured timeout."""


class GovernorClosed(DatabaseError, ConfigurationError):
    """The governor was closed: it has no database connections any more. Not a lost
    connection (nothing retries it); to a server that uses it, its database is gone."""


class SchemaMismatch(DatabaseError):
    """The database schema is not the one this version of gov expects."""
