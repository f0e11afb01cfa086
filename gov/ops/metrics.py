"""Prometheus metrics, with the ``prometheus_client`` library.

Two sources, both in the Prometheus text format:

* **In the process** (this module's counter and histogram): every push attempt the
  process makes, reported by the runner through :func:`observe_attempt` —
  ``gov_push_attempts_total{outcome,status_class}`` and ``gov_push_attempt_seconds``.
  They count from the process's start (counters: use ``rate()``). Recording is off until
  :func:`enable` (``gov serve`` enables it, ``gov dispatch --metrics-port`` too), so a
  runner that exposes nothing never imports the library (``dispatch --once`` start-up).
* **From the database** at scrape time (:class:`DatabaseCollector`, ``gov serve``'s
  ``/metrics``): one call of ``gov.metrics_v1`` — decisions, suppressions and delivery
  attempts over the last 24 h (gauges of a window, not totals: a scrape must stay cheap
  however long the history), and the current outbox and held depths.

``gov dispatch --processes N`` aggregates its processes' attempts with the library's
multiprocess mode: :func:`expose` with ``processes > 1`` points PROMETHEUS_MULTIPROC_DIR
at a fresh directory before any metric exists, every process (forked or spawned) writes
its samples there, and the parent's HTTP server sums them.
"""

from __future__ import annotations

import atexit
import glob
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

from gov.errors import ConfigurationError, ConnectionLost, DatabaseError
from gov.queries import q

log = logging.getLogger("gov.ops.metrics")

DEFAULT_HOST = "127.0.0.1"  # loopback: the runner's metrics server has no authentication
WINDOW_MS = 86_400_000  # the database figures' window: 24 h
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_MARK_ENV = "GOV_METRICS_MULTIPROC"  # set by expose(): spawned children enable recording themselves

_lock = threading.Lock()
_attempts: Any = None
_seconds: Any = None
_worker_errors: Any = None
_batch_size: Any = None
_batch_wait: Any = None


def status_class(status: int | None) -> str:
    """``2xx``, ``4xx``, ``5xx`` … for an HTTP status; ``none`` when no answer came."""
    if status is None or not 100 <= status <= 599:
        return "none"
    return f"{status // 100}xx"


def enable() -> None:
    """Start recording attempts in this process (idempotent)."""
    global _attempts, _seconds, _worker_errors, _batch_size, _batch_wait
    with _lock:
        if _attempts is not None:
            return
        from prometheus_client import Counter, Histogram

        _worker_errors = Counter(
            "gov_worker_errors",
            "Errors gov's service worker reported to `gov serve` (payload: a push it could not read, "
            "shown as a generic notification). A total since start.",
            ["kind"],
        )

        _attempts = Counter(
            "gov_push_attempts",
            "Push attempts made by this process (all processes of a `gov dispatch --processes N`), "
            "by outcome and HTTP status class (none: no answer). A total since start.",
            ["outcome", "status_class"],
        )
        _seconds = Histogram(
            "gov_push_attempt_seconds",
            "Duration of one push attempt (connect, send, read), in seconds.",
        )
        _batch_size = Histogram(
            "gov_serve_batch_size",
            "Sends `gov serve` decided together in one statement (POST /internal/send grouped).",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        )
        _batch_wait = Histogram(
            "gov_serve_batch_wait_seconds",
            "How long a send waited for its batch to start (the price of grouping), in seconds.",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1),
        )


def enabled() -> bool:
    return _attempts is not None


def observe_worker_error(kind: str) -> None:
    """Count one error a service worker reported (``kind`` is one of a fixed few: no user data)."""
    if _worker_errors is not None:
        _worker_errors.labels(kind).inc()


def observe_batch(size: int, waits_s: list[float]) -> None:
    """Count one grouped statement of ``size`` sends and each send's wait for it."""
    if _batch_size is not None:
        _batch_size.observe(size)
        for wait in waits_s:
            _batch_wait.observe(wait)


def observe_attempt(outcome: str, status: int | None, seconds: float) -> None:
    """Count one push attempt by outcome and status class, and its latency."""
    attempts, latency = _attempts, _seconds
    if attempts is None:
        if not os.environ.get(_MARK_ENV):
            return
        enable()  # a spawned process of a multiprocess runner
        attempts, latency = _attempts, _seconds
    attempts.labels(outcome, status_class(status)).inc()
    latency.observe(seconds)


