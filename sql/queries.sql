-- Named statements used by the Python package. Loaded once by gov/queries.py; each
-- block starts with "-- name: <name>" and holds exactly one statement. Values are
-- always parameters (%(name)s), never text pasted in.

-- name: decide
SELECT allowed, action, reason, used, cap, retry_after_ms, repeated
  FROM gov.decide_v1(%(user_id)s, %(message_id)s, %(tier)s, %(topic)s, %(campaign_id)s, %(now)s);

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

-- name: policy_settings
SELECT quiet_start, quiet_end, jitter_ms FROM gov.settings;

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

-- name: upsert_settings
INSERT INTO gov.settings (id, quiet_start, quiet_end, jitter_ms)
VALUES (true, %(quiet_start)s, %(quiet_end)s, %(jitter_ms)s)
ON CONFLICT (id) DO UPDATE
   SET quiet_start = excluded.quiet_start, quiet_end = excluded.quiet_end,
       jitter_ms = excluded.jitter_ms;

-- name: record_policy_version
INSERT INTO gov.policy_versions (source) VALUES (%(source)s);

-- name: ensure_user
INSERT INTO gov.users (user_id) VALUES (%(user_id)s) ON CONFLICT (user_id) DO NOTHING;

-- name: set_user_cap
INSERT INTO gov.user_caps (user_id, scope, window_ms, cap)
VALUES (%(user_id)s, %(scope)s, %(window_ms)s, %(cap)s)
ON CONFLICT (user_id, scope, window_ms) DO UPDATE SET cap = excluded.cap;

-- name: clear_user_cap
DELETE FROM gov.user_caps
 WHERE user_id = %(user_id)s AND scope = %(scope)s AND window_ms = %(window_ms)s;

-- name: user_caps
SELECT scope, window_ms, cap FROM gov.user_caps WHERE user_id = %(user_id)s
 ORDER BY scope, window_ms;

-- name: send
SELECT allowed, action, reason, used, cap, retry_after_ms, repeated, outbox_ids
  FROM gov.send_v1(%(user_id)s, %(message_id)s, %(tier)s, %(topic)s, %(campaign_id)s,
                   %(content)s, %(collapse_key)s, %(ttl)s, %(now)s);

-- name: subscribe
SELECT gov.subscribe_v1(%(user_id)s, %(endpoint)s, %(p256dh)s, %(auth)s);

-- name: claim_outbox
SELECT outbox_id, claim_token, user_id, message_id, tier, attempts, subscription_id, endpoint, p256dh, auth,
       content, collapse_key, ttl_s, urgency
  FROM gov.claim_outbox_v2(%(worker)s, %(limit)s, %(lease_ms)s, %(now)s, %(ids)s);

-- ---- queue and user settings (issue 4)

-- name: release_due
SELECT user_id, message_id, state, outcome, outbox_ids FROM gov.release_due_v1(%(limit)s, %(now)s);

-- name: known_time_zone
SELECT EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = %(tz)s);

-- name: set_user_time_zone
INSERT INTO gov.users (user_id, time_zone) VALUES (%(user_id)s, %(tz)s)
ON CONFLICT (user_id) DO UPDATE SET time_zone = excluded.time_zone, updated_at = clock_timestamp();

-- name: set_user_quiet_hours
INSERT INTO gov.users (user_id, quiet_start, quiet_end) VALUES (%(user_id)s, %(start)s, %(end)s)
ON CONFLICT (user_id) DO UPDATE
   SET quiet_start = excluded.quiet_start, quiet_end = excluded.quiet_end, updated_at = clock_timestamp();

-- name: user_settings
SELECT time_zone, quiet_start, quiet_end FROM gov.users WHERE user_id = %(user_id)s;

-- name: record_attempts
SELECT outbox_id, state FROM gov.record_attempts_v2(%(worker)s, %(attempts)s, %(max_attempts)s, %(backoff_ms)s,
                                                    %(backoff_cap_ms)s, %(now)s);

-- name: retire_tiers
SELECT tier, held, queued FROM gov.retire_tiers_v1(%(tiers)s, %(drop)s);
