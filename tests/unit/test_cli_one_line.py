"""Every CLI error is one line (probe of `gov simulate`, item 5): libpq's message for a
refused connection is two lines ("… Connection refused" and "Is the server running …"),
and `gov report fatigue` printed both."""

from __future__ import annotations

from click.testing import CliRunner

from gov.cli import main
from gov.errors import one_line

REFUSED = "postgresql://postgres@127.0.0.1:1/nope?connect_timeout=2"


def test_a_refused_connection_is_one_error_line_naming_both_parts() -> None:
    out = CliRunner().invoke(main, ["report", "fatigue", "--database-url", REFUSED])
    assert out.exit_code == 1, out.output
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gov: error: "), out.stderr
    # both of libpq's lines are kept, joined
    assert "Connection refused; Is the server running" in lines[0], lines[0]


def test_one_line_joins_lines_and_collapses_their_spaces() -> None:
    assert one_line("first  line\n\tsecond line\n\n") == "first line; second line"
    assert one_line("plain") == "plain" and one_line("") == ""
