-- Named statements of delivery: subscriptions, and the runner's claim and record on
-- the outbox.
-- Format (gov/queries.py): one statement per "-- name: <name>" block; values are always
-- parameters (%(name)s), never text pasted in. Names are unique across the queries*.sql files.

-- name: subscribe
SELECT gov.subscribe_v2(%(user_id)s, %(endpoint)s, %(p256dh)s, %(auth)s);

-- name: claim_outbox
-- (The given rows' ids go in binary: psycopg writes a text array through a regex per id.)
SELECT outbox_id, claim_token, user_id, message_id, tier, attempts, subscription_id, endpoint, p256dh, auth,
       content, collapse_key, ttl_s, urgency
  FROM gov.claim_outbox_v3(%(shard_key)s, %(worker)s, %(limit)s, %(lease_ms)s, %(now)s, %(ids)b);

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

-- name: lock_user_subscriptions
-- POST /subscriptions: one at a time per user, so two at once cannot both pass the user's
-- cap of live subscriptions (seed 2: the users' decision locks hash with seed 0, the
-- endpoints' with seed 1).
SELECT pg_advisory_xact_lock(hashtextextended(%(user_id)s, 2));

-- name: renew_subscription
-- A browser renews a subscription (pushsubscriptionchange): the old row is marked replaced,
-- once. It must be live, or retired by its push service (404/410) and not renewed since;
-- the row lock makes two renewals of one row go one after the other, and the second finds
-- it replaced (no row: refused). A retired row keeps when it was retired, and why after
-- the new reason.
UPDATE gov.subscriptions
   SET retired_at = coalesce(retired_at, now()),
       retired_reason = CASE WHEN retired_at IS NULL THEN %(reason)s
                             ELSE %(reason)s || ' after: ' || retired_reason END
 WHERE user_id = %(user_id)s AND id = %(id)s
   AND (retired_at IS NULL OR starts_with(retired_reason, %(renewable)s))
RETURNING id;

-- name: live_subscriptions_besides
-- How many live subscriptions a user has on other endpoints than this one (a subscription
-- of this endpoint is updated in place, not added).
SELECT count(*) FROM gov.subscriptions
 WHERE user_id = %(user_id)s AND retired_at IS NULL AND endpoint <> %(endpoint)s;

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
