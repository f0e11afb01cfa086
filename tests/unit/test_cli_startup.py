"""The command line starts with what the command uses (issue 12): `gov dispatch --once` does
not load Alembic, the simulator, the benches or the web server, and `gov --help` still lists
every command."""

from __future__ import annotations

import ast
import subprocess
import sys

from click.testing import CliRunner

HEAVY = ("alembic", "sqlalchemy", "gov.migrate", "gov.simulate", "gov.bench", "gov.soak", "gov.cli_ops",
         "gov.governor", "starlette", "uvicorn")


def _loaded_after(code: str) -> list[str]:
    probe = f"{code}\nimport sys\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def test_importing_the_cli_loads_no_other_command() -> None:
    assert _loaded_after("import gov.cli") == []


def test_the_runner_loads_no_other_command() -> None:
    assert _loaded_after("import gov.cli, gov.delivery, gov.processes") == []


def test_help_lists_every_command_loaded_on_demand() -> None:
    from gov.cli import main

    runner = CliRunner()
    top = runner.invoke(main, ["--help"])
    for name in ("bench", "check", "dispatch", "report", "serve", "simulate", "soak", "send-campaign"):
        assert f"  {name} " in top.output, name
    assert "  whatif " in runner.invoke(main, ["policy", "--help"]).output
    assert "  grant-analyst " in runner.invoke(main, ["db", "--help"]).output
    assert "--processes" in runner.invoke(main, ["dispatch", "--help"]).output
    assert runner.invoke(main, ["nosuch"]).exit_code == 2
