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

-- name: subscriptions_by_endpoint
-- The rows a browser's endpoint had (newest first), for a browser that proves it holds one
-- (the endpoint and its auth secret) to renew or retire it.
SELECT id, user_id, auth, retired_at IS NULL AS live, coalesce(retired_reason, '') AS retired_reason
  FROM gov.subscriptions
 WHERE endpoint = %(endpoint)s
 ORDER BY id DESC
 LIMIT 20;

-- name: retire_subscription
-- A live subscription the browser itself ended (gov.unsubscribe) or replaced (pushsubscriptionchange).
-- (By user and id: on a Citus cluster one shard's row; now(), as Citus admits no volatile
-- call in an UPDATE of a distributed table.)
UPDATE gov.subscriptions
   SET retired_at = now(), retired_reason = %(reason)s
 WHERE user_id = %(user_id)s AND id = %(id)s AND retired_at IS NULL
RETURNING id;

-- name: outbox_due
-- Is any outbox row due for a claim now? The condition of gov.claim_outbox_v3's claim
-- (keep the two equal: a "no" here skips the runner), over the partial index outbox_due;
-- `gov dispatch --once` asks it first, so a cron run on an empty outbox starts no runner.
-- now(), not clock_timestamp(): one statement in autocommit, and Citus pushes a stable call
-- down to the shards.
SELECT EXISTS (
    SELECT 1
      FROM gov.outbox o
     WHERE o.state IN ('pending', 'sending')
       AND ((o.state = 'pending' AND o.next_attempt_at <= now())
         OR (o.state = 'sending' AND o.lease_until <= now()))
);
