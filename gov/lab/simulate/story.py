"""The seeds' story: four teams sending to one population, each on its own schedule.

Nobody here sends too much. Lifecycle sends win-backs, merchandising sends campaigns and
flash sales, product announces features and sends digests, recommendations, mentions and
watchlist alerts, and the order pipeline sends confirmations, three shipping updates and
passcodes — all individually justified, all landing on the same people, on the same
Tuesday. The governor is the only part that sees the total.

Everything is drawn from random generators seeded by ``(seed, what, day)``, never from
one shared stream, so the traffic of a day does not depend on what happened before it
(who unsubscribed, what the governor did): the governed and the ungoverned run of
``--compare`` see exactly the same messages, and two runs with one seed the same story.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, time, timedelta
from typing import TypeVar
from zoneinfo import ZoneInfo

from gov.message import Message

#: The simulation starts on a Monday, so its second day is the seeds' Tuesday.
DEFAULT_START = datetime(2026, 6, 1, tzinfo=UTC)
DAY = timedelta(days=1)

#: (IANA zone told to gov, share of users). ``None``: the user never told us a zone, so
#: no quiet hours apply to them, but they still live somewhere (their ``home_zone``).
TIME_ZONES: tuple[tuple[str | None, float], ...] = (
    ("Europe/Berlin", 0.30),
    ("America/New_York", 0.25),
    ("Asia/Tokyo", 0.15),
    ("UTC", 0.10),
    (None, 0.20),
)
HOME_ZONES = ("Europe/Berlin", "America/New_York", "Asia/Tokyo", "UTC")
#: Quiet windows some users chose in the preference centre (local time).
OWN_QUIET_HOURS: tuple[tuple[time, time], ...] = (
    (time(21, 0), time(7, 0)),
    (time(23, 30), time(6, 30)),
    (time(20, 30), time(9, 0)),
    (time(0, 0), time(10, 0)),
)
OWN_QUIET_SHARE = 0.15  # of the users who have a time zone
ENDPOINT_WEIGHTS = (0.75, 0.20, 0.05)  # one, two or three browsers
MAX_ACTIVITY = 5.0  # the busiest users act five times as much as the average one


@dataclass(frozen=True)
class Kind:
    """One kind of notification a team sends, and how much a fresh user cares about it."""

    name: str
    team: str
    tier: str
    topic: str
    ttl_s: int
    click: float  # click probability for a user who received nothing else this week
    unsubscribe: float  # weight of this kind in the fatigue-driven unsubscribe probability
    collapse_key: str | None = None


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("winback", "lifecycle", "P2", "winback", 24 * 3600, 0.05, 1.0),
        Kind("promo", "merchandising", "P2", "promotions", 12 * 3600, 0.07, 1.0),
        Kind("flash", "merchandising", "P2", "flash-sale", 6 * 3600, 0.10, 1.0),
        Kind("feature", "product", "P2", "features", 48 * 3600, 0.06, 1.0),
        # a digest keeps its value for a week: its TTL outlasts the P3 window, so held
        # digests live to be collapsed into one summary instead of expiring
        Kind("digest", "product", "P3", "digest", 8 * 86400, 0.06, 1.0, collapse_key="digest"),
        Kind("recs", "product", "P3", "recommendations", 48 * 3600, 0.05, 1.0, collapse_key="recs"),
        Kind("mention", "product", "P1", "mentions", 24 * 3600, 0.30, 0.5),
        Kind("watch", "product", "P1", "watchlist", 12 * 3600, 0.20, 0.5),
        Kind("order", "orders", "P0", "orders", 3600, 0.35, 0.1),
        Kind("code", "orders", "P0", "passcodes", 600, 0.05, 0.1),
    )
}
TEAMS = ("lifecycle", "merchandising", "product", "orders")
TEAM_OF_TOPIC = {k.topic: k.team for k in KINDS.values()}
KIND_OF_TOPIC = {k.topic: k for k in KINDS.values()}


@dataclass(frozen=True)
class SimUser:
    """One subscriber and the traits that shape what the teams send them."""

    index: int
    user_id: str
    endpoints: int
    home_zone: str  # where they live: their day and night
    time_zone: str | None  # what gov was told (None: no quiet hours for them)
    quiet: tuple[time, time] | None  # their own quiet window, else the policy's
    activity: float  # mean 1: how much they order, follow and get mentioned
    digest: bool  # opted into the daily digest
    watchlist: bool  # watches prices
    lapsed: bool  # in the lifecycle team's win-back cohort
    marketing: bool  # opted into marketing pushes (campaigns, flash sales)
    segment: str = "casual"  # the app's own segment, told to gov (gov.users.segment); see SEGMENTS
    # hidden responsiveness by local hour of day (home zone), in [-1, 1] (hidden_hours):
    # gov never sees it, only what it shapes (when a notification shows, whether it is clicked)
    hours: tuple[float, ...] = ()


#: The app's segments and how much volume each tolerates: a segment's tolerance stretches
#: its fatigue curves along the volume axis (tolerance 2 reaches the same fatigue at twice
#: the weekly volume). Engaged users (busy, not lapsed) take more; dormant ones (the
#: win-back cohort) give up early; everyone else is casual, on the original curves.
SEGMENTS: dict[str, float] = {"engaged": 1.4, "casual": 1.0, "dormant": 0.7}
ENGAGED_ACTIVITY = 1.5  # activity at or above which a user who has not lapsed is engaged


def segment_of(activity: float, lapsed: bool) -> str:
    """The segment the app puts a user in, from traits the story already drew."""
    if lapsed:
        return "dormant"
    return "engaged" if activity >= ENGAGED_ACTIVITY else "casual"


@dataclass(frozen=True)
class Planned:
    """A message some team will hand to ``Governor.send`` at ``at``."""

    at: datetime
    user: int  # SimUser.index
    message: Message

    @property
    def sort_key(self) -> tuple[datetime, int, str]:
        return (self.at, self.user, self.message.id)


def rng(seed: int, *parts: object) -> random.Random:
    """An independent generator for one (seed, purpose, ...) (string seeds hash with SHA-512)."""
    return random.Random("/".join(str(p) for p in (seed, *parts)))


def uniform(seed: int, *parts: object) -> float:
    """One deterministic uniform draw in [0, 1) for a key: cheaper than a generator per message."""
    digest = hashlib.blake2b("/".join(str(p) for p in (seed, *parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


T = TypeVar("T")


def _pick(r: random.Random, weighted: Sequence[tuple[T, float]]) -> T:
    x = r.random() * sum(w for _, w in weighted)
    for value, weight in weighted:
        x -= weight
        if x < 0:
            return value
    return weighted[-1][0]


def population(users: int, seed: int) -> list[SimUser]:
    """``users`` subscribers with a spread of devices, time zones, quiet hours and habits."""
    r = rng(seed, "population")
    # lognormal activity with mean 1: most users are quiet, a tail is very busy — the
    # top decile the seeds warn is "buried while the median gets one a week"
    sigma = 0.8
    out = []
    for i in range(users):
        zone = _pick(r, TIME_ZONES)
        home = zone if zone is not None else r.choice(HOME_ZONES)
        quiet = r.choice(OWN_QUIET_HOURS) if zone is not None and r.random() < OWN_QUIET_SHARE else None
        # the draws below are in the population's original order, so the segments (read
        # off traits already drawn) change nobody's traffic
        endpoints = _pick(r, tuple(zip((1, 2, 3), ENDPOINT_WEIGHTS, strict=True)))
        activity = min(MAX_ACTIVITY, math.exp(r.gauss(-sigma * sigma / 2, sigma)))
        out.append(
            SimUser(
                index=i,
                user_id=f"u{i:05d}",
                endpoints=endpoints,
                home_zone=home,
                time_zone=zone,
                quiet=quiet,
                activity=activity,
                digest=r.random() < 0.30,
                watchlist=r.random() < 0.35,
                lapsed=r.random() < 0.20,
                marketing=r.random() < 0.50,
            )
        )
        out[-1] = replace(out[-1], segment=segment_of(out[-1].activity, out[-1].lapsed),
                          hours=hidden_hours(seed, out[-1].user_id))
    return out


# Relative likelihood that a user-driven event (an order, a mention) happens at each local
# hour: people act in the day and evening, rarely at night.
_LOCAL_ACTIVITY = (1, 1, 1, 1, 1, 1, 2, 4, 6, 7, 7, 7, 8, 7, 7, 7, 7, 8, 9, 10, 10, 8, 5, 2)
_ZONES: dict[str, ZoneInfo] = {}


def _zone(name: str) -> ZoneInfo:
    zone = _ZONES.get(name)
    if zone is None:
        zone = _ZONES[name] = ZoneInfo(name)
    return zone


def _poisson(r: random.Random, mean: float) -> int:
    # Knuth's method: the means here are small (well under 5)
    limit, k, p = math.exp(-mean), 0, r.random()
    while p > limit:
        k += 1
        p *= r.random()
    return k


class Story:
    """Generates, day by day, what each team hands to the governor."""

    def __init__(self, users: list[SimUser], seed: int, start: datetime = DEFAULT_START) -> None:
        self.users = users
        self.seed = seed
        self.start = start

    def _daytime(self, r: random.Random, user: SimUser, day_start: datetime) -> datetime:
        """A moment in this UTC day when ``user`` is likely awake, in their home zone."""
        zone = _zone(user.home_zone)
        top = max(_LOCAL_ACTIVITY)
        while True:
            at = day_start + timedelta(seconds=r.randrange(86400))
            if r.random() * top < _LOCAL_ACTIVITY[at.astimezone(zone).hour]:
                return at

    def _message(self, user: SimUser, kind: str, mid: str, title: str, body: str, campaign: str | None) -> Message:
        k = KINDS[kind]
        return Message(
            user_id=user.user_id,
            id=mid,
            tier=k.tier,
            topic=k.topic,
            campaign_id=campaign,
            title=title,
            body=body,
            url=f"https://shop.example/{k.topic}",
            collapse_key=k.collapse_key,
            ttl=k.ttl_s,
        )

    def day(self, d: int) -> Iterator[Planned]:
        """Everything the teams decide to send on day ``d`` (follow-ups may fall on later days)."""
        yield from self._lifecycle(d)
        yield from self._merchandising(d)
        yield from self._product(d)
        yield from self._orders(d)

    # ------------------------------------------------------------ the four teams

    def _lifecycle(self, d: int) -> Iterator[Planned]:
        """Win-backs at 09:00 UTC: each lapsed user every third day."""
        at = self.start + d * DAY + timedelta(hours=9)
        for u in self.users:
            if u.lapsed and (u.index + d) % 3 == 0:
                msg = self._message(u, "winback", f"winback-{d:02d}", "We miss you", "10% off your next order",
                                    f"winback-{d:02d}")
                yield Planned(at, u.index, msg)

    def _merchandising(self, d: int) -> Iterator[Planned]:
        """Campaigns at 10:00 and 18:00 UTC on weekdays, flash sales on Tuesdays and Saturdays at 12:00.

        Each to a random share of the users who opted into marketing: 25% per campaign, 50% per sale.
        """
        day_start = self.start + d * DAY
        weekday = day_start.weekday()
        if weekday < 5:
            for hour in (10, 18):
                r = rng(self.seed, "promo", d, hour)
                campaign = f"promo-{d:02d}-{hour:02d}"
                for u in self.users:
                    if r.random() < 0.25 and u.marketing:
                        msg = self._message(u, "promo", campaign, "New arrivals", "This week's picks for you", campaign)
                        yield Planned(day_start + timedelta(hours=hour), u.index, msg)
        if weekday in (1, 5):
            r = rng(self.seed, "flash", d)
            campaign = f"flash-{d:02d}"
            for u in self.users:
                if r.random() < 0.50 and u.marketing:
                    msg = self._message(u, "flash", campaign, "Flash sale: 6 hours only", "Up to 50% off", campaign)
                    yield Planned(day_start + timedelta(hours=12), u.index, msg)

    def _product(self, d: int) -> Iterator[Planned]:
        """Feature news (Tue 15:00 UTC), daily digests (07:00 UTC), recommendations, mentions, watchlist."""
        day_start = self.start + d * DAY
        if day_start.weekday() == 1:
            campaign = f"feature-{d:02d}"
            for u in self.users:
                msg = self._message(u, "feature", campaign, "New: saved searches", "Never miss a restock", campaign)
                yield Planned(day_start + timedelta(hours=15), u.index, msg)
        for u in self.users:
            if u.digest:
                msg = self._message(u, "digest", f"digest-{d:02d}", f"Your digest, day {d + 1}",
                                    "What happened while you were away", f"digest-{d:02d}")
                yield Planned(day_start + timedelta(hours=7), u.index, msg)
        r = rng(self.seed, "recs", d)
        for u in self.users:
            for n in range(_poisson(r, 0.10 * u.activity)):
                msg = self._message(u, "recs", f"recs-{d:02d}-{n}", "Picked for you", "Based on what you viewed",
                                    "recs")
                yield Planned(self._daytime(r, u, day_start), u.index, msg)
        r = rng(self.seed, "mention", d)
        for u in self.users:
            for n in range(_poisson(r, 0.15 * u.activity)):
                msg = self._message(u, "mention", f"mention-{d:02d}-{n}", "You were mentioned",
                                    "Someone replied to your review", None)
                yield Planned(self._daytime(r, u, day_start), u.index, msg)
        # A market move: prices drop at a random moment and every watcher gets a burst
        # of alerts within the hour — the P1 cap's reason to exist.
        r = rng(self.seed, "market", d)
        if r.random() < 0.30:
            move = day_start + timedelta(seconds=r.randrange(86400))
            for u in self.users:
                if u.watchlist:
                    for n in range(1 + _poisson(r, 0.5 * u.activity)):
                        msg = self._message(u, "watch", f"watch-{d:02d}-{n}", "Price drop on your watchlist",
                                            "An item you watch is cheaper now", None)
                        yield Planned(move + timedelta(seconds=r.randrange(3600)), u.index, msg)

    def _orders(self, d: int) -> Iterator[Planned]:
        """Orders (confirmation, then three shipping updates over the next days) and passcodes."""
        day_start = self.start + d * DAY
        r = rng(self.seed, "orders", d)
        for u in self.users:
            for n in range(_poisson(r, 0.05 * u.activity)):
                at = self._daytime(r, u, day_start)
                ref = f"{d:02d}{n}{u.index:05d}"
                steps = (
                    ("confirmed", "Order confirmed", timedelta(0)),
                    ("shipped", "Your order has shipped", timedelta(hours=r.uniform(4, 30))),
                    ("out", "Out for delivery today", timedelta(hours=r.uniform(12, 40))),
                    ("delivered", "Delivered", timedelta(hours=r.uniform(2, 8))),
                )
                for step, title, delay in steps:
                    at += delay
                    msg = self._message(u, "order", f"order-{d:02d}-{n}-{step}", title, f"Order #{ref}", None)
                    yield Planned(at, u.index, msg)
            for n in range(_poisson(r, 0.05 * u.activity)):
                msg = self._message(u, "code", f"code-{d:02d}-{n}", "Your sign-in code",
                                    f"{r.randrange(10**6):06d} is your code", None)
                yield Planned(self._daytime(r, u, day_start), u.index, msg)


# ---------------------------------------------------------------- engagement

#: The typical shapes of a user's day (the local hour they respond best at) and their
#: shares; each user's peak is shifted by up to PEAK_SHIFT hours and every hour gets
#: noise of its own, so no two users are alike.
HOUR_SHAPES: tuple[tuple[float, float], ...] = ((8.0, 0.30), (12.5, 0.30), (20.0, 0.40))  # morning, lunch, evening
PEAK_SHIFT = 1.5  # hours, either way
HOUR_NOISE = 0.35  # relative to the daily swing
MIN_OPEN = 0.05  # even at a user's worst hour, a browser is sometimes open
DEFAULT_HOUR_EFFECT = 0.5  # the best hour (1 + 0.5) three times as responsive as the worst (1 - 0.5)


def hidden_hours(seed: int, user_id: str) -> tuple[float, ...]:
    """A user's hidden responsiveness by local hour of day, 24 values scaled to [-1, 1].

    Drawn from its own generator (seed, user): the population's other traits, and so the
    traffic, are the same with or without it.
    """
    r = rng(seed, "hours", user_id)
    peak = _pick(r, HOUR_SHAPES) + r.uniform(-PEAK_SHIFT, PEAK_SHIFT)
    raw = [math.cos(2 * math.pi * (h - peak) / 24) + HOUR_NOISE * r.uniform(-1, 1) for h in range(24)]
    lo, hi = min(raw), max(raw)
    return tuple(2 * (x - lo) / (hi - lo) - 1 for x in raw)


def hidden_best_hour(user: SimUser) -> int:
    """The local hour a user responds best at (what gov's estimate should find)."""
    return max(range(24), key=lambda h: (user.hours[h], -h))


def hour_factor(user: SimUser, at: datetime, amplitude: float) -> float:
    """How much of the click probability a notification displayed at ``at`` gets: 1 + amplitude * g(local hour)."""
    if amplitude == 0 or not user.hours:
        return 1.0
    return 1.0 + amplitude * user.hours[at.astimezone(_zone(user.home_zone)).hour]


def shown_at(seed: int, user: SimUser, message_id: str, delivered: datetime, ttl_s: int,
             amplitude: float) -> datetime | None:
    """When a notification delivered at ``delivered`` is displayed; None if its TTL ran out first.

    A desktop browser shows a push only while it runs: at a user's local hour h it is open
    with probability 1 - amplitude * (1 - g(h)) (at least MIN_OPEN), so at their best
    hour always, at their worst (amplitude 0.5) hardly ever: a browser closed at night
    shows the notification in the morning. Checked at delivery, then once an hour (at a
    moment within it), while the push service still holds the message (its TTL, counted
    from the delivery). Amplitude 0: displayed on delivery, as before the hour effect.
    """
    if amplitude == 0 or not user.hours:
        return delivered
    zone = _zone(user.home_zone)
    hour_start = delivered.replace(minute=0, second=0, microsecond=0)
    k = 0
    while True:
        if k == 0:
            at = delivered
        else:
            at = hour_start + timedelta(hours=k, seconds=int(3600 * uniform(seed, "when", user.user_id, message_id, k)))
        if (at - delivered).total_seconds() > ttl_s:
            return None
        p_open = max(MIN_OPEN, 1.0 - amplitude * (1.0 - user.hours[at.astimezone(zone).hour]))
        if uniform(seed, "open", user.user_id, message_id, k) < p_open:
            return at
        k += 1


#: What a user does with a notification once it is displayed.
OUTCOMES = ("click", "close", "ignore", "unsubscribe")
DISPLAY_RATE = 0.97  # the rest the OS swallowed (focus modes, muted sites)
CLOSE_SHARE = 0.35  # of the notifications not clicked, the share dismissed by hand


def fatigue_click_factor(volume: float) -> float:
    """How much of a fresh user's click probability is left after ``volume`` sends this week."""
    return 1.0 / (1.0 + (volume / 4.0) ** 1.5)


def unsubscribe_probability(volume: float, weight: float) -> float:
    """Probability that one more notification makes a user leave, after ``volume`` this week.

    Negligible at a handful a week, steep past ten: the crossover the fatigue report finds.
    """
    return min(0.25, weight * (0.0002 + 0.0003 * (volume / 4.0) ** 4))


def probabilities(kind: Kind, volume: int, tolerance: float = 1.0, hour: float = 1.0) -> tuple[float, float]:
    """(P(unsubscribe), P(click)) of one displayed message after ``volume`` sends this week.

    ``tolerance`` stretches both fatigue curves along the volume axis: a user of tolerance
    2 is as tired after 10 sends as one of tolerance 1 after 5. ``hour`` is the user's
    responsiveness at the local hour of display (:func:`hour_factor`), which scales the
    click probability only: fatigue comes from the volume, whatever the hour.
    """
    felt = volume / tolerance
    p_unsub = unsubscribe_probability(felt, kind.unsubscribe)
    return p_unsub, min(kind.click * fatigue_click_factor(felt) * hour, 1.0 - p_unsub)


def expected(kind: Kind, volume: int, tolerance: float = 1.0, hour: float = 1.0) -> tuple[float, float]:
    """(expected clicks, expected unsubscribes) of one delivered message: the dice of
    :func:`react` without the noise (the ground truth the fatigue measure estimates)."""
    p_unsub, p_click = probabilities(kind, volume, tolerance, hour)
    p_click = min(p_click, 1.0 - p_unsub)
    return DISPLAY_RATE * p_click, DISPLAY_RATE * p_unsub


def react(
    seed: int, user_id: str, message_id: str, kind: Kind, volume: int, tolerance: float = 1.0, hour: float = 1.0
) -> tuple[bool, str]:
    """(displayed, outcome) of one delivered message, for a user who got ``volume`` this week.

    The draw is keyed by (seed, user, message), not taken from a shared stream: the same
    message meets the same dice in the governed and the ungoverned run, so the two differ
    only by the volume the user had received (common random numbers). ``tolerance`` is
    the user's (their segment's times the run's ``--tolerance``), ``hour`` their
    responsiveness at the hour of display, see :func:`probabilities`.
    """
    if uniform(seed, "display", user_id, message_id) >= DISPLAY_RATE:
        return False, "ignore"
    u = uniform(seed, "react", user_id, message_id)
    p_unsub, p_click = probabilities(kind, volume, tolerance, hour)
    if u < p_unsub:
        return True, "unsubscribe"
    if u < p_unsub + p_click:
        return True, "click"
    if u < p_unsub + p_click + (1 - p_unsub - p_click) * CLOSE_SHARE:
        return True, "close"
    return True, "ignore"
