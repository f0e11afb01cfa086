"""How close gov's best-hours estimate comes to the simulated users' hidden hours.

The simulator knows each user's hidden responsiveness by local hour (story.hidden_hours);
gov sees only the deliveries, displays and clicks it shapes. This reads both of gov's
estimates at the end of a run: the click rate by hour of display (gov.hour_curves_v1 and
gov.user_hour_estimates, the function behind gov.best_hours_v1) and the reach by hour of
delivery (gov.hour_curves_v2 and gov.user_reach_estimates, behind gov.best_hours_v2, which
the timing reads), and compares them with the hidden hours, in gov's own reference: the
user's local hours where gov was told a zone, UTC hours where not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from gov.db import Source
from gov.lab.simulate.model import SimConfig
from gov.lab.simulate.story import SimUser, population
from gov.queries import q

STRENGTH = 20.0  # gov.best_hours_v1's default prior strength
DISPLAY_BUCKETS = ((1, 4), (5, 9), (10, 19), (20, None))
DELIVERY_BUCKETS = ((1, 4), (5, 9), (10, 19), (20, None))
CLICK_BUCKETS = ((0, 0), (1, 1), (2, 2), (3, None))
CHANCE = 3 / 24  # a guess lands within ±1 h of the hidden hour this often


@dataclass(frozen=True)
class HourRecovery:
    """The estimate against the truth: the population's curves and the users' best hours."""

    correlation: float | None  # Pearson, gov's population curve vs the hidden one, over 24 hours
    by_displays: tuple[tuple[str, int, int], ...]  # (bucket, users, of whom within ±1 h)
    by_clicks: tuple[tuple[str, int, int], ...]
    # the same of the reach (gov.hour_curves_v2, gov.best_hours_v2): what the timing reads
    reach_correlation: float | None = None
    by_deliveries: tuple[tuple[str, int, int], ...] = ()


def reference_hours(user: SimUser, start: datetime) -> list[float]:
    """A user's hidden curve in the hours gov counts them in: local if gov knows the zone, else UTC."""
    if user.time_zone is not None:
        return list(user.hours)
    zone = ZoneInfo(user.home_zone)
    day = start.replace(hour=0, minute=0, second=0, microsecond=0)
    return [user.hours[(day + timedelta(hours=h)).astimezone(zone).hour] for h in range(24)]


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else None


def _bucket(value: int, buckets: Sequence[tuple[int, int | None]]) -> str | None:
    for lo, hi in buckets:
        if value >= lo and (hi is None or value <= hi):
            return f"{lo}+" if hi is None else (f"{lo}" if lo == hi else f"{lo}–{hi}")
    return None


def collect_hours(source: Source, config: SimConfig) -> HourRecovery | None:
    """The comparison for a run with an hour effect (None without one, or without data)."""
    if config.hour_effect == 0:
        return None
    users = {u.user_id: u for u in population(config.users, config.seed)}
    window = {"since": config.end - config.start + timedelta(days=1), "now": config.end + timedelta(days=1),
              "strength": STRENGTH}
    curve = source.execute(q("sim_hour_curve"), window)
    best = source.execute(q("sim_best_hours"), window)
    if not best or len(curve) != 24 or any(e is None for _, e in curve):
        return None
    hidden = [0.0] * 24
    for u in users.values():
        for h, g in enumerate(reference_hours(u, config.start)):
            hidden[h] += g / len(users)
    correlation = pearson([float(e) for _, e in sorted(curve)], hidden)
    tallies: dict[tuple[str, str], list[int]] = {}

    def tally(kind: str, value: int, buckets: Sequence[tuple[int, int | None]], user_id: str, hour: int) -> None:
        ref = reference_hours(users[user_id], config.start)
        truth = max(range(24), key=lambda h: (ref[h], -h))
        off = abs(hour - truth)
        name = _bucket(value, buckets)
        if name is not None:
            t = tallies.setdefault((kind, name), [0, 0])
            t[0] += 1
            t[1] += min(off, 24 - off) <= 1

    for user_id, hour, displays, clicks in best:
        tally("d", int(displays), DISPLAY_BUCKETS, user_id, int(hour))
        tally("c", int(clicks), CLICK_BUCKETS, user_id, int(hour))
    reach = source.execute(q("sim_reach_curve"), window)
    reach_correlation = None
    if len(reach) == 24 and all(e is not None for _, e in reach):
        reach_correlation = pearson([float(e) for _, e in sorted(reach)], hidden)
        for user_id, hour, deliveries in source.execute(q("sim_best_reach"), window):
            if hour is not None:
                tally("r", int(deliveries), DELIVERY_BUCKETS, user_id, int(hour))

    def rows(kind: str, buckets: Sequence[tuple[int, int | None]]) -> tuple[tuple[str, int, int], ...]:
        names = [_bucket(lo, buckets) for lo, _ in buckets]
        return tuple((n, *tallies[(kind, n)]) for n in names if n is not None and (kind, n) in tallies)  # type: ignore[misc]

    return HourRecovery(correlation, rows("d", DISPLAY_BUCKETS), rows("c", CLICK_BUCKETS),
                        reach_correlation, rows("r", DELIVERY_BUCKETS))


def hours_lines(r: HourRecovery) -> list[str]:
    """The closing note: what each estimate recovers of the hidden hours."""
    def corr(c: float | None) -> str:
        return "–" if c is None else f"{c:.2f}"

    def shares(rows: Sequence[tuple[str, int, int]], unit: str) -> str:
        return "; ".join(f"{name} {unit}: {near / n * 100:.0f} % of {n:,}" for name, n, near in rows)

    out = [f"Best hours vs the hidden ones: the population's estimated curve correlates {corr(r.correlation)} "
           "with the hidden one (clicks by hour of display, gov.best_hours_v1)."]
    for title, rows, unit in (("displays", r.by_displays, "displays"), ("clicks", r.by_clicks, "clicks")):
        out.append(f"  users whose estimated best hour is within ±1 h of the hidden one, by {title}: "
                   + shares(rows, unit) + f" (chance: {CHANCE * 100:.1f} %)")
    if r.reach_correlation is not None:
        out.append(f"  by reach (displayed at once, by hour of delivery, gov.best_hours_v2; the timing's): "
                   f"correlates {corr(r.reach_correlation)}; users within ±1 h, by deliveries: "
                   + shares(r.by_deliveries, "deliveries") + f" (chance: {CHANCE * 100:.1f} %)")
    return out
