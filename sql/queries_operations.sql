-- Named statements for campaigns, pruning and the conservation check.

-- name: decide_many
SELECT user_id, allowed, action, reason, used, cap, retry_after_ms, repeated
  FROM gov.decide_many_v1(%(user_ids)s, %(message_id)s, %(tier)s, %(topic)s, %(campaign_id)s, %(now)s);

-- name: send_many
SELECT user_id, allowed, action, reason, repeated, outbox_ids
  FROM gov.send_many_v1(%(user_ids)s, %(message_id)s, %(tier)s, %(topic)s, %(campaign_id)s,
                        %(content)s, %(collapse_key)s, %(ttl)s, %(now)s);

-- name: prune_sends
SELECT gov.prune_sends_v1(%(batch)s, %(margin)s, %(now)s);

-- name: prune_history
SELECT gov.prune_history_v1(%(batch)s, %(keep)s, %(now)s);

-- name: message_states
SELECT state, count(*) FROM gov.message_states_v1(%(since)s, %(until)s) GROUP BY state ORDER BY state;

-- name: inconsistent_messages
SELECT user_id, message_id, tier, state FROM gov.message_states_v1(%(since)s, %(until)s)
 WHERE state LIKE 'INCONSISTENT%%' ORDER BY user_id, message_id LIMIT %(limit)s;
