-- Migration 0024: gov.send_batch_v1, many unrelated messages sent in one call and one
-- transaction (gov serve groups the requests that arrive together). On one server its
-- plain messages are decided together: gov.decide_together now takes a message id per
-- user (the campaign's form, one id for all, calls it), and gov.plain_users is the
-- plain-user filter gov.lock_batch applied. gov.distribute_v1 delegates the batch by its
-- shard key on a Citus cluster, planned per call there.

-- The plain ones among users already locked, each with its own message id: those
-- gov.decide_together can decide, with no earlier verdict for their message and, unless
-- the tier is exempt, no time zone, no caps of their own, no opt-out of the topic and no
-- segment with windows of its own. An empty or NULL id is never plain (gov.decide_core
-- refuses it). The tier must exist. Users come back in the order given.
CREATE FUNCTION gov.plain_users(p_users text[], p_message_ids text[], p_tier text, p_topic text) RETURNS text[]
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
                                   AND (u.time_zone IS NOT NULL
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
-- (gov.plain_users) for the campaign's one message id.
CREATE OR REPLACE FUNCTION gov.lock_batch(p_users text[], p_message_id text, p_tier text, p_topic text) RETURNS text[]
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(x.u, 0))
       FROM unnest(p_users) WITH ORDINALITY AS x(u, n)
      WHERE x.u <> ''
      ORDER BY x.n;
    RETURN gov.plain_users(p_users, array_fill(p_message_id, ARRAY[coalesce(cardinality(p_users), 0)]),
                           p_tier, p_topic);
END;
$$;

-- Decide one tier's messages for plain users (gov.plain_users: locked, and none of what
-- makes a user's decision their own), each user with their own message id, in one
-- statement, with the verdicts and the message, suppression and send rows
-- gov.decide_core gives each of them: every window of every rule counted per user (one
-- range scan per budget over its longest window), the first that blocks in decision
-- order, the moment a slot frees for it. A fraction of a decision's cost per user. A
-- user appears once (a second message of theirs would not see the first's spend).
-- Rows come in no promised order.
CREATE FUNCTION gov.decide_together(
    p_users       text[],
    p_message_ids text[],
    p_tier        text,
    p_topic       text,
    p_campaign_id text,
    p_now         timestamptz
) RETURNS TABLE (
    user_id        text,
    allowed        boolean,
    action         text,
    reason         text,
    used           integer,
    cap            integer,
    retry_after_ms bigint
)
LANGUAGE plpgsql
-- Generic plans, as gov.decide_core: the statement below, planned per call, cost a
-- small batch (gov serve's) twice what it cost to run (pgbench, docs/performance.md).
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_tier  gov.tiers%ROWTYPE;
    v_topic text := '';
    v_spend text[];
BEGIN
    SELECT * INTO STRICT v_tier FROM gov.tiers t WHERE t.tier = p_tier;
    IF p_topic IS NOT NULL THEN
        v_topic := CASE WHEN EXISTS (SELECT 1 FROM gov.caps c WHERE c.scope = 'topic' AND c.topic = p_topic)
                        THEN p_topic ELSE '*' END;
    END IF;
    -- What an allowed message spends, as gov.decide_core writes it.
    v_spend := CASE WHEN v_tier.exempt THEN '{}'::text[] ELSE ARRAY(
        SELECT DISTINCT CASE WHEN r.scope = 'topic' THEN 'topic:' || p_topic ELSE r.budget END
          FROM gov.compiled_rules r
         WHERE r.tier = p_tier AND r.topic = v_topic) END;
    RETURN QUERY
    WITH rules AS (
        SELECT r.seq, r.scope, r.windows, r.caps,
               CASE WHEN r.scope = 'topic' THEN 'topic:' || p_topic ELSE r.budget END AS budget
          FROM gov.compiled_rules r
         WHERE NOT v_tier.exempt AND r.tier = p_tier AND r.topic = v_topic AND r.segment = ''
    ), checked AS (
        SELECT p.u, r.seq, r.scope, r.budget, x.i, x.w, x.c,
               CASE WHEN x.i <= 4 THEN k.counts[x.i]
                    ELSE (SELECT count(*) FROM gov.sends s
                           WHERE s.user_id = p.u AND s.budget = r.budget
                             AND s.sent_at > p_now - x.w * interval '1 millisecond') END AS n
          FROM unnest(p_users) p(u)
         CROSS JOIN rules r
         CROSS JOIN LATERAL (
                SELECT ARRAY[count(*) FILTER (WHERE s.sent_at > p_now - r.windows[1] * interval '1 millisecond'),
                             count(*) FILTER (WHERE s.sent_at > p_now - r.windows[2] * interval '1 millisecond'),
                             count(*) FILTER (WHERE s.sent_at > p_now - r.windows[3] * interval '1 millisecond'),
                             count(*) FILTER (WHERE s.sent_at > p_now - r.windows[4] * interval '1 millisecond')]
                       AS counts
                  FROM gov.sends s
                 WHERE s.user_id = p.u AND s.budget = r.budget
                   AND s.sent_at > p_now - r.windows[least(cardinality(r.windows), 4)] * interval '1 millisecond') k
         CROSS JOIN LATERAL unnest(r.windows, r.caps) WITH ORDINALITY AS x(w, c, i)
    ), blocked AS (
        SELECT DISTINCT ON (ch.u) ch.u, ch.scope, ch.budget, ch.w, ch.c, ch.n
          FROM checked ch
         WHERE ch.n >= ch.c
         ORDER BY ch.u, ch.seq, ch.i
    ), verdict AS (
        SELECT p.u, p.m, b.u IS NULL AS ok, b.scope,
               CASE WHEN b.u IS NOT NULL THEN v_tier.on_exceed END AS act,
               CASE b.scope WHEN 'topic' THEN 'topic_cap_' WHEN 'global' THEN 'global_cap_' ELSE 'cap_' END
                   || b.w || 'ms' AS rule,
               b.n::integer AS n, b.c AS c,
               -- a slot frees when enough of the oldest rows leave the window (a cap of 0: never)
               CASE WHEN f.free_at IS NOT NULL
                    THEN greatest(0, ceil(extract(epoch FROM f.free_at - p_now) * 1000))::bigint END AS retry
          FROM unnest(p_users, p_message_ids) p(u, m)
          LEFT JOIN blocked b ON b.u = p.u
          LEFT JOIN LATERAL (
                 SELECT (array_agg(s.sent_at ORDER BY s.sent_at))[b.n - b.c + 1]
                        + b.w * interval '1 millisecond' AS free_at
                   FROM gov.sends s
                  WHERE b.c > 0 AND s.user_id = b.u AND s.budget = b.budget
                    AND s.sent_at > p_now - b.w * interval '1 millisecond') f ON b.u IS NOT NULL
    ), spent AS (
        INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
        SELECT v.u, sb.b, p_now, v.m FROM verdict v CROSS JOIN unnest(v_spend) sb(b) WHERE v.ok
    ), decided AS (
        INSERT INTO gov.messages (user_id, message_id, tier, topic, campaign_id, allowed, action,
                                  reason, used, cap, retry_after_ms, decided_at)
        SELECT v.u, v.m, p_tier, p_topic, p_campaign_id, v.ok, v.act, v.rule, v.n, v.c, v.retry, p_now
          FROM verdict v
    ), logged AS (
        INSERT INTO gov.push_suppressions (user_id, message_id, tier, blocked_by, action,
                                           campaign_id, topic, blocked_scope, used, cap,
                                           retry_after_ms, created_at, segment)
        SELECT v.u, v.m, p_tier, v.rule, v.act, p_campaign_id, p_topic, v.scope, v.n, v.c,
               v.retry, p_now, (SELECT u.segment FROM gov.users u WHERE u.user_id = v.u)
          FROM verdict v
         WHERE NOT v.ok
         ORDER BY v.u
    )
    SELECT v.u, v.ok, v.act, v.rule, v.n, v.c, v.retry FROM verdict v;
END;
$$;

-- A campaign's form of it: one message id for every user.
CREATE OR REPLACE FUNCTION gov.decide_together(
    p_users       text[],
    p_message_id  text,
    p_tier        text,
    p_topic       text,
    p_campaign_id text,
    p_now         timestamptz
) RETURNS TABLE (
    user_id        text,
    allowed        boolean,
    action         text,
    reason         text,
    used           integer,
    cap            integer,
    retry_after_ms bigint
)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM gov.decide_together(
        p_users, array_fill(p_message_id, ARRAY[coalesce(cardinality(p_users), 0)]), p_tier, p_topic,
        p_campaign_id, p_now);
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
CREATE FUNCTION gov.send_batch_v1(
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
            v_plain := gov.plain_users(r_group.us, r_group.ms, r_group.t, r_group.tp);
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

CREATE OR REPLACE FUNCTION gov.distribute_v1() RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    v_name text;
    v_fn   regprocedure;
    v_arg  text;
    v_moved text[] := '{}';
BEGIN
    IF NOT gov.on_citus() THEN
        RETURN;
    END IF;
    -- the user tables carry triggers that write colocated rows (the accepted event, the
    -- user-cap ceiling); Citus runs them on the shards
    SET LOCAL citus.enable_unsafe_triggers = on;
    FOREACH v_name IN ARRAY ARRAY['gov.tiers', 'gov.tier_consumes', 'gov.caps', 'gov.settings',
                                  'gov.segment_caps', 'gov.compiled_rules', 'gov.policy_versions'] LOOP
        -- (a table with a foreign key to one made a reference table first is already a
        -- Citus table, a "local" one on the coordinator alone: it becomes a reference table too)
        IF NOT EXISTS (SELECT 1 FROM citus_tables t
                        WHERE t.table_name = v_name::regclass AND t.citus_table_type = 'reference') THEN
            PERFORM create_reference_table(v_name);
            v_moved := v_moved || v_name;
            RETURN NEXT v_name || ': reference table';
        END IF;
    END LOOP;
    -- parents before the tables whose foreign keys point at them
    FOREACH v_name IN ARRAY ARRAY['gov.users', 'gov.user_caps', 'gov.user_topic_optouts', 'gov.messages',
                                  'gov.sends', 'gov.push_suppressions', 'gov.deferred', 'gov.subscriptions',
                                  'gov.message_content', 'gov.outbox', 'gov.delivery_attempts',
                                  'gov.push_events'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = v_name::regclass) THEN
            IF v_name = 'gov.users' THEN
                PERFORM create_distributed_table(v_name, 'user_id');
            ELSE
                PERFORM create_distributed_table(v_name, 'user_id', colocate_with => 'gov.users');
            END IF;
            v_moved := v_moved || v_name;
            RETURN NEXT v_name || ': distributed by user_id';
        END IF;
    END LOOP;
    -- The schema revision, on every node: gov dispatch, gov release and gov serve check it at
    -- start, and a client may enter the cluster at any node (a multi-host URL). Alembic
    -- keeps updating it through the coordinator.
    IF to_regclass('public.gov_alembic_version') IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM pg_dist_partition p
                        WHERE p.logicalrelid = to_regclass('public.gov_alembic_version')) THEN
        PERFORM create_reference_table('public.gov_alembic_version');
        v_moved := v_moved || 'public.gov_alembic_version'::text;
        RETURN NEXT 'public.gov_alembic_version: reference table';
    END IF;
    -- the rows now live in the shards; the coordinator's local copies go once no local
    -- table's foreign key points at them any more
    FOREACH v_name IN ARRAY v_moved LOOP
        PERFORM truncate_local_data_after_distributing_table(v_name);
    END LOOP;
    -- the functions that run whole on the worker holding their first argument's shard
    FOR v_fn, v_arg IN
        SELECT p.oid::regprocedure, p.proargnames[1]
          FROM pg_proc p
         WHERE p.pronamespace = 'gov'::regnamespace
           AND p.proname IN ('decide_v1', 'send_v1', 'claim_outbox_v3', 'release_due_v2', 'decide_many_v2',
                             'send_many_v2', 'send_batch_v1')
           AND NOT EXISTS (SELECT 1 FROM pg_dist_object o
                            WHERE o.classid = 'pg_proc'::regclass AND o.objid = p.oid
                              AND o.distribution_argument_index IS NOT NULL)
    LOOP
        PERFORM create_distributed_function(v_fn, v_arg, colocate_with => 'gov.users');
        RETURN NEXT v_fn::text || ': delegated by ' || v_arg;
    END LOOP;
    -- On a worker a generic plan of the decision's statements cannot be routed to the
    -- user's shard ("could not create distributed plan"): Citus plans them per call.
    IF EXISTS (SELECT 1 FROM pg_proc p
                WHERE p.oid = 'gov.decide_core(text,text,text,text,text,timestamptz,boolean)'::regprocedure
                  AND p.proconfig IS NOT NULL) THEN
        ALTER FUNCTION gov.decide_core(text, text, text, text, text, timestamptz, boolean) RESET plan_cache_mode;
        RETURN NEXT 'gov.decide_core: planned per call';
    END IF;
    -- (and the batch, whose setting would hold for the gov.decide_core it calls)
    IF EXISTS (SELECT 1 FROM pg_proc p
                WHERE p.oid = 'gov.send_batch_v1(text, text[], text[], text[], text[], text[], jsonb[], text[], integer[], timestamptz)'::regprocedure
                  AND p.proconfig IS NOT NULL) THEN
        ALTER FUNCTION gov.send_batch_v1(text, text[], text[], text[], text[], text[], jsonb[], text[], integer[],
                                         timestamptz) RESET plan_cache_mode;
        RETURN NEXT 'gov.send_batch_v1: planned per call';
    END IF;
    -- The user's lock must be one lock wherever a decision runs (gov.cluster_user_lock):
    -- here, the user's row, locked on its shard.
    IF NOT EXISTS (SELECT 1 FROM pg_proc p
                    WHERE p.oid = 'gov.cluster_user_lock(text)'::regprocedure
                      AND p.prolang = (SELECT l.oid FROM pg_language l WHERE l.lanname = 'plpgsql')) THEN
        EXECUTE $fn$
            CREATE OR REPLACE FUNCTION gov.cluster_user_lock(p_user_id text) RETURNS void
            LANGUAGE plpgsql AS $body$
            BEGIN
                INSERT INTO gov.users (user_id) VALUES (p_user_id) ON CONFLICT DO NOTHING;
                PERFORM 1 FROM gov.users u WHERE u.user_id = p_user_id FOR UPDATE;
            END;
            $body$
        $fn$;
        RETURN NEXT 'gov.cluster_user_lock: the user''s row';
    END IF;
    -- every other function on every node too: a delegated function calls them there.
    -- (Citus creates a new function on every node by itself, but not one created before
    -- the tables its signature names were distributed.)
    FOR v_fn IN
        SELECT p.oid::regprocedure
          FROM pg_proc p
         WHERE p.pronamespace = 'gov'::regnamespace
           AND NOT EXISTS (SELECT 1 FROM pg_dist_object o WHERE o.classid = 'pg_proc'::regclass AND o.objid = p.oid)
    LOOP
        PERFORM create_distributed_function(v_fn);
        RETURN NEXT v_fn::text || ': on every node';
    END LOOP;
END;
$$;
