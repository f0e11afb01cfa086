-- Migration 0040 (issue 31, the first run): a user with a time zone who is outside their
-- quiet hours at the decision's moment is plain (gov.plain_users), so a campaign's or a
-- batch's message for them is decided together with the others (gov.decide_together)
-- instead of one by one through gov.send_v1. A time zone changes gov.decide_core's
-- verdict only through gov.quiet_until, and plain_users now asks that same function at
-- the same moment. The default `gov simulate` decided about 10,500 P2 campaign messages
-- of such users one by one (docs/performance.md, stop 42). gov.plain_users and
-- gov.lock_batch take the moment (p_now); their callers pass it. Signatures of the
-- released functions unchanged. As in sql/schema/ at this revision.
DROP FUNCTION gov.lock_batch(text[], text, text, text);
DROP FUNCTION gov.plain_users(text[], text[], text, text);

-- The plain ones among users already locked, each with its own message id: those
-- gov.decide_together can decide at p_now, with no earlier verdict for their message and,
-- unless the tier is exempt, outside their quiet hours at p_now (gov.quiet_until, the
-- clock gov.decide_core consults: a time zone changes a decision only through it), no
-- caps of their own, no opt-out of the topic and no segment with windows of its own. An
-- empty or NULL id is never plain (gov.decide_core refuses it). The tier must exist.
-- Users come back in the order given.
CREATE FUNCTION gov.plain_users(p_users text[], p_message_ids text[], p_tier text, p_topic text,
                                p_now timestamptz) RETURNS text[]
LANGUAGE plpgsql
-- (generic plans, as gov.decide_core: planning the probe for a batch of one cost more than running it)
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_exempt boolean;
    v_topic  text := '';
BEGIN
    SELECT t.exempt INTO STRICT v_exempt FROM gov.tiers t WHERE t.tier = p_tier;
    IF p_topic IS NOT NULL THEN
        v_topic := CASE WHEN EXISTS (SELECT 1 FROM gov.caps c WHERE c.scope = 'topic' AND c.topic = p_topic)
                        THEN p_topic ELSE '*' END;
    END IF;
    -- (The earlier verdict is probed per user, by its key: every row of a campaign's
    -- earlier batches has the campaign's message id, so a join on it would read them all.)
    RETURN ARRAY(
        SELECT x.u FROM unnest(p_users, p_message_ids) WITH ORDINALITY AS x(u, m, n)
          LEFT JOIN LATERAL (SELECT true AS seen FROM gov.messages m
                              WHERE m.user_id = x.u AND m.message_id = x.m LIMIT 1) e ON true
         WHERE x.u <> '' AND x.m <> '' AND e.seen IS NULL
           AND (v_exempt OR (
                    NOT EXISTS (SELECT 1 FROM gov.users u
                                 WHERE u.user_id = x.u
                                   AND ((u.time_zone IS NOT NULL AND gov.quiet_until(u.user_id, p_now) > p_now)
                                        OR EXISTS (SELECT 1 FROM gov.compiled_rules r
                                                    WHERE r.tier = p_tier AND r.topic = v_topic
                                                      AND r.segment = u.segment)))
                AND NOT EXISTS (SELECT 1 FROM gov.user_caps uc WHERE uc.user_id = x.u)
                AND NOT (p_topic IS NOT NULL
                         AND EXISTS (SELECT 1 FROM gov.user_topic_optouts o
                                      WHERE o.user_id = x.u AND o.topic = p_topic))))
         ORDER BY x.n);
END;
$$;

-- A campaign batch's first step on one server: lock every user of the batch (sorted,
-- distinct), in that order, the order every batch uses, so two batches never wait on each
-- other in a cycle (a single send locks one user only); then return the plain ones
-- (gov.plain_users) for the campaign's one message id at p_now.
CREATE FUNCTION gov.lock_batch(p_users text[], p_message_id text, p_tier text, p_topic text,
                               p_now timestamptz) RETURNS text[]
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(x.u, 0))
       FROM unnest(p_users) WITH ORDINALITY AS x(u, n)
      WHERE x.u <> ''
      ORDER BY x.n;
    RETURN gov.plain_users(p_users, array_fill(p_message_id, ARRAY[coalesce(cardinality(p_users), 0)]),
                           p_tier, p_topic, p_now);
