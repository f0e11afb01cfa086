"""Promises the docs make: gov.send() without a database URL is a ConfigurationError;
the runner, the releaser and the API refuse a database on another schema revision."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gov import migrate
from gov.schema_version import code_head, database_revision, require_head
from gov.testing.postgres import TemplateDatabases

OLD = "0008_fatigue_leavers"


def run(*args: str, env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, env=env, input=stdin, timeout=60)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOV_")}
    return {**env, **extra}


def test_module_send_without_database_url_is_a_configuration_error(tmp_path: Path) -> None:
    script = (
        "import gov\n"
        "try:\n"
        "    gov.send(gov.Message(user_id='u', id='m', tier='P2', title='t'))\n"
        "except gov.ConfigurationError as exc:\n"
        "    print('ConfigurationError:', exc)\n"
    )
    # run where an embedded server could be started: it must not be
    r = run(sys.executable, "-c", script, env=clean_env(GOV_DATA_DIR=str(tmp_path / "data")))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ConfigurationError:") and "GOV_DATABASE_URL" in lines[0], r
    assert not (tmp_path / "data").exists(), "gov.send() started an embedded server"


def test_module_send_in_process_without_url(monkeypatch: pytest.MonkeyPatch) -> None:
    import gov
    import gov.governor

    monkeypatch.delenv("GOV_DATABASE_URL", raising=False)
    monkeypatch.setattr(gov.governor, "_default", None)
    with pytest.raises(gov.ConfigurationError, match="GOV_DATABASE_URL"):
        gov.send(gov.Message(user_id="u", id="m", tier="P2", title="t"))


def test_code_head_agrees_with_alembic() -> None:
    assert code_head() == migrate.head()


@pytest.fixture
def old_url(databases: TemplateDatabases) -> Iterator[str]:
    url = databases.empty()
    migrate.upgrade(url, OLD)
    yield url
    databases.drop(url)


def _one_line_naming_both(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gov: error:"), r.stderr
    assert OLD in lines[0] and code_head() in lines[0], lines[0]


def _vapid_env(tmp_path: Path, url: str) -> dict[str, str]:
    key = tmp_path / "vapid.pem"
    if not key.exists():
        r = run(sys.executable, "-m", "gov.cli", "vapid", "generate", str(key), env=clean_env())
        assert r.returncode == 0, r.stderr
    return clean_env(GOV_DATABASE_URL=url, GOV_VAPID_PRIVATE_KEY=str(key),
                     GOV_VAPID_SUBJECT="mailto:ops@example.com")


def test_old_schema_is_refused_by_dispatch_release_and_serve(old_url: str, tmp_path: Path) -> None:
    env = _vapid_env(tmp_path, old_url)
    _one_line_naming_both(run(sys.executable, "-m", "gov.cli", "dispatch", "--once", "--processes", "1", env=env))
    _one_line_naming_both(run(sys.executable, "-m", "gov.cli", "release", "--once", env=env))
    _one_line_naming_both(run(sys.executable, "-m", "gov.cli", "serve", "--port", "0",
                              env={**env, "GOV_API_TOKEN": "t" * 32}))
    # checked, never upgraded behind the user's back
    assert database_revision(old_url) == OLD


def test_no_schema_at_all_is_refused(databases: TemplateDatabases) -> None:
    from gov import SchemaMismatch

    url = databases.empty()
    try:
        with pytest.raises(SchemaMismatch, match=f"none.*{code_head()}"):
            require_head(url)
    finally:
        databases.drop(url)


def test_head_schema_works(db_url: str, tmp_path: Path) -> None:
    env = _vapid_env(tmp_path, db_url)
    for args in (("dispatch", "--once", "--processes", "1"), ("release", "--once")):
        r = run(sys.executable, "-m", "gov.cli", *args, env=env)
        assert r.returncode == 0, r.stderr
    require_head(db_url)


def test_sql_ttl_checks_mirror_the_python_constant(db_url: str) -> None:
    import psycopg

    from gov.message import MAX_TTL_S

    with psycopg.connect(db_url) as conn:
        defs = conn.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conname LIKE '%ttl_range'"
        ).fetchall()
    assert len(defs) == 2, defs
    for name, definition in defs:
        assert f"<= {MAX_TTL_S}" in definition, (name, definition)
