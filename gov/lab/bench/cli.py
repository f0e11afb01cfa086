"""``gov bench``: the click command (registered on ``gov``'s group; also runnable on its own).

    python -m gov.lab.bench.cli --seconds 2 --workload mixed

Figures go to stdout (the table) and to ``--json FILE``; progress and errors to stderr.
A failure is one line, ``gov: error: …``, and exit 1.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console

from gov.cli.common import check_output_path, option
from gov.errors import GovError, one_line
from gov.lab.bench.decisions import WORKLOADS, BenchConfig, BenchError, run

if TYPE_CHECKING:
    from gov.lab.bench.http import HttpBenchConfig


@click.command(context_settings={"show_default": True})
@option(
    "--database-url",
    envvar="GOV_DATABASE_URL",
    help="A server to bench on: a scratch database gov_bench_<random> is created there (needs CREATEDB) "
    "and dropped after; your own gov tables are never touched. Without one, a throwaway embedded PostgreSQL.",
)
@option(
    "--compare-url",
    envvar="GOV_BENCH_COMPARE_URL",
    help="A second server to measure the same decisions on, in the same interleaved rounds (typically a "
    "Citus coordinator; a scratch database there too): its lines are named …@compare, with their ratio "
    "to the primary's (--database-url, or the embedded server). Not with --delivery, --campaign or --http.",
)
@option(
    "--connections",
    envvar="GOV_BENCH_CONNECTIONS",
    type=click.IntRange(min=1),
    default=8,
    help="Client processes, one connection each.",
)
@option(
    "--seconds",
    envvar="GOV_BENCH_SECONDS",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    help="Length of each timed run (one contender on one workload).",
)
@option(
    "--users",
    envvar="GOV_BENCH_USERS",
    type=click.IntRange(min=1),
    default=None,
    show_default="10,000; 2,000 with --http",
    help="Population of the saturated and mixed workloads, of --campaign's audience, and of --http's "
    "random users.",
)
@option(
    "--workload",
    "workloads",
    envvar="GOV_BENCH_WORKLOAD",
    type=click.Choice([*WORKLOADS, "all"]),
    multiple=True,
    default=["all"],
    help="fresh: users never seen (all allowed); saturated: users at their cap (all suppressed); "
    "mixed: random users from --users. Repeatable.",
)
@option(
    "--rounds",
    envvar="GOV_BENCH_ROUNDS",
    type=click.IntRange(min=1),
    default=1,
    help="Timed runs per contender and workload, interleaved (order reversed every other round); "
    "the table shows medians. Use on a busy machine.",
)
@option(
    "--history",
    envvar="GOV_BENCH_HISTORY",
    type=click.IntRange(min=0),
    default=0,
    help="Send rows preloaded before each gov run: half in-window for other users, half older than 7 days.",
)
@option(
    "--durability",
    envvar="GOV_BENCH_DURABILITY",
    type=click.Choice(["durable", "async", "both"]),
    default="durable",
    help="async: gov's connections SET synchronous_commit = off, an opt-in trade (a crash may lose the "
    "last fraction of a second of decisions); both: report gov and gov_async.",
)
@option(
    "--json",
    "json_path",
    envvar="GOV_BENCH_JSON",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the figures to this file as JSON.",
)
@option(
    "--redis/--no-redis",
    envvar="GOV_BENCH_REDIS",
    default=None,
    show_default="when redis-server is on PATH",
    help="Measure the seeds' Redis Lua scripts on a private redis-server.",
)
@option(
    "--lock",
    envvar="GOV_BENCH_LOCK",
    type=click.Choice(["advisory", "row", "both"]),
    default="advisory",
    hidden=True,
    help="Lock-choice measurement: 'row' swaps the decision's advisory lock for a gov.users row lock "
    "(gov_row; scratch database only); 'both' measures gov and gov_row in the same run.",
)
@option(
    "--delivery",
    is_flag=True,
    envvar="GOV_BENCH_DELIVERY",
    help="Measure deliveries/s and client CPU per message instead: gov dispatch against a naive "
    "one-request-at-a-time pywebpush loop, same run, same loopback push service (a counting Node.js "
    "server, measured alone first).",
)
@option(
    "--messages",
    envvar="GOV_BENCH_MESSAGES",
    type=click.IntRange(min=1),
    default=2000,
    help="With --delivery: messages each contender delivers.",
)
@option(
    "--workers",
    envvar="GOV_BENCH_WORKERS",
    type=click.IntRange(min=1),
    default=2,
    help="With --delivery: the runner's concurrent HTTP workers per process (on loopback two keep a "
    "process busy; real push services, tens of milliseconds away, want more: gov dispatch's default is 8).",
)
@option(
    "--processes",
    envvar="GOV_BENCH_PROCESSES",
    type=click.IntRange(min=1),
    default=None,
    show_default="the machine's cores",
    help="With --delivery: runner processes (gov dispatch --processes).",
)
@option(
    "--verify",
    is_flag=True,
    envvar="GOV_BENCH_VERIFY",
    help="With --delivery: deliver to gov.testing.PushService, which verifies VAPID and decrypts every "
    "message (a correctness pass; too slow to show the senders' speed).",
)
@option(
    "--campaign",
    is_flag=True,
    envvar="GOV_BENCH_CAMPAIGN",
    help="Measure campaign decisions/s (Governor.decide_many for --users fresh users) against single "
    "decisions on one connection and from --connections clients, in the same run.",
)
@option(
    "--campaign-connections",
    envvar="GOV_BENCH_CAMPAIGN_CONNECTIONS",
    type=click.IntRange(min=1),
    default=4,
    help="With --campaign: connections the campaign's user-ordered slices are decided on at once.",
)
@option(
    "--batch",
    envvar="GOV_BENCH_BATCH",
    type=click.IntRange(min=1),
    default=500,
    help="With --campaign: users per campaign transaction.",
)
@option(
    "--http",
    is_flag=True,
    envvar="GOV_BENCH_HTTP",
    help="Measure requests/s and latency at the door instead: gov serve's POST /internal/send against the "
    "seeds' send path in a node:http server on a private redis-server (skipped, with the reason, without "
    "node or npm), same load (P2 sends for --users random users), interleaved --rounds of --seconds.",
)
@option(
    "--http-connections",
    envvar="GOV_BENCH_HTTP_CONNECTIONS",
    type=click.IntRange(min=1),
    default=16,
    help="With --http: keep-alive connections of the load client, one request in flight on each.",
)
@option(
    "--http-client",
    envvar="GOV_BENCH_HTTP_CLIENT",
    type=click.Choice(["auto", "wrk", "python"]),
    default="auto",
    help="With --http: the load client; auto is wrk when it is on PATH, else gov's Python client.",
)
@option(
    "--http-baseline",
    envvar="GOV_BENCH_HTTP_BASELINE",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="With --http: also measure the gov serve of this gov checkout (e.g. a git worktree of an older "
    "commit), on a database its own gov db upgrade migrated, as gov_serve_baseline.",
)
@option(
    "--serve-arg",
    "serve_args",
    envvar="GOV_BENCH_SERVE_ARG",
    multiple=True,
    help="With --http: one more argument for this gov's `gov serve` command line (repeatable, in order; "
    "not given to the baseline's: see --baseline-serve-arg).",
)
@option(
    "--baseline-serve-arg",
    "baseline_serve_args",
    envvar="GOV_BENCH_BASELINE_SERVE_ARG",
    multiple=True,
    help="With --http-baseline: one more argument for the baseline's `gov serve` command line (repeatable, in "
    "order). Give it the same as --serve-arg to compare the code alone: a baseline without --workers 2 "
    "against this gov with it measures the processes, not the change.",
)
def bench(
    database_url: str | None,
    compare_url: str | None,
    connections: int,
    seconds: float,
    users: int | None,
    workloads: tuple[str, ...],
    rounds: int,
    history: int,
    durability: str,
    json_path: Path | None,
    redis: bool | None,
    lock: str,
    delivery: bool,
    messages: int,
    workers: int,
    processes: int | None,
    verify: bool,
    campaign: bool,
    campaign_connections: int,
    batch: int,
    http: bool,
    http_connections: int,
    http_client: str,
    http_baseline: Path | None,
    serve_args: tuple[str, ...],
    baseline_serve_args: tuple[str, ...],
) -> None:
    """Measure decisions per second: gov's decide against a SELECT 1 floor and the seeds' Redis scripts.

    Compare the × floor column within one run, never absolute figures across runs.
    --delivery, --campaign and --http measure deliveries, campaign decisions and gov serve's
    requests instead.
    """
    # before any scratch database, embedded server or client process exists
    check_output_path(json_path, "--json")
    if compare_url and (delivery or campaign or http):
        raise click.UsageError("--compare-url measures decisions only: not with --delivery, --campaign or --http")
    if delivery and not verify and shutil.which("node") is None:
        raise click.UsageError("--delivery: the counting push service needs Node.js (`node` on PATH); "
                               "or bench on the verifying Python service with --verify")
    if baseline_serve_args and not (http and http_baseline):
        raise click.UsageError("--baseline-serve-arg is for the baseline's gov serve: with --http and --http-baseline")
    if http:
        from gov.lab.bench.http import HttpBenchConfig

        _http(HttpBenchConfig(
            database_url=database_url, seconds=seconds, rounds=rounds, users=users or 2000,
            connections=http_connections, client=http_client, serve_args=serve_args, baseline=http_baseline,
            baseline_serve_args=baseline_serve_args,
        ), json_path)
        return
    users = users or 10_000
    if delivery:
        _delivery(database_url, messages, workers, processes, verify, json_path)
        return
    if campaign:
        _campaign(database_url, connections, campaign_connections, batch, users, seconds, rounds, json_path)
        return
    chosen = tuple(w for w in WORKLOADS if w in workloads or "all" in workloads)
    cfg = BenchConfig(
        database_url=database_url,
        connections=connections,
        seconds=seconds,
        users=users,
        workloads=chosen,
        history=history,
        rounds=rounds,
        durability=durability,
        redis=redis,
        lock=lock,
        compare_url=compare_url,
    )
    try:
        report = run(cfg, progress=lambda msg: click.echo(f"gov bench: {msg}", err=True))
        if json_path is not None:
            report.write_json(json_path)
    except (GovError, BenchError, RuntimeError, OSError) as exc:
        # one line, whatever the driver put in the message (libpq's span several)
        click.echo(f"gov: error: {one_line(str(exc)) or type(exc).__name__}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        # the clients, the private redis-server and the scratch database are already gone
        click.echo("gov: interrupted", err=True)
        sys.exit(130)
    # wide enough for the --compare-url ratio column without wrapping
    console = Console() if sys.stdout.isatty() else Console(width=160)
    report.print(console)


def _campaign(database_url: str | None, clients: int, campaign_connections: int, batch: int, users: int,
              seconds: float, rounds: int, json_path: Path | None) -> None:
    import json

    from rich.table import Table

    from gov.lab.bench.campaign import CONTENDERS, run_campaign_bench
    from gov.testing.postgres import scratch_database

    try:
        with scratch_database(database_url, "gov_bench") as dsn:
            report = run_campaign_bench(
                dsn, clients=clients, campaign_connections=campaign_connections, batch=batch, users=users,
                seconds=seconds, rounds=rounds, progress=lambda msg: click.echo(f"gov bench: {msg}", err=True),
            )
    except (GovError, BenchError, RuntimeError, OSError) as exc:
        click.echo(f"gov: error: {one_line(str(exc)) or type(exc).__name__}", err=True)
        sys.exit(1)
    single = report.median("single_1") or 1.0
    single_n = report.median("single_n") or 1.0
    table = Table(title=f"campaign vs single decisions (medians of {rounds} round(s), durable)")
    for column in ("contender", "what", "decisions/s", "× single (1 conn)", f"× single ({clients} clients)",
                   "rounds, decisions/s"):
        table.add_column(column, justify="left" if column in ("contender", "what") else "right")
    for c in CONTENDERS:
        m = report.median(c)
        table.add_row(c, str(report.settings[c]), f"{m:,.0f}", f"{m / single:.2f}", f"{m / single_n:.2f}",
                      " ".join(f"{x:,.0f}" for x in report.rates[c]))
    console = Console() if sys.stdout.isatty() else Console(width=160)
    console.print(table)
    console.print("load average (1, 5, 15 min): before {} · after {} · {} cores".format(
        ", ".join(f"{x:.2f}" for x in report.load_before), ", ".join(f"{x:.2f}" for x in report.load_after),
        os.cpu_count()))
    if json_path is not None:
        json_path.write_text(json.dumps(report.as_json(), indent=2))


def _http(cfg: HttpBenchConfig, json_path: Path | None) -> None:
    import json

    from gov.lab.bench.http import print_report, run_http_bench

    try:
        report = run_http_bench(cfg, progress=lambda msg: click.echo(f"gov bench: {msg}", err=True))
    except (GovError, BenchError, RuntimeError, OSError) as exc:
        click.echo(f"gov: error: {one_line(str(exc)) or type(exc).__name__}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        # the servers, the private redis-server and the scratch databases are already gone
        click.echo("gov: interrupted", err=True)
        sys.exit(130)
    print_report(report, Console() if sys.stdout.isatty() else Console(width=160))
    if json_path is not None:
        json_path.write_text(json.dumps(report.as_json(), indent=2) + "\n", encoding="utf-8")
    if report.failures:
        click.echo(f"gov: error: a cap was exceeded: {'; '.join(report.failures)}", err=True)
        sys.exit(1)


def _delivery(database_url: str | None, messages: int, workers: int, processes: int | None, verify: bool,
              json_path: Path | None) -> None:
    import json

    from rich.table import Table

    from gov.lab.bench.delivery import run_delivery_bench
    from gov.testing.postgres import scratch_database

    try:
        with scratch_database(database_url, "gov_bench") as dsn:
            report = run_delivery_bench(
                dsn, messages=messages, workers=workers, processes=processes,
                service="verify" if verify else "count",
                progress=lambda msg: click.echo(f"gov bench: {msg}", err=True),
            )
    except (GovError, BenchError, RuntimeError, OSError) as exc:
        click.echo(f"gov: error: {one_line(str(exc)) or type(exc).__name__}", err=True)
        sys.exit(1)
    figures = report.figures
    naive = figures[0].per_second or 1.0
    where = "the verifying test push service" if verify else "a counting push service"
    table = Table(title=f"deliveries to {where} on loopback (its own process)")
    for column in ("contender", "messages", "delivered", "seconds", "messages/s", "× naive", "client CPU ms/msg"):
        table.add_column(column, justify="left" if column == "contender" else "right")
    for f in figures:
        table.add_row(f.contender, f"{f.messages:,}", f"{f.delivered:,}", f"{f.seconds:.2f}",
                      f"{f.per_second:,.0f}", f"{f.per_second / naive:.2f}", f"{f.cpu_ms_per_message:.3f}")
    console = Console() if sys.stdout.isatty() else Console(width=120)
    console.print(table)
    seeds = next((f for f in figures if f.contender.startswith("the seeds' sender")), None)
    command = next((f for f in figures if f.contender.startswith("the whole command")), None)
    if seeds is not None and command is not None and seeds.per_second:
        console.print(f"the whole command against the seeds' sender: {command.per_second / seeds.per_second:.2f}×")
    for note in report.notes:
        console.print(note)
    if report.service_per_second is not None:
        console.print(f"push service alone (keep-alive, pipelined): {report.service_per_second:,.0f} requests/s")
    console.print("load average (1, 5, 15 min): before {} · after {} · {} cores".format(
        ", ".join(f"{x:.2f}" for x in report.load_before), ", ".join(f"{x:.2f}" for x in report.load_after),
        os.cpu_count()))
    if json_path is not None:
        json_path.write_text(json.dumps(report.as_json(), indent=2))


if __name__ == "__main__":  # pragma: no cover
    bench()
