"""gov: a send-rate governor for web push notifications that lives in PostgreSQL.

    import gov
    with gov.Governor("postgresql://…") as governor:
        verdict = governor.decide(gov.Message(user_id="u42", id="m1", tier="P2"))
"""

from __future__ import annotations

from gov.errors import (
    ConfigurationError,
    DatabaseError,
    GovError,
    InvalidInput,
    InvalidMessage,
    InvalidSubscription,
    PolicyError,
    PoolTimeout,
    SchemaMismatch,
)
from gov.governor import Governor, SendResult, send
from gov.message import Decision, Message
from gov.vapid import VapidSigner

__all__ = [
    "ConfigurationError",
    "DatabaseError",
    "Decision",
    "GovError",
    "Governor",
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
