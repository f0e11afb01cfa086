"""Policy as data: parse and validate a TOML policy, store it in tables, diff it.

The policy file is the one reviewable place where caps live (invariant 9). It is
validated completely before anything is written; a bad file is refused with the line
and the reason, and the stored policy is left as it was.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import dataclass, field
from datetime import time
from importlib import resources
from typing import Any

import psycopg

from gov.errors import PolicyError
from gov.message import MAX_TTL_S
from gov.queries import q

VERBS = ("drop", "defer", "collapse")
URGENCIES = ("very-low", "low", "normal", "high")
DEFAULT_DEFER_MAX_MS = 6 * 3600 * 1000  # milliseconds: the seeds' ceiling on a deferral
DEFAULT_TTL_S = 86400  # seconds
MAX_CAP = 1_000_000  # sends in one window: a cap above this is a typo, not a policy
MAX_JITTER_MS = 3_600_000  # milliseconds: releases are spread over the first hour, as the seeds do
MAX_DURATION_MS = 366 * 86_400_000  # milliseconds: no window, TTL or wait is longer than a year
_UNITS_MS = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000, "ms": 1}
_DURATION = re.compile(r"^\s*([0-9]+)\s*(ms|s|m|h|d)\s*$")  # ASCII digits: int() reads "２4h" too
_TIER_NAME = re.compile(r"^P[0-9]$")
_TIER_KEYS = {"exempt", "windows", "on_exceed", "defer_max", "consumes", "ttl", "urgency", "segments"}
_CLOCK = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")
#: A segment's name, as gov.users.segment and gov.segment_caps check it.
SEGMENT_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
#: The segments `gov segments refresh` assigns from the policy's [segments] rules. Any
#: other name is the app's own: refresh leaves a user the app put in one alone.
RULE_SEGMENTS = ("engaged", "casual", "dormant")
DEFAULT_ENGAGED_MS = 7 * 86_400_000  # a click within this: engaged
DEFAULT_DORMANT_MS = 30 * 86_400_000  # no click for this (and known this long): dormant
_SEGMENT_RULE_KEYS = {"engaged_within", "dormant_after"}
_TIMING_KEYS = {"enabled", "p1_max_delay", "explore"}
DEFAULT_P1_MAX_DELAY_MS = 3_600_000  # a P1 (account activity) waits at most an hour for a better one
DEFAULT_EXPLORE = 0.05  # of the timed messages, released at a drawn hour so the estimate sees others


@dataclass(frozen=True, order=True)
class Window:
    """A rolling window: at most ``cap`` sends in any ``window_ms`` milliseconds."""

    window_ms: int
    cap: int


@dataclass(frozen=True)
class Tier:
    name: str
    exempt: bool = False
    on_exceed: str | None = None
    defer_max_ms: int | None = None
    ttl_s: int = DEFAULT_TTL_S
    urgency: str = "normal"
    consumes: tuple[str, ...] = ()
    windows: tuple[Window, ...] = ()
    #: (segment, windows) pairs sorted by segment: for a user of that segment these
    #: windows replace ``windows`` (``[tiers.P2.segments.dormant]``).
    segments: tuple[tuple[str, tuple[Window, ...]], ...] = ()

    def windows_for(self, segment: str | None) -> tuple[Window, ...]:
        """The windows a user of ``segment`` (None: no segment) is held to in this tier."""
        return dict(self.segments).get(segment or "", self.windows)


@dataclass(frozen=True)
class Policy:
    tiers: dict[str, Tier]
    topics: dict[str, tuple[Window, ...]] = field(default_factory=dict)
    global_windows: tuple[Window, ...] = ()
    quiet_start: time | None = None
    quiet_end: time | None = None
    jitter_ms: int = 0
    segment_engaged_ms: int = DEFAULT_ENGAGED_MS
    segment_dormant_ms: int = DEFAULT_DORMANT_MS
    #: ``[release] per_minute``: at most this many releases of held messages a minute
    #: (None: no limit, the default, so held messages go at their slot as before)
    release_per_minute: int | None = None
    #: ``[timing]``: a held message goes at the best hour of its user's estimate within
    #: its deadline (off by default: the first slot, as the seeds have it); P1 at most
    #: ``timing_p1_max_delay_ms`` later than its first slot; a share ``timing_explore``
    #: at an hour drawn from the message id (docs/analysts.md, "Timing")
    timing_enabled: bool = False
    timing_p1_max_delay_ms: int = DEFAULT_P1_MAX_DELAY_MS
    timing_explore: float = DEFAULT_EXPLORE

    def to_toml(self) -> str:
        """The canonical text of this policy: what `gov policy show` prints and diffs."""
        out: list[str] = []
        for tier in sorted(self.tiers.values(), key=lambda t: t.name):
            out.append(f"[tiers.{tier.name}]")
            if tier.exempt:
                out.append("exempt = true")
            else:
                out.append(f"windows = {_windows_toml(tier.windows)}")
                out.append(f'on_exceed = "{tier.on_exceed}"')
                if tier.defer_max_ms is not None:
                    out.append(f'defer_max = "{format_duration(tier.defer_max_ms)}"')
                out.append("consumes = [" + ", ".join(f'"{c}"' for c in tier.consumes) + "]")
            out.append(f'ttl = "{format_duration(tier.ttl_s * 1000)}"')
            out.append(f'urgency = "{tier.urgency}"')
            out.append("")
            for segment, windows in tier.segments:
                out.append(f"[tiers.{tier.name}.segments.{segment}]")
                out.append(f"windows = {_windows_toml(windows)}")
                out.append("")
        if self.topics:
            out.append("[topics]")
            for topic in sorted(self.topics):
                out.append(f"{_toml_key(topic)} = {_windows_toml(self.topics[topic])}")
            out.append("")
        if self.global_windows:
            out.append("[global]")
            out.append(f"windows = {_windows_toml(self.global_windows)}")
            out.append("")
        if self.quiet_start is not None or self.jitter_ms:
            out.append("[quiet_hours]")
            if self.quiet_start is not None and self.quiet_end is not None:
                out.append(f'start = "{self.quiet_start:%H:%M}"')
                out.append(f'end = "{self.quiet_end:%H:%M}"')
            if self.jitter_ms:
                out.append(f'jitter = "{format_duration(self.jitter_ms)}"')
            out.append("")
        if self.release_per_minute is not None:
            out.append("[release]")
            out.append(f"per_minute = {self.release_per_minute}")
            out.append("")
        if (self.timing_enabled, self.timing_p1_max_delay_ms, self.timing_explore) != (
            False, DEFAULT_P1_MAX_DELAY_MS, DEFAULT_EXPLORE
        ):
            out.append("[timing]")
            out.append(f"enabled = {'true' if self.timing_enabled else 'false'}")
            out.append(f'p1_max_delay = "{format_duration(self.timing_p1_max_delay_ms)}"')
            out.append(f"explore = {self.timing_explore!r}")
            out.append("")
        out.append("[segments]")
        out.append(f'engaged_within = "{format_duration(self.segment_engaged_ms)}"')
        out.append(f'dormant_after = "{format_duration(self.segment_dormant_ms)}"')
        out.append("")
        return "\n".join(out)

    def warnings(self) -> list[str]:
        """What is allowed but probably not meant: a collapse tier whose TTL cannot outlive its wait."""
        out = []
        for tier in sorted(self.tiers.values(), key=lambda t: t.name):
            if tier.on_exceed != "collapse":
                continue
            longest = max(
                (
                    w.window_ms
                    for c in tier.consumes
                    for ws in (self.tiers[c].windows, *(sw for _, sw in self.tiers[c].segments))
                    for w in ws
                ),
                default=0,
            )
            if tier.ttl_s * 1000 <= longest:
                out.append(
                    f"tier {tier.name}: ttl {format_duration(tier.ttl_s * 1000)} is not longer than its "
                    f"{format_duration(longest)} window: a held {tier.name} message may expire before its "
                    "group's slot opens (collapse then deletes instead of compressing)"
                )
        return out


def _windows_toml(windows: tuple[Window, ...]) -> str:
    inner = ", ".join(
        f'{{ window = "{format_duration(w.window_ms)}", cap = {w.cap} }}' for w in windows
    )
    return f"[{inner}]"


def _toml_key(key: str) -> str:
    """A TOML key: bare when it can be, else a basic string with every control character escaped."""
    if re.fullmatch(r"[A-Za-z0-9_-]+", key):
        return key
    escaped = []
    for ch in key:
        if ch in ('"', "\\"):
            escaped.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            escaped.append(f"\\u{ord(ch):04X}")
        else:
            escaped.append(ch)
    return '"' + "".join(escaped) + '"'


def format_duration(ms: int) -> str:
    """Render milliseconds in the largest unit that divides them: 86400000 → "24h"."""
    for unit in ("d", "h", "m", "s"):
        size = _UNITS_MS[unit]
        if ms % size == 0 and ms >= size:
            if unit == "d" and ms // size == 1:
                return "24h"
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def parse_duration(value: object, what: str) -> int:
    """A duration in milliseconds from "24h" / "7d" / "90m" / "30s" / "500ms" or an int of ms."""
    if isinstance(value, bool):
        raise ValueError(f"{what}: expected a duration such as \"24h\", got {value!r}")
    if isinstance(value, int):
        ms = value
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        ms = int(m.group(1)) * _UNITS_MS[m.group(2)]
    else:
        raise ValueError(f"{what}: expected a duration such as \"24h\" or \"7d\", got {value!r}")
    if ms <= 0:
        raise ValueError(f"{what}: must be positive, got {value!r}")
    if ms > MAX_DURATION_MS:
        raise ValueError(f"{what}: at most 366d, got {value!r}")
    return ms


def parse_clock(value: object, what: str) -> time:
    if not isinstance(value, str) or not (m := _CLOCK.match(value)):
        # (TOML's own local time, 22:00 unquoted, printed as datetime.time(22, 0) before)
        shown = f'{value:%H:%M} unquoted (write "{value:%H:%M}")' if isinstance(value, time) else repr(value)
        raise ValueError(f"{what}: expected a local time HH:MM in quotes, got {shown}")
    return time(int(m.group(1)), int(m.group(2)))


# ---------------------------------------------------------------- parsing


class _Locator:
    """Finds the line a problem is on, so a refusal points at it."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()

    def line(self, section: str | None, key: str | None = None) -> int:
        start = 0
        if section is not None:
            header = re.compile(r"^\s*\[\s*" + re.escape(section).replace(r"\.", r"\s*\.\s*") + r"\s*\]")
            for i, line in enumerate(self.lines):
                if header.match(line):
                    start = i
                    break
            else:
                return self.first(key or section.split(".")[-1])
        if key is None:
            return start + 1
        key_re = re.compile(r'^\s*"?' + re.escape(key) + r'"?\s*=')
        for i in range(start, len(self.lines)):
            if i > start and section is not None and self.lines[i].lstrip().startswith("["):
                break
            if key_re.match(self.lines[i]):
                return i + 1
        return start + 1

    def first(self, key: str) -> int:
        """The first line that names ``key`` (1 when none does)."""
        for i, line in enumerate(self.lines):
            if re.search(r"\b" + re.escape(key) + r"\b", line):
                return i + 1
        return 1


