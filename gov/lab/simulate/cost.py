"""What a simulation cost this machine: CPU-seconds by who spent them, beside the load it ran with.

The first run's wall time depends on the machine and on whatever else runs on it (the same
run took 53 s and 101 s on two days here, with identical summaries). Its CPU-seconds
depend far less on either, so ``gov simulate`` prints them next to the wall time: this
process (the story, the decisions' calls, the users' reactions), its children (gov's
runners and the loopback push services, which encrypt and decrypt every delivery) and
the PostgreSQL server when it runs on this machine (read from the postmaster's and its
backends' own counters, as ``gov bench`` reads them), with the cores and the load average
before the run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from gov.lab.bench.server_cpu import postmaster_pid, server_ticks, ticks_per_second


@dataclass(frozen=True)
class RunCost:
    """CPU-seconds a run spent, by who spent them; ``server_s`` is None when the server is not countable."""

    own_s: float
    children_s: float
    server_s: float | None
    server_note: str
    cores: int
    load_before: float

    @property
    def total_s(self) -> float | None:
        return None if self.server_s is None else self.own_s + self.children_s + self.server_s

    def line(self) -> str:
        gov_s = self.own_s + self.children_s
        parts = [f"gov {gov_s:.1f} (this process {self.own_s:.1f}, runners and push services {self.children_s:.1f})"]
        if self.server_s is None:
            parts.append(f"PostgreSQL not counted: {self.server_note}")
            head = f"CPU {gov_s:.1f} s without the server"
        else:
            parts.append(f"PostgreSQL {self.server_s:.1f}")
            head = f"CPU {self.total_s:.1f} s"
        return f"{head} on {self.cores} cores, load {self.load_before:.2f} before: {', '.join(parts)}"


def _process_seconds() -> tuple[float, float]:
    """(this process, its reaped children): user + system seconds."""
    t = os.times()
    return t.user + t.system, t.children_user + t.children_system


def cost_meter(server_url: str) -> Callable[[], RunCost]:
    """Start counting now; the function returned gives what was spent since (children once reaped)."""
    load_before = os.getloadavg()[0]
    pid: int | None = None
    note = ""
    try:
        with psycopg.connect(server_url, autocommit=True, connect_timeout=10) as conn:
            pid, note = postmaster_pid(conn)
    except psycopg.Error as exc:
        note = f"not reachable ({' '.join(str(exc).split())[:80]})"
    server_before = server_ticks(pid) if pid is not None else None
    own_before, children_before = _process_seconds()

    def spent() -> RunCost:
        own, children = _process_seconds()
        server_after = server_ticks(pid) if pid is not None else None
        server_s: float | None = None
        why = note
        if server_before is not None and server_after is not None:
            server_s = (server_after - server_before) / ticks_per_second()
        elif pid is not None:
            why = "the postmaster exited during the run"
        return RunCost(own - own_before, children - children_before, server_s, why, os.cpu_count() or 1,
                       load_before)

    return spent
