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

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
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
from gov.lab.simulate.story import DEFAULT_HOUR_EFFECT

FORMAT = 2  # the cache files' layout; a file of another layout is simulated again
DEFAULT_SEEDS = (1, 2, 3, 4, 5)
DEFAULT_TOLERANCES = (0.75, 1.0, 1.5)

#: What makes a simulation's data, besides its settings: the simulator, the parts of gov
#: it drives, the SQL, the default policy. A change to any of them (a comment too) makes
#: every saved simulation stale: it is simulated again rather than reused.
_PACKAGE = Path(__file__).resolve().parents[2]  # gov/
SIMULATED_BY = ("lab/simulate/*.py", "governor.py", "message.py", "policy.py", "users.py", "default_policy.toml",
                "hold/*.py", "delivery/*.py", "analytics/marginal.py", "analytics/events.py")


@cache
def code_version() -> str:
    """A fingerprint of the code that makes a simulation's data (SIMULATED_BY and the SQL)."""
    from gov.queries import sql_dir

    digest = hashlib.sha256()
    files = sorted({f for pattern in SIMULATED_BY for f in _PACKAGE.glob(pattern)})
    root = sql_dir()
    for f in [*files, *sorted(root.rglob("*.sql"))]:
        digest.update(str(f.relative_to(_PACKAGE if f.is_relative_to(_PACKAGE) else root)).encode())
        digest.update(b"\0")
        digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class SimData:
    """What the measure and the truth need from one finished simulation."""

    seed: int
    tolerance: float
    users: int
    days: int
    hour_effect: float = DEFAULT_HOUR_EFFECT
    code: str = ""  # code_version() of the code that simulated it
    # segment (OVERALL for everyone) -> [(position, sends, clicks, unsubscribes)], positions ascending
    counts: dict[str, list[tuple[int, int, int, int]]] = field(default_factory=dict)
    # (segment, position, sends, expected clicks, expected unsubscribes), from the simulator's dice
    truth: list[tuple[str, int, int, float, float]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "seed": self.seed, "tolerance": self.tolerance, "users": self.users,
                "days": self.days, "hour_effect": self.hour_effect, "code": self.code, "counts": self.counts,
                "truth": self.truth}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SimData:
        return cls(
            seed=int(data["seed"]), tolerance=float(data["tolerance"]), users=int(data["users"]),
            days=int(data["days"]), hour_effect=float(data["hour_effect"]), code=str(data["code"]),
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
    """'1-5' or '1,2,3' (seeds) or '0.75,1,1.5' (tolerances); ValueError for anything else."""
    out: list[Any] = []
    for part in text.split(","):
        part = part.strip()
        span = re.fullmatch(r"(-?\d+)\s*-\s*(-?\d+)", part) if kind is int else None
        if span is not None:
            out.extend(range(int(span[1]), int(span[2]) + 1))
        elif part:
            out.append(kind(part))
    if not out:
        raise ValueError(f"{text!r}: no value")
    return tuple(out)


def cache_path(cache: Path, seed: int, tolerance: float, users: int, days: int,
               hour_effect: float = DEFAULT_HOUR_EFFECT) -> Path:
    return cache / f"sim-u{users}-d{days}-seed{seed}-tol{tolerance:g}-hour{hour_effect:g}.json"


def simulate_data(server: str | None, seed: int, tolerance: float, users: int, days: int,
                  hour_effect: float = DEFAULT_HOUR_EFFECT) -> SimData:
    """Run one governed simulation and read back what the measure and the truth need."""
    from gov.analytics.marginal import marginal_counts
    from gov.lab.simulate.engine import Engine
    from gov.lab.simulate.model import SimConfig
    from gov.testing.postgres import scratch_database

    config = SimConfig(users=users, days=days, seed=seed, tolerance=tolerance, hour_effect=hour_effect)
    with scratch_database(server, "gov_sim", durable=False) as dsn:
        stats = Engine(dsn, config, governed=True).run()
        counts = marginal_counts(dsn, since=config.end - config.start, now=config.end)
    return SimData(
        seed=seed, tolerance=tolerance, users=users, days=days, hour_effect=hour_effect, code=code_version(),
        counts={seg: [(c.position, c.sends, c.clicks, c.unsubscribes) for c in rows] for seg, rows in counts.items()},
        truth=[(seg, pos, int(n), float(c), float(u)) for (seg, pos), (n, c, u) in sorted(stats.truth.items())],
    )


def read_saved(path: Path, seed: int, tolerance: float, users: int, days: int,
               hour_effect: float = DEFAULT_HOUR_EFFECT) -> tuple[SimData | None, str]:
    """The saved simulation at ``path`` if it is one of exactly these settings and this
    code; else (None, why not): no file, not JSON, another layout, other settings (a
    tolerance that only prints the same, another hour effect) or other code."""
    if not path.exists():
        return None, "not saved"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return None, "not a saved simulation of this layout"
        sim = SimData.from_json(data)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        return None, f"not a saved simulation ({type(exc).__name__})"
    if (sim.seed, sim.tolerance, sim.users, sim.days, sim.hour_effect) != (seed, tolerance, users, days, hour_effect):
        return None, "saved with other settings"
    if sim.code != code_version():
        return None, "saved by other code"
    return sim, ""


def load_or_simulate(
    cache: Path, server: str | Callable[[], str] | None, seed: int, tolerance: float, users: int, days: int,
    *, hour_effect: float = DEFAULT_HOUR_EFFECT, on_simulate: Callable[[int, float], None] | None = None,
    on_stale: Callable[[Path, str], None] | None = None,
) -> SimData:
    """The saved simulation of (seed, tolerance, users, days, hour effect), simulated and
    saved first if missing (``server`` may be a callable, called only then: a saved grid
    starts no server). A file that is not a saved simulation of these settings and this
    code (unreadable, truncated, of other code) is simulated again and replaced, and
    ``on_stale`` is told which and why."""
    path = cache_path(cache, seed, tolerance, users, days, hour_effect)
    saved, why = read_saved(path, seed, tolerance, users, days, hour_effect)
    if saved is not None:
        return saved
    if path.exists() and on_stale is not None:
        on_stale(path, why)
    if on_simulate is not None:
        on_simulate(seed, tolerance)
    sim = simulate_data(server() if callable(server) else server, seed, tolerance, users, days, hour_effect)
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
