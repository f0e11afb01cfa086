"""``gov simulate --grid``: the crossover measure calibrated against the simulator's truth.

One *cell* is one simulation (a seed and a tolerance, governed by gov's default policy)
and one set of users (everyone, or one segment). Simulating is the slow part (minutes
per run) and the measure is cheap, so a simulation is run once and saved as a small JSON
file (:class:`SimData`: the observed sends, clicks and unsubscribes per segment and
position, read back through ``gov.fatigue_marginal_v1`` with groups of one send, and the
noiseless truth the simulator summed from its own dice); every later evaluation of the
measure reads those files (:func:`load_or_simulate`). The measure recomputed from a file
is the measure ``gov report fatigue --marginal`` computes on the same database.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gov.analytics.crossover import (
    DEFAULT_MIN_EVENTS,
    OVERALL,
    Cell,
    Counts,
    CrossoverEstimate,
    estimate_report,
    true_crossover,
)

FORMAT = 1  # the cache files' layout; a file of another layout is simulated again
DEFAULT_SEEDS = (1, 2, 3, 4, 5)
DEFAULT_TOLERANCES = (0.75, 1.0, 1.5)


@dataclass(frozen=True)
class SimData:
    """What the measure and the truth need from one finished simulation."""

    seed: int
    tolerance: float
    users: int
    days: int
    # segment (OVERALL for everyone) -> [(position, sends, clicks, unsubscribes)], positions ascending
    counts: dict[str, list[tuple[int, int, int, int]]] = field(default_factory=dict)
    # (segment, position, sends, expected clicks, expected unsubscribes), from the simulator's dice
    truth: list[tuple[str, int, int, float, float]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "seed": self.seed, "tolerance": self.tolerance, "users": self.users,
                "days": self.days, "counts": self.counts, "truth": self.truth}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SimData:
        return cls(
            seed=int(data["seed"]), tolerance=float(data["tolerance"]), users=int(data["users"]),
            days=int(data["days"]),
            counts={s: [(int(p), int(n), int(c), int(u)) for p, n, c, u in rows] for s, rows in data["counts"].items()},
            truth=[(str(s), int(p), int(n), float(c), float(u)) for s, p, n, c, u in data["truth"]],
        )

    def truth_curve(self, segment: str) -> list[tuple[int, int, float, float]]:
        """(position, sends, expected clicks, expected unsubscribes) of one segment (OVERALL: everyone)."""
        out: dict[int, list[float]] = {}
        for seg, pos, n, c, u in self.truth:
            if segment in (OVERALL, seg):
                acc = out.setdefault(pos, [0, 0.0, 0.0])
                acc[0] += n
                acc[1] += c
                acc[2] += u
        return [(p, int(v[0]), v[1], v[2]) for p, v in sorted(out.items())]


def parse_list(text: str, kind: type) -> tuple[Any, ...]:
    """'1-5' or '1,2,3' (seeds) or '0.75,1,1.5' (tolerances)."""
    out: list[Any] = []
    for part in text.split(","):
        part = part.strip()
        if kind is int and "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        elif part:
            out.append(kind(part))
    return tuple(out)


def cache_path(cache: Path, seed: int, tolerance: float, users: int, days: int) -> Path:
    return cache / f"sim-u{users}-d{days}-seed{seed}-tol{tolerance:g}.json"


def simulate_data(server: str | None, seed: int, tolerance: float, users: int, days: int) -> SimData:
    """Run one governed simulation and read back what the measure and the truth need."""
    from gov.analytics.marginal import marginal_counts
    from gov.lab.simulate.engine import Engine
    from gov.lab.simulate.model import SimConfig
    from gov.testing.postgres import scratch_database

    config = SimConfig(users=users, days=days, seed=seed, tolerance=tolerance)
    with scratch_database(server, "gov_sim", durable=False) as dsn:
        stats = Engine(dsn, config, governed=True).run()
        counts = marginal_counts(dsn, since=config.end - config.start, now=config.end)
    return SimData(
        seed=seed, tolerance=tolerance, users=users, days=days,
        counts={seg: [(c.position, c.sends, c.clicks, c.unsubscribes) for c in rows] for seg, rows in counts.items()},
        truth=[(seg, pos, int(n), float(c), float(u)) for (seg, pos), (n, c, u) in sorted(stats.truth.items())],
    )


def load_or_simulate(
    cache: Path, server: str | Callable[[], str] | None, seed: int, tolerance: float, users: int, days: int,
    *, on_simulate: Callable[[int, float], None] | None = None,
) -> SimData:
    """The saved simulation of (seed, tolerance, users, days), simulated and saved first if
    missing (``server`` may be a callable, called only then: a saved grid starts no server)."""
    path = cache_path(cache, seed, tolerance, users, days)
    if path.exists():
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") == FORMAT:
            return SimData.from_json(data)
    if on_simulate is not None:
        on_simulate(seed, tolerance)
    sim = simulate_data(server() if callable(server) else server, seed, tolerance, users, days)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(sim.as_json()), encoding="utf-8")
    tmp.replace(path)  # a run killed halfway leaves no half file behind
    return sim


# ---------------------------------------------------------------- cells


def cells(sims: Iterable[SimData], *, min_events: int = DEFAULT_MIN_EVENTS) -> list[Cell]:
    """Every set of users of every simulation, everyone first."""
    out = []
    for sim in sims:
        counts = {seg: [Counts(*row) for row in rows] for seg, rows in sim.counts.items()}
        estimates = estimate_report(counts, min_events=min_events)
        segments = [OVERALL, *sorted({seg for seg, *_ in sim.truth})]
        for seg in segments:
            estimate = estimates.get(seg) or CrossoverEstimate.empty()
            out.append(Cell(sim.seed, sim.tolerance, seg, estimate, true_crossover(sim.truth_curve(seg))))
    return out


def cell_rows(grid: Sequence[Cell]) -> list[tuple[str, ...]]:
    """The grid as text rows: seed, tolerance, segment, the measure, its interval, the truth, agreement."""
    rows: list[tuple[str, ...]] = []
    for c in grid:
        e = c.estimate
        interval = "" if e.low is None else f"{e.low}–{'…' if e.high is None else e.high}"
        rows.append((
            str(c.seed), f"{c.tolerance:g}", "all users" if c.segment == OVERALL else c.segment,
            e.short_text(), interval, "not reached" if c.truth is None else str(c.truth),
            "FALSE EARLY" if c.false_early else c.mark,
        ))
    return rows


def grid_table(grid: Sequence[Cell]) -> Any:
    """Every cell as a rich table, and below it the agreement and the false-early count."""
    from rich.table import Table

    table = Table(title="The crossover measure vs the simulator's truth, per cell", title_justify="left",
                  title_style="bold")
    for name in ("seed", "tolerance", "users", "measure", "interval", "truth", "agree"):
        table.add_column(name, justify="left" if name in ("users", "measure") else "right")
    for row in cell_rows(grid):
        table.add_row(*row)
    return table


def grid_verdict(grid: Sequence[Cell]) -> str:
    agree = sum(c.agrees for c in grid)
    early = sum(c.false_early for c in grid)
    open_ = sum(c.undecided for c in grid)
    share = agree / len(grid) * 100 if grid else 0.0
    return (f"{agree} of {len(grid)} cells agree ({share:.1f} %); false early: {early}; "
            f"undecided (nothing declared, nothing said rules the truth out): {open_}")
