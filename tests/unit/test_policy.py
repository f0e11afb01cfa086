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


# ---------------------------------------------------------------- segment caps and rules

SEGMENTED = default_policy_text() + """
[tiers.P2.segments.dormant]
windows = [{ window = "7d", cap = 2 }]

[tiers.P2.segments.engaged]
windows = [{ window = "24h", cap = 3 }, { window = "7d", cap = 8 }]

[segments]
engaged_within = "3d"
dormant_after = "21d"
"""


def test_segment_caps_parse_and_replace_the_tiers_windows_for_that_segment() -> None:
    p = parse_policy(SEGMENTED)
    p2 = p.tiers["P2"]
    assert [s for s, _ in p2.segments] == ["dormant", "engaged"]
    assert [(w.window_ms, w.cap) for w in p2.windows_for("dormant")] == [(604_800_000, 2)]
    assert [(w.window_ms, w.cap) for w in p2.windows_for("engaged")] == [(86_400_000, 3), (604_800_000, 8)]
    # a user of another segment, or of none, keeps the tier's own windows
    assert p2.windows_for("casual") == p2.windows == p2.windows_for(None)
    assert p.tiers["P1"].segments == ()
    assert (p.segment_engaged_ms, p.segment_dormant_ms) == (3 * 86_400_000, 21 * 86_400_000)


def test_the_default_policy_has_no_segment_caps_and_the_default_rules() -> None:
    p = default_policy()
    assert all(t.segments == () for t in p.tiers.values())
    assert (p.segment_engaged_ms, p.segment_dormant_ms) == (7 * 86_400_000, 30 * 86_400_000)


def test_segment_caps_round_trip_and_show_in_the_canonical_text() -> None:
    p = parse_policy(SEGMENTED)
    text = p.to_toml()
    assert '[tiers.P2.segments.dormant]\nwindows = [{ window = "7d", cap = 2 }]' in text
    assert 'engaged_within = "3d"' in text and 'dormant_after = "21d"' in text
    assert parse_policy(text) == p
    assert diff(p, parse_policy(text)) == ""


def test_diff_shows_a_segment_cap_change() -> None:
    d = diff(default_policy(), parse_policy(SEGMENTED))
    assert "+[tiers.P2.segments.dormant]" in d
    assert '+windows = [{ window = "7d", cap = 2 }]' in d
    assert '-engaged_within = "7d"' in d and '+engaged_within = "3d"' in d


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        # a segment may not cap P0 (nor any exempt tier)
        ('[tiers.P0]\nexempt = true\n[tiers.P0.segments.dormant]\nwindows = [{ window = "7d", cap = 0 }]\n',
         3, "is exempt: it cannot have segments"),
        ('[tiers.P0]\nexempt = true\n[tiers.P5]\nexempt = true\n[tiers.P5.segments.vip]\nwindows = []\n',
         5, "is exempt: it cannot have segments"),
        ('[tiers.P0]\nexempt = true\n[tiers.P2]\non_exceed = "drop"\n[tiers.P2.segments.Dormant]\n'
         'windows = [{ window = "7d", cap = 1 }]\n', 5, "segment name 'Dormant'"),
        ('[tiers.P0]\nexempt = true\n[tiers.P2]\non_exceed = "drop"\n[tiers.P2.segments.9lives]\n'
         'windows = [{ window = "7d", cap = 1 }]\n', 5, "segment name '9lives'"),
        ('[tiers.P0]\nexempt = true\n[tiers.P2]\non_exceed = "drop"\n[tiers.P2.segments.dormant]\n'
         'windows = []\n', 6, "give at least one window"),
        ('[tiers.P0]\nexempt = true\n[tiers.P2]\non_exceed = "drop"\n[tiers.P2.segments.dormant]\n'
         'windows = [{ window = "7d", cap = 1 }]\ncap = 3\n', 5, "takes exactly `windows`"),
        ('[tiers.P0]\nexempt = true\n[tiers.P2]\non_exceed = "drop"\n[tiers.P2.segments.dormant]\n'
         'windows = [{ window = "7d", cap = -1 }]\n', 6, "cap must be a whole number"),
        ('[tiers.P0]\nexempt = true\n[tiers.P2]\non_exceed = "drop"\nsegments = 3\n', 5, "segments must be tables"),
        ('[tiers.P0]\nexempt = true\n\n[segments]\nvip_within = "7d"\n', 4, "[segments] takes"),
        ('[tiers.P0]\nexempt = true\n\n[segments]\nengaged_within = "soon"\n', 4, "expected a duration"),
        ('[tiers.P0]\nexempt = true\n\n[segments]\nengaged_within = "30d"\ndormant_after = "7d"\n',
         6, "dormant_after must be at least engaged_within"),
    ],
)
def test_malformed_segments_name_line_and_reason(text: str, line: int, reason: str) -> None:
    with pytest.raises(PolicyError) as exc:
        parse_policy(text, "p.toml")
    assert str(exc.value).startswith(f"p.toml:{line}: "), str(exc.value)
    assert reason in str(exc.value)


@pytest.mark.parametrize(
    ("jitter", "ttl", "reason"),
    [
        ("2h", None, "at most 1h"),  # held messages spread over two hours: past many deadlines
        ("30m", "30m", "not shorter than tier P1's ttl 30m"),  # every held P1 would wait past its TTL
    ],
)
def test_a_jitter_that_would_hold_messages_past_their_deadlines_is_refused(
    jitter: str, ttl: str | None, reason: str
) -> None:
    text = default_policy_text().replace('jitter = "10m"', f'jitter = "{jitter}"')
    if ttl is not None:
        text = text.replace('consumes = ["P1"]\nttl = "24h"', f'consumes = ["P1"]\nttl = "{ttl}"', 1)
    with pytest.raises(PolicyError) as exc:
        parse_policy(text, "p.toml")
    assert str(exc.value).startswith("p.toml:") and reason in str(exc.value), str(exc.value)
    assert parse_policy(default_policy_text().replace('jitter = "10m"', 'jitter = "1h"')).jitter_ms == 3_600_000


def test_durations_are_ascii_digits() -> None:
    with pytest.raises(ValueError):
        parse_duration("\uff124h", "x")  # a full-width 2: int() would read it as 24h


def test_a_byte_order_mark_is_not_a_statement() -> None:
    # an editor that writes one made the whole file "file:1: Invalid statement"
    text = "\ufeff" + default_policy_text()
    assert parse_policy(text, "bom.toml") == default_policy()


def test_an_unquoted_toml_time_is_named_as_one() -> None:
    text = default_policy_text().replace('start = "22:00"', "start = 22:00:00")
    with pytest.raises(PolicyError, match=r'22:00 unquoted \(write "22:00"\)') as caught:
        parse_policy(text, "q.toml")
    assert "datetime.time" not in str(caught.value)
