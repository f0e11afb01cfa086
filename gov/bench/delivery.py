"""``gov bench --delivery``: deliveries per second to the loopback test push service.

Two contenders, one run, the same push services (processes of their own, so their
decryption and VAPID checks do not share our interpreter's lock) and the same number of
messages:

* ``naive``: one request at a time through ``pywebpush.webpush()``, as most code calls
  it: a new connection and a fresh VAPID signature per message.
* ``gov``: the runner, ``gov.delivery.Dispatcher``, draining a filled outbox: concurrent
  workers, a reused HTTP session per worker, VAPID tokens cached per origin, every
  outcome recorded in PostgreSQL.
"""

from __future__ import annotations

import json
import multiprocessing
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gov import Governor, Message
from gov.delivery import Dispatcher
from gov.vapid import VapidSigner, generate_keypair

SUBJECT = "mailto:bench@example.com"


@dataclass(frozen=True)
class DeliveryFigure:
    contender: str
    messages: int
    seconds: float
    delivered: int

    @property
    def per_second(self) -> float:
        return self.delivered / self.seconds if self.seconds else 0.0


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


class _RemotePushService:
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

    def close(self) -> None:
        try:
            self._conn.send("stop")
        finally:
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.kill()
            self._conn.close()


def _naive(infos: list[dict[str, Any]], key_path: Path, payload: bytes) -> float:
    from pywebpush import webpush

    started = time.perf_counter()
    for info in infos:
        # a fresh claims dict each time: pywebpush writes aud and exp into the one it is given
        webpush(
            info, payload, vapid_private_key=str(key_path), vapid_claims={"sub": SUBJECT},
            ttl=3600, timeout=10, headers={"Content-Type": "application/octet-stream"},
        )
    return time.perf_counter() - started


class _PushServices:
    """Several push service processes (several origins, as real traffic has): one Python
    process decrypting and verifying every request would otherwise be what is measured."""

    def __init__(self, count: int, subscriptions: int, expected_key: str) -> None:
        self._services = [_RemotePushService(-(-subscriptions // count), expected_key) for _ in range(count)]
        # interleaved, so each contender's share spreads over every service
        self.infos = [info for group in zip(*(s.infos for s in self._services), strict=True) for info in group]

    def accepted(self) -> int:
        return sum(s.accepted() for s in self._services)

    def close(self) -> None:
        for s in self._services:
            s.close()


def run_delivery_bench(
    dsn: str, messages: int = 2000, workers: int = 16, services: int = 2
) -> list[DeliveryFigure]:
    """Deliver ``messages`` both ways to the same push services; return the figures of each."""
    with tempfile.TemporaryDirectory(prefix="gov-bench-delivery-") as tmp:
        key_path = Path(tmp) / "vapid.pem"
        public = generate_keypair(key_path)
        signer = VapidSigner.from_env({"GOV_VAPID_PRIVATE_KEY": str(key_path), "GOV_VAPID_SUBJECT": SUBJECT})
        service = _PushServices(services, messages * 2, public)
        try:
            payload = json.dumps({"title": "bench", "body": "x" * 120}).encode()
            before = service.accepted()
            naive_s = _naive(service.infos[:messages], key_path, payload)
            naive_ok = service.accepted() - before

            with Governor(dsn, pool_size=2, allow_loopback_http=True) as gov:
                for i, info in enumerate(service.infos[messages:]):
                    gov.subscribe(f"bench-d{i}", info)
                gov.send_many(
                    Message(user_id="-", id="bench-delivery", tier="P0", title="bench", body="x" * 120, ttl=3600),
                    [f"bench-d{i}" for i in range(messages)],
                )
            before = service.accepted()
            with Dispatcher(dsn, signer, workers=workers, batch=workers * 8, allow_loopback_http=True) as runner:
                started = time.perf_counter()
                runner.run_once()
                gov_s = time.perf_counter() - started
            gov_ok = service.accepted() - before
        finally:
            service.close()
    return [
        DeliveryFigure("naive pywebpush loop", messages, naive_s, naive_ok),
        DeliveryFigure(f"gov dispatch ({workers} workers)", messages, gov_s, gov_ok),
    ]