class Exposed:
    """A running metrics server: where it listens, and how to stop it."""

    def __init__(self, server: Any, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.host, self.port = server.server_address[:2]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def expose(port: int, host: str = DEFAULT_HOST, *, processes: int = 1) -> Exposed:
    """Serve this process's metrics on ``http://host:port/metrics`` (port 0: any free port).

    With ``processes > 1`` call it in the parent **before** starting the other processes:
    it turns on the library's multiprocess mode so the server reports the sum of all.
    """
    if processes > 1:
        _multiprocess_dir()
    enable()
    import prometheus_client

    registry: Any = prometheus_client.REGISTRY
    if os.environ.get(MULTIPROC_ENV):
        registry = prometheus_client.CollectorRegistry()
        registry.register(_SummedProcesses(os.environ[MULTIPROC_ENV]))
    try:
        server, thread = prometheus_client.start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ConfigurationError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None
    return Exposed(server, thread)


def _started(path: str) -> bool:
    try:
        return os.stat(path).st_size > 0
    except FileNotFoundError:
        return False


class _SummedProcesses:
    """The library's sum over the processes' files (``MultiProcessCollector``), without a
    file still empty.

    A process creates its file and sizes it a moment later; a scrape that read it in
    between failed whole (struct.error: a 500 for every metric), and a process killed in
    that moment left the empty file behind, failing every scrape after it
    (prometheus/client_python#1199, open in 0.26). An empty file holds no sample yet.
    """

    def __init__(self, path: str) -> None:
        self._path = path

    def collect(self) -> Any:
        from prometheus_client.multiprocess import MultiProcessCollector

        files = [f for f in glob.glob(os.path.join(self._path, "*.db")) if _started(f)]
        return MultiProcessCollector.merge(files, accumulate=True)


def _multiprocess_dir() -> str:
    """A fresh PROMETHEUS_MULTIPROC_DIR for this runner and its children (removed at exit)."""
    if _attempts is not None:
        raise RuntimeError("metrics were created before multiprocess mode: call expose() before enable()")
    path = os.environ.get(MULTIPROC_ENV)
    if not path:
        path = tempfile.mkdtemp(prefix="gov-metrics-")
        os.environ[MULTIPROC_ENV] = path
        atexit.register(shutil.rmtree, path, True)
    os.environ[_MARK_ENV] = "1"
    from prometheus_client import values

    # the library picks its value store when first imported; pick again now the variable is set
    values.ValueClass = values.get_value_class()
    return path


# ---------------------------------------------------------------- from the database

#: name, help, labels of each database-derived family (gov.metrics_v1's ``metric``).
DB_FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "decisions": (
        "gov_decisions_24h",
        "Messages whose latest decision fell in the last 24 h (gov.messages.decided_at), by verdict "
        "(allow, drop, defer, collapse) and reason. A window, not a total.",
        ("verdict", "reason"),
    ),
    "suppressions": (
        "gov_suppressions_24h",
        "Suppressions logged in the last 24 h (gov.push_suppressions), by tier, blocked_by and action. "
        "A window, not a total.",
        ("tier", "blocked_by", "action"),
    ),
    "attempts": (
        "gov_delivery_attempts_24h",
        "Delivery attempts recorded in the last 24 h by every runner (gov.delivery_attempts), by HTTP "
        "status class (none: no answer) and outcome. A window, not a total.",
        ("status_class", "outcome"),
    ),
    "outbox": (
        "gov_outbox_rows",
        "Outbox rows still to do now, by state (pending: waiting for a runner or a retry; "
        "sending: claimed under a lease).",
        ("state",),
    ),
    "outbox_oldest_due_seconds": (
        "gov_outbox_oldest_due_seconds",
        "Seconds the oldest due pending outbox row has waited for a runner (0: none due).",
        (),
    ),
    "held": (
        "gov_held_messages",
        "Held messages waiting now (gov.deferred), by tier and kind (defer, quiet, collapse).",
        ("tier", "kind"),
    ),
}


class DatabaseCollector:
    """Reads ``gov.metrics_v1`` at scrape time (one SQL call) through ``connect``.

    ``connect`` is a context manager factory yielding a psycopg connection (a pool's
    ``connection``). If the database does not answer, the scrape still succeeds with
    ``gov_database_up 0`` and no database figures.
    """

    def __init__(self, connect: Callable[[], Any], window_ms: int = WINDOW_MS) -> None:
        self._connect = connect
        self._window_ms = window_ms

    def describe(self) -> list[Any]:
        return []  # nothing read at registration

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        up = GaugeMetricFamily("gov_database_up", "1 when the database answered this scrape's metrics read, else 0.")
        rows = None
        for attempt in (1, 2):  # a pool may hand out a connection the server dropped: once more
            try:
                with self._connect() as conn:
                    rows = conn.execute(q("metrics"), {"window_ms": self._window_ms}).fetchall()
                break
            except (DatabaseError, psycopg.Error) as exc:  # the scrape says so rather than failing
                if isinstance(exc, ConnectionLost) and attempt == 1:
                    continue
                log.warning("metrics read failed: %s", exc, extra={"action": "metrics_database_error"})
        if rows is None:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        families = {
            key: GaugeMetricFamily(name, help_text, labels=list(labels))
            for key, (name, help_text, labels) in DB_FAMILIES.items()
        }
        seen_states = set()
        for metric, labels, value in rows:
            family = families.get(metric)
            if family is None:
                continue  # a newer database function than this code: ignore what it does not know
            names = DB_FAMILIES[metric][2]
            family.add_metric([str(labels.get(name, "")) for name in names], value)
            if metric == "outbox":
                seen_states.add(labels.get("state"))
        for state in ("pending", "sending"):
            if state not in seen_states:
                families["outbox"].add_metric([state], 0)
        yield from families.values()


class Union:
    """Several collectors as one, for a single exposition (``generate_latest(Union(a, b))``)."""

    def __init__(self, *collectors: Any) -> None:
        self._collectors = collectors

    def collect(self) -> Iterator[Any]:
        for collector in self._collectors:
            yield from collector.collect()
