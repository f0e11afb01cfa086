-- Named statements of the policy: reading, storing and auditing it (gov policy apply),
-- and ending what removed tiers still hold.
-- Format (gov/queries.py): one statement per "-- name: <name>" block; values are always
-- parameters (%(name)s), never text pasted in. Names are unique across the queries*.sql files.

-- name: lock_policy
-- Serialises policy applies; decisions never take this lock.
SELECT pg_advisory_xact_lock(hashtextextended('gov.policy', 0));

-- name: policy_tiers
SELECT tier, exempt, on_exceed, defer_max_ms, default_ttl_s, urgency
  FROM gov.tiers ORDER BY tier;

-- name: policy_consumes
SELECT tier, consumes FROM gov.tier_consumes ORDER BY tier, consumes;

-- name: policy_caps
SELECT scope, topic, window_ms, cap FROM gov.caps ORDER BY scope, topic, window_ms;

-- name: policy_segment_caps
SELECT tier, segment, window_ms, cap FROM gov.segment_caps ORDER BY tier, segment, window_ms;

-- name: policy_settings
SELECT quiet_start, quiet_end, jitter_ms, segment_engaged_ms, segment_dormant_ms, release_per_minute,
       timing_enabled, timing_p1_max_delay_ms, timing_explore
  FROM gov.settings;

-- name: clear_segment_caps
DELETE FROM gov.segment_caps;

-- name: clear_caps
DELETE FROM gov.caps;

-- name: clear_consumes
DELETE FROM gov.tier_consumes;

-- name: clear_tiers
DELETE FROM gov.tiers;

-- name: insert_tier
INSERT INTO gov.tiers (tier, exempt, on_exceed, defer_max_ms, default_ttl_s, urgency)
VALUES (%(tier)s, %(exempt)s, %(on_exceed)s, %(defer_max_ms)s, %(default_ttl_s)s, %(urgency)s);

-- name: insert_consumes
INSERT INTO gov.tier_consumes (tier, consumes) VALUES (%(tier)s, %(consumes)s);

-- name: insert_cap
INSERT INTO gov.caps (scope, topic, window_ms, cap)
VALUES (%(scope)s, %(topic)s, %(window_ms)s, %(cap)s);

-- name: insert_segment_cap
INSERT INTO gov.segment_caps (tier, segment, window_ms, cap)
VALUES (%(tier)s, %(segment)s, %(window_ms)s, %(cap)s);

-- name: upsert_settings
INSERT INTO gov.settings (id, quiet_start, quiet_end, jitter_ms, segment_engaged_ms, segment_dormant_ms,
                          release_per_minute, timing_enabled, timing_p1_max_delay_ms, timing_explore)
VALUES (true, %(quiet_start)s, %(quiet_end)s, %(jitter_ms)s, %(segment_engaged_ms)s, %(segment_dormant_ms)s,
        %(release_per_minute)s, %(timing_enabled)s, %(timing_p1_max_delay_ms)s, %(timing_explore)s)
ON CONFLICT (id) DO UPDATE
   SET quiet_start = excluded.quiet_start, quiet_end = excluded.quiet_end,
       jitter_ms = excluded.jitter_ms, segment_engaged_ms = excluded.segment_engaged_ms,
       segment_dormant_ms = excluded.segment_dormant_ms, release_per_minute = excluded.release_per_minute,
       timing_enabled = excluded.timing_enabled, timing_p1_max_delay_ms = excluded.timing_p1_max_delay_ms,
       timing_explore = excluded.timing_explore;

-- name: record_policy_version
INSERT INTO gov.policy_versions (source) VALUES (%(source)s);

-- name: retire_tiers
SELECT tier, held, queued FROM gov.retire_tiers_v1(%(tiers)s, %(drop)s);

-- name: capped_budgets
-- What the compiled policy writes now, before a new policy replaces it.
SELECT gov.capped_budgets();

-- name: compile_policy
SELECT gov.compile_policy_v1();

-- name: backfill_sends
SELECT gov.backfill_sends_v1(%(before)s);

-- name: orphaned_user_caps
-- Users' own caps over a window the policy now in the tables has no default for: the
-- decision would ignore them (a user cap only lowers a default). Per (scope, window):
-- how many users, and one of them to name.
SELECT uc.scope, uc.window_ms, count(DISTINCT uc.user_id) AS users, min(uc.user_id) AS example
  FROM gov.user_caps uc
 WHERE gov.user_cap_ceiling(uc.scope, uc.window_ms) IS NULL
 GROUP BY uc.scope, uc.window_ms
 ORDER BY uc.scope, uc.window_ms;

-- name: drop_orphaned_user_caps
DELETE FROM gov.user_caps uc WHERE gov.user_cap_ceiling(uc.scope, uc.window_ms) IS NULL;
