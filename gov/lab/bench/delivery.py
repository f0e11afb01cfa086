"""``gov bench --delivery``: messages per second, and client CPU per message, to a push service.

Two contenders, one run, the same push service and the same number of messages:

* ``naive``: one request at a time through ``pywebpush.webpush()``, as most code calls
  it: a new session and connection and a fresh VAPID signature per message.
* ``gov``: the runner, ``gov dispatch --once --processes N``: forked runner processes
  (:func:`gov.delivery.processes.run_dispatchers`), each a :class:`~gov.delivery.runner.Dispatcher` draining
  the filled outbox with its workers, keep-alive connection pools per origin, VAPID tokens
  cached per origin, claims and outcome records in batches in PostgreSQL.

Each contender runs in processes of its own, forked from the bench once the code is
loaded; its client CPU is what those processes used (``os.times`` in each, measured from
the fork), divided by the messages delivered. The database server's and the push service's
CPU are not client CPU.

The push service (``service="count"``, the default) is a minimal Node.js server in its own
process (``countpush.js``, shipped here) that answers every POST 201 and counts them,
measured alone first with a pipelined keep-alive client, so the figures are the senders',
not the service's. ``service="verify"`` uses :class:`gov.testing.PushService` instead,
which verifies every VAPID token and decrypts every payload: a correctness pass, too slow
to measure speed with.
"""

from __future__ import annotations

import base64
import http.client
import json
import multiprocessing
import os
import resource
import selectors
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gov.delivery.vapid import VapidSigner, generate_keypair
from gov.lab.bench.node import node_modules

SUBJECT = "mailto:bench@example.com"
COUNTING_SERVER = Path(__file__).with_name("countpush.js")
WEBSEND_DIR = Path(__file__).with_name("websend")  # the seeds' sender: Node web-push
WEBSEND_INFLIGHT = 16
#: Rows per claim in the bench (``gov dispatch --batch``): a fast push service lets a runner
#: attempt far more than the default's 4 per worker in one lease, and every batch costs two commits.
DEFAULT_BATCH = 256


class DeliveryBenchError(RuntimeError):
    """The bench cannot run (no node for the counting push service, a service that fails)."""


@dataclass(frozen=True)
class DeliveryFigure:
    contender: str
    messages: int
    seconds: float
    delivered: int
    cpu_s: float  # user + system CPU of the contender's own processes

    @property
    def per_second(self) -> float:
        return self.delivered / self.seconds if self.seconds else 0.0

    @property
    def cpu_ms_per_message(self) -> float:
        return 1000 * self.cpu_s / self.delivered if self.delivered else 0.0

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "per_second": self.per_second, "cpu_ms_per_message": self.cpu_ms_per_message}


@dataclass
class DeliveryReport:
    figures: list[DeliveryFigure]
    service: str
    service_per_second: float | None  # the push service alone, keep-alive, pipelined
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # a contender skipped, and why

    def as_json(self) -> dict[str, Any]:
        return {
            "notes": self.notes,
            "figures": [f.as_json() for f in self.figures],
            "service": self.service,
            "service_per_second": self.service_per_second,
            "load_before": list(self.load_before),
            "load_after": list(self.load_after),
            "settings": self.settings,
        }


# ---------------------------------------------------------------- the counting push service


