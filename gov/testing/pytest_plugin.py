"""pytest plugin providing the ``push_service`` fixture.

Enable it in your top-level ``conftest.py``::

    pytest_plugins = ["gov.testing.pytest_plugin"]

then ask for ``push_service`` in a test: a started
:class:`~gov.testing.PushService` on 127.0.0.1, stopped after the test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gov.testing.push_service import PushService


@pytest.fixture
def push_service() -> Iterator[PushService]:
    """A started local push service, one per test (function scope)."""
    with PushService() as service:
        yield service
