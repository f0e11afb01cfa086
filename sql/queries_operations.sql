-- Named statements for running gov: health checks and liveness, /metrics, pruning,
-- and the conservation check.
-- Format (gov/queries.py): one statement per "-- name: <name>" block; values are always
-- parameters (%(name)s), never text pasted in. Names are unique across the queries*.sql files.

-- name: health
SELECT check_name, ok, detail FROM gov.health_v1(%(now)s, %(stuck_after)s);

-- name: ping
SELECT 1;

-- name: metrics
-- Everything /metrics reads from the database, in one call (gov.metrics_v1).
SELECT metric, labels, value FROM gov.metrics_v1(%(window_ms)s);

-- name: prune_sends
SELECT gov.prune_sends_v1(%(batch)s, %(margin)s, %(now)s);

-- name: prune_history
SELECT gov.prune_history_v1(%(batch)s, %(keep)s, %(now)s);

-- name: message_states
SELECT state, count(*) FROM gov.message_states_v1(%(since)s, %(until)s) GROUP BY state ORDER BY state;

-- name: inconsistent_messages
SELECT user_id, message_id, tier, state FROM gov.message_states_v1(%(since)s, %(until)s)
 WHERE state LIKE 'INCONSISTENT%%' ORDER BY user_id, message_id LIMIT %(limit)s;