class CountingPushService:
    """``node countpush.js`` on a free loopback port: 201 to every POST, and a count."""

    def __init__(self, subscriptions: int) -> None:
        node = shutil.which("node")
        if node is None:
            raise DeliveryBenchError("the counting push service needs Node.js (`node` on PATH); "
                                     "or bench on the verifying Python service with --verify")
        self._proc = subprocess.Popen([node, str(COUNTING_SERVER), "0"], stdout=subprocess.PIPE, text=True)
        line = self._proc.stdout.readline() if self._proc.stdout else ""
        if not line.startswith("listening "):
            self.close()
            raise DeliveryBenchError(f"the counting push service did not start: {line.strip()!r}")
        self.port = int(line.split()[1])
        self.infos = [
            {"endpoint": f"http://127.0.0.1:{self.port}/push/{i}", "keys": keys}
            for i, keys in zip(range(subscriptions), browser_keys(subscriptions), strict=True)
        ]

    def accepted(self) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", "/count")
            return int(conn.getresponse().read())
        finally:
            conn.close()

    def max_rate(self, requests: int = 60_000, connections: int = 4, depth: int = 64) -> float:
        """Requests/s the service answers alone: keep-alive connections, ``depth`` in flight each."""
        return _pipelined_load(self.port, requests, connections, depth)

    def close(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout:
            self._proc.stdout.close()


def browser_keys(count: int, distinct: int = 16) -> list[dict[str, str]]:
    """Valid subscription keys (P-256 points, 16-byte auth): the counting service decrypts
    nothing, so a few distinct keys, cycled, cost the senders exactly what real ones do."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    keys = []
    for _ in range(min(count, distinct)):
        point = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
        keys.append({"p256dh": b64(point), "auth": b64(os.urandom(16))})
    return [keys[i % len(keys)] for i in range(count)]


def _pipelined_load(port: int, total: int, connections: int, depth: int) -> float:
    body = b"x" * 300  # about the size of an encrypted 200-byte payload
    request = (b"POST /load HTTP/1.1\r\nHost: 127.0.0.1\r\nTTL: 60\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
    marker = b"HTTP/1.1 201"
    selector = selectors.DefaultSelector()
    per = max(1, total // connections)
    state: dict[socket.socket, list[Any]] = {}
    for _ in range(connections):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        state[sock] = [0, 0, b""]  # sent, answered, unparsed tail
        selector.register(sock, selectors.EVENT_READ)
    started = time.perf_counter()
    try:
        for sock, st in state.items():
            n = min(depth, per)
            sock.sendall(request * n)
            st[0] = n
        finished = 0
        while finished < connections:
            for key, _ in selector.select(timeout=10):
                sock = key.fileobj  # type: ignore[assignment]
                st = state[sock]
                data = sock.recv(1 << 16)
                if not data:
                    raise DeliveryBenchError("the push service closed a keep-alive connection")
                text = st[2] + data
                st[1] += text.count(marker)
                st[2] = text[-(len(marker) - 1):]  # a marker split between two reads
                if st[1] >= per:
                    finished += 1
                    selector.unregister(sock)
                    continue
                more = min(depth - (st[0] - st[1]), per - st[0])
                if more > 0:
                    sock.sendall(request * more)
                    st[0] += more
        return connections * per / (time.perf_counter() - started)
    finally:
        for sock in state:
            sock.close()
        selector.close()


# ---------------------------------------------------------------- the verifying push services


def _push_service_main(conn: Any, subscriptions: int, expected_key: str) -> None:
    """Child process: a PushService with ``subscriptions`` browsers; report counts on request."""
    from gov.testing import PushService

    with PushService(expected_public_key=expected_key) as service:
        infos = [service.subscribe().info for _ in range(subscriptions)]
        conn.send(infos)
        while True:
            request = conn.recv()
            if request == "stop":
                break
            conn.send(sum(1 for r in service.received if r.status == 201))


class VerifyingPushService:
    """:class:`gov.testing.PushService` in a process of its own: verifies and decrypts every request."""

    def __init__(self, subscriptions: int, expected_key: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_push_service_main, args=(child, subscriptions, expected_key), daemon=True)
        self._proc.start()
        child.close()
        self.infos: list[dict[str, Any]] = self._conn.recv()

    def accepted(self) -> int:
        self._conn.send("count")
        return int(self._conn.recv())

    def max_rate(self) -> float | None:
        return None

    def close(self) -> None:
        try:
            self._conn.send("stop")
        finally:
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.kill()
            self._conn.close()


# ---------------------------------------------------------------- the contenders


def _naive_child(conn: Any, infos: list[dict[str, Any]], key_path: str, payload: bytes) -> None:
    from pywebpush import webpush

    for info in infos:
        # a fresh claims dict each time: pywebpush writes aud and exp into the one it is given
        webpush(
            info, payload, vapid_private_key=key_path, vapid_claims={"sub": SUBJECT},
            ttl=3600, timeout=10, headers={"Content-Type": "application/octet-stream"},
        )
    times = os.times()
    conn.send(times.user + times.system)
    conn.close()


def _naive(infos: list[dict[str, Any]], key_path: Path, payload: bytes) -> tuple[float, float]:
    """The plain loop, in a forked process of its own; return (wall seconds, its CPU seconds)."""
    import pywebpush  # noqa: F401  # loaded before the fork: the child's clock starts warm

    ctx = multiprocessing.get_context("fork")
    mine, theirs = ctx.Pipe(duplex=False)
    started = time.perf_counter()
    proc = ctx.Process(target=_naive_child, args=(theirs, infos, str(key_path), payload))
    proc.start()
    theirs.close()
    cpu = mine.recv()
    proc.join()
    seconds = time.perf_counter() - started
    mine.close()
    if proc.exitcode != 0:
        raise DeliveryBenchError(f"the naive loop failed (exit code {proc.exitcode})")
    return seconds, float(cpu)


def _gov(dsn: str, signer: VapidSigner, processes: int, workers: int, batch: int) -> tuple[float, float]:
    """``gov dispatch --once --processes N``, as the command runs it; return (wall s, CPU s)."""
    from gov.delivery.processes import run_dispatchers
    from gov.delivery.runner import Dispatcher

    def make() -> Dispatcher:
        return Dispatcher(dsn, signer, workers=workers, batch=batch, allow_loopback_http=True)

    started = time.perf_counter()
    result = run_dispatchers(make, processes, once=True)
    seconds = time.perf_counter() - started
    if not result.ok:
        raise DeliveryBenchError(f"a runner process failed (exit codes {result.exit_codes})")
    return seconds, sum(user + system for user, system in result.cpu)


def run_delivery_bench(
    dsn: str, messages: int = 2000, workers: int = 2, processes: int | None = None, subscriptions: int = 500,
    service: str = "count", batch: int | None = None, progress: Any = None,
) -> DeliveryReport:
    """Deliver ``messages`` both ways to one push service; return the figures of each."""
    from gov.governor import Governor
    from gov.message import Message

    say = progress or (lambda _msg: None)
    processes = processes or os.cpu_count() or 1
    subscriptions = max(1, min(subscriptions, messages))
    per_subscription = -(-messages // subscriptions)
    batch = batch or DEFAULT_BATCH
    with tempfile.TemporaryDirectory(prefix="gov-bench-delivery-") as tmp:
        key_path = Path(tmp) / "vapid.pem"
        public = generate_keypair(key_path)
        signer = VapidSigner.from_env({"GOV_VAPID_PRIVATE_KEY": str(key_path), "GOV_VAPID_SUBJECT": SUBJECT})
        say(f"starting the {'counting' if service == 'count' else 'verifying'} push service")
        push: CountingPushService | VerifyingPushService = (
            CountingPushService(subscriptions * 3) if service == "count"
            else VerifyingPushService(subscriptions * 2, public)
        )
        notes: list[str] = []
        extra: list[DeliveryFigure] = []
        try:
            service_rate = push.max_rate()
            if service_rate is not None:
                say(f"the push service alone: {service_rate:,.0f} requests/s")
            payload = json.dumps({"title": "bench", "body": "x" * 170}).encode()  # about 200 bytes
            naive_infos = push.infos[:subscriptions]
            gov_infos = push.infos[subscriptions : 2 * subscriptions]
            node_infos = push.infos[2 * subscriptions :]
            users = [f"bench-d{i}" for i in range(subscriptions)]

            def fill(label: str) -> None:
                """``messages`` P0 messages queued for the gov users, ``label`` in their ids."""
                with Governor(dsn, pool_size=2, allow_loopback_http=True) as gov:
                    queued = 0
                    for round_ in range(per_subscription):
                        take = users[: min(subscriptions, messages - queued)]
                        gov.send_many(
                            Message(user_id="-", id=f"bench-delivery-{label}-{round_}", tier="P0", title="bench",
                                    body="x" * 150, ttl=3600),
                            take,
                        )
                        queued += len(take)

            with Governor(dsn, pool_size=2, allow_loopback_http=True) as gov:
                for i, info in enumerate(gov_infos):
                    gov.subscribe(f"bench-d{i}", info)
            fill("forked")
            load_before = os.getloadavg()
            say("naive pywebpush loop")
            before = push.accepted()
            naive_s, naive_cpu = _naive([naive_infos[i % subscriptions] for i in range(messages)], key_path, payload)
            naive_ok = push.accepted() - before
            say(f"gov dispatch --once, {processes} processes × {workers} workers")
            before = push.accepted()
            gov_s, gov_cpu = _gov(dsn, signer, processes, workers, batch) if processes > 1 else _gov_here(
                dsn, signer, workers, batch)
            gov_ok = push.accepted() - before
            # the whole command, as cron runs it: interpreter start, imports, schema check, drain
            fill("command")
            say(f"the whole command: gov dispatch --once --processes {processes} --workers {workers}")
            before = push.accepted()
            command_s, command_cpu = _gov_command(dsn, key_path, processes, workers, batch)
            extra.append(DeliveryFigure(
                f"the whole command `gov dispatch --once` ({processes} processes × {workers} workers)",
                messages, command_s, push.accepted() - before, command_cpu))
            if service == "count":
                modules, why = node_modules(WEBSEND_DIR, "bench-websend", "the seeds' sender (web-push)", say)
                if modules is None:
                    notes.append(f"the seeds' sender (Node web-push) skipped: {why}")
                else:
                    say(f"the seeds' sender: Node web-push, {WEBSEND_INFLIGHT} in flight")
                    before = push.accepted()
                    node_s, node_cpu = _websend(modules, node_infos, key_path, payload, messages)
                    extra.append(DeliveryFigure(
                        f"the seeds' sender: `node` + web-push, {WEBSEND_INFLIGHT} in flight (whole command)",
                        messages, node_s, push.accepted() - before, node_cpu))
            load_after = os.getloadavg()
        finally:
            push.close()
    return DeliveryReport(
        figures=[
            DeliveryFigure("naive pywebpush loop", messages, naive_s, naive_ok, naive_cpu),
            DeliveryFigure(f"gov dispatch ({processes} processes × {workers} workers, batch {batch})", messages,
                           gov_s, gov_ok, gov_cpu),
            *extra,
        ],
        notes=notes,
        service=service,
        service_per_second=service_rate,
        load_before=load_before,
        load_after=load_after,
        settings={"messages": messages, "subscriptions": subscriptions, "processes": processes,
                  "workers": workers, "batch": batch, "payload_bytes": len(payload)},
    )


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _gov_command(dsn: str, key_path: Path, processes: int, workers: int, batch: int) -> tuple[float, float]:
    """``gov dispatch --once`` as a command of its own; return (wall s, CPU s of it and its runners)."""
    import secrets
    import sys

    env = {**os.environ, "GOV_VAPID_PRIVATE_KEY": str(key_path), "GOV_VAPID_SUBJECT": SUBJECT,
           "GOV_BEACON_SECRET": secrets.token_hex(32), "GOV_ALLOW_LOOPBACK_HTTP": "1"}
    cpu = _children_cpu()
    started = time.perf_counter()
    # cwd: a directory with no gov in it (python -m puts the cwd ahead of everything)
    done = subprocess.run(
        [sys.executable, "-m", "gov.cli", "dispatch", "--once", "--processes", str(processes), "--workers",
         str(workers), "--batch", str(batch), "--database-url", dsn],
        cwd=key_path.parent, env=env, capture_output=True, text=True, timeout=600,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise DeliveryBenchError(f"gov dispatch --once failed: {(done.stderr or done.stdout).strip()[-300:]}")
    return seconds, _children_cpu() - cpu


def _websend(modules: Path, infos: list[dict[str, Any]], key_path: Path, payload: bytes,
             messages: int) -> tuple[float, float]:
    """The seeds' sender (``websend.js``: web-push per message) as a command; (wall s, CPU s)."""
    from cryptography.hazmat.primitives import serialization

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    key = serialization.load_pem_private_key(key_path.read_bytes(), None)
    private = key.private_numbers().private_value.to_bytes(32, "big")  # type: ignore[union-attr]
    public = key.public_key().public_bytes(  # type: ignore[union-attr]
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    config = key_path.parent / "websend.json"
    config.write_text(json.dumps({
        "subscriptions": infos, "messages": messages, "inflight": WEBSEND_INFLIGHT, "ttl": 3600,
        "payload": payload.decode(),
        "vapid": {"subject": SUBJECT, "publicKey": b64(public), "privateKey": b64(private)},
    }))
    node = shutil.which("node") or "node"
    cpu = _children_cpu()
    started = time.perf_counter()
    done = subprocess.run([node, str(WEBSEND_DIR / "websend.js"), str(config)], env={**os.environ,
                          "NODE_PATH": str(modules)}, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise DeliveryBenchError(f"the seeds' sender failed: {(done.stderr or done.stdout).strip()[-300:]}")
    return seconds, _children_cpu() - cpu


def _gov_here(dsn: str, signer: VapidSigner, workers: int, batch: int) -> tuple[float, float]:
    """One runner process: forked all the same, so that its CPU is its own."""
    from gov.delivery.processes import _child
    from gov.delivery.runner import Dispatcher

    ctx = multiprocessing.get_context("fork")
    mine, theirs = ctx.Pipe(duplex=False)

    def make() -> Dispatcher:
        return Dispatcher(dsn, signer, workers=workers, batch=batch, allow_loopback_http=True)

    started = time.perf_counter()
    proc = ctx.Process(target=_child, args=(make, True, 1.0, os.getpid(), theirs))
    proc.start()
    theirs.close()
    report = mine.recv()
    proc.join()
    seconds = time.perf_counter() - started
    mine.close()
    if proc.exitcode != 0:
        raise DeliveryBenchError(f"the runner process failed (exit code {proc.exitcode})")
    return seconds, sum(report["cpu"])
