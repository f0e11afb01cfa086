"""``gov simulate``: the click command (registered on ``gov``'s group; also runnable on its own).

    python -m gov.lab.simulate.cli --users 200 --days 7 --compare

The summary goes to stdout; the progress bar, the wall time and errors to stderr. A
failure is one line, ``gov: error: …``, and exit 1; so is a P0 message that was not
delivered, which must never happen.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from gov.cli.common import FiniteRange, check_output_path, option
from gov.db import resolve_url
from gov.errors import GovError, one_line
from gov.lab.simulate.cost import cost_meter
from gov.lab.simulate.engine import EngineStats, RunOutcome, SimConfig, load_policy
from gov.lab.simulate.engine import simulate as run_simulation
from gov.lab.simulate.model import HOUR_EFFECT_RANGE, TOLERANCE_RANGE, tolerance_problem
from gov.lab.simulate.summary import plural, print_summary, to_html
from gov.lab.simulate.versus import policy_comparison, policy_verdict


def _progress_callback(progress: Progress, task: Any, days: int) -> Callable[[int, int, EngineStats], None]:
    def update(tick: int, ticks: int, stats: EngineStats) -> None:
        day = min(days, tick * days // ticks + 1)
        progress.update(task, total=ticks, completed=tick, day=f"day {day}/{days}",
                        sent=f"{stats.sent:,} messages")

    return update


@click.command(context_settings={"show_default": True})
@option("--users", envvar="GOV_SIMULATE_USERS", type=click.IntRange(1, 1_000_000), default=2000,
        help="Simulated subscribers (one to three browsers each).")
@option("--days", envvar="GOV_SIMULATE_DAYS", type=click.IntRange(1, 366), default=14,
        help="Simulated days, starting on a Monday.")
@option("--policy", "policy_file", envvar="GOV_SIMULATE_POLICY", default=None,
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="A TOML policy to simulate instead of gov's default one.")
@option("--seed", envvar="GOV_SIMULATE_SEED", type=int, default=1,
        help="One seed, one story: two runs with the same seed print the same summary.")
@option("--tolerance", envvar="GOV_SIMULATE_TOLERANCE", type=FiniteRange(*TOLERANCE_RANGE), default=1.0,
        help="Stretch every simulated fatigue curve along the volume axis: 2 moves every true crossover "
        "to about twice the weekly volume.")
@option("--hour-effect", envvar="GOV_SIMULATE_HOUR_EFFECT", type=FiniteRange(*HOUR_EFFECT_RANGE), default=0.5,
        help="Amplitude of the users' hidden responsiveness by local hour (morning, lunch or evening people, "
        "each with noise): it delays display while their browser is closed and scales clicks by the hour of "
        "display; 0.5 makes the best hour about 3x the worst, 0 turns it off.")
@option("--html", "html_file", envvar="GOV_SIMULATE_HTML", default=None,
        type=click.Path(dir_okay=False, path_type=Path),
        help="Also write the summary to this file as a self-contained HTML page with SVG charts.")
@option("--compare", envvar="GOV_SIMULATE_COMPARE", is_flag=True,
        help="Replay the same story with the governor off (every cap out of reach, no quiet hours), or "
        "with --policy under gov's default policy, and show both side by side. The same messages are "
        "planned; the teams stop sending to users who unsubscribed, so the messages handed to gov differ.")
@option("--warm-days", envvar="GOV_SIMULATE_WARM_DAYS", type=click.IntRange(0, 365), default=0,
        help="With a --policy whose [timing] is on: play the first N days with the timing off and turn it on at "
        "that midnight, so that it starts from estimates that know the users (a warm start). Must be fewer than "
        "--days. With --compare the paired lines then count only what the timing moved after it.")
@option("--keep", envvar="GOV_SIMULATE_KEEP", is_flag=True,
        help="Keep the scratch database(s) and print their URLs, to look around with SQL.")
@option("--grid", envvar="GOV_SIMULATE_GRID", is_flag=True,
        help="Calibrate the crossover measure instead: one governed run per seed x tolerance (--seeds, "
        "--tolerances; --users, --days and --hour-effect as given), each saved under --grid-cache and reused, "
        "then every cell (all users and each segment: the measure, its interval, the truth, agreement) and the "
        "false-early count. A saved file is reused only when it holds a simulation of exactly these settings made "
        "by this code; any other (unreadable, truncated, of older code) is simulated again and replaced, said in "
        "one line on stderr.")
@option("--seeds", envvar="GOV_SIMULATE_SEEDS", default="1-5", help="With --grid: seeds, e.g. 1-5 or 11,12.")
@option("--tolerances", envvar="GOV_SIMULATE_TOLERANCES", default="0.75,1,1.5",
        help="With --grid: tolerances, comma-separated, each in 0.1-10 as --tolerance.")
@option("--grid-cache", envvar="GOV_SIMULATE_GRID_CACHE", default=Path(".gov/grid"),
        type=click.Path(file_okay=False, path_type=Path),
        help="With --grid: where each simulation's counts and truth are saved (a saved one is not simulated again).")
@option("--database-url", envvar="GOV_DATABASE_URL", default=None,
        help="A server to simulate on: a scratch database gov_sim_<random> is created there (needs CREATEDB) "
        "and dropped after; your own gov tables are never touched. Without one, the embedded PostgreSQL "
        "under $GOV_DATA_DIR (./.gov).")
def simulate(
    users: int,
    days: int,
    policy_file: Path | None,
    seed: int,
    tolerance: float,
    hour_effect: float,
    html_file: Path | None,
    compare: bool,
    warm_days: int,
    keep: bool,
    grid: bool,
    seeds: str,
    tolerances: str,
    grid_cache: Path,
    database_url: str | None,
) -> None:
    """Play the seeds' story — four teams sending on one Tuesday — through gov on a simulation clock.

    Lifecycle, merchandising, product and the order pipeline each send on their own
    schedule; every message goes through the governor, held messages through the
    releaser and allowed ones through the runner to a real loopback push service. Ends
    with what happened per tier and team, the rules that blocked, sends per user per
    week and the fatigue report.
    """
    check_output_path(html_file, "--html")  # before minutes of simulation, not after
    err = Console(stderr=True)
    if grid:
        _grid(users, days, hour_effect, seeds, tolerances, grid_cache, database_url, err)
        return
    try:
        policy_text = policy_name = None
        if policy_file is not None:
            try:
                policy_text, policy_name = policy_file.read_text(encoding="utf-8"), f"policy {policy_file.name}"
            except (OSError, UnicodeDecodeError) as exc:
                raise GovError(f"cannot read {policy_file}: {exc}") from None
        if warm_days >= days:
            _usage_error("--warm-days", f"{warm_days} is not fewer than the run's {days} days")
        if warm_days and policy_name is not None:
            policy_name += f" (warm: on from day {warm_days + 1})"
        config = SimConfig(users=users, days=days, seed=seed, tolerance=tolerance, hour_effect=hour_effect,
                           policy_text=policy_text, warm_days=warm_days,
                           policy_name=policy_name or "default policy")
        try:
            chosen, _ = load_policy(config)  # a bad file is refused before anything starts, as bad usage
        except GovError as exc:
            # one line, exit 2, as gov's own usage errors (also when run as this module)
            click.echo(f"gov: error: Invalid value for '--policy': {one_line(str(exc))} "
                       "(see gov simulate --help)", err=True)
            sys.exit(2)
        if warm_days and not chosen.timing_enabled:  # it would change nothing: say so, not a silent no-op
            _usage_error("--warm-days", "it needs a --policy whose [timing] is enabled")
        started = time.perf_counter()
        server = resolve_url(database_url)
        spent = cost_meter(server)
        runs: list[RunOutcome] = []
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[day]}"),
                      TextColumn("{task.fields[sent]}"), TimeElapsedColumn(), console=err, transient=True,
                      disable=not err.is_terminal) as bar:  # a bar on a terminal only, never in a log
            plans = [(config, True, "governed")]
            if compare and policy_file is not None:  # the file against gov's default policy
                plans.append((replace(config, policy_text=None, policy_name="default policy", warm_days=0), True,
                              "default policy"))
            elif compare:  # the governor against no governor
                plans.append((config, False, "governor off"))
            for plan, governed, label in plans:
                task = bar.add_task(f"simulating ({label})", total=None, day="setting up", sent="")
                runs.append(run_simulation(server, plan, governed=governed, keep=keep, label=label,
                                           progress=_progress_callback(bar, task, days)))
        wall = time.perf_counter() - started
        cost = spent()
    except GovError as exc:
        click.echo(f"gov: error: {one_line(str(exc)) or type(exc).__name__}", err=True)
        sys.exit(1)

    out = Console() if sys.stdout.isatty() else Console(width=160)
    governed_run = runs[0].summary
    off_run = runs[1].summary if compare and policy_file is None else None
    print_summary(out, governed_run, off_run)
    if compare and policy_file is not None:
        out.print()
        out.print(policy_comparison(governed_run, runs[1].summary))
        out.print(policy_verdict(governed_run, runs[1].summary))
    if html_file is not None:
        try:
            versus = runs[1].summary if compare and policy_file is not None else None
            html_file.write_text(to_html(governed_run, off_run, versus), encoding="utf-8")
        except OSError as exc:
            click.echo(f"gov: error: cannot write {html_file}: {exc.strerror}", err=True)
            sys.exit(1)
        click.echo(f"gov: summary written to {html_file}", err=True)
    for run in runs:
        if run.kept_url:
            click.echo(f"gov: kept the {run.label} run's database: {run.kept_url}", err=True)
    # wall time only here, on stderr: the summary must not change from run to run
    per_run = "; ".join(f"{r.label} {r.stats.wall_s:.1f} s, {r.stats.sent / max(r.stats.wall_s, 1e-9):,.0f} "
                        "messages/s" for r in runs)
    click.echo(f"gov: simulated {plural(users, 'user')} × {plural(days, 'day')} in {wall:.1f} s wall ({per_run}); "
               f"{cost.line()}", err=True)
    if not governed_run.exempt.ok or (off_run is not None and not off_run.exempt.ok):
        click.echo("gov: error: a P0 message was suppressed or not delivered to every endpoint", err=True)
        sys.exit(1)


def _usage_error(option_name: str, problem: str) -> NoReturn:
    """One line, exit 2, as gov's own usage errors (also when run as this module)."""
    click.echo(f"gov: error: Invalid value for '{option_name}': {problem} (see gov simulate --help)", err=True)
    sys.exit(2)