END;
$$;

-- Decide one message for many users in one call and one transaction, with the verdicts
-- and suppression rows one-by-one decisions (gov.decide_core) would give, but one commit
-- for the batch instead of one per user. Callers keep batches modest
-- (gov.Governor.decide_many: 500): every user lock is held until the batch commits, and
-- they share the server's lock table. Rows come in no promised order.
-- On one server the batch's plain users are decided together (gov.lock_batch,
-- gov.decide_together); everyone else, and every user on a Citus cluster, goes through
-- gov.decide_core, in user order.
-- p_shard_key: on a Citus cluster the batch is one shard's users and is decided on the
-- worker that holds them (gov.shard_groups_v1 splits an audience); NULL on one server.
CREATE OR REPLACE FUNCTION gov.decide_many_v2(
    p_shard_key   text,
    p_user_ids    text[],
    p_message_id  text,
    p_tier        text,
    p_topic       text        DEFAULT NULL,
    p_campaign_id text        DEFAULT NULL,
    p_now         timestamptz DEFAULT NULL
) RETURNS TABLE (
    user_id        text,
    allowed        boolean,
    action         text,
    reason         text,
    used           integer,
    cap            integer,
    retry_after_ms bigint,
    repeated       boolean
)
LANGUAGE plpgsql AS $$
DECLARE
    v_now   timestamptz := coalesce(p_now, clock_timestamp());
    v_users text[];
    v_plain text[] := '{}';
    r_user  record;
BEGIN
    PERFORM gov.require_one_shard(p_shard_key, p_user_ids);
    v_users := ARRAY(SELECT DISTINCT u FROM unnest(p_user_ids) u ORDER BY 1);
    -- Bad input (an unknown tier, no message id, an empty user id) is decide_core's to refuse.
    IF p_message_id <> '' AND EXISTS (SELECT 1 FROM gov.tiers t WHERE t.tier = p_tier)
       AND NOT gov.distributed() THEN
        v_plain := gov.lock_batch(v_users, p_message_id, p_tier, p_topic, v_now);
        RETURN QUERY
        SELECT d.user_id, d.allowed, d.action, d.reason, d.used, d.cap, d.retry_after_ms, false
          FROM gov.decide_together(v_plain, p_message_id, p_tier, p_topic, p_campaign_id, v_now) d;
    END IF;
    FOR r_user IN SELECT u AS id FROM unnest(v_users) u WHERE NOT u = ANY (v_plain) OR u IS NULL ORDER BY 1 LOOP
        RETURN QUERY
        SELECT r_user.id, d.allowed, d.action, d.reason, d.used, d.cap, d.retry_after_ms, d.repeated
          FROM gov.decide_core(r_user.id, p_message_id, p_tier, p_topic, p_campaign_id, v_now, false) d;
    END LOOP;
END;
$$;

-- The same for sends: decide, store the content, fan out or hold, per user, with what
-- gov.send_v1 gives each. On one server, for a tier that holds nothing (exempt, or one
-- that drops), the plain users are decided together and their content stored and fanned
-- out in a few statements; a tier that defers or collapses sends everyone through
-- gov.send_v1, as does a Citus cluster. Rows come in no promised order.
CREATE OR REPLACE FUNCTION gov.send_many_v2(
    p_shard_key    text,
    p_user_ids     text[],
    p_message_id   text,
    p_tier         text,
    p_topic        text,
    p_campaign_id  text,
    p_content      jsonb,
    p_collapse_key text,
    p_ttl_s        integer,
    p_now          timestamptz DEFAULT NULL
) RETURNS TABLE (
    user_id        text,
    allowed        boolean,
    action         text,
    reason         text,
    repeated       boolean,
    outbox_ids     bigint[]
)
LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz := coalesce(p_now, clock_timestamp());
    v_users  text[];
    v_plain  text[] := '{}';
    v_ttl_s  integer;
    v_u      text[];
    v_ok     boolean[];
    v_action text[];
    v_reason text[];
    r_user   record;