def parse_policy(text: str, source: str = "policy") -> Policy:
    """Parse and validate a policy file's text; raise PolicyError("source:line: reason")."""
    text = text.removeprefix("\ufeff")  # a byte-order mark some editors write is not a statement
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message ends "(at line L, column C)": keep the position, in our form.
        m = re.search(r"\(at line (\d+), column \d+\)", str(exc))
        line = m.group(1) if m else "1"
        reason = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc)) or "invalid TOML"
        raise PolicyError(f"{source}:{line}: {reason}") from None
    where = _Locator(text)
    try:
        return _build(data, where, source)
    except _Refusal as exc:
        raise PolicyError(f"{source}:{exc.line}: {exc.reason}") from None


class _Refusal(Exception):
    def __init__(self, line: int, reason: str) -> None:
        super().__init__(reason)
        self.line = line
        self.reason = reason


def _build(data: dict[str, Any], where: _Locator, source: str) -> Policy:
    def refuse(section: str | None, key: str | None, reason: str) -> _Refusal:
        return _Refusal(where.line(section, key), reason)

    unknown = set(data) - {"tiers", "topics", "global", "quiet_hours", "segments", "release", "timing"}
    if unknown:
        key = sorted(unknown)[0]
        raise refuse(
            key,
            None,
            f"unknown section {key!r} (expected tiers, topics, global, quiet_hours, segments, release, timing)",
        )
    raw_tiers = data.get("tiers")
    if not isinstance(raw_tiers, dict) or not raw_tiers:
        raise refuse(None, "tiers", "the policy must define at least one tier under [tiers.<name>]")

    def windows(raw: object, section: str, key: str, what: str) -> tuple[Window, ...]:
        if not isinstance(raw, list):
            raise refuse(section, key, f"{what}: expected a list of {{ window = \"24h\", cap = 2 }}")
        seen: set[int] = set()
        out = []
        for item in raw:
            if not isinstance(item, dict) or set(item) != {"window", "cap"}:
                raise refuse(section, key, f"{what}: each window needs exactly `window` and `cap`")
            try:
                ms = parse_duration(item["window"], f"{what} window")
            except ValueError as exc:
                raise refuse(section, key, str(exc)) from None
            cap = item["cap"]
            if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0 or cap > MAX_CAP:
                raise refuse(section, key, f"{what}: cap must be a whole number ≥ 0, got {cap!r}")
            if ms in seen:
                raise refuse(section, key, f"{what}: two windows of {format_duration(ms)}")
            seen.add(ms)
            out.append(Window(ms, cap))
        return tuple(sorted(out))

    tiers: dict[str, Tier] = {}
    for name, raw in raw_tiers.items():
        section = f"tiers.{name}"
        if not _TIER_NAME.match(name):
            raise refuse(section, None, f"tier name {name!r} must be P0..P9")
        if not isinstance(raw, dict):
            raise refuse(section, None, f"tier {name}: expected a table")
        extra = set(raw) - _TIER_KEYS
        if extra:
            key = sorted(extra)[0]
            raise refuse(section, key, f"tier {name}: unknown key {key!r}")
        exempt = raw.get("exempt", False)
        if not isinstance(exempt, bool):
            raise refuse(section, "exempt", f"tier {name}: exempt must be true or false")
        try:
            ttl_ms = parse_duration(raw.get("ttl", DEFAULT_TTL_S * 1000), f"tier {name} ttl")
        except ValueError as exc:
            raise refuse(section, "ttl", str(exc)) from None
        if ttl_ms % 1000 or ttl_ms > MAX_TTL_S * 1000:
            most = format_duration(MAX_TTL_S * 1000)
            raise refuse(section, "ttl", f"tier {name}: ttl must be whole seconds, at most {most}")
        urgency = raw.get("urgency", "high" if exempt else "normal")
        if urgency not in URGENCIES:
            raise refuse(section, "urgency", f"tier {name}: urgency must be one of {', '.join(URGENCIES)}")
        if urgency == "high" and not exempt:
            raise refuse(
                section, "urgency", f'tier {name}: urgency "high" wakes devices; only an exempt tier may use it'
            )
        if exempt:
            for key in ("windows", "on_exceed", "defer_max", "consumes", "segments"):
                if key in raw:
                    at: tuple[str, str | None] = (section, key)
                    if key == "segments" and isinstance(raw[key], dict) and raw[key]:
                        at = f"{section}.segments.{sorted(raw[key])[0]}", None  # its table's header
                    raise refuse(*at, f"tier {name} is exempt: it cannot have {key}")
            tiers[name] = Tier(name, exempt=True, ttl_s=ttl_ms // 1000, urgency=urgency)
            continue
        verb = raw.get("on_exceed")
        if verb not in VERBS:
            raise refuse(
                section, "on_exceed", f"tier {name}: on_exceed must be one of drop, defer, collapse (got {verb!r})"
            )
        defer_max = None
        if verb == "defer":
            try:
                defer_max = parse_duration(
                    raw.get("defer_max", DEFAULT_DEFER_MAX_MS), f"tier {name} defer_max"
                )
            except ValueError as exc:
                raise refuse(section, "defer_max", str(exc)) from None
        elif "defer_max" in raw:
            raise refuse(section, "defer_max", f"tier {name}: defer_max only applies to on_exceed = \"defer\"")
        consumes = raw.get("consumes", [name])
        if not isinstance(consumes, list) or not all(isinstance(c, str) for c in consumes):
            raise refuse(section, "consumes", f"tier {name}: consumes must be a list of tier names")
        if name not in consumes:
            raise refuse(section, "consumes", f"tier {name}: consumes must include {name} itself")
        if len(set(consumes)) != len(consumes):
            raise refuse(section, "consumes", f"tier {name}: consumes lists a tier twice")
        raw_segments = raw.get("segments", {})
        if not isinstance(raw_segments, dict):
            raise refuse(section, "segments", f"tier {name}: segments must be tables [tiers.{name}.segments.<name>]")
        segments = []
        for segment, raw_segment in sorted(raw_segments.items()):
            seg_section = f"{section}.segments.{segment}"
            if not SEGMENT_NAME.match(segment):
                raise refuse(
                    seg_section, None,
                    f"tier {name}: segment name {segment!r} must be a lower-case letter, then up to 31 of "
                    "a-z, 0-9, _ or -",
                )
            if not isinstance(raw_segment, dict) or set(raw_segment) != {"windows"}:
                raise refuse(seg_section, None, f"tier {name} segment {segment}: takes exactly `windows`")
            seg_windows = windows(raw_segment["windows"], seg_section, "windows", f"tier {name} segment {segment}")
            if not seg_windows:
                raise refuse(
                    seg_section, "windows",
                    f"tier {name} segment {segment}: give at least one window (an empty list would leave "
                    "the segment on the tier's own windows)",
                )
            segments.append((segment, seg_windows))
        tiers[name] = Tier(
            name,
            on_exceed=verb,
            defer_max_ms=defer_max,
            ttl_s=ttl_ms // 1000,
            urgency=urgency,
            consumes=tuple(sorted(consumes)),
            windows=windows(raw.get("windows", []), section, "windows", f"tier {name}"),
            segments=tuple(segments),
        )
    for tier in tiers.values():
        for consumed in tier.consumes:
            problem = "is not defined" if consumed not in tiers else "is exempt" if tiers[consumed].exempt else None
            if problem:
                raise refuse(f"tiers.{tier.name}", "consumes", f"tier {tier.name} consumes {consumed}, which {problem}")

    topics: dict[str, tuple[Window, ...]] = {}
    raw_topics = data.get("topics", {})
    if not isinstance(raw_topics, dict):
        raise refuse(None, "topics", "[topics] must map a topic (or \"*\") to a list of windows")
    for topic, raw in raw_topics.items():
        if not topic or len(topic) > 200 or "\x00" in topic:
            raise refuse("topics", None, f"topic name {topic!r} must be 1 to 200 characters")
        topics[topic] = windows(raw, "topics", topic, f"topic {topic!r}")

    raw_global = data.get("global", {})
    if not isinstance(raw_global, dict) or set(raw_global) - {"windows"}:
        raise refuse("global", None, "[global] takes only `windows`")
    global_windows = windows(raw_global.get("windows", []), "global", "windows", "global")

    raw_quiet = data.get("quiet_hours", {})
    if not isinstance(raw_quiet, dict) or set(raw_quiet) - {"start", "end", "jitter"}:
        raise refuse("quiet_hours", None, "[quiet_hours] takes start, end and jitter")
    quiet_start = quiet_end = None
    if ("start" in raw_quiet) != ("end" in raw_quiet):
        raise refuse("quiet_hours", None, "[quiet_hours] needs both start and end")
    try:
        if "start" in raw_quiet:
            quiet_start = parse_clock(raw_quiet["start"], "quiet_hours start")
            quiet_end = parse_clock(raw_quiet["end"], "quiet_hours end")
            if quiet_start == quiet_end:
                raise ValueError("quiet_hours: start and end are equal")
        jitter_ms = parse_duration(raw_quiet["jitter"], "quiet_hours jitter") if "jitter" in raw_quiet else 0
    except ValueError as exc:
        raise refuse("quiet_hours", None, str(exc)) from None

    raw_release = data.get("release", {})
    if not isinstance(raw_release, dict) or set(raw_release) - {"per_minute"}:
        raise refuse("release", None, "[release] takes per_minute")
    per_minute = raw_release.get("per_minute")
    # bool is an int to Python: `per_minute = true` is a mistake, not 1
    if per_minute is not None and (
        not isinstance(per_minute, int) or isinstance(per_minute, bool) or not 1 <= per_minute <= 2**31 - 1
    ):
        raise refuse("release", "per_minute", "[release] per_minute must be a whole number of releases, at least 1")

    raw_timing = data.get("timing", {})
    if not isinstance(raw_timing, dict) or set(raw_timing) - _TIMING_KEYS:
        raise refuse("timing", None, "[timing] takes enabled, p1_max_delay and explore")
    timing_enabled = raw_timing.get("enabled", False)
    if not isinstance(timing_enabled, bool):
        raise refuse("timing", "enabled", "[timing] enabled must be true or false")
    try:
        p1_max_delay_ms = parse_duration(raw_timing.get("p1_max_delay", "1h"), "timing p1_max_delay")
    except ValueError as exc:
        raise refuse("timing", "p1_max_delay", str(exc)) from None
    explore = raw_timing.get("explore", DEFAULT_EXPLORE)
    if isinstance(explore, bool) or not isinstance(explore, int | float) or not 0 <= explore <= 1:
        raise refuse("timing", "explore", "[timing] explore must be a share between 0 and 1 (0.05: 5 %)")

    raw_rules = data.get("segments", {})
    if not isinstance(raw_rules, dict) or set(raw_rules) - _SEGMENT_RULE_KEYS:
        raise refuse("segments", None, "[segments] takes engaged_within and dormant_after")
    try:
        engaged_ms = parse_duration(raw_rules.get("engaged_within", DEFAULT_ENGAGED_MS), "segments engaged_within")
        dormant_ms = parse_duration(raw_rules.get("dormant_after", DEFAULT_DORMANT_MS), "segments dormant_after")
    except ValueError as exc:
        raise refuse("segments", None, str(exc)) from None
    if dormant_ms < engaged_ms:
        raise refuse(
            "segments", "dormant_after",
            "[segments] dormant_after must be at least engaged_within (a user cannot be both engaged and dormant)",
        )
    # Invariant 4: P0 is exempt by structure. A policy without it, or with it capped,
    # deferred or collapsed, would let a one-time passcode be suppressed.
    if "P0" not in tiers:
        raise _Refusal(where.first("tiers"), "P0 (transactional) must be defined, with exempt = true")
    if not tiers["P0"].exempt:
        raise refuse("tiers.P0", None, "tier P0 (transactional) must be exempt = true: it is never capped, "
                                       "deferred or quieted")
    # Every held message waits up to the jitter past its slot: a jitter longer than an hour
    # (the seeds spread releases over the first hour) or than a held tier's TTL would hold
    # messages past their deadlines, and they would expire instead of going out.
    if jitter_ms > MAX_JITTER_MS:
        raise refuse("quiet_hours", "jitter", f"quiet_hours jitter: at most {format_duration(MAX_JITTER_MS)} "
                     f"(got {format_duration(jitter_ms)}): releases are spread over the first hour")
    for tier in sorted(tiers.values(), key=lambda t: t.name):
        if not tier.exempt and jitter_ms >= tier.ttl_s * 1000:
            raise refuse("quiet_hours", "jitter", f"quiet_hours jitter {format_duration(jitter_ms)} is not shorter "
                         f"than tier {tier.name}'s ttl {format_duration(tier.ttl_s * 1000)}: its held messages "
                         "would expire waiting for their jitter")
    return Policy(
        tiers, topics, global_windows, quiet_start, quiet_end, jitter_ms, engaged_ms, dormant_ms, per_minute,
        timing_enabled, p1_max_delay_ms, float(explore),
    )


def default_policy_text() -> str:
    return resources.files("gov").joinpath("default_policy.toml").read_text(encoding="utf-8")


def default_policy() -> Policy:
    return parse_policy(default_policy_text(), "default_policy.toml")


# ---------------------------------------------------------------- storage


def load_stored(conn: psycopg.Connection[Any]) -> Policy:
    """The policy as the tables hold it now."""
    tiers_rows = conn.execute(q("policy_tiers")).fetchall()
    consumes: dict[str, list[str]] = {}
    for tier, consumed in conn.execute(q("policy_consumes")).fetchall():
        consumes.setdefault(tier, []).append(consumed)
    tier_windows: dict[str, list[Window]] = {}
    topics: dict[str, list[Window]] = {}
    global_windows: list[Window] = []
    for scope, topic, window_ms, cap in conn.execute(q("policy_caps")).fetchall():
        if scope == "global":
            global_windows.append(Window(window_ms, cap))
        elif scope == "topic":
            topics.setdefault(topic, []).append(Window(window_ms, cap))
        else:
            tier_windows.setdefault(scope, []).append(Window(window_ms, cap))
    segment_windows: dict[str, dict[str, list[Window]]] = {}
    for tier, segment, window_ms, cap in conn.execute(q("policy_segment_caps")).fetchall():
        segment_windows.setdefault(tier, {}).setdefault(segment, []).append(Window(window_ms, cap))
    tiers = {
        name: Tier(
            name,
            exempt=exempt,
            on_exceed=verb,
            defer_max_ms=defer_max,
            ttl_s=ttl,
            urgency=urgency,
            consumes=tuple(sorted(consumes.get(name, []))),
            windows=tuple(sorted(tier_windows.get(name, []))),
            segments=tuple(
                (segment, tuple(sorted(ws))) for segment, ws in sorted(segment_windows.get(name, {}).items())
            ),
        )
        for name, exempt, verb, defer_max, ttl, urgency in tiers_rows
    }
    settings = conn.execute(q("policy_settings")).fetchone()
    quiet_start, quiet_end, jitter_ms, engaged_ms, dormant_ms, per_minute, timing, p1_delay, explore = (
        settings
        if settings
        else (None, None, 0, DEFAULT_ENGAGED_MS, DEFAULT_DORMANT_MS, None, False, DEFAULT_P1_MAX_DELAY_MS,
              DEFAULT_EXPLORE)
    )
    return Policy(
        tiers,
        {t: tuple(sorted(w)) for t, w in topics.items()},
        tuple(sorted(global_windows)),
        quiet_start,
        quiet_end,
        jitter_ms,
        engaged_ms,
        dormant_ms,
        per_minute,
        timing,
        p1_delay,
        explore,
    )


@dataclass(frozen=True)
class Retired:
    """Messages of a tier the new policy removes: held, and queued for delivery."""

    tier: str
    held: int
    queued: int


@dataclass(frozen=True)
class OrphanedCaps:
    """Users' own caps over a window the new policy has no default for (a user cap only
    lowers a default, so the decision would ignore them): how many users, one named."""

    scope: str
    window_ms: int
    users: int
    example: str

    def describe(self) -> str:
        return (f"{self.scope} over {format_duration(self.window_ms)}: {self.users} user(s)"
                f" (e.g. {self.example!r})")


def apply(
    conn: psycopg.Connection[Any],
    policy: Policy,
    source: str,
    *,
    name: str = "policy",
    drop_held: bool = False,
    backfill: bool = True,
    drop_user_caps: bool = False,
) -> list[Retired | OrphanedCaps]:
    """Replace the stored policy with ``policy`` in the caller's transaction.

    A policy that removes a tier while messages of it are held or queued for delivery
    is refused (:class:`~gov.errors.PolicyError`, ``name:line: reason``) unless
    ``drop_held``: they then end dropped with reason ``tier_removed``, logged like any
    suppression. Returns what was (or would have been) retired, per removed tier.

    A policy that takes away the window a user's own cap lowers is refused likewise
    (that cap would silently stop holding, and come back with the window) unless
    ``drop_user_caps``: those caps are then deleted, and returned as :class:`OrphanedCaps`.

    The policy is then compiled for the decision (``gov.compile_policy_v1``). A decision
    writes send rows only for budgets some cap reads; with ``backfill``, a budget the new
    policy caps that the old one did not is filled from ``gov.messages`` over its window
    (``gov.backfill_sends_v1``), so the new cap counts what was already sent.
    """
    conn.execute(q("lock_policy"))
    before = _one(conn, "capped_budgets")
    stored = {row[0] for row in conn.execute(q("policy_tiers")).fetchall()}
    removed = sorted(stored - set(policy.tiers))
    retired: list[Retired | OrphanedCaps] = []
    if removed:
        rows = conn.execute(q("retire_tiers"), {"tiers": removed, "drop": drop_held}).fetchall()
        tiers = [Retired(tier, held, queued) for tier, held, queued in rows if held or queued]
        if tiers and not drop_held:
            what = "; ".join(f"{r.tier}: {r.held} held, {r.queued} queued for delivery" for r in tiers)
            line = _Locator(source).first("tiers")
            raise PolicyError(
                f"{name}:{line}: the policy removes tier(s) {', '.join(r.tier for r in tiers)} while messages "
                f"of them wait ({what}); apply with --drop-held to drop them (reason tier_removed)"
            )
        retired.extend(tiers)
    conn.execute(q("clear_segment_caps"))
    conn.execute(q("clear_caps"))
    conn.execute(q("clear_consumes"))
    conn.execute(q("clear_tiers"))
    with conn.cursor() as cur:
        cur.executemany(
            q("insert_tier"),
            [
                {
                    "tier": t.name,
                    "exempt": t.exempt,
                    "on_exceed": t.on_exceed,
                    "defer_max_ms": t.defer_max_ms,
                    "default_ttl_s": t.ttl_s,
                    "urgency": t.urgency,
                }
                for t in policy.tiers.values()
            ],
        )
        cur.executemany(
            q("insert_consumes"),
            [{"tier": t.name, "consumes": c} for t in policy.tiers.values() for c in t.consumes],
        )
        caps = [
            {"scope": t.name, "topic": "", "window_ms": w.window_ms, "cap": w.cap}
            for t in policy.tiers.values()
            for w in t.windows
        ]
        caps += [
            {"scope": "topic", "topic": topic, "window_ms": w.window_ms, "cap": w.cap}
            for topic, ws in policy.topics.items()
            for w in ws
        ]
        caps += [
            {"scope": "global", "topic": "", "window_ms": w.window_ms, "cap": w.cap}
            for w in policy.global_windows
        ]
        if caps:
            cur.executemany(q("insert_cap"), caps)
        segment_caps = [
            {"tier": t.name, "segment": segment, "window_ms": w.window_ms, "cap": w.cap}
            for t in policy.tiers.values()
            for segment, ws in t.segments
            for w in ws
        ]
        if segment_caps:
            cur.executemany(q("insert_segment_cap"), segment_caps)
    conn.execute(
        q("upsert_settings"),
        {
            "quiet_start": policy.quiet_start,
            "quiet_end": policy.quiet_end,
            "jitter_ms": policy.jitter_ms,
            "segment_engaged_ms": policy.segment_engaged_ms,
            "segment_dormant_ms": policy.segment_dormant_ms,
            "release_per_minute": policy.release_per_minute,
            "timing_enabled": policy.timing_enabled,
            "timing_p1_max_delay_ms": policy.timing_p1_max_delay_ms,
            "timing_explore": policy.timing_explore,
        },
    )
    # (the new caps are in the tables now: gov.user_cap_ceiling reads them)
    orphans = [OrphanedCaps(scope, int(window_ms), int(users), str(example))
               for scope, window_ms, users, example in conn.execute(q("orphaned_user_caps")).fetchall()]
    if orphans and not drop_user_caps:
        what = "; ".join(o.describe() for o in orphans)
        raise PolicyError(
            f"{name}:{_Locator(source).first('tiers')}: the policy takes away the window(s) users' own caps lower"
            f" ({what}): those caps would stop holding; keep the window, or apply with --drop-user-caps to"
            " remove them"
        )
    if orphans:
        conn.execute(q("drop_orphaned_user_caps"))
        retired.extend(orphans)
    conn.execute(q("record_policy_version"), {"source": source})
    conn.execute(q("compile_policy"))
    if backfill:
        conn.execute(q("backfill_sends"), {"before": before})
    return retired


def _one(conn: psycopg.Connection[Any], query: str) -> Any:
    row = conn.execute(q(query)).fetchone()
    return row[0] if row else None


def diff(old: Policy, new: Policy, old_name: str = "stored", new_name: str = "file") -> str:
    """A unified diff of the canonical texts; empty when nothing would change."""
    return "".join(
        difflib.unified_diff(
            old.to_toml().splitlines(keepends=True),
            new.to_toml().splitlines(keepends=True),
            fromfile=old_name,
            tofile=new_name,
        )
    )
