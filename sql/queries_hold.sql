-- Named statements of the deferral queue: releasing held messages that are due.
-- Format (gov/queries.py): one statement per "-- name: <name>" block; values are always
-- parameters (%(name)s), never text pasted in. Names are unique across the queries*.sql files.

-- name: release_due
SELECT user_id, message_id, state, outcome, outbox_ids FROM gov.release_due_v2(%(shard_key)s, %(limit)s, %(now)s);
