"""Prometheus metrics (issue 12 item 7): the interface the runner calls.

A stub until the metrics module is filled in: ``observe_attempt`` is called by the
runner once per push attempt, with the outcome kind, the HTTP status (or None) and
the attempt's duration in seconds.
"""

from __future__ import annotations


def observe_attempt(outcome: str, status: int | None, seconds: float) -> None:
    """Count one push attempt by outcome and status class, and its latency."""
