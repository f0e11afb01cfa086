"""The `gov` command line. :data:`gov.cli.main.COMMANDS` maps each command to the module
of its concern (``send``, ``delivery``, ``policy``, ``users``, ``db``, ``ops``, and the lab's
tools); ``common`` holds what they share."""

from gov.cli.main import main

__all__ = ["main"]
