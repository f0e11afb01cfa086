-- Undo migration 0024: no batch entry point; gov.lock_batch and gov.decide_together as
-- migration 0020 left them, gov.distribute_v1 as migration 0021 left it.

DROP FUNCTION gov.send_batch_v1(text, text[], text[], text[], text[], text[], jsonb[], text[], integer[], timestamptz);
DROP FUNCTION gov.decide_together(text[], text[], text, text, text, timestamptz);

CREATE OR REPLACE FUNCTION gov.lock_batch(p_users text[], p_message_id text, p_tier text, p_topic text) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    v_exempt boolean;
    v_topic  text := '';
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(x.u, 0))
       FROM unnest(p_users) WITH ORDINALITY AS x(u, n)
      WHERE x.u <> ''
      ORDER BY x.n;
    SELECT t.exempt INTO STRICT v_exempt FROM gov.tiers t WHERE t.tier = p_tier;
    IF p_topic IS NOT NULL THEN
        v_topic := CASE WHEN EXISTS (SELECT 1 FROM gov.caps c WHERE c.scope = 'topic' AND c.topic = p_topic)
                        THEN p_topic ELSE '*' END;
    END IF;
    -- (The earlier verdict is probed per user, by its key: every row of the campaign's
    -- earlier batches has this message id, so a join on it would read them all.)
    RETURN ARRAY(
        SELECT x.u FROM unnest(p_users) WITH ORDINALITY AS x(u, n)
          LEFT JOIN LATERAL (SELECT true AS seen FROM gov.messages m
                              WHERE m.user_id = x.u AND m.message_id = p_message_id LIMIT 1) e ON true
         WHERE x.u <> '' AND e.seen IS NULL
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
        SELECT p.u, b.u IS NULL AS ok, b.scope,
               CASE WHEN b.u IS NOT NULL THEN v_tier.on_exceed END AS act,
               CASE b.scope WHEN 'topic' THEN 'topic_cap_' WHEN 'global' THEN 'global_cap_' ELSE 'cap_' END
                   || b.w || 'ms' AS rule,
               b.n::integer AS n, b.c AS c,
               -- a slot frees when enough of the oldest rows leave the window (a cap of 0: never)
               CASE WHEN f.free_at IS NOT NULL
                    THEN greatest(0, ceil(extract(epoch FROM f.free_at - p_now) * 1000))::bigint END AS retry
          FROM unnest(p_users) p(u)
          LEFT JOIN blocked b ON b.u = p.u
          LEFT JOIN LATERAL (
                 SELECT (array_agg(s.sent_at ORDER BY s.sent_at))[b.n - b.c + 1]
                        + b.w * interval '1 millisecond' AS free_at
                   FROM gov.sends s
                  WHERE b.c > 0 AND s.user_id = b.u AND s.budget = b.budget
                    AND s.sent_at > p_now - b.w * interval '1 millisecond') f ON b.u IS NOT NULL
    ), spent AS (
        INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
        SELECT v.u, sb.b, p_now, p_message_id FROM verdict v CROSS JOIN unnest(v_spend) sb(b) WHERE v.ok
    ), decided AS (
        INSERT INTO gov.messages (user_id, message_id, tier, topic, campaign_id, allowed, action,
                                  reason, used, cap, retry_after_ms, decided_at)
        SELECT v.u, p_message_id, p_tier, p_topic, p_campaign_id, v.ok, v.act, v.rule, v.n, v.c, v.retry, p_now
          FROM verdict v
    ), logged AS (
        INSERT INTO gov.push_suppressions (user_id, message_id, tier, blocked_by, action,
                                           campaign_id, topic, blocked_scope, used, cap,
                                           retry_after_ms, created_at, segment)
        SELECT v.u, p_message_id, p_tier, v.rule, v.act, p_campaign_id, p_topic, v.scope, v.n, v.c,
               v.retry, p_now, (SELECT u.segment FROM gov.users u WHERE u.user_id = v.u)
          FROM verdict v
         WHERE NOT v.ok
         ORDER BY v.u
    )
    SELECT v.u, v.ok, v.act, v.rule, v.n, v.c, v.retry FROM verdict v;
END;
$$;

DROP FUNCTION gov.plain_users(text[], text[], text, text);

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
                             'send_many_v2')
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
