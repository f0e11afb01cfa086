"""A runner's lease and attempt deadline, and the rule that ties them (invariant 12).

Apart from :mod:`gov.delivery.runner` so that ``gov dispatch`` can refuse a bad
``--lease``/``--timeout`` pair before it imports the runner's HTTP and encryption stack
or forks a process: it imports nothing but :mod:`gov.errors`.
"""

from __future__ import annotations

import math

from gov.errors import ConfigurationError

DEFAULT_LEASE_S = 60.0  # seconds a claimed row stays ours before another runner may take it
DEFAULT_TIMEOUT_S = 10.0  # seconds for a whole attempt (connect, send, read): never infinite (WEBPUSH.md 11)
LEASE_MARGIN_S = 1.0  # at most this much of a lease is kept back for recording the batch
MAX_LEASE_S = 86_400.0  # a dead runner's rows wait this long at most (gov.max_lease_ms() in SQL)


def check_deadlines(lease_s: float, timeout_s: float) -> None:
    """Refuse a runner whose attempts could outlive their lease (invariant 12)."""
    for name, value in (("lease", lease_s), ("timeout", timeout_s)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise ConfigurationError(f"{name}: must be finite seconds > 0 (got {value!r})")
    if lease_s > MAX_LEASE_S:
        raise ConfigurationError(
            f"lease {lease_s:g} s: at most a day ({MAX_LEASE_S:g} s); a dead runner's rows wait that long")
    if timeout_s >= lease_s:
        raise ConfigurationError(
            f"timeout {timeout_s:g} s must be shorter than the lease {lease_s:g} s: an attempt must end "
            "before another runner may claim its row"
        )