def _grid(users: int, days: int, hour_effect: float, seeds: str, tolerances: str, cache: Path,
          database_url: str | None, err: Console) -> None:
    from gov.lab.simulate.grid import cells, grid_table, grid_verdict, load_or_simulate, parse_list

    # every value checked before the first simulation: a bad one must not end minutes of work
    try:
        seed_list = parse_list(seeds, int)
    except ValueError:
        _usage_error("--seeds", f"{seeds!r} is not a list of whole numbers or ranges (e.g. 1-5 or 11,12)")
    try:
        tolerance_list = parse_list(tolerances, float)
    except ValueError:
        _usage_error("--tolerances", f"{tolerances!r} is not a comma-separated list of numbers")
    for tol in tolerance_list:
        problem = tolerance_problem(tol)
        if problem is not None:
            _usage_error("--tolerances", problem)

    def stale(path: Path, why: str) -> None:
        click.echo(f"gov: {path}: {why}; simulating it again", err=True)  # one line, never wrapped

    try:
        sims = [load_or_simulate(cache, lambda: resolve_url(database_url), seed, tol, users, days,
                                 hour_effect=hour_effect, on_stale=stale,
                                 on_simulate=lambda s, t: err.print(f"gov: simulating seed {s}, tolerance {t:g}"))
                for tol in tolerance_list for seed in seed_list]
    except GovError as exc:
        click.echo(f"gov: error: {one_line(str(exc)) or type(exc).__name__}", err=True)
        sys.exit(1)
    result = cells(sims)
    out = Console() if sys.stdout.isatty() else Console(width=160)
    out.print(grid_table(result))
    out.print(grid_verdict(result))


if __name__ == "__main__":  # pragma: no cover
    simulate()
