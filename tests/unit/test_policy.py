"""Policy files: parsing, validation with line numbers, canonical text and diff."""

from __future__ import annotations

import pytest

from gov import PolicyError
from gov.policy import default_policy, default_policy_text, diff, format_duration, parse_duration, parse_policy


def test_default_policy_is_the_seeds_tiers() -> None:
    p = default_policy()
    assert p.tiers["P0"].exempt and p.tiers["P0"].urgency == "high"
    assert [(w.window_ms, w.cap) for w in p.tiers["P1"].windows] == [(86_400_000, 6)]
    assert [(w.window_ms, w.cap) for w in p.tiers["P2"].windows] == [(86_400_000, 2), (604_800_000, 5)]
    assert [(w.window_ms, w.cap) for w in p.tiers["P3"].windows] == [(604_800_000, 1)]
    assert {n: t.on_exceed for n, t in p.tiers.items()} == {"P0": None, "P1": "defer", "P2": "drop", "P3": "collapse"}
    assert p.tiers["P1"].defer_max_ms == 6 * 3_600_000
    assert p.tiers["P3"].consumes == ("P1", "P2", "P3")
    assert p.tiers["P2"].consumes == ("P1", "P2")


def test_canonical_text_round_trips() -> None:
    p = default_policy()
    again = parse_policy(p.to_toml())
    assert again == p
    assert diff(p, again) == ""


def test_diff_shows_the_change() -> None:
    p = default_policy()
    tighter = parse_policy(default_policy_text().replace("cap = 2 }", "cap = 1 }"))
    d = diff(p, tighter)
    assert '-windows = [{ window = "24h", cap = 2 }' in d
    assert '+windows = [{ window = "24h", cap = 1 }' in d


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("[tiers.P1\nwindows = []\n", 1, "Expected ']'"),
        ('[tiers.P1]\non_exceed = "shout"\n', 2, "on_exceed must be one of"),
        ('[tiers.P1]\non_exceed = "drop"\nwindows = [{ window = "24h", cap = -1 }]\n', 3, "cap must be a whole number"),
        ('[tiers.P1]\non_exceed = "drop"\nwindows = [{ window = "a day", cap = 1 }]\n', 3, "expected a duration"),
        ('\n[tiers.P2]\non_exceed = "drop"\nconsumes = ["P1", "P2"]\n', 4, "consumes P1, which is not defined"),
        ('[tiers.P0]\nexempt = true\nwindows = []\n', 3, "is exempt"),
        ('[tiers.P1]\non_exceed = "drop"\nurgency = "high"\n', 3, "only an exempt"),
        ('[tiers.X1]\nexempt = true\n', 1, "must be P0..P9"),
        ('[tiers.P1]\non_exceed = "drop"\n[extra]\na = 1\n', 3, "unknown section"),
        ('[tiers.P1]\non_exceed = "drop"\n\n[quiet_hours]\nstart = "25:00"\nend = "08:00"\n', 4, "HH:MM"),
    ],
)
def test_malformed_policy_names_line_and_reason(text: str, line: int, reason: str) -> None:
    with pytest.raises(PolicyError) as exc:
        parse_policy(text, "p.toml")
    assert str(exc.value).startswith(f"p.toml:{line}: "), str(exc.value)
    assert reason in str(exc.value)


def test_durations() -> None:
    assert parse_duration("24h", "x") == 86_400_000
    assert parse_duration("7d", "x") == 604_800_000
    assert parse_duration(1500, "x") == 1500
    assert format_duration(86_400_000) == "24h"
    assert format_duration(604_800_000) == "7d"
    assert format_duration(1500) == "1500ms"
    with pytest.raises(ValueError):
        parse_duration("0h", "x")


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        # no P0 at all: a passcode would have no exempt tier to go to
        ('# caps\n[tiers.P1]\non_exceed = "drop"\n', 2, "P0 (transactional) must be defined"),
        # P0 capped, deferred or collapsed: invariant 4 broken by configuration
        ('[tiers.P0]\non_exceed = "drop"\nwindows = [{ window = "24h", cap = 1 }]\n', 1, "must be exempt"),
        ('[tiers.P0]\nexempt = false\non_exceed = "defer"\n', 1, "P0 (transactional) must be exempt"),
    ],
)
def test_a_policy_that_could_suppress_p0_is_refused(text: str, line: int, reason: str) -> None:
    with pytest.raises(PolicyError) as exc:
        parse_policy(text, "p.toml")
    assert str(exc.value).startswith(f"p.toml:{line}: ") and reason in str(exc.value)


def test_a_collapse_tier_whose_ttl_cannot_outlive_its_window_is_warned_about() -> None:
    assert default_policy().warnings() == []
    short = parse_policy(default_policy_text().replace('ttl = "8d"', 'ttl = "24h"'))
    assert [w.split(":")[0] for w in short.warnings()] == ["tier P3"]
