"""What a simulation is asked to do and what its loop counts: shared by the engine, which
fills them, and the summary, which reads them (apart from both so that neither imports
the other back)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gov.lab.simulate.story import DAY, DEFAULT_HOUR_EFFECT, DEFAULT_START

CURVE_TOP = 15  # the ground-truth curve groups 15 and more sends a week together
TOLERANCE_RANGE = (0.1, 10.0)  # --tolerance and each --tolerances value (story.probabilities divides by it)
HOUR_EFFECT_RANGE = (0.0, 0.9)  # --hour-effect: at 1 a user's worst hour would never show a notification


def tolerance_problem(value: float) -> str | None:
    """Why ``value`` is no tolerance (not finite, or outside TOLERANCE_RANGE), or None."""
    low, high = TOLERANCE_RANGE
    if not math.isfinite(value) or not low <= value <= high:
        return f"{value!r} is not a finite number in the range {low:g}<=x<={high:g}"
    return None


@dataclass(frozen=True)
class SimConfig:
    """What to simulate. ``policy_text`` None: the default policy."""

    users: int = 2000
    days: int = 14
    seed: int = 1
    tolerance: float = 1.0  # stretches every fatigue curve along the volume axis (story.probabilities)
    # amplitude of the users' hidden responsiveness by local hour (story.hidden_hours): 0 plays
    # the run without it, every notification displayed on delivery and clicked whatever the hour
    hour_effect: float = DEFAULT_HOUR_EFFECT
    policy_text: str | None = None
    policy_name: str = "default policy"
    start: datetime = DEFAULT_START
    tick: timedelta = timedelta(minutes=5)
    lanes: int = 4  # parallel senders (by user): the decision is server-side work
    runners: int = 2  # runner processes (gov.delivery.runner.Dispatcher)
    workers: int = 8  # concurrent HTTP requests per runner process
    push_services: int = 2  # loopback push services, each in its own process (users are spread over them)
    # with the policy's [timing] on: the days played with it off first, so that the timing
    # starts from estimates that know the users (a warm start); 0: on from the first day
    warm_days: int = 0

    def __post_init__(self) -> None:
        # the CLI refuses these as usage errors; a caller of the library gets a ValueError
        # before a database is created, not a ZeroDivisionError (or complex numbers) mid-run
        problem = tolerance_problem(self.tolerance)
        if problem is not None:
            raise ValueError(f"tolerance: {problem}")
        if not 0 <= self.warm_days < self.days:
            raise ValueError(f"warm_days: {self.warm_days!r} is not a whole number of days from 0 to the "
                             f"run's {self.days} less one")
        low, high = HOUR_EFFECT_RANGE
        if not (math.isfinite(self.hour_effect) and low <= self.hour_effect <= high):
            raise ValueError(f"hour_effect: {self.hour_effect!r} is not a finite number in the range "
                             f"{low:g}<=x<={high:g}")

    @property
    def end(self) -> datetime:
        return self.start + self.days * DAY


@dataclass
class EngineStats:
    """Counters the loop keeps; the summary itself is read from the database."""

    planned: int = 0  # messages the teams planned within the run
    sent: int = 0  # handed to Governor.send
    skipped: int = 0  # planned for a user who had unsubscribed by then
    unsubscribed: int = 0  # users
    events: int = 0  # telemetry events recorded
    events_available: bool = True
    push_requests: int = 0  # what the push service received
    push_decrypted: int = 0  # of which it verified and decrypted (answered 2xx)
    wall_s: float = 0.0
    # the simulated users' own fatigue curve, the ground truth the fatigue report estimates:
    # sends already received in the trailing 7 days → [sends, clicks, unsubscribes]
    curve: dict[int, list[int]] = field(default_factory=dict)
    # the same by the fatigue measure's definition, without the noise: (segment, position:
    # sends already received in the trailing 7 days) → [sends, expected clicks, expected
    # unsubscribes], summed from the dice of every delivered send (story.expected)
    truth: dict[tuple[str, int], list[float]] = field(default_factory=dict)
