"""``gov bench --campaign``: campaign decisions/s against single decisions, in one run.

Each round, on a scratch database emptied before every measurement (so every user is
fresh: all allowed, the write path, as the ``fresh`` workload):

* **single, 1 connection**: ``gov.decide_v1`` one user at a time on one connection, for
  ``seconds`` (durable commits, prepared, as gov's own pool configures connections);
* **single, N clients**: the same from the bench's N client processes at once (the
  ``fresh`` workload of ``gov bench``);
* **campaign**: :meth:`gov.Governor.decide_many` for ``users`` users, in batches of
  ``batch``, on ``campaign_connections`` connections at once.

The order of the three alternates between rounds; the figures are medians over rounds.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from gov.lab.bench.decisions import RESET, TIER, ClientPool, RunSpec, _checkpoint
from gov.lab.bench.report import rate
from gov.queries import q

CONTENDERS = ("single_1", "single_n", "campaign")


@dataclass
class CampaignReport:
    """Decisions per second of each contender, one entry per round, and the machine's load."""

    rates: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in CONTENDERS})
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    settings: dict[str, Any] = field(default_factory=dict)

    def median(self, contender: str) -> float:
        return statistics.median(self.rates[contender]) if self.rates[contender] else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "settings": self.settings,
            "rates": self.rates,
            "medians": {c: self.median(c) for c in CONTENDERS},
            "load_before": self.load_before,
            "load_after": self.load_after,
        }


def _single_one(dsn: str, seconds: float, prefix: str) -> float:
    params: dict[str, Any] = {"tier": TIER, "topic": None, "campaign_id": None, "now": None}
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=0) as conn:
        conn.execute(q("decide"), {**params, "user_id": f"{prefix}-warm", "message_id": "warm"}).fetchone()
        n = 0
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            conn.execute(q("decide"), {**params, "user_id": f"{prefix}-{n}", "message_id": "m"}).fetchone()
            n += 1
            now = time.perf_counter()
            if now >= deadline:
                return n / (now - start)


def _campaign(dsn: str, users: int, batch: int, connections: int, prefix: str) -> float:
    from gov.governor import Governor
    from gov.message import Message

    audience = [f"{prefix}-{i}" for i in range(users)]
    template = Message(user_id="-", id=f"{prefix}-campaign", tier=TIER, campaign_id=prefix)
    with Governor(dsn, pool_size=connections) as gov:
        gov.decide_many(template, [f"{prefix}-warm-{i}" for i in range(connections)], connections=connections,
                        batch=1)  # untimed: open every connection, prepare
        start = time.perf_counter()
        decided = gov.decide_many(template, audience, batch=batch, connections=connections)
        elapsed = time.perf_counter() - start
    if len(decided) != users or not all(d.allowed for _, d in decided):
        raise RuntimeError(f"campaign: {len(decided)} verdicts for {users} fresh users, not all allowed")
    return users / elapsed


def run_campaign_bench(
    dsn: str,
    *,
    clients: int,
    campaign_connections: int,
    batch: int,
    users: int,
    seconds: float,
    rounds: int,
    progress: Callable[[str], None] = lambda _msg: None,
) -> CampaignReport:
    report = CampaignReport()
    report.settings = {
        "decision": f"{TIER} for a fresh user (allowed: the write path), durable commits",
        "single_1": f"one connection, {seconds:g} s",
        "single_n": f"{clients} client processes, {seconds:g} s",
        "campaign": f"Governor.decide_many: {users:,} users, batches of {batch}, {campaign_connections} connections",
        "rounds": rounds,
        "cpus": os.cpu_count(),
    }
    report.load_before = os.getloadavg()
    with ClientPool(clients) as pool, psycopg.connect(dsn, autocommit=True) as admin:
        for r in range(rounds):
            order = CONTENDERS if r % 2 == 0 else CONTENDERS[::-1]
            for contender in order:
                progress(f"campaign bench: {contender} (round {r + 1} of {rounds})")
                admin.execute(RESET)
                _checkpoint(admin)
                prefix = f"r{r}-{contender}"
                if contender == "single_1":
                    value = _single_one(dsn, seconds, prefix)
                elif contender == "single_n":
                    value = rate(pool.run(RunSpec("gov", "fresh", seconds, users, dsn)))
                else:
                    value = _campaign(dsn, users, batch, campaign_connections, prefix)
                report.rates[contender].append(value)
    report.load_after = os.getloadavg()
    return report
