"""gov.http.door: the fast door's message and verdict are the route's, field for field and byte for byte."""

from __future__ import annotations

import asyncio
import json
from dataclasses import fields

import pytest

from gov.governor import SendResult
from gov.http.door import FastSend
from gov.http.models import Send
from gov.message import Decision, Message


def test_a_send_becomes_the_message_its_every_field_names() -> None:
    # every field set to a value of its own: a field the mapping forgot, or put in another's
    # place, changes the message
    body = {"userId": "u-1", "tier": "P3", "id": "m-1", "title": "T", "body": "B", "url": "https://e.test/x",
            "topic": "news", "collapseKey": "k", "ttl": 600, "campaignId": "c-1"}
    message = Send.model_validate_json(json.dumps(body)).message()
    assert message == Message(user_id="u-1", tier="P3", id="m-1", title="T", body="B", url="https://e.test/x",
                              topic="news", collapse_key="k", ttl=600, campaign_id="c-1")
    # and nothing a Send holds is left out: its fields are the message's
    assert set(Send.model_fields) == {f.name for f in fields(Message)}


def _verdict(decision: Decision) -> tuple[int, bytes]:
    loop = asyncio.new_event_loop()
    try:
        outcome: asyncio.Future[SendResult] = loop.create_future()
        outcome.set_result(SendResult(decision, ()))
        return FastSend.verdict(outcome)
    finally:
        loop.close()


@pytest.mark.parametrize("decision", [
    Decision(True),
    Decision(False, "drop", "cap_86400000ms", 2, 2, 1000),
    Decision(False, "defer", "quiet_hours", None, None, None),
    Decision(False, "drop", "cap_3600000ms", 1, 1, 5),
    Decision(False, "collapse", "topic_cap_86400000ms", 3, 3, 7),
])
def test_a_verdict_is_the_decision_in_the_seeds_shape_every_time(decision: Decision) -> None:
    expected = {"sent": True} if decision.allowed else {
        "sent": False, "action": decision.action, "reason": decision.reason}
    for _ in range(2):  # the second answer of a reason is the one written before: still its own
        status, body = _verdict(decision)
        assert status == 200
        assert json.loads(body) == expected
