"""gov: a send-rate governor for web push notifications that lives in PostgreSQL.

    import gov
    with gov.Governor("postgresql://…") as governor:
        verdict = governor.decide(gov.Message(user_id="u42", id="m1", tier="P2"))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gov.errors import (
    ConfigurationError,
    DatabaseError,
    GovernorClosed,
    GovError,
    InvalidInput,
    InvalidMessage,
    InvalidSubscription,
    PolicyError,
    PoolTimeout,
    SchemaMismatch,
)

if TYPE_CHECKING:
    from gov.analytics.events import InvalidEvent
    from gov.delivery.vapid import VapidSigner
    from gov.governor import Governor, SendResult, send
    from gov.message import Decision, Message

# Imported on first use (PEP 562), so that `import gov.delivery.runner` (the runner) does not
# load the governor, the policy code and their dependencies.
_LAZY = {
    "Governor": "gov.governor",
    "SendResult": "gov.governor",
    "send": "gov.governor",
    "Decision": "gov.message",
    "Message": "gov.message",
    "VapidSigner": "gov.delivery.vapid",
    "InvalidEvent": "gov.analytics.events",  # the README names it gov.InvalidEvent
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gov' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})

__all__ = [
    "ConfigurationError",
    "DatabaseError",
    "Decision",
    "GovError",
    "Governor",
    "GovernorClosed",
    "InvalidEvent",
    "InvalidInput",
    "InvalidMessage",
    "InvalidSubscription",
    "Message",
    "PolicyError",
    "PoolTimeout",
    "SchemaMismatch",
    "SendResult",
    "VapidSigner",
    "send",
]
