"""The simulated users' hidden hours (story.hidden_hours, hour_factor, shown_at): the test
bench for gov's best-hours estimate, deterministic per seed and off at amplitude 0."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from gov.lab.simulate.story import (
    HOUR_SHAPES,
    KINDS,
    SEGMENTS,
    expected,
    hidden_best_hour,
    hidden_hours,
    hour_factor,
    population,
    react,
    shown_at,
)

T = datetime(2026, 6, 2, 12, 0, tzinfo=UTC)


def test_every_user_has_a_day_of_their_own_scaled_to_one_swing() -> None:
    users = population(300, seed=1)
    assert all(len(u.hours) == 24 and min(u.hours) == -1.0 and max(u.hours) == 1.0 for u in users)
    assert users[0].hours == hidden_hours(1, users[0].user_id) == population(300, seed=1)[0].hours  # per seed
    assert population(300, seed=2)[0].hours != users[0].hours
    # the typical shapes show: best hours cluster near 8, 12-13 and 20, with spread
    best = [hidden_best_hour(u) for u in users]
    for peak, _ in HOUR_SHAPES:
        assert sum(abs(b - peak) <= 2.5 for b in best) > 30, (peak, sorted(best))
    assert len(set(best)) >= 8


def test_the_population_is_unchanged_but_for_the_hours() -> None:
    # the hours have a generator of their own: every other trait, so the traffic, is as before
    users = population(200, seed=3)
    again = population(200, seed=3)
    assert [replace(u, hours=()) for u in users] == [replace(u, hours=()) for u in again]
    assert all(u.segment and u.home_zone for u in users)


def test_the_best_hour_is_three_times_the_worst_at_the_default() -> None:
    u = population(1, seed=1)[0]
    zone = ZoneInfo(u.home_zone)
    day = datetime(2026, 6, 2, tzinfo=zone)
    factors = [hour_factor(u, day + timedelta(hours=h), 0.5) for h in range(24)]
    assert max(factors) == 1.5 and min(factors) == 0.5
    assert factors.index(max(factors)) == hidden_best_hour(u)
    assert all(hour_factor(u, day + timedelta(hours=h), 0.0) == 1.0 for h in range(24))


def test_display_waits_for_an_open_browser_and_only_within_the_ttl() -> None:
    users = population(200, seed=1)
    # amplitude 0: displayed on delivery, the run as before the hour effect
    assert all(shown_at(1, u, "m", T, 3600, 0.0) == T for u in users)
    waits = [shown_at(1, u, f"m{i}", T + timedelta(hours=i % 24), 48 * 3600, 0.5) for i, u in enumerate(users)]
    assert all(w is not None for w in waits)
    delays = [(w - (T + timedelta(hours=i % 24))).total_seconds() for i, w in enumerate(waits) if w is not None]
    assert min(delays) == 0 and max(delays) > 3600 and sum(d == 0 for d in delays) > len(delays) / 4
    # deterministic, and never later than the TTL
    assert waits == [shown_at(1, u, f"m{i}", T + timedelta(hours=i % 24), 48 * 3600, 0.5) for i, u in enumerate(users)]
    short = [shown_at(1, u, f"m{i}", T + timedelta(hours=i % 24), 600, 0.5) for i, u in enumerate(users)]
    assert any(s is None for s in short)
    assert all(s is None or s - (T + timedelta(hours=i % 24)) <= timedelta(seconds=600) for i, s in enumerate(short))
    # a displayed notification shows while the browser is likelier open: at better hours
    def mean_g(times: list[datetime | None]) -> float:
        gs = [u.hours[t.astimezone(ZoneInfo(u.home_zone)).hour] for u, t in zip(users, times, strict=True) if t]
        return sum(gs) / len(gs)

    delivered: list[datetime | None] = [T + timedelta(hours=i % 24) for i in range(len(users))]
    assert mean_g(waits) > mean_g(delivered) + 0.1


def test_clicks_follow_the_hour_of_display() -> None:
    kind = KINDS["promo"]
    good = sum(react(1, "u", f"m{i}", kind, 0, hour=1.5)[1] == "click" for i in range(4000))
    bad = sum(react(1, "u", f"m{i}", kind, 0, hour=0.5)[1] == "click" for i in range(4000))
    plain = sum(react(1, "u", f"m{i}", kind, 0)[1] == "click" for i in range(4000))
    assert 2.4 < good / bad < 3.6 and bad < plain < good


def test_the_recovery_note_compares_in_gvs_own_hours() -> None:
    from gov.lab.simulate.hours import HourRecovery, hours_lines, pearson, reference_hours

    users = population(200, seed=1)
    told = next(u for u in users if u.time_zone is not None)
    assert reference_hours(told, T) == list(told.hours)
    # a user who never told a zone is counted by gov in UTC hours: their curve shifted there
    silent = next(u for u in users if u.time_zone is None and u.home_zone == "Asia/Tokyo")
    shifted = reference_hours(silent, T)
    assert shifted == [silent.hours[(h + 9) % 24] for h in range(24)]
    assert pearson([1, 2, 3], [2, 4, 6]) == 1.0 and pearson([1, 1], [1, 2]) is None
    lines = hours_lines(HourRecovery(0.93, (("1–4", 10, 3), ("20+", 4, 2)), (("0", 8, 1),)))
    assert "correlates 0.93" in lines[0]
    assert "1–4 displays: 30 % of 10; 20+ displays: 50 % of 4" in lines[1] and "0 clicks: 12 % of 8" in lines[2]
    assert len(lines) == 3  # no reach read: no reach line
    both = hours_lines(HourRecovery(-0.3, (), (), 0.97, (("10–19", 10, 4),)))
    assert "correlates -0.30" in both[0] and "by reach" in both[3]
    assert "correlates 0.97" in both[3] and "10–19 deliveries: 40 % of 10" in both[3]


def test_the_story_ends_at_its_end_no_display_or_reaction_after_it_is_recorded_or_counted() -> None:
    """With an hour effect a display can fall after the simulation's end; its display and
    reaction were recorded then and counted by the summary's engagement line and dice
    table, not by the marginal measure at the end (263 unsubscribes against 259)."""
    from gov.lab.simulate.engine import Engine
    from gov.lab.simulate.model import SimConfig

    config = SimConfig(users=80, days=1, seed=5, tolerance=0.1, hour_effect=0.9)
    engine = Engine("postgresql://unused", config, governed=True)
    now = config.end - timedelta(minutes=5)  # the last tick's delivery
    for u in engine.users:  # a busy week: an unsubscribe is a likely reaction
        for k in range(12):
            engine.reader.add(u.index, now - timedelta(hours=k + 1))
    items = [(u.user_id, "promo-00-10", 1) for u in engine.users]
    late = [u for u in engine.users
            if (shown_at(config.seed, u, "promo-00-10", now, KINDS["promo"].ttl_s, 0.9) or now) > config.end]
    assert len(late) >= 10  # the rule is exercised: many browsers open only after midnight
    events = engine._react(items, now)
    assert events and all(at <= config.end for *_, at in events)
    late_ids = {u.user_id for u in late}
    assert not any(user in late_ids for user, *_ in events)  # neither the display nor the reaction
    # the dice table counts what was recorded, and every send
    (sends, clicks, unsubscribes), = engine.stats.curve.values()
    assert sends == len(items)
    assert clicks == sum(e == "click" for _, _, e, _, _ in events)
    assert unsubscribes == sum(e == "unsubscribe" for _, _, e, _, _ in events) > 0
    # the truth gives a display after the end no expected click or unsubscribe either
    truth = sum(c + u for _, c, u in engine.stats.truth.values())
    on_time = 0.0
    for u in engine.users:
        shown = shown_at(config.seed, u, "promo-00-10", now, KINDS["promo"].ttl_s, 0.9)
        if shown is not None and u.user_id not in late_ids:
            on_time += sum(expected(KINDS["promo"], 12, SEGMENTS[u.segment] * 0.1, hour_factor(u, shown, 0.9)))
    assert sum(n for n, _, _ in engine.stats.truth.values()) == len(items)
    assert truth == pytest.approx(on_time) and on_time > 0
    # an unsubscribe drawn after the end still stops the teams (gov is handed what it was), uncounted
    assert engine.unsubscribed_after_end and engine.unsubscribed_after_end <= engine.unsubscribed
    assert not engine.unsubscribed_after_end & {engine.by_id[user].index for user, *_ in events}
