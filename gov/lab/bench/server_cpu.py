"""Server CPU per decision, per node: what each PostgreSQL server spent, from its processes' own counters.

A PostgreSQL server is a postmaster and its children (one backend per connection, plus
the checkpointer, the WAL writer, autovacuum…). Its CPU over a timed run is the change in

* utime + stime of every live child (``/proc/<pid>/stat``), plus
* the postmaster's own utime + stime + cutime + cstime: a child that exited (a client's
  backend closing at the end of the run) is accounted in its parent's cutime/cstime,
  once it has been reaped.

The postmaster's PID is the first line of ``postmaster.pid`` in the data directory,
read through the server (``pg_read_file``, superuser or pg_read_server_files) or from
the file itself. Only a server on this machine can be counted: for any other, or when
the PID is not readable, the node says why (``not local``) instead of a figure.

On a Citus target every node of ``pg_dist_node`` (coordinator and workers) is counted
the same way, each through a connection of its own to the target's database there.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, LiteralString

import psycopg

# the bench's own SQL (see decisions.py): measurement, never part of a decision
POSTMASTER_PID_FILE: LiteralString = "SELECT split_part(pg_read_file('postmaster.pid'), E'\\n', 1)"
DATA_DIRECTORY: LiteralString = "SELECT current_setting('data_directory')"
CITUS_INSTALLED: LiteralString = "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"
# every active primary node, the coordinator (group 0) first
CITUS_NODES: LiteralString = (
    "SELECT nodename, nodeport, CASE WHEN groupid = 0 THEN 'coordinator' ELSE 'worker' END"
    "  FROM pg_dist_node WHERE noderole = 'primary' AND isactive ORDER BY groupid, nodeid"
)

PROC = Path("/proc")


def ticks_per_second() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (which may hold spaces), or None."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid …": split after the last ')'
    return text[text.rindex(")") + 2 :].split()


def server_ticks(postmaster: int) -> int | None:
    """CPU ticks the server of ``postmaster`` has spent so far (see the module's docstring), or None if gone."""
    # A child reaped between the postmaster's read and its own is counted in neither (a run's
    # end, when the clients' backends exit): read the postmaster again after the children,
    # and start over when its reaped children's CPU moved meanwhile.
    for _ in range(20):
        own = _stat_fields(postmaster)
        if own is None:
            return None
        # after the name: state(0) ppid(1) … utime(11) stime(12) cutime(13) cstime(14)
        total = sum(int(x) for x in own[11:15])
        for entry in PROC.iterdir():
            if not entry.name.isdigit():
                continue
            fields = _stat_fields(int(entry.name))
            if fields is not None and fields[1] == str(postmaster):
                total += int(fields[11]) + int(fields[12])
        again = _stat_fields(postmaster)
        if again is None:
            return None
        if again[13:15] == own[13:15]:
            return total
    return total


def is_local_host(host: str) -> bool:
    """Whether ``host`` (a libpq host: a name, an address, or a Unix socket directory) is this machine."""
    if not host or host.startswith("/") or host.startswith("@"):
        return True  # a Unix socket is always local
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    for address in addresses:
        with contextlib.suppress(ValueError):
            if ipaddress.ip_address(address.split("%")[0]).is_loopback:
                return True
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        # binding succeeds only for an address of one of this machine's interfaces
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            try:
                s.bind((address, 0))
            except OSError:
                continue
            return True
    return False


def postmaster_pid(conn: psycopg.Connection[Any]) -> tuple[int | None, str]:
    """(PID, "") of the server behind ``conn`` when it runs on this machine, else (None, why not)."""
    host = conn.info.host
    if not is_local_host(host):
        return None, "not local"
    line: str | None = None
    try:
        row = conn.execute(POSTMASTER_PID_FILE).fetchone()
        line = str(row[0]) if row else None
    except psycopg.Error:
        # no superuser: the file itself, if this user may read the data directory
        with contextlib.suppress(psycopg.Error, OSError, IndexError, TypeError):
            row = conn.execute(DATA_DIRECTORY).fetchone()
            line = (Path(str(row[0] if row else "")) / "postmaster.pid").read_text().splitlines()[0]
    if not line or not line.strip().isdigit():
        return None, "not local (postmaster.pid unreadable: needs superuser or pg_read_server_files)"
    pid = int(line.strip())
    fields = _stat_fields(pid)
    if fields is None:
        return None, "not local"  # a PID of another machine (or of a container's own PID namespace)
    try:
        comm = (PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        comm = ""
    if "postgres" not in comm and "postmaster" not in comm:
        return None, f"not local (PID {pid} here is {comm or 'unknown'}, not a postmaster)"
    return pid, ""


@dataclass
class Node:
    """One PostgreSQL server of a target: where it is, and its postmaster when it is countable."""

    host: str
    port: int
    role: str  # server | coordinator | worker
    pid: int | None
    why_not: str = ""  # when pid is None

    @property
    def name(self) -> str:
        return f"{self.host}:{self.port}"


def target_nodes(admin: psycopg.Connection[Any], dsn: str) -> list[Node]:
    """The servers of the target ``admin`` is connected to (its database ``dsn``): itself, or every Citus node."""
    ((citus,),) = admin.execute(CITUS_INSTALLED).fetchall()
    rows = admin.execute(CITUS_NODES).fetchall() if citus else []
    if not rows:
        pid, why = postmaster_pid(admin)
        return [Node(admin.info.host, int(admin.info.port), "server", pid, why)]
    nodes = []
    for host, port, role in rows:
        try:
            with psycopg.connect(psycopg.conninfo.make_conninfo(dsn, host=str(host), port=int(port)),
                                 autocommit=True, connect_timeout=10) as conn:
                pid, why = postmaster_pid(conn)
        except psycopg.OperationalError as exc:
            pid, why = None, f"not reachable from here ({' '.join(str(exc).split())[:80]})"
        nodes.append(Node(str(host), int(port), str(role), pid, why))
    return nodes


@dataclass
class CpuMeter:
    """Sums each node's CPU over the runs of each contender it is told about."""

    nodes: Sequence[Node]
    ticks: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # (workload, contender) -> per node
    _before: list[int | None] = field(default_factory=list)

    def before(self) -> None:
        self._before = [server_ticks(n.pid) if n.pid is not None else None for n in self.nodes]

    def after(self, workload: str, contender: str) -> None:
        spent = self.ticks.setdefault((workload, contender), [0] * len(self.nodes))
        for i, (node, start) in enumerate(zip(self.nodes, self._before, strict=True)):
            end = server_ticks(node.pid) if node.pid is not None else None
            if start is None or end is None:
                if node.pid is not None:
                    node.pid, node.why_not = None, "the postmaster exited during the run"
                continue
            spent[i] += end - start

    def per_decision(self, target: str, workload: str, contender: str, decisions: int) -> list[dict[str, Any]]:
        """One row per node and a total: µs of server CPU per decision (None where not countable)."""
        tick_us = 1e6 / ticks_per_second()
        spent = self.ticks.get((workload, contender), [0] * len(self.nodes))
        rows: list[dict[str, Any]] = []
        total = 0.0
        countable = True
        for node, ticks in zip(self.nodes, spent, strict=True):
            us = round(ticks * tick_us / decisions, 1) if node.pid is not None and decisions > 0 else None
            if us is None:
                countable = False
            else:
                total += us
            base = {"target": target, "workload": workload, "contender": contender, "decisions": decisions}
            rows.append(base | {"node": node.name, "role": node.role, "us_per_decision": us,
                                "cpu_s": None if us is None else round(ticks * tick_us / 1e6, 2),
                                "note": node.why_not if us is None else ""})
        rows.append({"target": target, "workload": workload, "contender": contender, "decisions": decisions,
                     "node": "total", "role": f"{len(self.nodes)} node(s)",
                     "us_per_decision": round(total, 1) if countable else None, "cpu_s": None,
                     "note": "" if countable else "some node not counted"})
        return rows
