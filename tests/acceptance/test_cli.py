"""The real `gov` command in a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg


def gov(
    db_url: str, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "GOV_DATABASE_URL": db_url, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "gov.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        input=stdin,
        timeout=60,
    )


def test_seed_verification_from_the_shell(db_url: str) -> None:
    out = [gov(db_url, "decide", "--user", "u42", "--tier", "P2", "--id", f"m{i}") for i in (1, 2, 3)]
    assert [r.returncode for r in out] == [0, 0, 0], [r.stderr for r in out]
    verdicts = [json.loads(r.stdout) for r in out]
    assert verdicts[0] == {"allowed": True} and verdicts[1] == {"allowed": True}
    assert verdicts[2]["allowed"] is False
    assert (verdicts[2]["action"], verdicts[2]["reason"]) == ("drop", "cap_86400000ms")
    assert 0 < verdicts[2]["retry_after_ms"] <= 86_400_000
    p0 = gov(db_url, "decide", "--user", "u42", "--tier", "P0", "--id", "otp-1")
    assert json.loads(p0.stdout) == {"allowed": True}


def test_bad_input_is_one_line_and_records_nothing(db_url: str, conn: psycopg.Connection[Any]) -> None:
    for args in (
        ["--user", "u", "--tier", "P7", "--id", "m"],
        ["--user", "u", "--tier", "urgent", "--id", "m"],
        ["--user", "", "--tier", "P1", "--id", "m"],
        ["--user", "u", "--tier", "P1", "--id", "m", "--at", "yesterday"],
        # a decision dated ahead would hold the user's slot until then (a typo: for ever)
        ["--user", "u", "--tier", "P1", "--id", "m", "--at", "9999-12-31T23:59:59Z"],
    ):
        r = gov(db_url, "decide", *args)
        assert r.returncode == 1, r
        assert r.stdout == ""
        assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("gov: error:"), r.stderr
    missing = gov(db_url, "decide", "--user", "u", "--id", "m")
    assert missing.returncode != 0 and "--tier" in missing.stderr
    assert conn.execute("SELECT count(*) FROM gov.messages").fetchone() == (0,)


def test_at_moves_the_clock(db_url: str) -> None:
    at = ["--at", "2026-03-01T12:00:00+00:00"]
    for i in (1, 2):
        assert gov(db_url, "decide", "--user", "u", "--tier", "P2", "--id", f"a{i}", *at).returncode == 0
    blocked = json.loads(gov(db_url, "decide", "--user", "u", "--tier", "P2", "--id", "a3", *at).stdout)
    assert blocked["retry_after_ms"] == 86_400_000
    later = gov(db_url, "decide", "--user", "u", "--tier", "P2", "--id", "a4", "--at", "2026-03-02T12:00:00Z")
    assert json.loads(later.stdout) == {"allowed": True}


def test_policy_show_apply_dry_run_and_refusal(db_url: str, tmp_path: Path, conn: psycopg.Connection[Any]) -> None:
    shown = gov(db_url, "policy", "show")
    assert shown.returncode == 0 and "[tiers.P2]" in shown.stdout
    tighter = tmp_path / "tight.toml"
    tighter.write_text(shown.stdout.replace('{ window = "24h", cap = 2 }', '{ window = "24h", cap = 1 }'))
    dry = gov(db_url, "policy", "apply", "--dry-run", str(tighter))
    assert dry.returncode == 0 and "+windows = [{ window = \"24h\", cap = 1 }" in dry.stdout
    assert conn.execute("SELECT cap FROM gov.caps WHERE scope = 'P2' AND window_ms = 86400000").fetchone() == (2,)
    applied = gov(db_url, "policy", "apply", str(tighter))
    assert applied.returncode == 0, applied.stderr
    assert conn.execute("SELECT cap FROM gov.caps WHERE scope = 'P2' AND window_ms = 86400000").fetchone() == (1,)
    broken = tmp_path / "broken.toml"
    broken.write_text('[tiers.P0]\nexempt = true\n\n[tiers.P1]\non_exceed = "maybe"\n')
    refused = gov(db_url, "policy", "apply", str(broken))
    assert refused.returncode == 1
    assert refused.stderr.strip().startswith(f"gov: error: {broken}:5: tier P1: on_exceed")
    assert conn.execute("SELECT cap FROM gov.caps WHERE scope = 'P2' AND window_ms = 86400000").fetchone() == (1,)
    assert conn.execute("SELECT count(*) FROM gov.tiers").fetchone() == (4,)


def test_db_check_exits_non_zero_while_pending(databases: Any) -> None:
    empty = databases.empty()
    try:
        pending = gov(empty, "db", "check")
        assert pending.returncode == 1 and "pending" in pending.stderr
        assert gov(empty, "db", "upgrade").returncode == 0
        assert gov(empty, "db", "check").returncode == 0
    finally:
        databases.drop(empty)


def test_help_shows_environment_variables() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "gov.cli", "decide", "--help"], capture_output=True, text=True, timeout=30
    )
    assert "GOV_DATABASE_URL" in r.stdout and "GOV_DECIDE_TIER" in r.stdout


def test_send_end_to_end_from_the_shell(db_url: str, tmp_path: Path) -> None:
    from gov.testing import PushService

    key = tmp_path / "vapid.pem"
    generated = gov(db_url, "vapid", "generate", str(key))
    assert generated.returncode == 0 and len(generated.stdout.strip()) == 87  # 65 bytes, base64url
    assert key.stat().st_mode & 0o777 == 0o600
    env = {"GOV_VAPID_PRIVATE_KEY": str(key), "GOV_VAPID_SUBJECT": "mailto:ops@example.com",
           "GOV_ALLOW_LOOPBACK_HTTP": "1"}
    with PushService(expected_public_key=generated.stdout.strip()) as push:
        browsers = [push.subscribe(), push.subscribe()]
        for b in browsers:
            r = gov(db_url, "subscribe", "--user", "u42", "-", stdin=json.dumps(b.info), env=env)
            assert r.returncode == 0, r.stderr
        outs = [
            gov(db_url, "send", "--user", "u42", "--tier", "P2", "--id", f"m{i}", "--title", f"t{i}", env=env)
            for i in (1, 2, 3)
        ]
        assert [o.stdout.strip() for o in outs] == [
            '{"sent":true}', '{"sent":true}', '{"sent":false,"action":"drop","reason":"cap_86400000ms"}'
        ], [o.stderr for o in outs]
        for b in browsers:
            assert sorted(json.loads(p)["data"]["id"] for p in push.delivered_payloads(b)) == ["m1", "m2"]
        # bad input: no VAPID key → refuses to start, records nothing
        bare = {k: v for k, v in os.environ.items() if not k.startswith("GOV_VAPID")}
        r = subprocess.run(
            [sys.executable, "-m", "gov.cli", "send", "--user", "u42", "--tier", "P0", "--id", "x", "--title", "t"],
            capture_output=True, text=True, env={**bare, "GOV_DATABASE_URL": db_url}, timeout=60,
        )
        assert r.returncode == 1 and "GOV_VAPID_PRIVATE_KEY" in r.stderr
        with psycopg.connect(db_url) as c:
            assert c.execute("SELECT count(*) FROM gov.messages WHERE message_id = 'x'").fetchone() == (0,)


def test_user_set_and_release_from_the_shell(db_url: str, tmp_path: Path) -> None:
    from gov.testing import PushService

    key = tmp_path / "vapid.pem"
    public = gov(db_url, "vapid", "generate", str(key)).stdout.strip()
    env = {"GOV_VAPID_PRIVATE_KEY": str(key), "GOV_VAPID_SUBJECT": "mailto:ops@example.com",
           "GOV_ALLOW_LOOPBACK_HTTP": "1"}
    assert gov(db_url, "user", "set", "--user", "u", "--tz", "Mars/Olympus").returncode == 1
    assert gov(db_url, "user", "set", "--user", "u", "--cap", "P2:24h=3").returncode == 1  # only lower
    twice = gov(db_url, "user", "set", "--user", "u", "--cap", "P2:24h=1", "--cap", "P2:1d=2")  # one window
    assert twice.returncode == 1 and "given twice" in twice.stderr, twice.stderr
    ok = gov(db_url, "user", "set", "--user", "u", "--tz", "Europe/Berlin", "--quiet", "22:00-08:00",
             "--cap", "P2:24h=1")
    assert ok.returncode == 0, ok.stderr
    with PushService(expected_public_key=public) as push:
        browser = push.subscribe()
        gov(db_url, "subscribe", "--user", "u", "-", stdin=json.dumps(browser.info), env=env)
        held = gov(db_url, "send", "--user", "u", "--tier", "P2", "--id", "late", "--title", "t",
                   "--at", "2026-06-10T23:30:00+02:00", env=env)
        assert json.loads(held.stdout) == {"sent": False, "action": "defer", "reason": "quiet_hours"}
        early = gov(db_url, "release", "--once", "--at", "2026-06-11T07:59:00+02:00", env=env)
        assert json.loads(early.stdout) == {"released": {}, "delivered": 0}
        out = gov(db_url, "release", "--once", "--at", "2026-06-11T08:30:00+02:00", env=env)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == {"released": {"released": 1}, "delivered": 1}
        assert [json.loads(p)["data"]["id"] for p in push.delivered_payloads(browser)] == ["late"]


def test_non_utf8_input_is_one_line_and_writes_nothing(db_url: str, conn: psycopg.Connection[Any]) -> None:
    bad = b"u1\n\xff\xfeu2\n"
    env = {**os.environ, "GOV_DATABASE_URL": db_url}
    runs = {
        "send-campaign": ["send-campaign", "--users", "-", "--tier", "P2", "--id", "c1", "--title", "t"],
        "subscribe": ["subscribe", "--user", "u", "-"],
        "policy apply": ["policy", "apply", "-"],
    }
    for name, args in runs.items():
        r = subprocess.run([sys.executable, "-m", "gov.cli", *args], input=bad, capture_output=True, env=env,
                           timeout=60)
        err = r.stderr.decode()
        assert r.returncode == 1, (name, err)
        assert len(err.strip().splitlines()) == 1 and "not UTF-8" in err and "Traceback" not in err, (name, err)
    assert conn.execute("SELECT count(*) FROM gov.messages").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM gov.subscriptions").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM gov.policy_versions").fetchone() == (1,)


def test_quiet_hours_without_a_time_zone_are_refused(db_url: str, conn: psycopg.Connection[Any]) -> None:
    r = gov(db_url, "user", "set", "--user", "u", "--quiet", "21:00-07:30")
    assert r.returncode == 1 and "has no time zone" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert conn.execute("SELECT count(*) FROM gov.users").fetchone() == (0,)
    ok = gov(db_url, "user", "set", "--user", "u", "--tz", "Europe/Berlin", "--quiet", "21:00-07:30")
    assert ok.returncode == 0, ok.stderr
    assert gov(db_url, "user", "set", "--user", "u", "--quiet", "22:00-07:00").returncode == 0  # the zone is stored


def test_ttl_zero_is_refused_at_the_door(db_url: str, conn: psycopg.Connection[Any]) -> None:
    r = gov(db_url, "send", "--user", "u", "--tier", "P2", "--id", "m", "--title", "t", "--ttl", "0", "--no-deliver")
    assert r.returncode == 2 and "--ttl" in r.stderr
    assert conn.execute("SELECT count(*) FROM gov.messages").fetchone() == (0,)


def test_policy_apply_refuses_to_orphan_held_messages_unless_told(
    db_url: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    conn.execute("INSERT INTO gov.users (user_id, time_zone) VALUES ('u', 'Etc/GMT-12')")  # always some quiet hour
    at = "2026-06-10T11:30:00+00:00"  # 23:30 at GMT+12
    held = gov(db_url, "send", "--user", "u", "--tier", "P3", "--id", "d", "--title", "t", "--no-deliver", "--at", at)
    assert json.loads(held.stdout) == {"sent": False, "action": "collapse", "reason": "quiet_hours"}
    shown = gov(db_url, "policy", "show").stdout
    without_p3 = shown[: shown.index("[tiers.P3]")] + shown[shown.index("[quiet_hours]"):]
    path = tmp_path / "p.toml"
    path.write_text(without_p3, encoding="utf-8")
    refused = gov(db_url, "policy", "apply", str(path))
    assert refused.returncode == 1 and f"{path}:" in refused.stderr and "--drop-held" in refused.stderr
    assert conn.execute("SELECT count(*) FROM gov.tiers WHERE tier = 'P3'").fetchone() == (1,)
    applied = gov(db_url, "policy", "apply", "--drop-held", str(path))
    assert applied.returncode == 0, applied.stderr
    assert "P3 removed: 1 held" in applied.stderr
    assert conn.execute("SELECT state, outcome FROM gov.deferred").fetchall() == [("dropped", "tier_removed")]
