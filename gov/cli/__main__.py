"""``python -m gov.cli``: the `gov` command line."""

from gov.cli.main import main

main()
