"""The payload bound gov uses to skip building a payload at send time.

Property: whenever :func:`gov.delivery.push.surely_fits` says a message's fields fit, the
payload :func:`~gov.delivery.push.build_payload` makes of them, with the longest beacon
fields a runner may add, is within :data:`~gov.delivery.push.MAX_PAYLOAD_BYTES`. (A bound
that is too generous would let an oversize message spend a slot that no push can carry.)
"""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from gov.delivery.beacon import MAX_SUBSCRIPTION_ID, PLACEHOLDER_TOKEN
from gov.delivery.push import MAX_PAYLOAD_BYTES, build_payload, surely_fits
from tests.fuzz import FUZZ

# the characters JSON and UTF-8 make longest: control characters (\u00XX), astral ones
# (4 bytes), quotes and backslashes (escaped), and plain ASCII to fill
WORST = st.text(alphabet=st.sampled_from(["\x01", "\x1f", "\U0001f600", "\u20ac", '"', "\\", "a"]), max_size=700)
TITLE = WORST.filter(lambda t: t.strip() != "")


@FUZZ
@given(title=TITLE, body=WORST, tag=st.none() | WORST, url=st.none() | WORST, tier=WORST, message_id=TITLE)
@example(title="\x01" * 650, body="", tag=None, url=None, tier="P2", message_id="m")  # a control-character title
def test_a_message_the_bound_passes_always_fits(
    title: str, body: str, tag: str | None, url: str | None, tier: str, message_id: str
) -> None:
    if surely_fits(title, body, tag, url, tier, message_id):
        payload = build_payload(title, body, tag, url, tier, message_id,
                                subscription_id=MAX_SUBSCRIPTION_ID, token=PLACEHOLDER_TOKEN)
        assert len(payload) <= MAX_PAYLOAD_BYTES
