"""Test helpers for gov and for applications using it: a real local push service.

Enable the ``push_service`` pytest fixture with
``pytest_plugins = ["gov.testing.pytest_plugin"]`` in your top-level conftest.py.
"""

from __future__ import annotations

from gov.testing.push_service import BrowserSubscription, PushService, Received

__all__ = ["BrowserSubscription", "PushService", "Received"]