BEGIN
    PERFORM gov.require_one_shard(p_shard_key, p_user_ids);
    v_users := ARRAY(SELECT DISTINCT u FROM unnest(p_user_ids) u ORDER BY 1);
    SELECT coalesce(p_ttl_s, t.default_ttl_s) INTO v_ttl_s
      FROM gov.tiers t WHERE t.tier = p_tier AND (t.exempt OR t.on_exceed = 'drop');
    -- Bad input (an unknown tier, no message id, a TTL under a second, an empty user id)
    -- is send_v1's to refuse.
    IF FOUND AND p_message_id <> '' AND (p_ttl_s IS NULL OR p_ttl_s >= 1) AND NOT gov.distributed() THEN
        v_plain := gov.lock_batch(v_users, p_message_id, p_tier, p_topic, v_now);
        SELECT coalesce(array_agg(d.user_id), '{}'), coalesce(array_agg(d.allowed), '{}'),
               coalesce(array_agg(d.action), '{}'), coalesce(array_agg(d.reason), '{}')
          INTO v_u, v_ok, v_action, v_reason
          FROM gov.decide_together(v_plain, p_message_id, p_tier, p_topic, p_campaign_id, v_now) d;
        -- every decided message keeps its content, as send_v1 stores it (a drop too)
        INSERT INTO gov.message_content (user_id, message_id, content, collapse_key, ttl_s, expires_at)
        SELECT u, p_message_id, p_content, p_collapse_key, v_ttl_s, v_now + v_ttl_s * interval '1 second'
          FROM unnest(v_u) u;
        RETURN QUERY
        WITH fan AS (  -- gov.fan_out for every allowed user: one outbox row per live endpoint
            INSERT INTO gov.outbox (user_id, message_id, subscription_id, next_attempt_at, created_at)
            SELECT s.user_id, p_message_id, s.id, v_now, v_now
              FROM gov.subscriptions s
              JOIN unnest(v_u, v_ok) AS d(u, ok) ON d.u = s.user_id AND d.ok
             WHERE s.retired_at IS NULL
             ORDER BY s.user_id, s.id
            RETURNING gov.outbox.user_id AS u, gov.outbox.id
        )
        SELECT d.u, d.ok, d.act, d.why, false,
               coalesce((SELECT array_agg(f.id ORDER BY f.id) FROM fan f WHERE f.u = d.u), '{}'::bigint[])
          FROM unnest(v_u, v_ok, v_action, v_reason) AS d(u, ok, act, why);
    END IF;
    FOR r_user IN SELECT u AS id FROM unnest(v_users) u WHERE NOT u = ANY (v_plain) OR u IS NULL ORDER BY 1 LOOP
        RETURN QUERY
        SELECT r_user.id, s.allowed, s.action, s.reason, s.repeated, s.outbox_ids
          FROM gov.send_v1(r_user.id, p_message_id, p_tier, p_topic, p_campaign_id, p_content,
                           p_collapse_key, p_ttl_s, v_now) s;
    END LOOP;
END;
$$;

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
        -- (bad input, an unknown tier, no message id, a TTL under a second, an empty user
        -- id, is left to gov.send_v1 to refuse)
        FOR r_group IN
            WITH msg AS (
                SELECT x.*, count(*) OVER (PARTITION BY x.u) AS mine
                  FROM unnest(p_user_ids, p_message_ids, p_tiers, p_topics, p_campaign_ids)
                       WITH ORDINALITY AS x(u, m, t, tp, c, n)
            )
            SELECT msg.t, msg.tp, msg.c, array_agg(msg.u ORDER BY msg.u) AS us, array_agg(msg.m ORDER BY msg.u) AS ms
              FROM msg JOIN gov.tiers t ON t.tier = msg.t AND (t.exempt OR t.on_exceed = 'drop')
             WHERE msg.mine = 1 AND msg.u <> '' AND msg.m <> ''
               AND (p_ttls[msg.n] IS NULL OR p_ttls[msg.n] >= 1)
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
