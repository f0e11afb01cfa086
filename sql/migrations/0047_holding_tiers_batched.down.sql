-- Migration 0047, down: gov.send_batch_v1 as migration 0044 left it (tiers that hold, one by one).

-- Send a batch of unrelated messages (any users, tiers, topics, content) in one call and
-- one transaction: what `gov serve` does with the requests that arrive together. Each
-- message gets the verdict, rows and fan-out gov.send_v1 would give it alone, one call
-- after the other in user order, then in the order given (ordinal, from 1): a user's
-- later message in the batch sees the earlier one's spend. What the batch saves is the
-- round trip and the durable commit per message (most of an allowed decision's cost),
-- and on one server the per-message work: the messages of users with one message in the
-- batch, plain ones (gov.plain_users) of a tier that holds nothing (exempt, or one that
-- drops), are decided together, per tier, topic and campaign, by gov.decide_together,
-- their content stored and fanned out in a few statements; the rest go through
-- gov.send_v1, as does everything on a Citus cluster. Every user of the batch is locked
-- first, in user order, the order every batch uses, so batches never wait on each other
-- in a cycle. An error in any message (an unknown tier, say) fails the whole call and
-- nothing is written: the caller then sends each message alone, so the error stays with
-- its message (gov.aio.AsyncGovernor.send_batch). p_shard_key: on a Citus cluster, one
-- shard's messages decided on the worker that holds them (gov.shard_groups_v1); NULL on
-- one server. Rows come in no promised order.
CREATE OR REPLACE FUNCTION gov.send_batch_v1(
    p_shard_key     text,
    p_user_ids      text[],
    p_message_ids   text[],
    p_tiers         text[],
    p_topics        text[],
    p_campaign_ids  text[],
    p_contents      jsonb[],
    p_collapse_keys text[],
    p_ttls          integer[],
    p_now           timestamptz DEFAULT NULL
) RETURNS TABLE (
    ordinal        integer,
    allowed        boolean,
    action         text,
    reason         text,
    used           integer,
    cap            integer,
    retry_after_ms bigint,
    repeated       boolean,
    outbox_ids     bigint[]
)
LANGUAGE plpgsql
-- Generic plans, as gov.decide_core (a batch of one: 1.19 ms instead of 3.17 by pgbench).
-- On a Citus cluster gov.distribute_v1 resets it: the setting holds for the functions it
-- calls, and a worker cannot route a generic plan of gov.decide_core's statements.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_now   timestamptz := coalesce(p_now, clock_timestamp());
    v_n     integer := coalesce(cardinality(p_user_ids), 0);
    v_done  integer[] := '{}';
    r_group record;
    r_msg   record;
    v_plain text[];
BEGIN
    IF coalesce(cardinality(p_message_ids), 0) <> v_n OR coalesce(cardinality(p_tiers), 0) <> v_n
       OR coalesce(cardinality(p_topics), 0) <> v_n OR coalesce(cardinality(p_campaign_ids), 0) <> v_n
       OR coalesce(cardinality(p_contents), 0) <> v_n OR coalesce(cardinality(p_collapse_keys), 0) <> v_n
       OR coalesce(cardinality(p_ttls), 0) <> v_n THEN
        RAISE EXCEPTION 'a batch''s arrays must have one entry per message (% user ids)', v_n
            USING ERRCODE = 'GV003';
    END IF;
    PERFORM gov.require_one_shard(p_shard_key, p_user_ids);
    IF NOT gov.distributed() THEN
        PERFORM pg_advisory_xact_lock(hashtextextended(x.u, 0))
           FROM (SELECT DISTINCT u FROM unnest(p_user_ids) u WHERE u <> '') x
          ORDER BY x.u;
        -- (bad input, an unknown tier, no message id, a TTL out of range, an empty or long
        -- id, content no push can be built from, is left to gov.send_v1 to refuse)
        FOR r_group IN
            WITH msg AS (
                SELECT x.*, count(*) OVER (PARTITION BY x.u) AS mine
                  FROM unnest(p_user_ids, p_message_ids, p_tiers, p_topics, p_campaign_ids)
                       WITH ORDINALITY AS x(u, m, t, tp, c, n)
            )
            SELECT msg.t, msg.tp, msg.c, array_agg(msg.u ORDER BY msg.u) AS us, array_agg(msg.m ORDER BY msg.u) AS ms
              FROM msg JOIN gov.tiers t ON t.tier = msg.t AND (t.exempt OR t.on_exceed = 'drop')
             WHERE msg.mine = 1 AND msg.u <> '' AND msg.m <> ''
               AND length(msg.u) <= 256 AND length(msg.m) <= 256
               AND (p_ttls[msg.n] IS NULL OR p_ttls[msg.n] BETWEEN 1 AND 2419200)
               AND gov.content_ok(p_contents[msg.n])
             GROUP BY msg.t, msg.tp, msg.c
        LOOP
            v_plain := gov.plain_users(r_group.us, r_group.ms, r_group.t, r_group.tp, v_now);
            CONTINUE WHEN cardinality(v_plain) = 0;
            RETURN QUERY
            WITH decided AS (
                SELECT d.*, x.n::integer AS n
                  FROM gov.decide_together(
                           v_plain,
                           ARRAY(SELECT p_message_ids[x.n] FROM unnest(p_user_ids) WITH ORDINALITY x(u, n)
                                   JOIN unnest(v_plain) WITH ORDINALITY pu(u, k) ON pu.u = x.u ORDER BY pu.k),
                           r_group.t, r_group.tp, r_group.c, v_now) d
                  JOIN unnest(p_user_ids) WITH ORDINALITY x(u, n) ON x.u = d.user_id
            ), content AS (  -- every decided message keeps its content, as send_v1 stores it (a drop too)
                INSERT INTO gov.message_content (user_id, message_id, content, collapse_key, ttl_s, expires_at)
                SELECT d.user_id, p_message_ids[d.n], p_contents[d.n], p_collapse_keys[d.n], l.ttl_s,
                       v_now + l.ttl_s * interval '1 second'
                  FROM decided d
                 CROSS JOIN LATERAL (SELECT coalesce(p_ttls[d.n], t.default_ttl_s) AS ttl_s
                                       FROM gov.tiers t WHERE t.tier = r_group.t) l
            ), fan AS (  -- gov.fan_out for every allowed message: one outbox row per live endpoint
                INSERT INTO gov.outbox (user_id, message_id, subscription_id, next_attempt_at, created_at)
                SELECT s.user_id, p_message_ids[d.n], s.id, v_now, v_now
                  FROM gov.subscriptions s
                  JOIN decided d ON d.user_id = s.user_id AND d.allowed
                 WHERE s.retired_at IS NULL
                 ORDER BY s.user_id, s.id
                RETURNING gov.outbox.user_id AS u, gov.outbox.id
            )
            SELECT d.n, d.allowed, d.action, d.reason, d.used, d.cap, d.retry_after_ms, false,
                   coalesce((SELECT array_agg(f.id ORDER BY f.id) FROM fan f WHERE f.u = d.user_id), '{}'::bigint[])
              FROM decided d;
            v_done := v_done || ARRAY(SELECT x.n::integer FROM unnest(p_user_ids) WITH ORDINALITY x(u, n)
                                       WHERE x.u = ANY (v_plain));
        END LOOP;
    END IF;
    FOR r_msg IN
        SELECT x.n::integer AS n, x.u, x.m, x.t, x.tp, x.c, x.ct, x.ck, x.ttl
          FROM unnest(p_user_ids, p_message_ids, p_tiers, p_topics, p_campaign_ids, p_contents,
                      p_collapse_keys, p_ttls) WITH ORDINALITY AS x(u, m, t, tp, c, ct, ck, ttl, n)
         WHERE NOT x.n::integer = ANY (v_done)
         ORDER BY x.u, x.n
    LOOP
        RETURN QUERY
        SELECT r_msg.n, s.allowed, s.action, s.reason, s.used, s.cap, s.retry_after_ms, s.repeated, s.outbox_ids
          FROM gov.send_v1(r_msg.u, r_msg.m, r_msg.t, r_msg.tp, r_msg.c, r_msg.ct, r_msg.ck, r_msg.ttl, v_now) s;
    END LOOP;
END;
$$;
