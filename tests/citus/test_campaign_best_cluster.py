"""Campaigns at each user's best hour on the cluster: gov.send_many_best_v1 is delegated by
shard and gives what it gives on one server (tests/integration/test_campaign_best.py)."""

from __future__ import annotations

from tests.integration.test_campaign_best import (  # noqa: F401  (fixtures and tests, run here too)
    clock,
    gov,
    test_a_retry_returns_the_first_slot_and_spends_nothing,
    test_decided_now_delivered_at_the_best_hour_with_its_ttl_from_there,
    test_twenty_campaigns_at_best_for_one_fresh_user_allow_exactly_two,
)
