"""A throwaway three-node Citus cluster on loopback, for the ``citus`` test tier and the lab.

``citus_cluster()`` starts a coordinator and two workers, each its own PostgreSQL
instance of the machine's server (``pg_config`` of $GOV_CITUS_PG_MAJOR, 15 by default)
in a temporary directory, with ``shared_preload_libraries = 'citus'``; registers the
coordinator and adds the workers; yields the coordinator's URL; and stops and deletes
everything afterwards. It needs the Citus extension installed for that server
(``../shared/citus/build.sh`` builds it); :func:`citus_missing` says why it cannot run.

PostgreSQL refuses to run as root, so as root the servers run as the ``postgres``
system user (the Debian packages create it).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import sql

PG_MAJOR = os.environ.get("GOV_CITUS_PG_MAJOR", "15")
BIN = Path(f"/usr/lib/postgresql/{PG_MAJOR}/bin")
LIB = Path(f"/usr/lib/postgresql/{PG_MAJOR}/lib")
WORKERS = 2


def citus_missing() -> str | None:
    """Why a cluster cannot be started here, or None when it can."""
    if not (BIN / "initdb").exists():
        return f"PostgreSQL {PG_MAJOR} server binaries are not installed ({BIN})"
    if not (LIB / "citus.so").exists():
        return f"the Citus extension is not installed for PostgreSQL {PG_MAJOR} (run ../shared/citus/build.sh)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to run the servers as"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(args: list[str], user: str | None) -> None:
    env = dict(os.environ)
    if user:
        env["HOME"] = pwd.getpwnam(user).pw_dir  # the servers' libpq must not look in root's home
    done = subprocess.run(args, user=user, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")


def _start_node(root: Path, name: str, user: str | None) -> tuple[Path, int]:
    data = root / name
    _run([str(BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"], user)
    port = _free_port()
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(
            f"port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{root}'\n"
            "shared_preload_libraries = 'citus'\nfsync = off\nmax_connections = 300\n"
            "citus.max_cached_conns_per_worker = 4\n"
            # loopback only: no TLS between the nodes (and no client certificate lookup)
            "citus.node_conninfo = 'sslmode=disable'\n"
            # functions that are delegated to a worker may write to a colocated table there
            "citus.enable_unsafe_triggers = on\n"
        )
    _run([str(BIN / "pg_ctl"), "-D", str(data), "-l", str(root / f"{name}.log"), "-w", "start"], user)
    return data, port


@contextlib.contextmanager
def citus_cluster(dbname: str = "postgres") -> Iterator[str]:
    """A running coordinator with two workers; yields ``postgresql://postgres@127.0.0.1:<port>/<dbname>``."""
    reason = citus_missing()
    if reason:
        raise RuntimeError(reason)
    user = "postgres" if os.geteuid() == 0 else None
    root = Path(tempfile.mkdtemp(prefix="gov-citus-"))
    if user:
        shutil.chown(root, user)
    started: list[Path] = []
    try:
        nodes: list[tuple[Path, int]] = []
        for name in ["coordinator", *(f"worker{i}" for i in range(1, WORKERS + 1))]:
            nodes.append(_start_node(root, name, user))
            started.append(nodes[-1][0])
        for _, port in nodes:
            with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True) as conn:
                if dbname != "postgres":
                    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
            with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/{dbname}", autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS citus")
        coordinator = f"postgresql://postgres@127.0.0.1:{nodes[0][1]}/{dbname}"
        with psycopg.connect(coordinator, autocommit=True) as conn:
            conn.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)", (nodes[0][1],))
            for _, port in nodes[1:]:
                conn.execute("SELECT citus_add_node('127.0.0.1', %s)", (port,))
        yield coordinator
    finally:
        for data in reversed(started):
            subprocess.run([str(BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                           user=user, capture_output=True, check=False)
        # a server's last files can appear while it exits; a second pass takes them
        for _ in range(3):
            shutil.rmtree(root, ignore_errors=True)
            if not root.exists():
                break
            time.sleep(0.2)
