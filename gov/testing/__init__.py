"""Test helpers for gov and for applications using it: a real local push service, a
clock moved by hand, a real PostgreSQL (:mod:`gov.testing.postgres`).

Enable the ``push_service`` pytest fixture with
``pytest_plugins = ["gov.testing.pytest_plugin"]`` in your top-level conftest.py.
"""

from __future__ import annotations

from gov.testing.clock import Clock
from gov.testing.push_service import BrowserSubscription, PushService, Received

__all__ = ["BrowserSubscription", "Clock", "PushService", "Received"]
