"""Run the mutants: one deliberate bug at a time, the tests expected to catch it.

Not collected by pytest (the name does not start with ``test_``) and not run in CI:
run it on demand from the repository root::

    .venv/bin/python tests/mutation/run.py            # every mutant
    .venv/bin/python tests/mutation/run.py a d        # some of them, by name prefix

For each mutant it makes a temporary git worktree of HEAD, copies in the working
tree's tests/ (so new tests are tried before they are committed), applies the mutation
(a text replacement, which must match exactly the given number of times), runs the
named tests there with PYTHONPATH pointing at the worktree, and prints ``caught`` (a
test failed) or ``SURVIVED``. The same tests are first run on the unmutated worktree:
they must pass there, or the run stops.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the checkout's own venv; from a git worktree without one, the interpreter running this script
PYTHON = ROOT / ".venv" / "bin" / "python" if (ROOT / ".venv").exists() else Path(sys.executable)


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str
    edits: tuple[tuple[str, str, str, int], ...]  # (file, old, new, expected matches)
    tests: tuple[str, ...]


OLD_SEGMENT_GUARD = "\n             WHERE old.segment IS NULL OR old.segment IN ('engaged', 'casual', 'dormant')) c;"
HOST_NOW = "__import__('datetime').datetime.now(__import__('datetime').UTC)"
SURFACE_TEST = "tests/migration/test_sql_surface.py"
SUBSCRIBE_V1_HEAD = "CREATE FUNCTION gov.subscribe_v1(p_user_id text, p_endpoint text, p_p256dh text, p_auth text)\n"
SUBSCRIBE_V1_BODY = "    RETURN gov.subscribe_v2(p_user_id, p_endpoint, p_p256dh, p_auth);\nEND;\n$$;\n"
HOLDING_TIERS = "sql/migrations/0047_holding_tiers_batched.sql"
SEGMENTS_TOGETHER = "sql/migrations/0048_segments_together.sql"
EDF_ORDER = "ORDER BY least(c.expires_at, d.give_up_at) NULLS LAST, d.tier, d.enqueued_at, d.id"
PROBE = "tests/acceptance/test_http_probe.py::"
LIMITS = "tests/acceptance/test_serve_limits.py::"
INF_CORE = ("    IF NOT isfinite(v_now) OR v_now > clock_timestamp() + gov.moment_ahead_limit() THEN\n"
            "        -- a send row")
INF_CORE_OFF = "    IF false THEN\n        -- a send row"
INF_TOGETHER = ("    IF NOT isfinite(p_now) OR p_now > clock_timestamp() + gov.moment_ahead_limit() THEN"
                "  -- as gov.decide_core")
CONTENT_OK = "    SELECT coalesce(jsonb_typeof(p_content)"
CONTENT_ANY = "    SELECT true OR coalesce(jsonb_typeof(p_content)"
NAN_STRENGTH = " OR NOT p_strength < 'Infinity'::double precision THEN"
REACH = "sql/migrations/0053_best_hours_from_reach.sql"
TIMED = "sql/migrations/0054_timed_rows_contend.sql"
CHEAP = "sql/migrations/0055_hold_timing_cheap.sql"
REACH_KERNEL = "VALUES (-1, 0.25::double precision), (0, 0.5::double precision), (1, 0.25::double precision)"
BACKFILL_ROWS = "AND m.decided_at <= v_now\n    ON CONFLICT DO NOTHING;"
BACKFILL_NEW_ONLY = "AND m.decided_at <= v_now AND NOT b.budget = ANY (p_before)\n    ON CONFLICT DO NOTHING;"
BACKFILL_OWN_OFF = "AND m.decided_at <= v_now\n    ;"
QUIET_CROSSING = "AND ((c.at - interval '15 minutes') AT TIME ZONE p_tz) < p_local"
SW_SCHEMES = "      if (target.protocol === 'https:' || target.protocol === 'http:') return target.href;"
SW_RENEWAL_REPORT = "      await reportError(e && e.message ? e.message : e, {}, 'renewal').catch(() => {});"
PRUNE_GUARD = "    IF p_margin IS NULL OR p_margin < interval '0' OR"
SUBSCRIBE_V1_DROP = "DROP FUNCTION gov.subscribe_v1(text, text, text, text);\n"

MUTANTS = [
    Mutant(
        "dr1_batcher_expects_no_company",
        "an idle SendBatcher no longer waits for the clients its last batch answered (two half batches)",
        (("gov/aio.py", "self._expected = queue.qsize() + len(live)", "self._expected = 1", 1),),
        ("tests/integration/test_aio.py::test_clients_that_send_again_once_answered_are_grouped_whole",),
    ),
    Mutant(
        "dr2_joined_close_drops_the_answer",
        "closing a connection with joined writes drops the answer not yet sent",
        (("gov/http/wire.py", "    def close(self) -> None:\n        self.flush()\n",
          "    def close(self) -> None:\n        self._pending = None\n", 1),),
        ("tests/unit/test_wire.py::test_close_sends_what_is_pending_first_and_abort_drops_it",),
    ),
    Mutant(
        "a_user_cap_replaces_default",
        "the decision takes the user's own cap instead of least(default, user)",
        (
            ("sql/schema/20_decide.sql", "least(d.c, uc.cap) AS c", "coalesce(uc.cap, d.c) AS c", 1),
            ("sql/migrations/0044_poison_inputs.sql", "least(d.c, uc.cap) AS c", "coalesce(uc.cap, d.c) AS c", 1),
        ),
        (
            "tests/integration/test_policy_change.py::test_a_default_lowered_under_a_users_own_cap_holds_that_user_too",
            "tests/integration/test_segments.py::test_a_users_own_cap_lowers_the_segment_cap_and_never_raises",
        ),
    ),
    Mutant(
        "b_defer_max_ignored_at_release",
        "release_one never gives up at give_up_at (defer_max)",
        (
            ("sql/schema/30_hold_release.sql", "IF p_row.give_up_at IS NOT NULL AND v_next > p_row.give_up_at THEN",
             "IF false THEN", 1),
            (TIMED,
             "IF p_row.give_up_at IS NOT NULL AND v_next > p_row.give_up_at THEN", "IF false THEN", 1),
        ),
        ("tests/integration/test_queue.py::test_defer_max_holds_at_release_when_the_slot_is_taken_again",),
    ),
    Mutant(
        "c_host_clock_in_governor",
        "Governor passes the host's clock as p_now when no clock is given",
        (("gov/governor.py", "(self.clock() if self.clock is not None else None)",
          f"(self.clock() if self.clock is not None else {HOST_NOW})", 1),),
        ("tests/integration/test_decide.py::test_with_no_clock_given_the_database_clock_decides",),
    ),
    Mutant(
        "c2_host_clock_in_releaser",
        "the Releaser passes the host's clock as p_now when no clock is given",
        (("gov/hold/release.py", "now = self.clock() if self.clock is not None else None",
          f"now = self.clock() if self.clock is not None else {HOST_NOW}", 1),),
        ("tests/integration/test_decide.py::test_with_no_clock_given_the_database_clock_decides",),
    ),
    Mutant(
        "d_release_claim_without_skip_locked",
        "release_due_v2 takes held rows FOR UPDATE without SKIP LOCKED",
        (
            ("sql/schema/30_hold_release.sql", "FOR UPDATE SKIP LOCKED", "FOR UPDATE", 1),
            # (release_due_v2 as migration 0054 last made it)
            (TIMED, "FOR UPDATE SKIP LOCKED\n        $q$",
             "FOR UPDATE\n        $q$", 1),
        ),
        ("tests/integration/test_claim_specs.py::test_two_releasers_never_block_on_or_share_a_held_row",),
    ),
    Mutant(
        "e_dispatch_claim_without_skip_locked",
        "claim_outbox_v3 takes outbox rows FOR UPDATE without SKIP LOCKED",
        (
            ("sql/schema/40_delivery.sql", "FOR UPDATE OF o SKIP LOCKED", "FOR UPDATE OF o", 1),
            ("sql/migrations/0036_claim_plan.sql", "FOR UPDATE OF o SKIP LOCKED", "FOR UPDATE OF o", 1),
        ),
        (
            "tests/integration/test_claim_specs.py::test_two_runners_never_block_on_or_share_an_outbox_row",
            "tests/integration/test_claim_specs.py::test_a_runner_that_rolls_back_leaves_its_rows_to_the_other",
        ),
    ),
    Mutant(
        "f_segment_windows_ignored",
        "decide_core holds every user to the tier's own windows, whatever their segment",
        (
            ("sql/schema/20_decide.sql", "v_seg_key := v_segment;", "v_seg_key := '';", 1),
            ("sql/migrations/0044_poison_inputs.sql", "v_seg_key := v_segment;", "v_seg_key := '';", 1),
        ),
        (
            "tests/integration/test_decide.py::test_twenty_way_race_is_exact_for_a_user_of_each_segment",
            "tests/integration/test_segments.py::test_the_decision_uses_the_users_segments_windows",
        ),
    ),
    Mutant(
        "g_refresh_overwrites_the_apps_segments",
        "gov.refresh_segments_v1 reclassifies users the app put in a segment of its own",
        (
            ("sql/schema/10_policy.sql",
             "\n     WHERE u.segment IS NULL OR u.segment IN ('engaged', 'casual', 'dormant');", ";", 1),
            ("sql/migrations/0044_poison_inputs.sql",
             "\n     WHERE u.segment IS NULL OR u.segment IN ('engaged', 'casual', 'dormant');", ";", 1),
            ("sql/schema/10_policy.sql",
             OLD_SEGMENT_GUARD, ") c;", 1),
            ("sql/migrations/0044_poison_inputs.sql",
             OLD_SEGMENT_GUARD, ") c;", 1),
        ),
        ("tests/integration/test_segments.py::test_refresh_classifies_with_an_explicit_clock",),
    ),
    Mutant(
        "i_campaign_checks_windows_out_of_order",
        "gov.decide_together takes a user's first blocking window in window order, not decision order",
        (
            ("sql/schema/20_decide.sql", "ORDER BY ch.u, ch.seq, ch.i", "ORDER BY ch.u, ch.i, ch.seq", 1),
            (SEGMENTS_TOGETHER, "ORDER BY ch.u, ch.seq, ch.i", "ORDER BY ch.u, ch.i, ch.seq", 1),
        ),
        ("tests/integration/test_campaign_set.py::test_a_batch_gives_every_user_the_one_by_one_decision",),
    ),
    Mutant(
        "h_batch_record_unfenced",
        "record_attempts_v3 records a batch's accepted attempts without checking their claim tokens",
        (
            ("sql/schema/40_delivery.sql", "WHERE o.state = 'sending' AND o.claim_token = a.claim_token",
             "WHERE o.state = 'sending'", 1),
            ("sql/migrations/0017_record_batch_set.sql", "WHERE o.state = 'sending' AND o.claim_token = a.claim_token",
             "WHERE o.state = 'sending'", 1),
        ),
        (
            "tests/integration/test_delivery_robust.py::test_a_stale_runner_cannot_record_over_the_lease_holder",
            "tests/integration/test_delivery_robust.py::test_a_batch_records_each_row_as_it_would_alone",
        ),
    ),
    Mutant(
        "j_own_caps_read_as_plain",
        "decide_core reads a user with caps of their own through the plain rule query",
        (
            ("sql/schema/20_decide.sql", "            IF v_own THEN\n                OPEN c_rules FOR",
             "            IF false THEN\n                OPEN c_rules FOR", 1),
            ("sql/migrations/0044_poison_inputs.sql",
             "            IF v_own THEN\n                OPEN c_rules FOR",
             "            IF false THEN\n                OPEN c_rules FOR", 1),
        ),
        (
            "tests/integration/test_policy_change.py::test_a_default_lowered_under_a_users_own_cap_holds_that_user_too",
            "tests/integration/test_segments.py::test_a_users_own_cap_lowers_the_segment_cap_and_never_raises",
        ),
    ),
    Mutant(
        "l_batch_failure_fails_every_message",
        "AsyncGovernor.send_batch gives a failed batch's error to all its messages instead of sending each alone",
        (
            ("gov/aio.py", "results[i] = await self.send(messages[i], at=now, deliver=False)", "results[i] = exc", 1),
        ),
        (
            "tests/integration/test_aio.py::test_a_failing_message_in_a_batch_leaves_the_others_their_verdicts",
            "tests/acceptance/test_serve_batch.py::test_a_batch_with_a_failing_message_answers_the_others",
        ),
    ),
    Mutant(
        "m_batch_stores_the_tiers_ttl",
        "gov.send_batch_v1 stores a plain message's content with its tier's TTL, not the message's own",
        (
            ("sql/schema/20_decide.sql", "SELECT coalesce(p_ttls[d.n], t.default_ttl_s) AS ttl_s",
             "SELECT t.default_ttl_s AS ttl_s", 1),
            (HOLDING_TIERS, "SELECT coalesce(p_ttls[d.n], t.default_ttl_s) AS ttl_s",
             "SELECT t.default_ttl_s AS ttl_s", 1),
        ),
        ("tests/integration/test_send_batch.py::test_a_batch_of_unrelated_messages_gives_each_what_send_gives_it_alone",),
    ),
    Mutant(
        "n_door_answers_before_the_commit",
        "the batcher answers a send before its batch has run (a verdict no row backs)",
        (
            ("gov/aio.py", "        queue.put_nowait((message, future, time.monotonic()))\n        return future",
             "        queue.put_nowait((message, asyncio.get_running_loop().create_future(), time.monotonic()))\n"
             "        future.set_result(SendResult(Decision(allowed=True)))\n        return future", 1),
        ),
        (
            "tests/acceptance/test_serve_batch.py"
            "::test_kill_9_under_load_loses_no_answered_decision_and_a_retry_gets_the_committed_verdict",
            "tests/integration/test_aio.py::test_twenty_concurrent_sends_grouped_by_the_batcher_are_exact",
        ),
    ),
    Mutant(
        "o_surface_function_dropped",
        "the newest migration drops a released function (gov.subscribe_v1) after creating it",
        (
            ("sql/schema/40_delivery.sql", SUBSCRIBE_V1_BODY, SUBSCRIBE_V1_BODY + SUBSCRIBE_V1_DROP, 1),
            ("sql/migrations/0025_sql_surface.sql", SUBSCRIBE_V1_BODY, SUBSCRIBE_V1_BODY + SUBSCRIBE_V1_DROP, 1),
        ),
        (f"{SURFACE_TEST}::test_after_an_upgrade_from_every_release_the_surface_answers",),
    ),
    Mutant(
        "p_surface_signature_changed",
        "the newest migration gives a released function (gov.subscribe_v1) another result type",
        (
            ("sql/schema/40_delivery.sql", SUBSCRIBE_V1_HEAD + "RETURNS bigint",
             SUBSCRIBE_V1_HEAD + "RETURNS numeric", 1),
            ("sql/migrations/0025_sql_surface.sql", SUBSCRIBE_V1_HEAD + "RETURNS bigint",
             SUBSCRIBE_V1_HEAD + "RETURNS numeric", 1),
        ),
        (
            f"{SURFACE_TEST}::test_after_an_upgrade_from_every_release_the_surface_answers",
            f"{SURFACE_TEST}::test_a_released_signature_never_changes",
        ),
    ),
    Mutant(
        "q_beacon_token_compared_by_prefix",
        "POST /events accepts a beacon token whose first 4 characters match (a prefix compare)",
        (
            ("gov/delivery/beacon.py", 'matches = [hmac.compare_digest(e.encode("ascii"), given) for e in expected]',
             'matches = [hmac.compare_digest(e.encode("ascii")[:4], given[:4]) for e in expected]', 1),
        ),
        (
            "tests/acceptance/test_beacons.py::test_a_token_for_another_user_message_or_subscription_is_refused",
        ),
    ),
    Mutant(
        "r_beacon_token_ignores_the_subscription",
        "the beacon token signs the user and the message only: one delivery's token serves any subscription",
        (
            ("gov/delivery/beacon.py", '\n            + subscription_id.to_bytes(8, "big"))', ")", 1),
        ),
        (
            "tests/acceptance/test_beacons.py::test_a_token_for_another_user_message_or_subscription_is_refused",
        ),
    ),
    Mutant(
        "s_server_cpu_counts_the_postmaster_alone",
        "gov bench's server CPU counts the postmaster's own time only: neither its live children nor the exited ones",
        (
            ("gov/lab/bench/server_cpu.py", "total = sum(int(x) for x in own[11:15])",
             "total = sum(int(x) for x in own[11:13])", 1),
            ("gov/lab/bench/server_cpu.py", "if fields is not None and fields[1] == str(postmaster):",
             "if fields is not None and fields[0] == str(postmaster):", 1),
        ),
        ("tests/acceptance/test_bench.py::test_compare_url_measures_both_targets_with_ratios_and_server_cpu",),
    ),
    Mutant(
        "u_release_order_by_release_time",
        "the release order back to release time and id (no earliest deadline first, no tier tie-break)",
        (
            ("sql/schema/30_hold_release.sql", EDF_ORDER, "ORDER BY d.release_at, d.id", 1),
            (TIMED, EDF_ORDER, "ORDER BY d.release_at, d.id", 1),
        ),
        (
            "tests/integration/test_release_order.py::test_the_slot_goes_to_the_nearest_deadline",
            "tests/integration/test_release_order.py::test_on_the_same_deadline_the_higher_tier_goes_first",
            "tests/integration/test_release_order.py::test_the_order_holds_under_concurrent_releasers",
        ),
    ),
    Mutant(
        "v_a_fresh_message_takes_an_owed_slot",
        "gov.send_v1 decides a holding tier's message without first releasing the rows owed the slot",
        (
            ("sql/schema/20_decide.sql", "    IF v_verb IN ('defer', 'collapse') THEN\n", "    IF false THEN\n", 1),
            ("sql/migrations/0044_poison_inputs.sql", "    IF v_verb IN ('defer', 'collapse') THEN\n",
             "    IF false THEN\n", 1),
        ),
        ("tests/integration/test_release_order.py::test_a_fresh_message_does_not_take_a_slot_owed_to_a_nearer_deadline",),
    ),
    Mutant(
        "w_best_hours_at_click_time",
        "the best hours place a clicked message at the hour of its click, not of its display",
        tuple(
            (f, "coalesce(min(e.created_at) FILTER (WHERE e.event = 'display'), min(e.created_at)) AS shown_at",
             "max(e.created_at) AS shown_at", 1)
            for f in ("sql/schema/50_analytics.sql", CHEAP)
        ),
        ("tests/integration/test_best_hours.py::test_hours_are_local_at_display_and_dst_moves_none",),
    ),
    Mutant(
        "x_best_hours_skip_the_segment",
        "a user's best hours are shrunk toward all users' curve even when their segment has its own",
        tuple(
            (f, "coalesce(s.estimate, p.estimate) AS prior", "p.estimate AS prior", 1)
            for f in ("sql/schema/50_analytics.sql", "sql/migrations/0029_best_hours.sql")
        ),
        ("tests/integration/test_best_hours.py::test_a_segment_with_its_own_hours_is_the_prior_of_its_users",),
    ),
    Mutant(
        "sw1_last_shown_overwritten_by_an_older_one",
        "the worker keeps as the last notification shown whichever write ends last: with two pushes "
        "handled at once, gov.unsubscribe() may charge the older one",
        (("gov/http/static/gov-sw.js", "if (!old || !(old.shownAt > shownAt)) store.put(",
          "if (old || true) store.put(", 1),),
        ("tests/browser/test_worker.py::test_the_notification_shown_last_stays_last_whatever_order_its_writes_end",),
    ),
    Mutant(
        "ps1_verified_token_by_token_alone",
        "the loopback push service remembers a verified VAPID token by the token alone: the same token "
        "under another public key is accepted without a signature check",
        (("gov/testing/push_service.py", 'known = self._verified.get((fields["k"], fields["t"]))',
          'known = next((v for (k, t), v in self._verified.items() if t == fields["t"]), None)', 1),),
        ("tests/unit/test_push.py::test_a_token_that_verified_once_is_still_checked_on_every_request",),
    ),
    Mutant(
        "ps2_verified_token_skips_the_claims",
        "the loopback push service accepts a remembered token without checking its exp again",
        (("gov/testing/push_service.py", "        if exp <= now:\n",
          "        if exp <= now and known is None:\n", 1),),
        ("tests/unit/test_push.py::test_a_token_that_verified_once_is_still_checked_on_every_request",),
    ),
    Mutant(
        "ct1_policy_reads_through_citus",
        "on a Citus cluster the decision's policy reads stay on the reference tables: Citus plans each of "
        "them again on every call (four more statements per decision through its planner)",
        tuple(
            (f, "            PERFORM gov.bind_policy_reads(v_copies[1], v_copies[2], v_copies[3]);",
             "            PERFORM gov.bind_policy_reads('gov.tiers', 'gov.caps', 'gov.compiled_rules', true);", 1)
            for f in ("sql/schema/70_scale_out.sql", "sql/migrations/0038_shard_decisions.sql")
        ),
        ("-m", "citus", "tests/citus/test_statement_shapes.py"),
    ),
    Mutant(
        "cs1_shard_decision_without_the_users_row_lock",
        "the decision on the user's shard tables takes only the node's advisory lock, not the user's row: "
        "a decision in an app's transaction on the coordinator (Citus's path) no longer waits for it",
        tuple(
            (f, "'PERFORM 1 FROM %1$s u WHERE u.user_id = p_user_id FOR UPDATE;', v_users));",
             "'PERFORM 1 FROM %1$s u WHERE u.user_id = p_user_id;', v_users));", 1)
            for f in ("sql/schema/70_scale_out.sql", "sql/migrations/0038_shard_decisions.sql")
        ),
        ("-m", "citus", "tests/citus/test_cluster.py::"
                        "test_a_race_of_delegated_decisions_and_decisions_in_the_apps_transaction_is_exact"),
    ),
    Mutant(
        "cs3_shard_decision_for_any_role",
        "the dispatcher takes Citus's metadata lock for any role: one that does not own the tables "
        "(Citus grants the lock to the owner only) can no longer decide on a cluster",
        tuple(
            (f, "IF p_user_id IS NOT NULL AND p_user_id <> '' AND pg_has_role(%4$L, 'USAGE') THEN",
             "IF p_user_id IS NOT NULL AND p_user_id <> '' THEN", 1)
            for f in ("sql/schema/70_scale_out.sql", "sql/migrations/0038_shard_decisions.sql")
        ),
        ("-m", "citus", "tests/citus/test_statement_shapes.py::"
                        "test_a_role_that_does_not_own_the_tables_decides_through_citus_s_path"),
    ),
    Mutant(
        "cs2_shard_decisions_never_dispatched",
        "the dispatcher never finds the user's shard on its node: every decision takes Citus's path, "
        "its ten statements through Citus's planner again",
        tuple(
            (f, "        IF EXISTS (SELECT 1 FROM pg_dist_placement pl\n"
                "                    WHERE pl.shardid = v_shard AND pl.groupid",
             "        IF false AND EXISTS (SELECT 1 FROM pg_dist_placement pl\n"
             "                    WHERE pl.shardid = v_shard AND pl.groupid", 1)
            for f in ("sql/schema/70_scale_out.sql", "sql/migrations/0038_shard_decisions.sql")
        ),
        ("-m", "citus", "tests/citus/test_statement_shapes.py::"
                        "test_a_decision_on_the_users_worker_runs_no_statement_through_citus"),
    ),
    Mutant(
        "ct2_probe_joined_to_its_condition",
        "the topic opt-out probe is one statement with its condition again (IF p_topic IS NOT NULL AND "
        "EXISTS …): Citus plans it on every decision, topic or not",
        tuple(
            (f, "        IF p_topic IS NOT NULL THEN\n            PERFORM 1 FROM gov.user_topic_optouts o "
                "WHERE o.user_id = p_user_id AND o.topic = p_topic;\n            IF FOUND THEN",
             "        IF p_topic IS NOT NULL OR true THEN\n            PERFORM 1 FROM gov.user_topic_optouts o "
             "WHERE o.user_id = p_user_id AND o.topic = p_topic;\n            IF FOUND THEN", 1)
            for f in ("sql/schema/20_decide.sql", "sql/migrations/0044_poison_inputs.sql")
        ),
        ("-m", "citus",
         "tests/citus/test_statement_shapes.py::test_a_plain_decision_runs_only_its_shards_statements_through_citus"),
    ),
    Mutant(
        "y_crossover_rule_per_position",
        "the crossover rule tests each group on its own at 95 % (no fixed sequence): the lowest group that "
        "passes is declared, so over a curve of many positions a crossover is declared early far more than 5 %",
        (
            ("gov/analytics/crossover.py",
             "        adjusted = {j: max(local[k] for k in ends if k >= j) for j in ends}",
             "        adjusted = {j: local[j] for j in ends}", 1),
        ),
        (
            "tests/unit/test_crossover.py::"
            "test_the_rule_declares_a_crossover_early_at_most_alpha_of_the_time_over_the_whole_curve",
        ),
    ),
    Mutant(
        "bt1_minute_slot_taken_without_the_check",
        "gov.take_release_slot adds to the minute's count whatever it is: only the releaser's own "
        "look before each user (racy) keeps the capacity",
        tuple(
            (f, "DO UPDATE SET used = m.used + 1 WHERE m.used < $3", "DO UPDATE SET used = m.used + 1", 1)
            for f in ("sql/schema/30_hold_release.sql", "sql/migrations/0030_best_slot.sql")
        ),
        ("tests/integration/test_release_capacity.py::test_the_capacity_is_exact_under_concurrent_releasers",),
    ),
    Mutant(
        "bt2_minute_slot_kept_when_nothing_went",
        "a release that is held again or ends keeps the minute's place it took",
        tuple(
            (f, "SET used = m.used - 1 WHERE", "SET used = m.used WHERE", 1)
            for f in ("sql/schema/30_hold_release.sql", TIMED)
        ),
        ("tests/integration/test_release_capacity.py::test_a_release_that_does_not_go_gives_its_place_back",),
    ),
    Mutant(
        "bt3_release_capacity_ignored",
        "gov.release_due_v2 never reads [release] per_minute: every due row goes in its minute",
        tuple(
            (f, "v_cap     integer := gov.release_minute_cap();", "v_cap     integer := NULL;", 1)
            for f in ("sql/schema/30_hold_release.sql", TIMED)
        ),
        (
            "tests/integration/test_release_capacity.py::test_no_minute_gets_more_than_the_capacity",
            "tests/integration/test_release_capacity.py::test_a_user_cut_at_the_minute_waits_for_the_next_with_its_order_kept",
        ),
    ),
    Mutant(
        "bt4_timing_ignores_quiet_hours",
        "the timing's candidate hours include quiet ones",
        tuple(
            edit
            for f in ("sql/schema/30_hold_release.sql", CHEAP)
            for edit in ((f, "IF gov.quiet_until(p_user_id, v_t) = v_t THEN", "IF true THEN", 2),
                         (f, " WHERE gov.quiet_until(p_user_id, c.t) = c.t ORDER BY c.t", " ORDER BY c.t", 1))
        ),
        (
            "tests/integration/test_timing.py::test_quiet_hours_are_never_chosen",
        ),
    ),
    Mutant(
        "bt5_timing_p1_unbounded",
        "a P1 waits for its best hour up to its deadline, past p1_max_delay",
        tuple(
            (f, "        v_last := least(v_last, p_first + v_set.timing_p1_max_delay_ms * interval '1 millisecond');",
             '        NULL;', 1)
            for f in ("sql/schema/30_hold_release.sql", CHEAP)
        ),
        (
            "tests/integration/test_timing.py::test_p1_waits_at_most_its_bounded_extra_delay_and_p0_never",
        ),
    ),
    Mutant(
        "bt6_timing_ignores_the_users_own_data",
        "the timing reads the segment's or all users' curve only, never the user's own reach",
        tuple(
            (f, '(coalesce(o.k, 0) + 2 * coalesce(g.estimate, p.estimate)) / (coalesce(o.n, 0) + 2)',
             'coalesce(g.estimate, p.estimate)', 1)
            for f in ("sql/schema/30_hold_release.sql", CHEAP)
        ),
        (
            "tests/integration/test_timing.py::test_a_users_own_reach_beats_the_population",
        ),
    ),
    Mutant(
        "bt7_timing_never_explores",
        "no share of the timed messages explores",
        tuple(
            (f, 'IF (v_draw % 1000000) < v_set.timing_explore * 1000000 THEN',
             'IF false THEN', 1)
            for f in ("sql/schema/30_hold_release.sql", CHEAP)
        ),
        (
            "tests/integration/test_timing.py::test_an_explored_share_goes_at_a_drawn_hour_and_says_so",
        ),
    ),
    Mutant(
        "bt8_campaign_at_best_needs_timing_on",
        "a campaign sent --at best gets the best hour only when the policy's [timing] is on",
        tuple(
            (f, "IF (v_set.timing_enabled IS NOT TRUE AND NOT p_asked) OR p_tier = 'P0' THEN",
             "IF (v_set.timing_enabled IS NOT TRUE) OR p_tier = 'P0' THEN", 1)
            for f in ("sql/schema/30_hold_release.sql", CHEAP)
        ),
        (
            "tests/integration/test_campaign_best.py::"
            "test_decided_now_delivered_at_the_best_hour_with_its_ttl_from_there",
        ),
    ),
    Mutant(
        "bt9_campaign_at_best_delivered_at_once",
        "a campaign sent --at best names the best hour but its outbox rows are due at once",
        tuple(
            (f, "UPDATE gov.outbox o SET next_attempt_at = v_slot\n",
             "UPDATE gov.outbox o SET next_attempt_at = o.next_attempt_at\n", 1)
            for f in ("sql/schema/20_decide.sql", "sql/migrations/0035_campaign_at_best.sql")
        ),
        (
            "tests/integration/test_campaign_best.py::"
            "test_decided_now_delivered_at_the_best_hour_with_its_ttl_from_there",
        ),
    ),
    Mutant(
        "bt10_campaign_at_best_ttl_from_the_decision",
        "a campaign sent --at best keeps the TTL counted from the decision: dead at its hour",
        tuple(
            (f, "SET expires_at = v_slot + v_ttl_s * interval '1 second', timing = v_timing",
             "SET timing = v_timing", 1)
            for f in ("sql/schema/20_decide.sql", "sql/migrations/0035_campaign_at_best.sql")
        ),
        (
            "tests/integration/test_campaign_best.py::"
            "test_decided_now_delivered_at_the_best_hour_with_its_ttl_from_there",
        ),
    ),
    Mutant(
        "cm1_undecided_said_to_disagree",
        "gov simulate says the measure and the truth disagree where the measure has not decided",
        (("gov/analytics/crossover.py",
          "        return self.truth is None or e.low is None or e.low <= self.truth\n",
          "        return False\n", 1),),
        ("tests/unit/test_simulate_summary.py::"
         "test_a_measure_that_has_not_decided_is_not_said_to_disagree_with_the_truth",),
    ),
    Mutant(
        "cm2_lower_end_past_the_truth_undecided",
        "a confirmed lower end past the truth's position is shown as undecided, not as a contradiction",
        (("gov/analytics/crossover.py",
          "        return self.truth is None or e.low is None or e.low <= self.truth\n",
          "        return True\n", 1),),
        ("tests/unit/test_simulate_grid.py::"
         "test_a_cell_that_has_not_decided_is_marked_undecided_unless_its_lower_end_rules_the_truth_out",),
    ),
    Mutant(
        "sc1_children_cpu_not_counted",
        "gov simulate's cost line leaves out what its runners and push services spent",
        (("gov/lab/simulate/cost.py",
          "        return RunCost(own - own_before, children - children_before, server_s, why,",
          "        return RunCost(own - own_before, 0.0, server_s, why,", 1),),
        ("tests/acceptance/test_simulate.py::test_one_seed_one_summary",),
    ),
    Mutant(
        "sc2_server_cpu_not_counted",
        "gov simulate's cost line reads the server's CPU at the end only where it read it at the start",
        (("gov/lab/simulate/cost.py",
          "            server_s = (server_after - server_before) / ticks_per_second()",
          "            server_s = (server_before - server_before) / ticks_per_second()", 1),),
        ("tests/acceptance/test_simulate.py::test_one_seed_one_summary",),
    ),
    Mutant(
        "cp1_claim_plan_chosen_per_call",
        "the claim's two statements without their generic plans: the plan cache chooses per call",
        (("sql/migrations/0039_claim_plans.sql", "        SET plan_cache_mode = force_generic_plan\n", "", 1),
         ("sql/schema/40_delivery.sql", "        SET plan_cache_mode = force_generic_plan\n", "", 1)),
        ("tests/integration/test_claim_plan.py",),
    ),
    Mutant(
        "cp2_one_claim_statement",
        "the claim as migration 0036 left it: one statement for given rows and any rows",
        (("alembic/versions/0039_claim_plans.py", '    run_sql_file("migrations/0039_claim_plans.sql")\n',
          "    pass\n", 1),),
        ("tests/integration/test_claim_plan.py",),
    ),
    Mutant(
        "hp1_nul_in_a_proof_reaches_the_database",
        "a subscription proof's endpoint and auth are not checked for NUL bytes",
        (("gov/http/models.py",
          "MAX_ENDPOINT_LENGTH), AfterValidator(_storable)]\n"
          "    auth: Annotated[str, Field(min_length=1, max_length=MAX_KEY_LENGTH), AfterValidator(_storable)]\n",
          "MAX_ENDPOINT_LENGTH)]\n"
          "    auth: Annotated[str, Field(min_length=1, max_length=MAX_KEY_LENGTH)]\n", 1),),
        (PROBE + "test_a_nul_byte_in_a_subscription_proof_is_a_422_not_a_503",),
    ),
    Mutant(
        "hp2_abandoned_body_not_caught",
        "a client that abandons its body is not caught: the server logs a traceback",
        (("gov/http/app.py", "    except ClientDisconnect:\n", "    except ZeroDivisionError:\n", 1),),
        (PROBE + "test_a_body_the_client_abandons_is_answered_not_raised",),
    ),
    Mutant(
        "hp3_path_escapes_read_leniently",
        "a path whose escapes are not UTF-8 is read with U+FFFD",
        (("gov/http/app.py", "            if self.dependant.path_params:\n                _strict_path(request)\n",
          "", 1),),
        (PROBE + "test_percent_escapes_that_are_not_utf8_are_refused",),
    ),
    Mutant(
        "hp4_door_reads_the_last_authorization",
        "the fast send door takes the last of two Authorization headers",
        (("gov/http/door.py", "                      and authorizations == 1)", ")", 1),),
        (PROBE + "test_two_authorization_headers_are_refused_at_every_door",),
    ),
    Mutant(
        "hp5_routes_read_the_first_authorization",
        "the routes take the first of two Authorization headers",
        (("gov/http/app.py", '        if len(request.headers.getlist("authorization")) > 1:',
          '        if len(request.headers.getlist("authorization")) > 2:', 1),),
        (PROBE + "test_two_authorization_headers_are_refused_at_every_door",),
    ),
    Mutant(
        "hp6_trailing_slash_redirects",
        "/path/ redirects to /path, the Location built from the Host header",
        (("gov/http/app.py", "        redirect_slashes=False,\n", "        redirect_slashes=True,\n", 1),),
        (PROBE + "test_a_trailing_slash_is_a_json_404_not_a_redirect_to_the_host_header",),
    ),
    Mutant(
        "hp7_json_encoding_guessed",
        "a body that is not UTF-8 is decoded as whatever it looks like",
        (("gov/http/app.py", '        text = bytes(body).decode("utf-8")\n',
          '        text = bytes(body).decode(json.detect_encoding(bytes(body)))\n',
          1),),
        (PROBE + "test_json_that_is_not_utf8_is_a_400",),
    ),
    Mutant(
        "hp8_echoed_token_taken_without_a_secret",
        "a beacon token echoed to a server without a beacon secret is taken",
        (("gov/http/browser.py",
          "            if beacon_keys is None:  # no push of this server carries one: no echo can be valid\n"
          "                raise HTTPError(403, \"beacon token refused: this server has no beacon secret\")\n",
          "            if beacon_keys is None:\n                return Response(status_code=204)\n", 1),),
        (PROBE + "test_a_beacon_token_echoed_to_a_server_without_a_beacon_secret_is_refused",),
    ),
    Mutant(
        "ds1_dead_handles_keep_the_server",
        "gov db stop leaves the handle of a process that ended without letting go",
        (("gov/db.py", "        if pid != os.getpid() and not _alive(pid):", "        if False:", 1),),
        ("tests/acceptance/test_db_stop.py",),
    ),
    Mutant(
        "es1_any_later_send_took_the_slot",
        "the expired split counts a later send even where the held message had no room without it",
        (("sql/queries_simulate.sql", "    HAVING bool_and(c.n < c.c)", "    HAVING true", 1),),
        ("tests/integration/test_expired_split.py",),
    ),
    Mutant(
        "sp1_short_runs_scaled_to_a_week",
        "a run shorter than a week prints its sends scaled up to a week",
        (("gov/lab/simulate/summary.py", "        return value * 7 / self.days if self.days >= 7 else value",
          "        return value * 7 / self.days", 1),),
        ("tests/unit/test_simulate_probe.py::"
         "test_a_run_shorter_than_a_week_counts_sends_over_its_days_not_per_week",),
    ),
    Mutant(
        "sp2_policy_comparison_not_on_the_page",
        "the HTML page of --policy FILE --compare leaves the comparison out",
        (("gov/lab/simulate/summary.py", "    if versus is not None:\n", "    if False:\n", 1),),
        ("tests/unit/test_simulate_probe.py::test_the_page_of_a_policy_comparison_shows_what_the_terminal_shows",),
    ),
    Mutant(
        "hp9_healthz_blind_to_the_sends_pool",
        "/healthz reads the database through the app's pool only, not the sends' own",
        (("gov/http/app.py", '        await sender.source.execute(q("ping"), {})\n', "", 1),),
        (PROBE + "test_healthz_answers_for_the_sends_own_pool_too",),
    ),
    Mutant(
        "pt1_time_zone_always_plain",
        "a user with a time zone is plain whatever the hour: quiet hours skipped in the set path",
        ((SEGMENTS_TOGETHER, "u.time_zone IS NOT NULL AND gov.quiet_until(u.user_id, p_now) > p_now)", "false)", 1),
         ("sql/schema/20_decide.sql",
          "u.time_zone IS NOT NULL AND gov.quiet_until(u.user_id, p_now) > p_now)", "false)", 1)),
        ("tests/integration/test_send_batch.py",),
    ),
    Mutant(
        "pt2_time_zone_never_plain",
        "a user with a time zone is never plain (migration 0039's rule): decided one by one",
        ((SEGMENTS_TOGETHER,
          "u.time_zone IS NOT NULL AND gov.quiet_until(u.user_id, p_now) > p_now)", "u.time_zone IS NOT NULL)", 1),
         ("sql/schema/20_decide.sql",
          "u.time_zone IS NOT NULL AND gov.quiet_until(u.user_id, p_now) > p_now)", "u.time_zone IS NOT NULL)", 1)),
        ("tests/integration/test_send_batch.py::test_users_with_a_time_zone_are_decided_together_outside_their_quiet_hours_only",),
    ),
    Mutant(
        "fm1_decision_at_infinity",
        "gov.decide_core records a decision at an infinite moment",
        (("sql/migrations/0044_poison_inputs.sql", INF_CORE, INF_CORE_OFF, 1),
         ("sql/schema/20_decide.sql", INF_CORE, INF_CORE_OFF, 1)),
        ("tests/integration/test_hostile_moments.py",),
    ),
    Mutant(
        "fm2_batch_at_infinity",
        "gov.decide_together decides plain users at an infinite moment",
        ((SEGMENTS_TOGETHER, INF_TOGETHER, "    IF false THEN", 1),
         ("sql/schema/20_decide.sql", INF_TOGETHER, "    IF false THEN", 1)),
        ("tests/integration/test_hostile_moments.py",),
    ),
    Mutant(
        "fm3_prune_negative_margin",
        "gov.prune_sends_v1 takes a negative margin",
        (("sql/migrations/0044_poison_inputs.sql", PRUNE_GUARD, "    IF false AND", 1),
         ("sql/schema/60_operations.sql", PRUNE_GUARD, "    IF false AND", 1)),
        ("tests/integration/test_hostile_moments.py",),
    ),
    Mutant(
        "fr1_nan_seconds_accepted",
        "the CLI's float options take nan and inf, as click's range does",
        (("gov/cli/common.py", "        if not math.isfinite(rv):", "        if False:", 1),),
        ("tests/acceptance/test_errors_before_work.py::test_usage_errors_of_the_long_commands_are_one_line",),
    ),
    Mutant(
        "fa1_decision_dated_ahead",
        "gov decide takes an --at in the future",
        (("gov/cli/common.py", "    if decides and at > datetime.now(UTC) + AT_SKEW:", "    if False:", 1),),
        ("tests/acceptance/test_cli.py::test_bad_input_is_one_line_and_records_nothing",),
    ),
    Mutant(
        "jt1_jitter_unbounded",
        "a quiet-hours jitter longer than a held tier's TTL (or than an hour) is applied",
        (("gov/policy.py", "    if jitter_ms > MAX_JITTER_MS:", "    if False:", 1),
         ("gov/policy.py", "        if not tier.exempt and jitter_ms >= tier.ttl_s * 1000:", "        if False:", 1)),
        ("tests/unit/test_policy.py::test_a_jitter_that_would_hold_messages_past_their_deadlines_is_refused",),
    ),
    Mutant(
        "de1_unknown_revision_not_named",
        "a database at a revision this gov does not ship goes on to Alembic (a traceback)",
        (("gov/migrate.py", "    if have is not None and have not in revisions():", "    if False:", 1),),
        ("tests/acceptance/test_db_errors.py::test_a_database_a_newer_gov_migrated_is_one_line",),
    ),
    Mutant(
        "de2_sqlalchemy_error_not_unwrapped",
        "a migration's connection error stays SQLAlchemy's (a traceback)",
        (("gov/migrate.py", "        if isinstance(exc.orig, psycopg.Error):", "        if False:", 1),),
        ("tests/acceptance/test_db_errors.py::test_a_database_that_does_not_exist_is_one_line_naming_it",),
    ),
    Mutant(
        "de3_pool_timeout_not_diagnosed",
        "a pool that could not open says only that it timed out",
        (("gov/db.py", "psycopg.connect(source, connect_timeout=max(2, int(pool_timeout))).close()", "None", 1),),
        ("tests/acceptance/test_db_errors.py::test_a_database_that_does_not_exist_is_one_line_naming_it",),
    ),
    Mutant(
        "iv1_interval_outside_its_domain",
        "gov.wilson_interval_v1 computes an interval for counts that are no proportion's",
        (("sql/migrations/0042_interval_domain.sql", "p_trials > 0 AND p_successes BETWEEN 0 AND p_trials AND p_z >= 0",
          "p_trials > 0", 1),
         ("sql/schema/50_analytics.sql", "p_trials > 0 AND p_successes BETWEEN 0 AND p_trials AND p_z >= 0",
          "p_trials > 0", 1)),
        ("tests/integration/test_interval_domain.py",),
    ),
    Mutant(
        "rf1_callers_row_factory",
        "gov reads its rows with the caller's row factory (dicts from a dict_row connection)",
        (("gov/db.py", "row_factory=row_factory or tuple_row", "row_factory=row_factory or conn.row_factory", 2),),
        ("tests/integration/test_dict_rows.py",),
    ),
    Mutant(
        "ao1_failed_first_open_kept",
        "an AsyncGovernor keeps the pool whose first opening failed or was cancelled",
        (("gov/db.py", "                self._owned_pool = self._pool = self._new_pool(self.dsn)\n", "", 1),),
        ("tests/integration/test_aio_open.py",),
    ),
    Mutant(
        "ao2_closed_governor_retries",
        "a closed governor's use goes on to the closed pool (retried as a lost connection)",
        (("gov/db.py", "        if self._closed:\n            raise GovernorClosed",
          "        if False:\n            raise GovernorClosed", 2),),
        ("tests/integration/test_aio_open.py",),
    ),
    Mutant(
        "ai1_one_id_as_an_audience",
        "a campaign's audience may be one string (decided for each of its characters)",
        (("gov/governor.py", "    if isinstance(user_ids, (str, bytes)):", "    if False:", 1),),
        ("tests/integration/test_api_inputs.py::test_a_single_user_id_as_the_audience_is_refused",),
    ),
    Mutant(
        "ai2_moment_not_checked",
        "at= goes to the database whatever it is",
        (("gov/governor.py", "    if not isinstance(at, datetime):", "    if False:", 1),),
        ("tests/integration/test_api_inputs.py::test_a_moment_that_is_not_a_datetime_is_refused",),
    ),
    Mutant(
        "ai3_empty_url_taken",
        "an empty database URL opens a pool on libpq's defaults",
        (("gov/db.py", "            if not source.strip():", "            if False:", 2),),
        ("tests/integration/test_api_inputs.py::test_an_empty_database_url_is_refused",),
    ),
    Mutant(
        "ra1_retry_after_unicode_digits",
        "a Retry-After of digits str.isdigit() knows and int() does not (a 201 then fails)",
        (("gov/delivery/push.py", "    if value.isascii() and value.isdigit():", "    if value.isdigit():", 1),),
        ("tests/unit/test_push.py::test_parse_retry_after",),
    ),
    Mutant(
        "ra2_retry_after_unbounded",
        "a Retry-After of any size goes to the record (an interval out of range)",
        (("gov/delivery/push.py",
          "        return MAX_RETRY_AFTER_S if len(value) > 9 else min(float(value), MAX_RETRY_AFTER_S)",
          "        return float(int(value))", 1),),
        ("tests/unit/test_push.py::test_parse_retry_after",),
    ),
    Mutant(
        "ra3_status_unicode_digits",
        "a status line of digits str.isdigit() knows and int() does not",
        (("gov/delivery/pushclient.py", "code.isascii() and code.isdigit()", "code.isdigit()", 1),),
        ("tests/unit/test_pushclient.py::test_a_status_that_is_not_three_ascii_digits_is_not_an_answer",),
    ),
    Mutant(
        "rd1_redirect_unexplained",
        "a redirect fails with an empty reason",
        (("gov/delivery/push.py", "    if not 300 <= status <= 399:\n        return None",
          "    if True:\n        return None", 1),),
        ("tests/unit/test_push.py",),
    ),
    Mutant(
        "ic1_idle_connections_unbounded",
        "idle keep-alive connections are kept per origin with no bound over all origins",
        (("gov/delivery/pushclient.py", "                while self._idle_count > self._max_idle_total:",
          "                while False:", 1),),
        ("tests/unit/test_pushclient.py::test_idle_connections_over_all_origins_are_bounded_the_least_recently_used_first",),
    ),
    Mutant(
        "hs1_hanging_endpoint_row_by_row",
        "an endpoint that did not answer is sent its other rows of the batch, one timeout each",
        (("gov/delivery/runner.py", 'elif attempt["outcome"] == "throttled" or (attempt["outcome"] == "transient"',
          'elif False and (attempt["outcome"] == "transient"', 1),),
        ("tests/integration/test_delivery_robust.py::test_an_endpoint_that_does_not_answer_costs_one_timeout_not_one_per_row",),
    ),
    Mutant(
        "hs2_handed_back_due_at_once",
        "a row handed back unsent is due again at once, whatever wait the runner gave",
        (("sql/migrations/0043_held_siblings.sql", "CASE WHEN p_retry_after_ms IS NULL THEN next_attempt_at",
          "CASE WHEN true THEN next_attempt_at", 1),
         ("sql/schema/40_delivery.sql", "CASE WHEN p_retry_after_ms IS NULL THEN next_attempt_at",
          "CASE WHEN true THEN next_attempt_at", 1)),
        ("tests/integration/test_delivery_robust.py::test_an_endpoint_that_does_not_answer_costs_one_timeout_not_one_per_row",),
    ),
    Mutant(
        "op1_report_path_checked_last",
        "gov report fatigue computes and prints before finding it cannot write its --html",
        (("gov/cli/ops.py", '    check_output_path(html_file, "--html")\n    if by == "volume":',
          '    if by == "volume":', 1),),
        ("tests/acceptance/test_errors_before_work.py::test_usage_errors_of_the_long_commands_are_one_line",),
    ),
    Mutant(
        "uc1_duplicate_cap_last_wins",
        "gov user set takes the last of two caps given for one window",
        (("gov/cli/users.py", "        if (scope, window_ms) in seen:", "        if False:", 1),),
        ("tests/acceptance/test_cli.py::test_user_set_and_release_from_the_shell",),
    ),
    Mutant(
        "dq1_drain_ends_on_a_waited_out_batch",
        "a drain ends when a batch claimed ahead comes back all handed back, its lease spent waiting",
        (("gov/delivery/runner.py", "if waited_out and ahead:", "if False:", 1),),
        ("tests/integration/test_delivery_robust.py::test_a_drain_goes_on_when_a_batch_claimed_ahead_waited_its_lease_away",),
    ),
    Mutant(
        "os1_origin_never_stopped",
        "a push service refusing the VAPID key is sent every row, one 403 after another",
        (("gov/delivery/runner.py", "            state[2] = now + ORIGIN_STOP_S\n", "            return\n", 1),),
        ("tests/integration/test_delivery.py::test_an_origin_that_refuses_the_key_is_stopped",),
    ),
    Mutant(
        "os2_origin_stopped_while_it_accepts",
        "an origin is stopped by three refusals of old subscriptions although it accepts others",
        (("gov/delivery/runner.py", "            if state[1] is not None and now - state[1] < ORIGIN_OK_MEMORY_S:",
          "            if False:", 1),),
        ("tests/integration/test_delivery.py::test_refusals_while_the_origin_accepts_are_the_subscriptions_own",),
    ),
    Mutant(
        "pf1_prune_ahead_of_the_clock",
        "gov.prune_sends_v1 prunes at a moment ahead of the database clock",
        (("sql/migrations/0044_poison_inputs.sql", " OR v_now > clock_timestamp() THEN", " THEN", 1),
         ("sql/schema/60_operations.sql", " OR v_now > clock_timestamp() THEN", " THEN", 1)),
        ("tests/integration/test_hostile_moments.py::test_a_prune_at_a_moment_ahead_of_the_clock_is_refused_and_the_cap_holds",),
    ),
    Mutant(
        "ma1_no_moment_limit",
        "a decision or a claim may be dated any finite time ahead",
        (("sql/migrations/0044_poison_inputs.sql", "SELECT interval '366 days'", "SELECT interval '300000 years'", 1),
         ("sql/schema/20_decide.sql", "SELECT interval '366 days'", "SELECT interval '300000 years'", 1)),
        ("tests/integration/test_hostile_moments.py::test_a_decision_far_ahead_of_the_clock_is_refused_and_writes_nothing",
         "tests/integration/test_hostile_moments.py::test_a_claim_with_a_long_lease_or_far_ahead_strands_nothing",),
    ),
    Mutant(
        "lb1_any_lease",
        "gov.claim_outbox_v3 takes a lease of a hundred years",
        (("sql/migrations/0044_poison_inputs.sql", " OR p_lease_ms > gov.max_lease_ms() THEN", " THEN", 1),
         ("sql/schema/40_delivery.sql", " OR p_lease_ms > gov.max_lease_ms() THEN", " THEN", 1)),
        ("tests/integration/test_hostile_moments.py::test_a_claim_with_a_long_lease_or_far_ahead_strands_nothing",),
    ),
    Mutant(
        "rt1_exempt_tier_retired",
        "gov.retire_tiers_v1 drops an exempt tier's queued messages",
        (("sql/migrations/0044_poison_inputs.sql", "    IF p_drop AND EXISTS", "    IF false AND EXISTS", 1),
         ("sql/schema/10_policy.sql", "    IF p_drop AND EXISTS", "    IF false AND EXISTS", 1)),
        ("tests/integration/test_hostile_moments.py::test_an_exempt_tiers_messages_are_never_retired",),
    ),
    Mutant(
        "co1_any_content",
        "gov.send_v1 and the batch paths store content no push can be built from",
        (("sql/migrations/0044_poison_inputs.sql", CONTENT_OK, CONTENT_ANY, 1),
         ("sql/schema/20_decide.sql", CONTENT_OK, CONTENT_ANY, 1)),
        ("tests/integration/test_hostile_moments.py::test_content_no_push_can_be_built_from_is_refused_before_a_slot_is_spent",),
    ),
    Mutant(
        "ev1_event_at_infinity",
        "gov.record_event_v1 stores an event at infinity",
        (("sql/migrations/0044_poison_inputs.sql", "    IF NOT isfinite(p_at) THEN", "    IF false THEN", 1),
         ("sql/schema/50_analytics.sql", "    IF NOT isfinite(p_at) THEN", "    IF false THEN", 1)),
        ("tests/integration/test_hostile_moments.py::test_events_and_segments_at_infinity_are_refused",),
    ),
    Mutant(
        "st1_nan_strength",
        "gov.hour_curves_v1 takes a prior strength of NaN or infinity",
        (("sql/migrations/0044_poison_inputs.sql", NAN_STRENGTH, " THEN", 1),
         ("sql/schema/50_analytics.sql", NAN_STRENGTH, " THEN", 1)),
        ("tests/integration/test_hostile_moments.py::test_the_hour_estimates_refuse_a_prior_strength_that_is_not_a_number_of_displays",),
    ),
    Mutant(
        "ld1_lease_unbounded_in_the_cli",
        "gov dispatch starts with a lease longer than a day, to fail at its claim",
        (("gov/delivery/deadlines.py", "    if lease_s > MAX_LEASE_S:", "    if False:", 1),),
        ("tests/acceptance/test_errors_before_work.py::test_usage_errors_of_the_long_commands_are_one_line",),
    ),
    Mutant(
        "rc1_beacon_not_retried",
        "a beacon whose pooled connection the server dropped is answered 503 and lost",
        (("gov/analytics/events.py", "        row = src.transaction(record)",
          "        row = src.transaction(record, retry=False)", 1),),
        ("tests/acceptance/test_serve.py::test_every_door_answers_after_the_database_dropped_its_connections",),
    ),
    Mutant(
        "rc2_preferences_not_retried",
        "a preferences call whose pooled connection the server dropped is answered 503",
        (("gov/http/app.py", "transaction(lambda conn: fn(conn, *args))",
          "transaction(lambda conn: fn(conn, *args), retry=False)", 1),),
        ("tests/acceptance/test_serve.py::test_every_door_answers_after_the_database_dropped_its_connections",),
    ),
    Mutant(
        "pt3_pool_timeout_unchecked",
        "Governor(pool_timeout=None) reaches the pool and fails there with a TypeError",
        (("gov/db.py", "            or not math.isfinite(pool_timeout) or pool_timeout <= 0):",
          "            and False):", 1),),
        ("tests/integration/test_api_inputs.py::test_pool_settings_that_cannot_work_are_refused_by_name",),
    ),
    Mutant(
        "sv1_error_lines_not_joined",
        "gov's one error line prints libpq's two-line message as it is",
        (("gov/cli/main.py", 'click.echo(f"gov: error: {one_line(str(exc)) or type(exc).__name__}", err=True)',
          'click.echo(f"gov: error: {exc}", err=True)', 1),),
        ("tests/unit/test_cli_one_line.py::test_a_refused_connection_is_one_error_line_naming_both_parts",),
    ),
    Mutant(
        "sv2_grid_tolerances_unchecked",
        "gov simulate --grid takes --tolerances as given (0: a ZeroDivisionError after minutes of work)",
        (("gov/lab/simulate/cli.py", "        problem = tolerance_problem(tol)\n        if problem is not None:",
          "        problem = tolerance_problem(tol)\n        if False:", 1),),
        ("tests/unit/test_simulate_grid.py::test_every_tolerance_is_checked_before_any_simulation",),
    ),
    Mutant(
        "sv3_tolerance_nan_accepted",
        "--tolerance is a click.FloatRange again, which lets nan through",
        (("gov/lab/simulate/cli.py", "type=FiniteRange(*TOLERANCE_RANGE)",
          "type=click.FloatRange(*TOLERANCE_RANGE)", 1),),
        ("tests/unit/test_simulate_grid.py::test_every_tolerance_is_checked_before_any_simulation",),
    ),
    Mutant(
        "sv4_corrupt_grid_file_raises",
        "a saved grid file that is not JSON ends the grid in a traceback",
        (("gov/lab/simulate/grid.py", "(OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:",
          "(OSError, UnicodeDecodeError, KeyError, TypeError) as exc:", 1),),
        ("tests/unit/test_simulate_grid.py::test_a_corrupt_saved_simulation_is_simulated_again_and_said_so",),
    ),
    Mutant(
        "sv5_grid_key_without_hour_effect",
        "a saved grid cell is reused whatever --hour-effect it was simulated with",
        (("gov/lab/simulate/grid.py", '-hour{hour_effect:g}.json"', '.json"', 1),
         ("gov/lab/simulate/grid.py", "sim.days, sim.hour_effect) != (seed, tolerance, users, days, hour_effect):",
          "sim.days) != (seed, tolerance, users, days):", 1)),
        ("tests/unit/test_simulate_grid.py::test_a_saved_simulation_is_reused_only_for_its_own_hour_effect_and_code",),
    ),
    Mutant(
        "sv6_grid_key_without_code",
        "a saved grid cell is reused whatever code simulated it",
        (("gov/lab/simulate/grid.py", "    if sim.code != code_version():", "    if False:", 1),),
        ("tests/unit/test_simulate_grid.py::test_a_saved_simulation_is_reused_only_for_its_own_hour_effect_and_code",),
    ),
    Mutant(
        "sv7_sends_needed_borrowed_rates",
        "the sends needed fall back to the fitted rates at the estimate, which the highest group does not draw at",
        (("gov/analytics/crossover.py", "pc, pu, alpha)\n    return CrossoverEstimate(NOT_ENOUGH_DATA",
          "pc, pu, alpha) or sends_needed(blocker.clicks, blocker.unsubscribes, *rates_at(curve, fitted), alpha)\n"
          "    return CrossoverEstimate(NOT_ENOUGH_DATA", 1),),
        ("tests/unit/test_crossover.py::"
         "test_the_sends_needed_are_the_highest_groups_at_its_own_or_fitted_rates_or_none",),
    ),
    Mutant(
        "sv8_expired_line_ttl_only",
        "the summary's expired line counts the TTL-expired alone beside the tier table's every expired",
        (("gov/lab/simulate/summary.py", "        total = sum(n for _, n, _ in outcomes)\n",
          "        total = split.get(tier, (0, 0))[0]\n", 1),),
        ("tests/unit/test_simulate_probe.py::"
         "test_every_expired_count_is_named_for_what_it_counts_and_adds_up_to_the_tier_table",),
    ),
    Mutant(
        "sv9_blocking_rules_plain_drop",
        "the blocking rules show a message expired at its decision as a plain drop",
        (("sql/queries_simulate.sql", "THEN s.action || ': ' || d.outcome", "THEN s.action", 1),),
        ("tests/integration/test_expired_split.py::"
         "test_a_message_expired_at_its_decision_is_named_for_its_outcome_not_a_plain_drop",),
    ),
    Mutant(
        "sv10_events_after_the_end_recorded",
        "a display after the simulation's end, and its reaction, are recorded and counted",
        (("gov/lab/simulate/engine.py", "if shown > self.config.end:", "if False:", 1),),
        ("tests/unit/test_simulate_hours.py::"
         "test_the_story_ends_at_its_end_no_display_or_reaction_after_it_is_recorded_or_counted",),
    ),
    Mutant(
        "sv11_truth_counts_after_the_end",
        "the truth keeps the expected click and unsubscribe of a display after the end",
        (("gov/lab/simulate/engine.py", "                    displayed, outcome = False, \"ignore\"\n"
          "                    e_click, e_unsub = 0.0, 0.0\n",
          "                    displayed, outcome = False, \"ignore\"\n", 1),),
        ("tests/unit/test_simulate_hours.py::"
         "test_the_story_ends_at_its_end_no_display_or_reaction_after_it_is_recorded_or_counted",),
    ),
    Mutant(
        "sv12_late_unsubscribe_keeps_receiving",
        "an unsubscribe that shows after the end no longer stops the teams (the per-tier numbers would move)",
        (("gov/lab/simulate/engine.py", "                        self.unsubscribed.add(user.index)  # the teams stop",
          "                        pass  # the teams stop", 1),),
        ("tests/unit/test_simulate_hours.py::"
         "test_the_story_ends_at_its_end_no_display_or_reaction_after_it_is_recorded_or_counted",),
    ),
    Mutant(
        "ae1_engine_timeout_untranslated",
        "an engine's full pool reaches the caller as sqlalchemy.exc.TimeoutError",
        (("gov/db.py", "        if isinstance(exc, sa_exc.TimeoutError):", "        if False:", 1),),
        ("tests/integration/test_aio_edges.py::test_an_engines_full_pool_is_gov_pool_timeout",),
    ),
    Mutant(
        "ae2_engine_connect_untranslated",
        "an async engine's failed connect reaches the caller as SQLAlchemy's error, never retried",
        (("gov/db.py", "        if isinstance(exc, sa_exc.DBAPIError) and isinstance(exc.orig, psycopg.Error):",
          "        if False:", 1),),
        ("tests/integration/test_aio_edges.py::test_an_async_engine_that_cannot_connect_raises_gov_s_error_and_is_retried",),
    ),
    Mutant(
        "ae3_async_event_moment_unchecked",
        "AsyncGovernor.record_event hands at='yesterday' to PostgreSQL to parse",
        (("gov/aio.py", '"at": moment(at) if at is not None else None}', '"at": at}', 1),),
        ("tests/integration/test_aio_edges.py::test_the_async_record_event_checks_its_moment_and_survives_a_dropped_connection",),
    ),
    Mutant(
        "ae4_closed_pool_retried",
        "a pool its owner closed is retried as a lost connection for the whole pool timeout",
        (("gov/db.py", "    if pool is not None and isinstance(exc, pool.PoolClosed):", "    if False:", 1),),
        ("tests/integration/test_aio_edges.py::test_a_pool_its_owner_closed_is_not_a_lost_connection",),
    ),
    Mutant(
        "ae5_batch_cancelled_silently",
        "a batcher closed mid-batch leaves that batch's callers waiting for ever",
        (("gov/aio.py", "            except asyncio.CancelledError:  # closed mid-batch",
          "            except ZeroDivisionError:  # closed mid-batch", 1),),
        ("tests/integration/test_aio_edges.py::test_a_batcher_closed_mid_batch_answers_its_callers",),
    ),
    Mutant(
        "ae6_close_cancels_running_batches",
        "closing the batcher cancels the batches under way instead of letting them answer",
        (("gov/aio.py", "        if self._running:  # the batches under way end",
          "        if False:  # the batches under way end", 1),),
        ("tests/integration/test_aio_edges.py::test_a_batcher_closed_mid_batch_answers_its_callers",),
    ),
    Mutant(
        "ai4_naive_moment_accepted",
        "at= takes a naive datetime, which PostgreSQL reads in the session's time zone",
        (("gov/governor.py", "    if at.tzinfo is None or at.utcoffset() is None:", "    if False:", 1),),
        ("tests/integration/test_api_inputs.py::test_a_moment_that_is_not_a_datetime_is_refused",),
    ),
    Mutant(
        "bf1_backfill_new_budgets_only",
        "a policy change fills only budgets no cap read before: a longer window forgets what a prune deleted",
        (("sql/migrations/0045_backfill_every_budget.sql", BACKFILL_ROWS, BACKFILL_NEW_ONLY, 1),
         ("sql/schema/10_policy.sql", BACKFILL_ROWS, BACKFILL_NEW_ONLY, 1)),
        ("tests/integration/test_lean_decision.py::test_a_window_made_longer_after_a_prune_counts_the_sends_it_covers",),
    ),
    Mutant(
        "bf2_backfill_twice",
        "a policy change writes a row a message already has (its decision's or its release's)",
        (("sql/migrations/0045_backfill_every_budget.sql", BACKFILL_ROWS, BACKFILL_OWN_OFF, 1),
         ("sql/schema/10_policy.sql", BACKFILL_ROWS, BACKFILL_OWN_OFF, 1)),
        ("tests/integration/test_lean_decision.py::test_a_policy_change_gives_no_message_a_second_row_in_a_budget",),
    ),
    Mutant(
        "wi1_ties_by_message_id",
        "gov.whatif_v1 replays messages decided at one instant by message id, not allowed first",
        (("sql/migrations/0045_backfill_every_budget.sql", "m.user_id, m.allowed DESC, m.message_id)",
          "m.user_id, m.message_id)", 8),
         ("sql/schema/50_analytics.sql", "m.user_id, m.allowed DESC, m.message_id)", "m.user_id, m.message_id)", 8)),
        ("tests/integration/test_whatif.py::test_messages_decided_at_one_instant_replay_as_they_were_decided",),
    ),
    Mutant(
        "uo1_orphaned_user_caps_ignored",
        "a policy that takes away the window a user's own cap lowers is applied, the cap silently dead",
        (("gov/policy.py", "    if orphans and not drop_user_caps:", "    if False:", 1),),
        ("tests/integration/test_policy_change.py::test_a_policy_that_takes_away_the_window_a_users_cap_lowers_is_refused",),
    ),
    Mutant(
        "pb2_byte_order_mark_refused",
        "a policy file that starts with a byte-order mark is refused as an invalid statement",
        (("gov/policy.py", '    text = text.removeprefix("\\ufeff")', "    text = text", 1),),
        ("tests/unit/test_policy.py::test_a_byte_order_mark_is_not_a_statement",),
    ),
    Mutant(
        "qe1_at_time_zone_only",
        "a quiet end the clocks skip is read as if they had not changed: an hour late",
        (("sql/migrations/0052_local_instant_planned_once.sql", "FROM generate_series(0, 8) k",
          "FROM generate_series(0, 0) k", 1),
         ("sql/schema/20_decide.sql", "FROM generate_series(0, 8) k", "FROM generate_series(0, 0) k", 1)),
        ("tests/integration/test_quiet_clock_change.py::test_quiet_hours_end_when_the_clock_reads_their_end",),
    ),
    Mutant(
        "qe2_any_later_reading",
        "any instant reading past the quiet end counts, also one before a repeated hour: inside quiet hours",
        (("sql/migrations/0052_local_instant_planned_once.sql", QUIET_CROSSING, "AND true", 1),
         ("sql/schema/20_decide.sql", QUIET_CROSSING, "AND true", 1)),
        ("tests/integration/test_quiet_clock_change.py::test_quiet_hours_end_when_the_clock_reads_their_end",),
    ),
    Mutant(
        "hb1_no_header_deadline_at_connect",
        "a connection gets no header deadline when it connects: one that sends nothing is held for good",
        (("gov/http/wire.py", "        self._deadline = self.loop.time() + self.limits.header_timeout\n",
          "        pass\n", 1),),
        (f"{LIMITS}test_a_connection_that_sends_nothing_is_closed",
         f"{LIMITS}test_partial_headers_are_closed_after_the_header_timeout"),
    ),
    Mutant(
        "hb2_header_deadline_from_the_last_byte",
        "every read pushes the header deadline back: a head trickled a byte at a time is never closed",
        (("gov/http/wire.py", "        if self._deadline is None:\n            # the first bytes",
          "        if True:\n            # the first bytes", 1),),
        (f"{LIMITS}test_headers_trickled_a_byte_at_a_time_are_closed_too",),
    ),
    Mutant(
        "hb3_slow_body_closed_without_408",
        "a body past its timeout is closed without the 408",
        (("gov/http/wire.py", '            self.transport.write(_refusal(b"408 Request Timeout", _BODY_TOO_SLOW))\n',
          "", 1),),
        (f"{LIMITS}test_a_body_that_does_not_arrive_in_time_gets_408_and_no_traceback",),
    ),
    Mutant(
        "hb4_head_bytes_not_counted_as_they_come",
        "a head's bytes are counted only when the parser hands a whole header over (it buffers a huge one)",
        (("gov/http/wire.py", "        if room is None or len(data) <= room:  #", "        if True:  #", 1),),
        (f"{LIMITS}test_a_huge_header_line_is_not_buffered",),
    ),
    Mutant(
        "hb5_header_count_unbounded",
        "any number of headers is taken",
        (("gov/http/wire.py", "if self._headers_left < 0 or self._head_bytes_left < 0:",
          "if self._head_bytes_left < 0:", 1),),
        (f"{LIMITS}test_too_many_headers_is_a_431",),
    ),
    Mutant(
        "hb6_connections_uncapped",
        "a connection over --max-connections is served",
        (("gov/http/wire.py", "if len(self.connections) > self.limits.max_connections:", "if False:", 1),),
        (f"{LIMITS}test_connections_over_the_cap_are_closed_at_once",),
    ),
    Mutant(
        "hb7_accept_errors_logged_each_time",
        "every failed accept is logged with its traceback, as asyncio does",
        (("gov/http/wire.py", "exc.errno in ACCEPT_ERRNOS) or (retry and exc is not None):",
          "exc.errno in ()) or False:", 1),),
        (f"{LIMITS}test_running_out_of_descriptors_logs_a_line_not_a_storm",),
    ),
    Mutant(
        "hb8_body_counted_as_head",
        "the head's room is not lifted once the headers end: a big body in the same write is a 431",
        (("gov/http/wire.py", "        self._head_room = None\n        self._body_read = self._body_given = 0\n",
          "        self._body_read = self._body_given = 0\n", 1),),
        (f"{LIMITS}test_headers_and_a_body_in_one_write_are_not_mistaken_for_a_big_head",),
    ),
    Mutant(
        "hb9_renewed_row_stays_renewable",
        "a push-retired subscription keeps its reason when renewed: the same proof renews it again and again",
        (("sql/queries_delivery.sql", "ELSE %(reason)s || ' after: ' || retired_reason END", "ELSE retired_reason END",
          1),),
        (f"{PROBE}test_a_subscription_its_push_service_retired_is_renewed_once",),
    ),
    Mutant(
        "hc1_renewal_not_rechecked_at_the_write",
        "the renewal's write does not re-check the old row: two renewals at once both succeed",
        (("sql/queries_delivery.sql", "AND (retired_at IS NULL OR starts_with(retired_reason, %(renewable)s))",
          "AND true", 1),),
        (f"{PROBE}test_two_renewals_of_one_subscription_at_once_one_wins",),
    ),
    Mutant(
        "hc2_live_subscriptions_uncapped",
        "POST /subscriptions adds any number of live subscriptions for one user",
        (("gov/http/browser.py", "if live_count >= max_live:", "if False:", 1),),
        (f"{PROBE}test_one_token_adds_at_most_the_cap_of_live_subscriptions",),
    ),
    Mutant(
        "hc3_routes_strip_the_token_as_text",
        "the routes strip the Authorization header as text (a Latin-1 NBSP too), the fast door as bytes",
        (("gov/http/app.py", "        given = value.strip()\n",
          '        given = value.decode("latin-1").strip().encode("latin-1")\n', 1),),
        (f"{PROBE}test_every_door_reads_the_authorization_header_as_the_same_bytes",),
    ),
    Mutant(
        "hc4_non_ascii_token_accepted",
        "a GOV_API_TOKEN that is not printable ASCII is taken at start",
        (("gov/http/app.py", "not (secret.strip().isascii() and secret.strip().isprintable()):", "False:", 1),),
        (f"{PROBE}test_a_token_that_is_not_printable_ascii_is_refused_at_start",),
    ),
    Mutant(
        "hc5_quotes_unclipped",
        "a refusal quotes its input whole (up to the line's own cap)",
        (("gov/http/refusals.py", "clipped = _LONG_QUOTE.sub(cut, message)", "clipped = message", 1),),
        (f"{PROBE}test_a_refusal_quotes_a_long_input_cut_short",),
    ),
    Mutant(
        "hc6_error_reports_limited_after_the_body",
        "the /events/errors bucket is not taken before the body: malformed reports are never 429",
        (("gov/http/app.py", 'limit: RateLimit | None = getattr(self.endpoint, "gov_rate_limit", None)',
          "limit: RateLimit | None = None", 1),),
        (f"{PROBE}test_malformed_worker_error_reports_take_from_the_bucket_too",),
    ),
    Mutant(
        "hc7_localtime_taken",
        "timeZone localtime (the database host's /etc/localtime) is taken",
        (("gov/users.py", "if time_zone in HOST_ZONES:", "if False:", 1),),
        (f"{PROBE}test_localtime_is_not_a_time_zone",),
    ),
    Mutant(
        "cd1_batch_of_one_shard",
        "a runner's batch holds one shard's rows: a cluster's shards are sent one after another",
        (("gov/delivery/runner.py", "            if len(claimed) >= limit:", "            if claimed:", 1),),
        ("-m", "citus",
         "tests/citus/test_cluster.py::test_one_drain_sends_a_cluster_s_due_rows_together_and_each_once"),
    ),
    Mutant(
        "gw1_answered_early_held_open",
        "a request answered before its body came leaves its connection without a deadline, held for good",
        (("gov/http/wire.py", "        answered = self.cycle is not None and self.cycle.response_complete\n",
          "        answered = False\n", 1),),
        (f"{LIMITS}test_a_request_answered_before_its_body_came_is_not_held_open_after_it",),
    ),
    Mutant(
        "gw2_trailers_uncounted",
        "a chunked body's trailers are fed to the parser uncounted: an endless one is buffered",
        (("gov/http/wire.py", "            if (self._head_room is None  # still the same body",
          "            if (False  # still the same body", 1),),
        (f"{LIMITS}test_an_endless_trailer_is_not_buffered",),
    ),
    Mutant(
        "gw3_framing_bound_too_tight",
        "the bound on chunk framing refuses a body sent in one-byte chunks",
        (("gov/http/wire.py", "FRAMING_PER_BYTE = 8", "FRAMING_PER_BYTE = 1", 1),),
        (f"{LIMITS}test_a_body_in_one_byte_chunks_is_still_a_body",),
    ),
    Mutant(
        "sw1_click_opens_any_scheme",
        "a click opens the push's javascript: or data: url",
        (("gov/http/static/gov-sw.js", SW_SCHEMES, "      return target.href;", 1),),
        ("tests/browser/test_worker.py::test_a_click_opens_only_an_http_url_and_is_counted_whatever_the_url",),
    ),
    Mutant(
        "sw2_unreadable_url_throws",
        "a click on a push whose url the browser cannot parse throws before the click is counted",
        (("gov/http/static/gov-sw.js", "    } catch (e) { /* not a URL: the scope */ }",
          "    } finally { /* not a URL: the scope */ }", 1),),
        ("tests/browser/test_worker.py::test_a_click_opens_only_an_http_url_and_is_counted_whatever_the_url",),
    ),
    Mutant(
        "sw3_renewal_failure_thrown",
        "a failed renewal rejects unhandled and is reported nowhere",
        (("gov/http/static/gov-sw.js", SW_RENEWAL_REPORT, "      throw e;", 1),),
        ("tests/browser/test_worker.py::test_a_renewal_that_fails_is_reported_not_thrown",),
    ),
    Mutant(
        "url1_any_click_url",
        "a message's url may be javascript:, data: or not a URL at all",
        (("gov/message.py", "        if self.url is not None:\n            _check_url(self.url)\n", "", 1),),
        ("tests/unit/test_message_url.py",),
    ),
    Mutant(
        "os3_refused_subscription_kept",
        "a subscription refused again and again while its origin accepts others is never retired",
        (("gov/delivery/runner.py", "        return count >= SUBSCRIPTION_RETIRE_AFTER\n",
          "        return False\n", 1),),
        ("tests/integration/test_delivery.py::"
         "test_a_subscription_refused_again_and_again_while_its_origin_accepts_is_retired",),
    ),
    Mutant(
        "pb3_payload_bound_too_generous",
        "the send-time payload bound counts 5 bytes a character, so an oversize message passes",
        (("gov/delivery/push.py", "_EMPTY_PAYLOAD_BYTES + 6 * sum(", "_EMPTY_PAYLOAD_BYTES + 5 * sum(", 1),),
        ("tests/fuzz/test_fuzz_payload_bound.py",),
    ),
    Mutant(
        "cq1_http_bench_cpu_unreported",
        "gov bench --http no longer reports each contender's server CPU per request",
        (("gov/lab/bench/http.py", "        settings=settings, cpu=cpu,\n", "        settings=settings,\n", 1),),
        ("tests/acceptance/test_bench.py::test_http_bench_smoke",),
    ),
    Mutant(
        "cq2_release_loads_the_pool",
        "gov release --once imports psycopg_pool although it works on its one connection",
        (("gov/db.py", "        given_pool = sys.modules.get(\"psycopg_pool\")\n",
          "        import psycopg_pool\n\n        given_pool = psycopg_pool\n", 1),),
        ("tests/acceptance/test_cron_path.py::test_release_once_on_an_empty_queue_opens_one_connection_and_no_runner",),
    ),
    Mutant(
        "rp1_serve_workers_share_one_socket",
        "gov serve --workers N: every process accepts on the first socket (one shared socket again)",
        (("gov/http/app.py", "    for mine in socks:\n        pid = os.fork()\n",
          "    for mine in [socks[0]] * len(socks):\n        pid = os.fork()\n", 1),),
        ("tests/acceptance/test_serve_batch.py::test_each_worker_process_accepts_on_its_own_socket",),
    ),
    Mutant(
        "dq1_batch_doc_ttl_from_the_collapse_key",
        "send_batch_doc reads each message's TTL from the collapse key's place in its row",
        (("sql/queries_decide.sql", "array_agg((e.v->>7)::integer) AS ttl",
          "array_agg((e.v->>6)::integer) AS ttl", 1),),
        ("tests/integration/test_send_batch.py",),
    ),
    Mutant(
        "wp1_fast_door_ignores_a_request_in_flight",
        "gov serve's protocol answers a send below ASGI even while an earlier request is unanswered",
        (("gov/http/wire.py",
          "                and (self.cycle is None or self.cycle.response_complete) and not self.pipeline\n", "", 1),),
        ("tests/acceptance/test_serve_batch.py::test_pipelined_sends_are_answered_in_order_whichever_door_answers_each",),
    ),
    Mutant(
        "wp2_fast_door_keeps_a_closing_connection",
        "gov serve's protocol keeps a connection open after a fast answer to Connection: close",
        (("gov/http/wire.py", "        if not cycle.keep_alive:\n            self.transport.close()\n", "", 1),),
        ("tests/acceptance/test_serve_batch.py::test_a_send_asking_to_close_is_answered_then_closed",),
    ),
    Mutant(
        "ht1_batch_blocked_together_never_held",
        "send_batch_v1 decides a holding tier's message together but never holds it when blocked",
        ((HOLDING_TIERS, "IF r_msg.n = ANY (v_hold) THEN\n", "IF false THEN\n", 1),),
        ("tests/integration/test_send_batch.py",),
    ),
    Mutant(
        "ht2_batch_together_with_a_group_waiting",
        "send_batch_v1 decides a holding tier's message together though the user has rows held",
        ((HOLDING_TIERS, "OR NOT EXISTS (SELECT 1 FROM gov.deferred d WHERE d.user_id = msg.u",
          "OR true OR NOT EXISTS (SELECT 1 FROM gov.deferred d WHERE d.user_id = msg.u", 1),),
        ("tests/integration/test_send_batch.py::test_a_batch_of_unrelated_messages_gives_each_what_send_gives_it_alone",),
    ),
    Mutant(
        "ht3_batch_hold_outcome_not_written",
        "send_batch_v1 leaves the blocked verdict's action on the rows when the hold drops the message",
        ((HOLDING_TIERS, "IF r_held.o_action IS DISTINCT FROM v_m.action OR r_held.o_reason",
          "IF false AND r_held.o_reason", 1),),
        ("tests/integration/test_send_batch.py",),
    ),
    Mutant(
        "sg1_together_ignores_the_segment_windows",
        "gov.decide_together reads the default group of rules for every user, whatever their segment",
        ((SEGMENTS_TOGETHER, "JOIN rules r ON r.segment = p.seg", "JOIN rules r ON r.segment = ''", 1),),
        ("tests/integration/test_send_batch.py", "tests/integration/test_campaign_set.py"),
    ),
    Mutant(
        "sg2_together_never_looks_up_segments",
        "gov.decide_together skips the segment lookup as if no segment had rules of its own",
        ((SEGMENTS_TOGETHER, "WHERE v_segmented AND u.user_id = p.u", "WHERE false AND u.user_id = p.u", 1),),
        ("tests/integration/test_campaign_set.py",),
    ),
    Mutant(
        "sig1_handler_sets_the_event_itself",
        "the SIGTERM handler of gov dispatch and gov release sets the stop event in the interrupted thread",
        (("gov/ops/signals.py", "        _thread.start_new_thread(event.set, ())\n", "        event.set()\n", 1),),
        ("tests/unit/test_signals.py",),
    ),
    Mutant(
        "ph1_values_stripped_both_ends",
        "the push service's header reading strips a value's trailing blanks too (http.server keeps them)",
        (("gov/testing/push_service.py", 'value.lstrip(" \\t").rstrip("\\r\\n")', 'value.strip()', 1),),
        ("tests/unit/test_push.py",),
    ),
    Mutant(
        "ph2_no_header_count_limit",
        "the push service reads any number of header fields (http.client stops at 100)",
        (("gov/testing/push_service.py", "if len(fields) == _MAX_HEADERS:\n", "if False:\n", 1),),
        ("tests/unit/test_push.py",),
    ),
    Mutant(
        "ob1_outbox_todo_not_by_id",
        "migration 0049 indexes the outbox rows to do by another column than id",
        (("sql/migrations/0049_outbox_todo_by_id.sql", "gov.outbox (id) WHERE", "gov.outbox (created_at) WHERE", 1),),
        ("tests/integration/test_claim_plan.py",),
    ),
    Mutant(
        "sk1_a_claim_per_given_key_on_one_server",
        "on one server the runner claims given rows once per shard key it is handed (one per user)",
        (("gov/delivery/runner.py", "        if shard_keys is not None and keys != [None]:\n",
          "        if shard_keys is not None:\n", 1),),
        ("tests/integration/test_delivery_robust.py::test_given_rows_of_several_users_are_claimed_in_one_statement_on_one_server",),
    ),
    Mutant(
        "pm1_an_empty_process_file_is_read",
        "a scrape reads a runner process's metrics file while it is still empty (the library's 500)",
        (("gov/ops/metrics.py", "        return os.stat(path).st_size > 0\n", "        return True\n", 1),),
        ("tests/integration/test_metrics.py::test_a_process_file_still_empty_does_not_fail_the_scrape",),
    ),
    Mutant(
        "rp2_given_rows_report_a_made_up_state",
        "a drain of given rows reports each row as delivered, not the state its record wrote",
        (("gov/delivery/runner.py", "                               for i, state in recorded]\n",
          "                               for i, _ in recorded for state in ['delivered']]\n", 1),),
        ("tests/integration/test_delivery_robust.py::test_a_drain_of_given_rows_reports_what_became_of_each",),
    ),
    Mutant(
        "sf1_released_is_not_pending",
        "the simulation takes a row handed back unsent ('released') as ended, not pending again",
        (("gov/lab/simulate/engine.py", '"pending" if r[4] == "released" else r[4]', "r[4]", 1),),
        ("tests/unit/test_simulate_deliver.py",),
    ),
    Mutant(
        "sf2_stale_rows_are_believed",
        "the simulation believes a row its runner found taken ('stale') instead of reading it back",
        (("gov/lab/simulate/engine.py", ' for r in reported or () if r[4] != "stale"]',
          " for r in reported or ()]", 1),),
        ("tests/unit/test_simulate_deliver.py",),
    ),
    Mutant(
        "sf3_rows_in_id_order",
        "the simulation reacts to a tick's rows in outbox id order, not by user, message and subscription",
        (("gov/lab/simulate/engine.py", "key=lambda r: (r[1], r[2], r[3]))", "key=lambda r: r[0])", 1),),
        ("tests/unit/test_simulate_deliver.py",),
    ),
    Mutant(
        "sf4_reactions_out_of_tick_order",
        "a tick's users react as soon as its runners are done, without waiting for the tick before",
        (("gov/lab/simulate/engine.py", "        if before is not None:\n            before.result()\n", "", 1),),
        ("tests/unit/test_simulate_deliver.py",),
    ),
    Mutant(
        "dr1_verdict_cached_by_action",
        "the door's written verdicts are looked up by action alone: a drop answers another drop's reason",
        (("gov/http/door.py", "        key = (decision.action, decision.reason)\n",
          "        key = (decision.action, None)\n", 1),),
        ("tests/unit/test_door.py",),
    ),
    Mutant(
        "dr2_send_loses_a_field",
        "the door's send becomes a message without its campaign",
        (("gov/http/models.py", "                       campaign_id=self.campaign_id)",
          "                       campaign_id=None)", 1),),
        ("tests/unit/test_door.py",),
    ),
    Mutant(
        "bb1_baseline_without_its_arguments",
        "gov bench --http starts the baseline's gov serve without its --baseline-serve-arg",
        (("gov/lab/bench/http.py", "token, cfg.baseline_serve_args)))", "token)))", 1),),
        ("tests/acceptance/test_bench.py::test_the_baseline_gov_serve_is_given_its_own_arguments",),
    ),
    Mutant(
        "pj1_policy_compile_jit",
        "gov.compile_policy_v1 keeps the server's JIT (run with GOV_TEST_DATABASE_URL on a server with LLVM)",
        (("sql/migrations/0051_compile_without_jit.sql", "ALTER FUNCTION gov.compile_policy_v1() SET jit = off;",
          "SELECT 1;", 1),),
        ("tests/integration/test_policy_compile_plan.py",),
    ),
    Mutant(
        "po1_on_citus_subselect",
        "gov.on_citus() is an EXISTS over pg_extension again: a SQL function planned on every call",
        (("sql/migrations/0050_on_citus_inlined.sql", "SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL",
          "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')", 1),),
        ("tests/integration/test_planned_once.py",),
    ),
    Mutant(
        "po2_local_instant_in_sql",
        "gov.local_instant stays SQL (0052 a no-op): planned per call (PostgreSQL 15: GOV_TEST_DATABASE_URL)",
        (("alembic/versions/0052_local_instant_planned_once.py",
          'run_sql_file("migrations/0052_local_instant_planned_once.sql")', "pass", 1),),
        ("tests/integration/test_planned_once.py",),
    ),
    Mutant(
        "ss1_series_one_moment",
        "the simulation's series decides every message at the first one's moment",
        (("gov/lab/simulate/engine.py", "[[*send_row(m), at.isoformat()] for m, at in messages]",
          "[[*send_row(m), messages[0][1].isoformat()] for m, _ in messages]", 1),),
        ("tests/integration/test_sim_send_series.py",),
    ),
    Mutant(
        "ss2_series_reversed",
        "the simulation's series decides its messages last first",
        (("sql/queries_simulate.sql", "FROM jsonb_array_elements(%(batch)s::jsonb) WITH ORDINALITY AS m(v, n)\n",
          "FROM (SELECT * FROM jsonb_array_elements(%(batch)s::jsonb) WITH ORDINALITY AS x(v, n)\n"
          "        ORDER BY x.n DESC) m\n", 1),),
        ("tests/integration/test_sim_send_series.py",),
    ),
    Mutant(
        "ss3_statement_cut_loses_one",
        "the simulation's batch cut into statements loses each part's first message",
        (("gov/lab/simulate/engine.py", "part = group[k : k + STATEMENT_MAX]",
          "part = group[k + 1 : k + STATEMENT_MAX]", 1),),
        ("tests/integration/test_sim_send_series.py",),
    ),
    Mutant(
        "rh1_reach_at_display_hour",
        "the reach counts a delivery at the hour it was displayed, not delivered",
        ((CHEAP, "date_part('hour', x.delivered_at AT TIME ZONE",
          "date_part('hour', coalesce(x.shown_at, x.delivered_at) AT TIME ZONE", 1),),
        ("tests/integration/test_reach_hours.py",),
    ),
    Mutant(
        "rh2_reach_any_display",
        "a delivery displayed at any time later counts as reached at once",
        ((CHEAP, "count(*) FILTER (WHERE x.shown_at <= x.delivered_at + p_prompt)",
          "count(*) FILTER (WHERE x.shown_at IS NOT NULL)", 1),),
        ("tests/integration/test_reach_hours.py",),
    ),
    Mutant(
        "rh3_reach_unsmoothed",
        "the reach curves are not smoothed over the neighbouring hours",
        ((REACH, REACH_KERNEL, "VALUES (0, 1.0::double precision)", 2),),
        ("tests/integration/test_reach_hours.py",),
    ),
    Mutant(
        "rh4_timing_reads_clicks",
        "the timing's prior is the click rate by hour of display again",
        ((REACH, "FROM gov.hour_curves_v2(p_since, v_now) c", "FROM gov.hour_curves_v1(p_since, v_now) c", 1),),
        ("tests/integration/test_timing.py",),
    ),
    Mutant(
        "rh5_upgrade_keeps_click_prior",
        "the upgrade to reach leaves the timing's prior as click rates",
        ((REACH, "SELECT gov.refresh_timing_curves_v1() WHERE EXISTS (SELECT 1 FROM gov.timing_curves);", "", 1),),
        ("tests/migration/test_migrations.py::"
         "test_the_upgrade_to_reach_rewrites_the_timings_prior_and_the_downgrade_restores_it",),
    ),
    Mutant(
        "tr1_timed_rows_never_contend_early",
        "a row timing placed later contends only from its chosen hour (the release order before 0054)",
        ((TIMED, "OR (d.first_at <= $2 AND EXISTS (", "OR (false AND EXISTS (", 2),),
        ("tests/integration/test_release_order.py::"
         "test_a_row_timing_placed_later_still_gets_the_slot_before_a_later_deadline",),
    ),
    Mutant(
        "tr2_fresh_send_ignores_timed_rows",
        "a fresh message takes the slot a timed row of its tier with a nearer deadline needs",
        ((TIMED, "OR (d.first_at <= p_now AND d.tier = p_tier)", "OR false", 1),),
        ("tests/integration/test_release_order.py::test_a_fresh_message_does_not_take_a_slot_a_timed_row_needs",),
    ),
    Mutant(
        "tr3_timed_rows_always_contend",
        "a timed row contends from its first slot whatever the deadlines: pulled forward, it loses its hour",
        ((TIMED, "\n                           AND coalesce(least(oc.expires_at, o.give_up_at), 'infinity')"
                 "\n                               > least(c.expires_at, d.give_up_at)", "", 2),),
        ("tests/integration/test_release_order.py::test_a_timed_row_with_the_later_deadline_keeps_its_hour",),
    ),
    Mutant(
        "tr4_first_slot_not_kept",
        "the hold does not keep a timed row's first slot",
        ((TIMED, "            CASE WHEN v_planned > v_first THEN v_first END);", "            NULL);", 1),),
        ("tests/integration/test_release_order.py::"
         "test_a_row_timing_placed_later_still_gets_the_slot_before_a_later_deadline",),
    ),
    Mutant(
        "bs1_best_slot_skips_quiet_check",
        "the lazy best slot takes the best estimate's hour without asking whether it is quiet",
        ((CHEAP, "        IF gov.quiet_until(p_user_id, v_t) = v_t THEN\n            o_slot := v_t;",
          "        IF true THEN\n            o_slot := v_t;", 1),),
        ("tests/integration/test_best_slot_same.py",),
    ),
    Mutant(
        "bs2_best_slot_counts_one",
        "the lazy best slot stops counting open candidates at one: it never times anything",
        ((CHEAP, "EXIT WHEN v_open > 1;", "EXIT WHEN v_open > 0;", 1),),
        ("tests/integration/test_best_slot_same.py",),
    ),
    Mutant(
        "pl1_paired_by_message_id_alone",
        "the simulation's paired lift matches a message by its id alone: another user's message of that id stands in",
        (("gov/lab/simulate/versus.py", "theirs = {(u, m): clicked for u, m, _, clicked in baseline.delivered_non_p0}",
          "theirs = {(\"\", m): clicked for u, m, _, clicked in baseline.delivered_non_p0}", 1),
         ("gov/lab/simulate/versus.py", "other = theirs.get((u, m))", "other = theirs.get((\"\", m))", 1)),
        ("tests/unit/test_simulate_probe.py::"
         "test_a_comparison_pairs_each_delivered_message_with_itself_by_what_the_timing_did",),
    ),
    Mutant(
        "pl2_moved_never_read",
        "the simulation's delivered messages never say the timing moved them",
        (("sql/queries_simulate.sql",
          "CASE WHEN d.first_at IS NOT NULL AND d.state = 'released' THEN d.timing END AS moved",
          "NULL::text AS moved", 1),),
        ("tests/integration/test_release_order.py::"
         "test_the_simulation_s_paired_lift_knows_which_deliveries_the_timing_moved",),
    ),
    Mutant(
        "pl3_paired_test_one_sided",
        "the paired lift's p-value is one-sided: half what McNemar's two-sided exact test gives",
        (("gov/lab/simulate/versus.py", "return min(1.0, 2 * binomial_tail(low, m, upper=False))",
          "return min(1.0, binomial_tail(low, m, upper=False))", 1),),
        ("tests/unit/test_simulate_probe.py::test_the_paired_test_of_a_lift_is_mcnemar_s_exact_two_sided_one",),
    ),
    Mutant(
        "wd1_warm_start_never_off",
        "gov simulate --warm-days never turns the timing off: it times holds from the first day",
        (("gov/lab/simulate/engine.py", 'gov.source.execute(q("sim_set_timing"), {"on": False})',
          'gov.source.execute(q("sim_set_timing"), {"on": True})', 1),),
        ("tests/acceptance/test_simulate.py::test_a_warm_start_times_nothing_before_its_midnight",),
    ),
    Mutant(
        "wd2_warm_start_never_on",
        "gov simulate --warm-days never turns the timing back on",
        (("gov/lab/simulate/engine.py", '                        gov.source.execute(q("sim_set_timing"), {"on": True})',
          "                        pass", 1),),
        ("tests/acceptance/test_simulate.py::test_a_warm_start_times_nothing_before_its_midnight",),
    ),
]

def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def make_worktree(where: Path) -> None:
    git("worktree", "add", "--detach", str(where), "HEAD")
    shutil.rmtree(where / "tests")
    shutil.copytree(ROOT / "tests", where / "tests", ignore=shutil.ignore_patterns("__pycache__"))


def drop_worktree(where: Path) -> None:
    git("worktree", "remove", "--force", str(where))


def apply(where: Path, mutant: Mutant) -> None:
    for name, old, new, expected in mutant.edits:
        path = where / name
        text = path.read_text()
        found = text.count(old)
        if found != expected:
            raise SystemExit(f"{mutant.name}: {name} has {found} matches of {old!r}, expected {expected}")
        path.write_text(text.replace(old, new))


def run_tests(where: Path, tests: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(where)}
    return subprocess.run(
        # a base directory of its own: pytest keeps only the newest three under
        # /tmp/pytest-of-<user>, so a session beside another (CI) would delete that one's;
        # -n 0: a mutant's few tests in this process (workers would each start a server first)
        [str(PYTHON), "-m", "pytest", "-q", "-n", "0", "--timeout", "120", "--basetemp", str(where / ".pytest-tmp"),
         *tests],
        cwd=where, env=env, capture_output=True, text=True,
    )


def last_line(out: str) -> str:
    lines = [line for line in out.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def main(argv: list[str]) -> int:
    chosen = [m for m in MUTANTS if not argv or any(m.name.startswith(a) for a in argv)]
    if not chosen:  # with no test named, the baseline would run the whole suite for nothing
        raise SystemExit(f"no mutant's name starts with {' or '.join(argv)}; the mutants: "
                         + ", ".join(m.name for m in MUTANTS))
    survived = []
    with tempfile.TemporaryDirectory(prefix="gov-mutation-") as tmp:
        base = Path(tmp) / "baseline"
        make_worktree(base)
        try:
            probe = subprocess.run(
                [str(PYTHON), "-c", "import gov; print(gov.__file__)"], cwd=base,
                env={**os.environ, "PYTHONPATH": str(base)}, capture_output=True, text=True, check=True,
            ).stdout.strip()
            if not probe.startswith(str(base)):
                raise SystemExit(f"the worktree's gov is not the one imported: {probe}")
            tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
            result = run_tests(base, tests)
            if result.returncode != 0:
                print(result.stdout[-4000:])
                raise SystemExit("baseline: the mutation tests fail without any mutation")
            print(f"{'baseline':38} passes   ({last_line(result.stdout)})")
        finally:
            drop_worktree(base)
        for mutant in chosen:
            where = Path(tmp) / mutant.name
            make_worktree(where)
            try:
                apply(where, mutant)
                result = run_tests(where, mutant.tests)
            finally:
                drop_worktree(where)
            verdict = "caught  " if result.returncode != 0 else "SURVIVED"
            if result.returncode == 0:
                survived.append(mutant.name)
            print(f"{mutant.name:38} {verdict} {mutant.what}\n{'':38} ({last_line(result.stdout)})")
            why = next((line for line in result.stdout.splitlines() if line.startswith("E ")), "")
            if why:
                print(f"{'':38} {why[:160]}")
    print(f"{len(chosen) - len(survived)} of {len(chosen)} mutants caught" +
          (f"; survived: {', '.join(survived)}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
