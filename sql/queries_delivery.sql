-- Named statements of delivery: subscriptions, and the runner's claim and record on
-- the outbox.
-- Format (gov/queries.py): one statement per "-- name: <name>" block; values are always
-- parameters (%(name)s), never text pasted in. Names are unique across the queries*.sql files.

-- name: subscribe
SELECT gov.subscribe_v2(%(user_id)s, %(endpoint)s, %(p256dh)s, %(auth)s);

-- name: claim_outbox
SELECT outbox_id, claim_token, user_id, message_id, tier, attempts, subscription_id, endpoint, p256dh, auth,
       content, collapse_key, ttl_s, urgency
  FROM gov.claim_outbox_v3(%(shard_key)s, %(worker)s, %(limit)s, %(lease_ms)s, %(now)s, %(ids)s);

-- name: record_attempts
SELECT outbox_id, state FROM gov.record_attempts_v3(%(worker)s, %(attempts)s, %(max_attempts)s, %(backoff_ms)s,
                                                    %(backoff_cap_ms)s, %(now)s);

-- name: shard_keys
-- One key per shard the runner and the releaser walk ({NULL} on one server).
SELECT gov.shard_keys_v1();
