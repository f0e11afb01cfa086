"""The bench's figures: aggregated from the client processes, printed as one table, saved as JSON."""

from __future__ import annotations

import json
import math
import statistics
from array import array
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


@dataclass(frozen=True)
class WorkerResult:
    """What one client process measured in one timed run."""

    index: int
    decisions: int
    allowed: int
    suppressed: int
    elapsed_ns: int
    latencies_ns: bytes  # array("q").tobytes(): one entry per call, in call order


@dataclass(frozen=True)
class Figures:
    """One contender on one workload: the line of the table."""

    contender: str
    workload: str
    decisions: int  # over every round
    decisions_per_s: float  # the median round's
    p50_ms: float  # over every call of every round
    p99_ms: float
    allowed: int | None  # None for the floor: SELECT 1 decides nothing
    suppressed: int | None
    x_floor: float | None  # median over rounds of (this round's rate / the floor's in the same round)
    rates: tuple[float, ...] = ()  # decisions/s of each round, in order
    target: str = "primary"  # primary (--database-url or embedded) | compare (--compare-url)
    # an @compare line against its primary line, same run: compare / primary
    x_primary_rate: float | None = None
    x_primary_p50: float | None = None
    x_primary_p99: float | None = None


def percentile(sorted_values: Sequence[int], p: float) -> int:
    """Nearest-rank percentile of already sorted values (no interpolation, no numpy)."""
    if not sorted_values:
        return 0
    rank = max(1, math.ceil(p * len(sorted_values)))
    return sorted_values[rank - 1]


def rate(results: Sequence[WorkerResult]) -> float:
    """Decisions per second of one timed run: the clients' own rates added up.

    Each over its own span: they were released together, but each stops after the call
    that crossed its deadline.
    """
    return sum(r.decisions / (r.elapsed_ns / 1e9) for r in results if r.elapsed_ns > 0)


def aggregate(
    contender: str,
    workload: str,
    rounds: Sequence[Sequence[WorkerResult]],
    floor: Sequence[Sequence[WorkerResult]],
    *,
    decides: bool,
) -> Figures:
    """Merge the rounds of one contender on one workload; ``floor`` is SELECT 1's rounds, the same run.

    The ratio to the floor is taken round by round (each pair ran minutes apart at most,
    under the same background load) and its median kept: the figure noise moves least.
    """
    latencies = array("q")
    for results in rounds:
        for r in results:
            latencies.frombytes(r.latencies_ns)
    ordered = sorted(latencies)
    rates = [rate(results) for results in rounds]
    ratios = [mine / theirs for mine, theirs in zip(rates, (rate(f) for f in floor), strict=True) if theirs > 0]
    every = [r for results in rounds for r in results]
    return Figures(
        contender=contender,
        workload=workload,
        decisions=sum(r.decisions for r in every),
        decisions_per_s=round(statistics.median(rates), 1),
        p50_ms=round(percentile(ordered, 0.50) / 1e6, 3),
        p99_ms=round(percentile(ordered, 0.99) / 1e6, 3),
        allowed=sum(r.allowed for r in every) if decides else None,
        suppressed=sum(r.suppressed for r in every) if decides else None,
        x_floor=round(statistics.median(ratios), 3) if ratios else None,
        rates=tuple(round(x, 1) for x in rates),
    )


@dataclass
class Report:
    """A whole run: its settings (what was measured, and how) and one Figures per line."""

    settings: dict[str, Any]
    figures: list[Figures] = field(default_factory=list)
    # server CPU per decision: one row per (workload, contender, node) and a total per contender
    server_cpu: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"settings": self.settings, "results": [asdict(f) for f in self.figures],
                "server_cpu": self.server_cpu}

    def write_json(self, path: Path) -> None:
        path.write_text(json.dumps(self.as_json(), indent=2) + "\n", encoding="utf-8")

    def table(self) -> Table:
        """The figures as one rich table, grouped by workload."""
        rounds = max((len(f.rates) for f in self.figures), default=1)
        title = "gov bench: decisions" + (f" (medians of {rounds} interleaved rounds)" if rounds > 1 else "")
        table = Table(title=title, title_justify="left")
        table.add_column("contender")
        table.add_column("workload")
        for name in ("decisions/s", "× floor", "p50 ms", "p99 ms", "allowed", "suppressed"):
            table.add_column(name, justify="right")
        compared = any(f.x_primary_rate is not None for f in self.figures)
        if compared:
            table.add_column("compare/primary: dec/s, p50, p99", justify="right")
        if rounds > 1:
            table.add_column("rounds, decisions/s", justify="right")
        previous = None
        for f in self.figures:
            if previous is not None and f.workload != previous:
                table.add_section()
            previous = f.workload
            cells = [
                f.contender,
                f.workload,
                f"{f.decisions_per_s:,.0f}",
                "–" if f.x_floor is None else f"{f.x_floor:.2f}",
                f"{f.p50_ms:.2f}",
                f"{f.p99_ms:.2f}",
                "–" if f.allowed is None else f"{f.allowed:,}",
                "–" if f.suppressed is None else f"{f.suppressed:,}",
            ]
            if compared:
                cells.append("" if f.x_primary_rate is None else
                             f"{f.x_primary_rate:.2f}× {_ratio(f.x_primary_p50)}× {_ratio(f.x_primary_p99)}×")
            if rounds > 1:
                cells.append(" ".join(f"{x:,.0f}" for x in f.rates))
            table.add_row(*cells)
        return table

    def cpu_table(self) -> Table:
        """Server CPU per decision on each node of each target (µs), and each contender's total."""
        table = Table(title="server CPU per decision (postmaster and its children, /proc)", title_justify="left")
        for name in ("contender", "workload", "node", "role", "µs / decision", "CPU s"):
            table.add_column(name, justify="right" if name in ("µs / decision", "CPU s") else "left")
        previous = None
        for row in self.server_cpu:
            key = (row["workload"], row["contender"])
            if previous is not None and key != previous:
                table.add_section()
            previous = key
            us = row["us_per_decision"]
            table.add_row(row["contender"], row["workload"], row["node"], row["role"],
                          row["note"] if us is None else f"{us:,.1f}",
                          "" if row["cpu_s"] is None else f"{row['cpu_s']:.2f}")
        return table

    def print(self, console: Console) -> None:
        """The settings, then the table."""
        for k, v in self.settings.items():
            console.print(f"[bold]{k}[/bold]: {v}", highlight=False)
        console.print(self.table())
        if self.server_cpu:
            console.print(self.cpu_table())


def _ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"
