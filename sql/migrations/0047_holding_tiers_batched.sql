-- Migration 0047: a send batch decides the messages of tiers that hold (defer, collapse)
-- together too. gov.send_batch_v1 sent every such message through gov.send_v1 one by one
-- (gov.decide_core's dozen statements each, 0.5-0.9 ms), so `gov serve` grouped only the
-- sends of tiers that drop, and most of the simulation's batches were one-by-one loops. A
-- plain user with nothing held is now decided together in those tiers too; a message so
-- decided but blocked is held by gov.hold, as gov.send_v1 holds it, in the one-by-one
-- order. Same rows, same verdicts (tests/integration/test_send_batch.py compares them row
-- by row with one-by-one sends). Signature unchanged. As in sql/schema/ at this revision.

-- Send a batch of unrelated messages (any users, tiers, topics, content) in one call and
-- one transaction: what `gov serve` does with the requests that arrive together. Each
-- message gets the verdict, rows and fan-out gov.send_v1 would give it alone, one call
-- after the other in user order, then in the order given (ordinal, from 1): a user's
-- later message in the batch sees the earlier one's spend. What the batch saves is the
-- round trip and the durable commit per message (most of an allowed decision's cost),
-- and on one server the per-message work: the messages of users with one message in the
-- batch, plain ones (gov.plain_users), are decided together, per tier, topic and campaign,
-- by gov.decide_together, their content stored and fanned out in a few statements; the
-- rest go through gov.send_v1, as does everything on a Citus cluster. In a tier that
-- holds (defer, collapse) a user is plain only with nothing held (no waiting row: then
-- gov.send_v1's gov.release_owed and gov.absorb_group have nothing to do), and a message
-- decided together but blocked is held by gov.hold as gov.send_v1 holds it, in the
-- one-by-one loop's place (user order: holds compete for release minutes in that order),
-- so it gets the same rows and the same final verdict. Every user of the batch is locked
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
    v_hold  integer[] := '{}';
    r_group record;
    r_msg   record;
    r_held  record;
    v_plain text[];
    v_m     record;
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
            SELECT msg.t, msg.tp, msg.c, t.exempt OR t.on_exceed = 'drop' AS final,
                   array_agg(msg.u ORDER BY msg.u) AS us, array_agg(msg.m ORDER BY msg.u) AS ms
              FROM msg JOIN gov.tiers t ON t.tier = msg.t
             WHERE msg.mine = 1 AND msg.u <> '' AND msg.m <> ''
               AND length(msg.u) <= 256 AND length(msg.m) <= 256
               AND (p_ttls[msg.n] IS NULL OR p_ttls[msg.n] BETWEEN 1 AND 2419200)
               AND gov.content_ok(p_contents[msg.n])
               AND (t.exempt OR t.on_exceed = 'drop'
                    OR NOT EXISTS (SELECT 1 FROM gov.deferred d WHERE d.user_id = msg.u AND d.state = 'waiting'))
             GROUP BY msg.t, msg.tp, msg.c, t.exempt, t.on_exceed
            -- (a holding tier's message alone goes through gov.send_v1: pgbench, one message,
            -- 0.71-0.79 ms that way against 0.79-0.85 ms together)
            HAVING t.exempt OR t.on_exceed = 'drop' OR count(*) > 1
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
              FROM decided d
             WHERE d.allowed OR r_group.final;  -- a blocked message of a tier that holds: below
            v_done := v_done || ARRAY(SELECT x.n::integer FROM unnest(p_user_ids) WITH ORDINALITY x(u, n)
                                       WHERE x.u = ANY (v_plain));
            IF NOT r_group.final THEN
                v_hold := v_hold || ARRAY(
                    SELECT x.n::integer FROM unnest(p_user_ids) WITH ORDINALITY x(u, n)
                      JOIN gov.messages m ON m.user_id = x.u AND m.message_id = p_message_ids[x.n]
                     WHERE x.u = ANY (v_plain) AND NOT m.allowed);
            END IF;
        END LOOP;
    END IF;
    FOR r_msg IN
        SELECT x.n::integer AS n, x.u, x.m, x.t, x.tp, x.c, x.ct, x.ck, x.ttl
          FROM unnest(p_user_ids, p_message_ids, p_tiers, p_topics, p_campaign_ids, p_contents,
                      p_collapse_keys, p_ttls) WITH ORDINALITY AS x(u, m, t, tp, c, ct, ck, ttl, n)
         WHERE NOT x.n::integer = ANY (v_done) OR x.n::integer = ANY (v_hold)
         ORDER BY x.u, x.n
    LOOP
        IF r_msg.n = ANY (v_hold) THEN
            -- decided together above and blocked: what gov.send_v1 does after gov.decide_core
            -- (the content is stored; the user has nothing held for the hold to join)
            SELECT m.action, m.reason, m.used, m.cap, m.retry_after_ms, c.expires_at INTO STRICT v_m
              FROM gov.messages m
              JOIN gov.message_content c ON c.user_id = m.user_id AND c.message_id = m.message_id
             WHERE m.user_id = r_msg.u AND m.message_id = r_msg.m;
            SELECT * INTO r_held
              FROM gov.hold(r_msg.u, r_msg.m, r_msg.t, r_msg.ck, v_m.action, v_m.reason, v_m.retry_after_ms,
                            v_m.expires_at, v_now);
            IF r_held.o_action IS DISTINCT FROM v_m.action OR r_held.o_reason IS DISTINCT FROM v_m.reason THEN
                UPDATE gov.messages m SET action = r_held.o_action, reason = r_held.o_reason
                 WHERE m.user_id = r_msg.u AND m.message_id = r_msg.m;
                UPDATE gov.push_suppressions ps SET action = r_held.o_action
                 WHERE ps.user_id = r_msg.u AND ps.message_id = r_msg.m;
            END IF;
            RETURN QUERY SELECT r_msg.n, false, r_held.o_action, r_held.o_reason, v_m.used, v_m.cap,
                                v_m.retry_after_ms, false, '{}'::bigint[];
            CONTINUE;
        END IF;
        RETURN QUERY
        SELECT r_msg.n, s.allowed, s.action, s.reason, s.used, s.cap, s.retry_after_ms, s.repeated, s.outbox_ids
          FROM gov.send_v1(r_msg.u, r_msg.m, r_msg.t, r_msg.tp, r_msg.c, r_msg.ct, r_msg.ck, r_msg.ttl, v_now) s;
    END LOOP;
END;
$$;
