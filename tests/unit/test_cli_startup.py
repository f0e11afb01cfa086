"""The command line starts with what the command uses: `gov decide` and `gov dispatch --once`
do not load Alembic, the simulator, the benches or the web server, and `gov --help` lists
every command without loading any."""

from __future__ import annotations

import ast
import subprocess
import sys

from click.testing import CliRunner

HEAVY = ("alembic", "sqlalchemy", "gov.migrate", "gov.lab", "gov.lab.simulate", "gov.lab.bench", "gov.lab.soak",
         "gov.cli.ops", "gov.cli.send", "gov.cli.delivery", "gov.governor", "gov.http", "starlette", "uvicorn",
         "fastapi", "pydantic")


def _loaded_after(code: str) -> list[str]:
    probe = f"{code}\nimport sys\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def test_importing_the_cli_loads_no_other_command() -> None:
    assert _loaded_after("import gov.cli") == []


def test_the_runner_loads_no_other_command() -> None:
    assert _loaded_after("import gov.cli, gov.delivery.runner, gov.delivery.processes") == []


def test_help_loads_no_command() -> None:
    code = "from click.testing import CliRunner\nfrom gov.cli import main\nCliRunner().invoke(main, ['--help'])"
    assert _loaded_after(code) == []


def test_decide_loads_only_the_decision() -> None:
    code = ("from click.testing import CliRunner\nfrom gov.cli import main\n"
            "CliRunner().invoke(main, ['decide', '--help'])")
    assert _loaded_after(code) == ["gov.cli.send"]


def test_listed_help_is_each_commands_own() -> None:
    """`gov --help` prints COMMANDS' text without importing; it must say what the command says."""
    import inspect

    from gov.cli.main import COMMANDS, load

    for name, (_, listed) in COMMANDS.items():
        own = inspect.cleandoc(load(name).help or "").split("\n\n")[0].replace("\n", " ")
        assert listed == own, name


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
