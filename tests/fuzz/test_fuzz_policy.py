"""Policy files: random text, TOML-ish text, and valid-shaped documents rendered to TOML.

Property: ``gov.policy.parse_policy`` returns a Policy or raises ``gov.PolicyError`` as
``"<file>:<line>: <reason>"`` with a line of the file — nothing else. A Policy it accepts
is one gov can live with: its canonical text (what ``gov policy show`` prints) parses
back to the same policy, it can be stored, and a decision can be taken under it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from gov import PolicyError
from gov import policy as policy_mod
from gov.queries import q
from gov.testing.postgres import TemplateDatabases
from tests.fuzz import FUZZ, UNICODE

SOURCE = "fuzz.toml"
REFUSAL = re.compile(r"^fuzz\.toml:(\d+): (\S.*)$", re.DOTALL)


def check_parse(text: str, record: bool = True) -> policy_mod.Policy | None:
    """Parse; a refusal must be "fuzz.toml:LINE: reason" with LINE in the file. Returns the Policy or None."""

    def note(what: str) -> None:
        if record:  # hypothesis's statistics: how many examples got past validation
            event(what)

    try:
        parsed = policy_mod.parse_policy(text, SOURCE)
    except PolicyError as exc:
        match = REFUSAL.match(str(exc))
        assert match, f"not 'file:line: reason': {str(exc)[:200]!r}"
        line = int(match.group(1))
        assert 1 <= line <= max(1, len(text.splitlines()) + 1), (line, len(text.splitlines()))
        note("refused")
        return None
    note("accepted")
    return parsed


# ---------------------------------------------------------------- text


@FUZZ
@given(st.text(UNICODE, max_size=300))
def test_random_text(text: str) -> None:
    check_parse(text)


KEYS = ["exempt", "windows", "on_exceed", "defer_max", "consumes", "ttl", "urgency", "window", "cap", "start",
        "end", "jitter", '"*"', "sale", "bogus", "P1", '"a\\"b"']
VALUES = ["true", "false", "1", "-1", "0", "2", "1e3", '"24h"', '"7d"', '"90m"', '"0s"', '"drop"', '"defer"',
          '"collapse"', '"high"', '"low"', '"22:00"', '"25:99"', '["P1"]', '["P1", "P2"]', '[]', "[1, 2]",
          '[{ window = "24h", cap = 2 }]', '[{ window = "1h", cap = -1 }]', '[{ window = 5, cap = 1 }]',
          '{ window = "1h" }', '"', "[", "{", '"""', "nan", "inf", '"\\u0000"', "1979-05-27"]
SECTIONS = ["[tiers.P0]", "[tiers.P1]", "[tiers.P2]", "[tiers.P3]", "[tiers.X]", "[tiers]", "[topics]", "[global]",
            "[quiet_hours]", "[[tiers.P1]]", "[bogus]", "[tiers.P1.windows]", "["]

lines = st.one_of(
    st.sampled_from(SECTIONS),
    st.builds(lambda k, v: f"{k} = {v}", st.sampled_from(KEYS), st.sampled_from(VALUES)),
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(KEYS), st.text(UNICODE, max_size=12)),
    st.just(""),
    st.just("# a comment"),
    st.text(UNICODE, max_size=20),
)


@FUZZ
@given(st.lists(lines, max_size=25))
def test_toml_ish_text(body: list[str]) -> None:
    check_parse("\n".join(body) + "\n")


def test_the_default_policy_parses_and_a_bad_line_is_named() -> None:
    text = policy_mod.default_policy_text()
    assert check_parse(text, record=False) is not None
    broken = text.replace('on_exceed = "drop"', 'on_exceed = "bounce"')
    with pytest.raises(PolicyError) as refused:
        policy_mod.parse_policy(broken, SOURCE)
    line = broken.splitlines().index('on_exceed = "bounce"') + 1
    assert str(refused.value).startswith(f"{SOURCE}:{line}: "), refused.value


# ---------------------------------------------------------------- valid-shaped documents


