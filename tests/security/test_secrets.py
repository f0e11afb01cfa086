"""Secrets stay secret: the VAPID private key and the API's bearer token.

* A whole flow through the real command line — ``vapid generate``, ``subscribe``, ``send``
  (delivered at once), ``send --no-deliver`` + ``dispatch``, a held message + ``release``,
  ``serve`` with good and bad tokens, and a refused start with a corrupted key — runs with
  every logger at DEBUG (the CLI has no log-level flag, so a wrapper turns DEBUG on for
  the whole process: gov's, psycopg's, urllib3's, uvicorn's). Nothing printed, to stdout
  or stderr, contains the private key (its PEM body, its raw base64url scalar, its hex or
  decimal form) or the bearer token; nor does any row gov stored.
* No tracked file of the repository holds a PEM private key or anything else that looks
  like a committed secret.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import secrets
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cryptography.hazmat.primitives import serialization

from gov.delivery.vapid import load_private_key
from gov.testing import PushService

REPO = Path(__file__).resolve().parents[2]
SUBJECT = "mailto:security@example.com"

# The CLI has no --log-level: run it with every logger at DEBUG, so anything gov or a
# library would log at any level is in the captured output.
DEBUG_CLI = (
    "import logging, sys; logging.basicConfig(level=logging.DEBUG, stream=sys.stderr); "
    "sys.argv[0] = 'gov'; from gov.cli import main; main()"
)


class Secrets:
    """The secrets of one flow, and every form in which they might leak."""

    def __init__(self, key_path: Path, token: str) -> None:
        pem = key_path.read_text()
        key = load_private_key(str(key_path))
        scalar = key.private_numbers().private_value
        raw = scalar.to_bytes(32, "big")
        body = "".join(line for line in pem.splitlines() if not line.startswith("-----"))
        self.pem = pem
        self.forms = {
            "PEM body": body,
            "raw base64url scalar": base64.urlsafe_b64encode(raw).rstrip(b"=").decode(),
            "raw base64 scalar": base64.b64encode(raw).decode(),
            "hex scalar": raw.hex(),
            "decimal scalar": str(scalar),
            "SEC1 DER base64": base64.b64encode(
                key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.TraditionalOpenSSL,
                                  serialization.NoEncryption())
            ).decode(),
            "bearer token": token,
        }
        # a key leaked one PEM line at a time is leaked too
        for i, line in enumerate(pem.splitlines()):
            if not line.startswith("-----") and len(line) >= 20:
                self.forms[f"PEM line {i}"] = line

    def leaks(self, text: str) -> list[str]:
        return [name for name, value in self.forms.items() if value and value in text]


def run_cli(env: dict[str, str], *args: str, stdin: str | None = None, timeout: float = 60) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-c", DEBUG_CLI, *args], env=env, input=stdin, capture_output=True, text=True,
        timeout=timeout,
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture
def flow_env(db_url: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOV_")}
    env.update({"GOV_DATABASE_URL": db_url, "GOV_VAPID_SUBJECT": SUBJECT, "GOV_ALLOW_LOOPBACK_HTTP": "1",
                "GOV_API_TOKEN": secrets.token_urlsafe(32)})
    yield env


def _serve(env: dict[str, str], outputs: list[str]) -> None:
    """gov serve: one send with the token, one with a wrong token, one without; then stop."""
    proc = subprocess.Popen(
        [sys.executable, "-c", DEBUG_CLI, "serve", "--port", "0", "--access-log"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stderr is not None
    lines = []
    try:
        for line in proc.stderr:  # until it announces where it listens (or dies)
            lines.append(line)
            if "gov: serving on http://" in line:
                host, port = line.strip().rsplit("//", 1)[1].rsplit(":", 1)
                break
        else:
            pytest.fail(f"gov serve did not start: {''.join(lines)[-2000:]}")
        token = env["GOV_API_TOKEN"]
        body = json.dumps({"userId": "carol", "id": "api-1", "tier": "P1", "title": "over HTTP"})
        for auth, expected in ((f"Bearer {token}", 200), (f"Bearer {token[:-2]}xx", 401), (None, 401)):
            connection = http.client.HTTPConnection(host, int(port), timeout=10)
            try:
                headers = {"Content-Type": "application/json"} | ({"Authorization": auth} if auth else {})
                connection.request("POST", "/internal/send", body=body, headers=headers)
                response = connection.getresponse()
                answer = response.read().decode()
                assert response.status == expected, (response.status, answer)
                outputs.append(answer + str(response.getheaders()))
            finally:
                connection.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        outputs.append("".join(lines) + out + err)


def test_no_secret_in_any_output_of_a_full_flow(
    flow_env: dict[str, str], db_url: str, tmp_path: Path, conn: psycopg.Connection[Any]
) -> None:
    env = flow_env
    outputs: list[str] = []

    # the key: generated by gov, 0600, only the public key printed
    key_path = tmp_path / "vapid.pem"
    code, out = run_cli(env, "vapid", "generate", str(key_path))
    assert code == 0, out
    outputs.append(out)
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    env["GOV_VAPID_PRIVATE_KEY"] = str(key_path)
    found = Secrets(key_path, env["GOV_API_TOKEN"])
    public_key = load_private_key(str(key_path)).public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )

    with PushService(expected_public_key=base64.urlsafe_b64encode(public_key).rstrip(b"=").decode()) as push:
        for user in ("alice", "bob", "carol"):
            sub = tmp_path / f"{user}.json"
            sub.write_text(json.dumps(push.subscribe(user).info))
            outputs.append(run_cli(env, "subscribe", "--user", user, str(sub))[1])

        steps = [
            ["send", "--user", "alice", "--tier", "P1", "--id", "m1", "--title", "delivered at once"],
            ["send", "--user", "alice", "--tier", "P2", "--id", "m2", "--title", "for the runner", "--no-deliver"],
            ["dispatch", "--once"],
            # bob: a cap of one a day; a message held four hours ago is due now
            ["user", "set", "--user", "bob", "--cap", "P1:24h=1"],
        ]
        now = datetime.now(UTC)
        steps += [
            ["send", "--user", "bob", "--tier", "P1", "--id", "b1", "--title", "first", "--ttl", "2419200",
             "--at", (now - timedelta(hours=25)).isoformat(), "--no-deliver"],
            ["send", "--user", "bob", "--tier", "P1", "--id", "b2", "--title", "held",
             "--at", (now - timedelta(hours=5)).isoformat(), "--no-deliver"],
            ["release", "--once"],
            ["dispatch", "--once"],
        ]
        for args in steps:
            code, out = run_cli(env, *args)
            assert code == 0, (args, out[-3000:])
            outputs.append(out)
        # the key given inline, as PEM text in the environment, instead of a path
        code, out = run_cli({**env, "GOV_VAPID_PRIVATE_KEY": found.pem}, "send", "--user", "carol", "--tier", "P0",
                            "--id", "c1", "--title", "inline key")
        assert code == 0, out[-3000:]
        outputs.append(out)
        _serve(env, outputs)
        code, out = run_cli(env, "dispatch", "--once")  # whatever the server left to the runner
        assert code == 0, out[-3000:]
        outputs.append(out)

        # a corrupted key: refused at start in one line that does not quote it
        corrupted = found.pem.replace(found.forms["PEM line 1"][:12], "A" * 12, 1)
        code, out = run_cli({**env, "GOV_VAPID_PRIVATE_KEY": corrupted}, "dispatch", "--once")
        assert code == 1 and "gov: error:" in out, out[-2000:]
        outputs.append(out)
        assert corrupted.splitlines()[1] not in out

        delivered = sorted(json.loads(p)["data"]["id"] for p in push.delivered_payloads())

    assert delivered == ["api-1", "b1", "b2", "c1", "m1", "m2"], delivered  # the flow really ran
    everything = "\n".join(outputs)
    assert "DEBUG" in everything, "the flow did not log at DEBUG: the check would prove little"
    assert found.leaks(everything) == [], "secret material in the output"

    # nothing gov stored holds them either
    tables = [t for (t,) in conn.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'gov' AND table_type = 'BASE TABLE'"
    )]
    assert "messages" in tables
    # table names from the catalog, not from input
    stored = "\n".join(repr(conn.execute(f"SELECT * FROM gov.{t}").fetchall()) for t in tables)
    assert found.leaks(stored) == []


# ---------------------------------------------------------------- the repository

# Each pattern names a kind of secret; built by concatenation so this file does not match itself.
_BEGIN, _END = "-----" + "BEGIN", "-----" + "END"
SECRET_PATTERNS = {
    "PEM private key": re.compile(
        _BEGIN + r" ([A-Z]+ )*PRIVATE KEY-----(\s|\\n|\\r)*[A-Za-z0-9+/=]{40,}", re.MULTILINE
    ),
    "AWS access key id": re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"),
    "GitHub token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"),
    "Slack token": re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    "Stripe live key": re.compile(r"\b[sr]k_live_[A-Za-z0-9]{16,}"),
    "Google API key": re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"),
    "EC private JWK": re.compile(r"\"d\"\s*:\s*\"[A-Za-z0-9_-]{43}\""),
    "gov secret in an assignment": re.compile(
        r"\b(GOV_API_TOKEN|GOV_VAPID_PRIVATE_KEY)\s*[=:]\s*[\"']?(?![$<{])[A-Za-z0-9_+/=-]{16,}"
    ),
    "password in a URL": re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s/:@'\"]+:(?P<pw>[^\s/@'\"]{1,})@"),
}
# Obvious placeholders in examples and test vectors are not secrets.
PLACEHOLDER_PASSWORDS = {"password", "pass", "pw", "passwd", "secret", "postgres", "changeme", "example", "xxx",
                         "user", "pwd", "test", "hunter2", "***", "PASSWORD"}
SECRET_FILE_NAMES = re.compile(r"(^|/)(id_(rsa|ecdsa|ed25519)|[^/]*\.(pem|key|p12|pfx|keystore)|\.env(\.[^/]*)?)$")


def committed_secrets(name: str, text: str) -> list[str]:
    """Every line of ``text`` (the file ``name``) that looks like a committed secret."""
    found = []
    for kind, pattern in SECRET_PATTERNS.items():
        for match in pattern.finditer(text):
            pw = match.groupdict().get("pw")
            if pw is not None and (pw in PLACEHOLDER_PASSWORDS or pw[0] in "$<{%*"):
                continue
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{name}:{line}: {kind}")
    return found


def test_the_scan_finds_committed_secrets() -> None:
    """The detector itself, on made-up secrets of each kind (built here, never committed)."""
    key = base64.b64encode(secrets.token_bytes(120)).decode()
    samples = {
        "PEM private key": f"{_BEGIN} EC PRIVATE KEY-----\n{key[:64]}\n{key[64:]}\n{_END} EC PRIVATE KEY-----\n",
        "AWS access key id": "aws = 'AKIA" + "ABCDEFGHIJKLMNOP'",
        "GitHub token": "token: ghp_" + "a1" * 18,
        "Slack token": "xoxb-" + "1234567890-abcdef",
        "Stripe live key": "sk_live_" + "a" * 24,
        "Google API key": "AIza" + "b" * 35,
        "EC private JWK": '{"kty": "EC", "d": "' + "c" * 43 + '"}',
        "gov secret in an assignment": "GOV_API_TOKEN=" + secrets.token_urlsafe(24),
        "password in a URL": "postgresql://gov:" + "S3cr3t-pw" + "@db.internal/gov",
    }
    for kind, sample in samples.items():
        assert committed_secrets("sample", sample) == [f"sample:1: {kind}"], (kind, committed_secrets("x", sample))
    harmless = [
        f'assert text.startswith("{_BEGIN} PRIVATE KEY-----")',  # a header alone is not a key
        f'"{_BEGIN} PRIVATE KEY-----\\nQUJDREVGR0g=\\n{_END} PRIVATE KEY-----"',  # nor a toy body
        "https://user:pw@push.example.com/x", "postgresql://postgres:@/postgres?host=/tmp/x",
        "GOV_API_TOKEN=${GOV_API_TOKEN}", "GOV_VAPID_PRIVATE_KEY=<path to the PEM file>",
    ]
    for text in harmless:
        assert committed_secrets("harmless", text) == [], text
    assert SECRET_FILE_NAMES.search("deploy/vapid.pem") and SECRET_FILE_NAMES.search(".env")
    assert not SECRET_FILE_NAMES.search("gov/delivery/vapid.py")


def test_no_secret_is_committed() -> None:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout, so there are no tracked files to scan: {exc}")
    names = [n for n in listed.stdout.decode().split("\0") if n]
    assert len(names) > 20, "git ls-files listed almost nothing: the scan would prove little"
    found = [f"{name}: a file of a kind that holds secrets" for name in names if SECRET_FILE_NAMES.search(name)]
    for name in names:
        path = REPO / name
        if not path.is_file():
            continue  # listed but deleted in the work tree
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        found += committed_secrets(name, data.decode("utf-8", errors="replace"))
    assert found == [], "\n".join(found)
