-- Named statements of the decision and the send, one user or a campaign's many.
-- Format (gov/queries.py): one statement per "-- name: <name>" block; values are always
-- parameters (%(name)s), never text pasted in. Names are unique across the queries*.sql files.

-- name: decide
SELECT allowed, action, reason, used, cap, retry_after_ms, repeated
  FROM gov.decide_v1(%(user_id)s, %(message_id)s, %(tier)s, %(topic)s, %(campaign_id)s, %(now)s);

-- name: send
SELECT allowed, action, reason, used, cap, retry_after_ms, repeated, outbox_ids
  FROM gov.send_v1(%(user_id)s, %(message_id)s, %(tier)s, %(topic)s, %(campaign_id)s,
                   %(content)s, %(collapse_key)s, %(ttl)s, %(now)s);

-- name: decide_many
SELECT user_id, allowed, action, reason, used, cap, retry_after_ms, repeated
  FROM gov.decide_many_v2(%(shard_key)s, %(user_ids)b, %(message_id)s, %(tier)s, %(topic)s, %(campaign_id)s, %(now)s);

-- name: send_many
SELECT user_id, allowed, action, reason, repeated, outbox_ids
  FROM gov.send_many_v2(%(shard_key)s, %(user_ids)b, %(message_id)s, %(tier)s, %(topic)s, %(campaign_id)s,
                        %(content)s, %(collapse_key)s, %(ttl)s, %(now)s);

-- name: send_many_best
-- send_many, each allowed user's delivery held to their best hour within %(within)s
SELECT user_id, allowed, action, reason, repeated, outbox_ids, deliver_at, timing
  FROM gov.send_many_best_v1(%(shard_key)s, %(user_ids)b, %(message_id)s, %(tier)s, %(topic)s, %(campaign_id)s,
                             %(content)s, %(collapse_key)s, %(ttl)s, %(within)s, %(now)s);

-- name: shard_groups
-- An audience in per-shard groups, each with its shard key (one group on one server).
SELECT shard_key, user_ids FROM gov.shard_groups_v1(%(user_ids)b);

-- name: send_batch
-- Unrelated messages sent together (gov serve's grouped requests; one shard's on a Citus
-- cluster): one row per message, by its ordinal (from 1) in the arrays. The arrays go in binary (%b): psycopg writes a
-- text array element by element through an escaping regex, about five times the CPU
-- (183 against 34 µs for a batch of 16, the largest Python cost of gov serve's batch).
SELECT ordinal, allowed, action, reason, used, cap, retry_after_ms, repeated, outbox_ids
  FROM gov.send_batch_v1(%(shard_key)s, %(user_ids)b, %(message_ids)b, %(tiers)b, %(topics)b, %(campaign_ids)b,
                         %(contents)b::jsonb[], %(collapse_keys)b, %(ttls)b::integer[], %(now)s);

-- name: send_batch_doc
-- send_batch on one server, its messages as one JSON document (gov.governor.send_row:
-- [user_id, message_id, tier, topic, campaign_id, content, collapse_key, ttl] each):
-- psycopg's nine arrays cost the door about 200 µs of Python a batch of 16, one json.dumps
-- a tenth of it, and the server unpacks it in about 70 µs. The arrays are built in one
-- aggregate pass, so position k of each is the same message, whose place in the document
-- is n[k]. (A Citus cluster delegates only a bare function call: send_batch there.)
SELECT a.n[b.ordinal] AS ordinal, b.allowed, b.action, b.reason, b.used, b.cap, b.retry_after_ms, b.repeated,
       b.outbox_ids
  FROM (SELECT array_agg(e.v->>0) AS u, array_agg(e.v->>1) AS m, array_agg(e.v->>2) AS t,
               array_agg(e.v->>3) AS tp, array_agg(e.v->>4) AS c, array_agg(e.v->5) AS ct,
               array_agg(e.v->>6) AS ck, array_agg((e.v->>7)::integer) AS ttl, array_agg(e.n::integer) AS n
          FROM jsonb_array_elements(%(batch)s::jsonb) WITH ORDINALITY AS e(v, n)) a
 CROSS JOIN LATERAL gov.send_batch_v1(NULL, a.u, a.m, a.t, a.tp, a.c, a.ct, a.ck, a.ttl, %(now)s) b;

-- name: distributed
-- True on a Citus cluster whose user tables are distributed (batches then go per shard).
SELECT gov.distributed();