def toml_value(value: Any) -> str:
    """A TOML rendering of a JSON-like value (strings as basic strings, escaped)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # TOML basic strings take JSON's escapes (\\uXXXX, \\", \\\\)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(type(value))


def toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def render(doc: dict[str, Any]) -> str:
    out = []
    for tier, table in doc.get("tiers", {}).items():
        out.append(f"[tiers.{toml_key(tier)}]")
        out += [f"{toml_key(k)} = {toml_value(v)}" for k, v in table.items()]
    for section in ("topics", "global", "quiet_hours"):
        if section in doc:
            out.append(f"[{section}]")
            out += [f"{toml_key(k)} = {toml_value(v)}" for k, v in doc[section].items()]
    return "\n".join(out) + "\n"


UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# Up to ~14 years: longer windows are a known gov bug with their own test below.
good_durations = st.one_of(
    st.builds(lambda n, u: f"{n}{u}", st.integers(1, 5000), st.sampled_from(list(UNITS))),
    st.integers(1, 10**9),
)
good_ttls = st.builds(lambda n, u: f"{n}{u}", st.integers(1, 28), st.sampled_from(["d", "h", "m", "s"]))
good_clocks = st.builds(lambda h, m: f"{h:02d}:{m:02d}", st.integers(0, 23), st.integers(0, 59))
BAD_VALUES = [True, False, -1, 0, 1_000_001, "", "h", "-1h", "0s", "1.5h", " 2 h", "1w", "bounce", "urgent", "24:00",
              "8:00", [], ["P8"], [1], {"window": "1h"}, [{"window": 5}], "\u0000", "x" * 300]


def windows_of(durations: list[Any], caps: list[int]) -> list[dict[str, Any]]:
    return [{"window": d, "cap": c} for d, c in zip(durations, caps, strict=False)]


def good_windows(min_size: int = 0) -> st.SearchStrategy[list[dict[str, Any]]]:
    return st.builds(
        windows_of,
        st.lists(good_durations, min_size=min_size, max_size=3, unique_by=lambda d: str(d)),
        st.lists(st.integers(0, 50), min_size=3, max_size=3),
    )


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    """A policy document that is valid, then, half the time, one value made wrong."""
    names = draw(st.lists(st.sampled_from(["P0", "P1", "P2", "P3", "P9"]), min_size=1, max_size=4, unique=True))
    exempt = {n for n in names if draw(st.booleans()) and draw(st.booleans())}
    capped = [n for n in names if n not in exempt]
    tiers: dict[str, dict[str, Any]] = {}
    for name in names:
        table: dict[str, Any] = {"ttl": draw(good_ttls)}
        if name in exempt:
            table |= {"exempt": True, "urgency": draw(st.sampled_from(["very-low", "low", "normal", "high"]))}
        else:
            verb = draw(st.sampled_from(["drop", "defer", "collapse"]))
            table |= {
                "windows": draw(good_windows()),
                "on_exceed": verb,
                "consumes": [name, *draw(st.lists(st.sampled_from(capped), unique=True, max_size=3))],
                "urgency": draw(st.sampled_from(["very-low", "low", "normal"])),
            }
            table["consumes"] = list(dict.fromkeys(table["consumes"]))
            if verb == "defer":
                table["defer_max"] = draw(good_durations)
        tiers[name] = table
    doc: dict[str, Any] = {"tiers": tiers}
    if draw(st.booleans()):
        doc["topics"] = draw(st.dictionaries(topic_names, good_windows(min_size=1), max_size=3))
    if draw(st.booleans()):
        doc["global"] = {"windows": draw(good_windows())}
    if draw(st.booleans()):
        start, end = draw(good_clocks), draw(good_clocks)
        doc["quiet_hours"] = {"start": start, "end": end} if start != end else {}
        if draw(st.booleans()):
            doc["quiet_hours"]["jitter"] = draw(good_durations)
    if draw(st.booleans()):  # one value made wrong, somewhere
        section = draw(st.sampled_from(sorted(doc)))
        table = doc[section]
        if section == "tiers":
            table = table[draw(st.sampled_from(sorted(table)))]
        key = draw(st.sampled_from([*sorted(table), "bogus"]))
        table[key] = draw(st.sampled_from(BAD_VALUES))
    return doc


# Topic names: any printable text (control characters are a known gov bug with their own test below).
topic_names = st.one_of(st.sampled_from(["*", "sale", "a b", 'q"uote', "back\\slash", "ünï", "😀"]),
                        st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=12))


@pytest.fixture(scope="module")
def policy_url(databases: TemplateDatabases) -> Iterator[str]:
    url = databases.clone()
    yield url
    databases.drop(url)


@pytest.fixture(scope="module")
def policy_conn(policy_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(policy_url) as c:
        yield c


def check_livable(conn: psycopg.Connection[Any], parsed: policy_mod.Policy, text: str) -> None:
    """An accepted policy round-trips through its canonical text, stores, and decides."""
    canonical = parsed.to_toml()
    assert policy_mod.parse_policy(canonical, "canonical") == parsed, canonical
    with conn.transaction(force_rollback=True):
        policy_mod.apply(conn, parsed, text)
        assert policy_mod.load_stored(conn) == parsed
        for name in parsed.tiers:
            topic = next(iter(parsed.topics), None)
            for message_id in ("m1", "m2", "m3"):
                conn.execute(
                    q("decide"),
                    {"user_id": "fuzz", "message_id": f"{name}-{message_id}", "tier": name, "topic": topic,
                     "campaign_id": None, "now": None},
                ).fetchone()


@FUZZ
@given(documents())
def test_valid_shaped_documents(policy_conn: psycopg.Connection[Any], doc: dict[str, Any]) -> None:
    text = render(doc)
    parsed = check_parse(text)
    if parsed is not None:
        check_livable(policy_conn, parsed, text)


@pytest.mark.parametrize("duration", ['"9999999d"', '"99999999999999999999d"', "9223372036854775808"])
def test_a_huge_window_is_refused_or_livable(policy_conn: psycopg.Connection[Any], duration: str) -> None:
    text = policy_mod.default_policy_text().replace('window = "24h", cap = 6', f"window = {duration}, cap = 6")
    parsed = check_parse(text, record=False)
    if parsed is not None:
        check_livable(policy_conn, parsed, text)


@pytest.mark.parametrize("topic", ["a\nb", "bell\x07", "del\x7f"])
def test_every_accepted_topic_round_trips(policy_conn: psycopg.Connection[Any], topic: str) -> None:
    text = policy_mod.default_policy_text() + f'\n[topics]\n{json.dumps(topic)} = [{{ window = "1h", cap = 1 }}]\n'
    parsed = check_parse(text, record=False)
    if parsed is not None:
        check_livable(policy_conn, parsed, text)
