-- Migration 0034: a decision on a Citus cluster runs statements Citus can cache (issue 28,
-- item 2). The decision's reads of the policy tables go through small SQL functions
-- (gov.policy_tier, policy_caps, policy_rules, policy_spend), which gov.distribute_v1 binds
-- to the reference tables' local copies; the probes for a topic and a segment run only when
-- their condition can hold; an allowed message's send rows are single-row inserts.
-- On one server the statements read the same tables as before.

-- The decision's reads of the policy tables, one small SQL function each, which
-- PostgreSQL inlines into the statement that calls it. On one server they read the
-- tables. On a Citus cluster the policy tables are reference tables, and a statement that
-- names one is planned again by Citus on every call (its shard query deparsed, parsed and
-- planned: docs/scale-out.md, "Where a delegated decision's time goes"); gov.distribute_v1
-- binds these functions to the tables' local copies instead (every node holds a reference
-- table's one shard, under the same name), which PostgreSQL plans once per session like any
-- table. Reads only: a write to a copy would bypass Citus's replication. Where a node holds
-- no copies, the functions read the Citus tables in PL/pgSQL (p_citus): Citus refuses a
-- parameterised SQL function over its tables. One text, this function, for every binding.
CREATE FUNCTION gov.bind_policy_reads(p_tiers text, p_caps text, p_rules text, p_citus boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql AS $bind$
DECLARE
    v_def text;
    v_fn  record;
BEGIN
    FOR v_fn IN
        SELECT * FROM (VALUES
            -- a tier's row
            ('gov.policy_tier(p_tier text)', 'SETOF gov.tiers',
             format('SELECT * FROM %s t WHERE t.tier = p_tier', p_tiers)),
            -- the caps of a scope (and topic)
            ('gov.policy_caps(p_scope text, p_topic text)', 'SETOF gov.caps',
             format('SELECT * FROM %s c WHERE c.scope = p_scope AND c.topic = p_topic', p_caps)),
            -- the compiled rules of one (tier, topic, segment) group
            ('gov.policy_rules(p_tier text, p_topic text, p_segment text)', 'SETOF gov.compiled_rules',
             format('SELECT * FROM %s r WHERE r.tier = p_tier AND r.topic = p_topic AND r.segment = p_segment',
                    p_rules)),
            -- the budgets an allowed message of p_tier spends in (any segment's: a change of
            -- segment finds the history it needs); p_topic_key is the rules' topic ('', '*', the topic)
            ('gov.policy_spend(p_tier text, p_topic_key text, p_topic text)', 'SETOF text',
             format('SELECT DISTINCT CASE WHEN r.scope = ''topic'' THEN ''topic:'' || p_topic ELSE r.budget END'
                    ' FROM %s r WHERE r.tier = p_tier AND r.topic = p_topic_key', p_rules))
        ) f(signature, result, query)
    LOOP
        IF p_citus THEN
            v_def := format('LANGUAGE plpgsql STABLE AS %L', 'BEGIN RETURN QUERY ' || v_fn.query || '; END');
        ELSE
            v_def := format('LANGUAGE sql STABLE AS %L', v_fn.query);
        END IF;
        EXECUTE format('CREATE OR REPLACE FUNCTION %s RETURNS %s %s', v_fn.signature, v_fn.result, v_def);
    END LOOP;
END;
$bind$;

SELECT gov.bind_policy_reads('gov.tiers', 'gov.caps', 'gov.compiled_rules');

-- The decision itself, shared by a first decision (gov.decide_v1, gov.send_v1) and a
-- re-decision at release (p_release: the message was decided before and waited; it
-- is decided again now, its verdict updated, and no second suppression is logged).
-- The rules come compiled (gov.compiled_rules, written at `gov policy apply`): one index
-- scan for the (tier, topic, segment) group, a user's own caps joined only for a user
-- who has any. Each budget's windows are counted in one range scan of gov.sends over the
-- longest of them; the moment a slot frees is computed only for the window that blocks.
-- An allowed message writes a send row only for the budgets some cap reads.
CREATE OR REPLACE FUNCTION gov.decide_core(
    p_user_id     text,
    p_message_id  text,
    p_tier        text,
    p_topic       text,
    p_campaign_id text,
    p_now         timestamptz,
    p_release     boolean
) RETURNS TABLE (
    allowed        boolean,
    action         text,
    reason         text,
    used           integer,
    cap            integer,
    retry_after_ms bigint,
    repeated       boolean
)
LANGUAGE plpgsql
-- One generic plan per statement, kept for the session: measured, re-planning the rule
-- query on every call (PostgreSQL's custom plans for the first calls, and whenever the
-- generic one looks dearer) was most of a decision's server time.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_tier    gov.tiers%ROWTYPE;
    v_msg     gov.messages%ROWTYPE;
    r_rule    record;
    v_used    integer;
    v_cap     integer;
    v_rule    text;
    v_scope   text;
    v_action  text;
    v_free_at timestamptz;
    v_segment text;
    v_seg_key text := '';
    v_tz      text;
    v_topic   text := '';
    v_own     boolean;
    v_budget  text;
    v_window  bigint;
    v_counts  bigint[];
    v_uc      jsonb;
    v_spend   text[];
    c_rules   refcursor;
BEGIN
    IF p_user_id IS NULL OR p_user_id = '' THEN
        RAISE EXCEPTION 'user_id is required' USING ERRCODE = 'GV001';
    END IF;
    IF p_message_id IS NULL OR p_message_id = '' THEN
        RAISE EXCEPTION 'message id is required (user %)', p_user_id USING ERRCODE = 'GV001';
    END IF;
    SELECT * INTO v_tier FROM gov.policy_tier(p_tier) t;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown tier % for message % (the policy defines: %)', p_tier, p_message_id,
            (SELECT string_agg(t.tier, ', ' ORDER BY t.tier) FROM gov.tiers t)
            USING ERRCODE = 'GV001';
    END IF;

    PERFORM pg_advisory_xact_lock(hashtextextended(p_user_id, 0));
    PERFORM gov.cluster_user_lock(p_user_id);

    -- Idempotent on (user, message): a repeat returns the first verdict, spends nothing.
    IF NOT p_release THEN
        SELECT * INTO v_msg FROM gov.messages m
         WHERE m.user_id = p_user_id AND m.message_id = p_message_id;
        IF FOUND THEN
            RETURN QUERY SELECT v_msg.allowed, v_msg.action, v_msg.reason, v_msg.used, v_msg.cap,
                                v_msg.retry_after_ms, true;
            RETURN;
        END IF;
    END IF;

    IF NOT v_tier.exempt THEN
        -- The user's segment and time zone, read once under the user's lock. The segment
        -- chooses the windows of each consumed tier when the policy has that segment's
        -- (its own group of compiled rules); any other segment, or none, reads group ''.
        SELECT u.segment, u.time_zone INTO v_segment, v_tz FROM gov.users u WHERE u.user_id = p_user_id;
        -- (Each probe below runs only when its condition can hold, in an IF of its own: a
        -- condition joined by AND to an EXISTS is one statement, which on a Citus cluster
        -- is planned again on every call, topic or not, segment or not.)
        -- The topic's own caps when it has any, else those of "*" ('' without a topic).
        IF p_topic IS NOT NULL THEN
            v_topic := CASE WHEN EXISTS (SELECT 1 FROM gov.policy_caps('topic', p_topic)) THEN p_topic ELSE '*' END;
        END IF;
        IF v_segment IS NOT NULL THEN
            IF EXISTS (SELECT 1 FROM gov.policy_rules(p_tier, v_topic, v_segment)) THEN
                v_seg_key := v_segment;
            END IF;
        END IF;
        -- A topic the user opted out of (the preference centre) is dropped, whatever
        -- the verb and the hour: holding it through the night would only drop it later.
        IF p_topic IS NOT NULL THEN
            PERFORM 1 FROM gov.user_topic_optouts o WHERE o.user_id = p_user_id AND o.topic = p_topic;
            IF FOUND THEN
                v_rule := 'topic_opt_out';
                v_scope := 'topic';
                v_action := 'drop';
            END IF;
        END IF;
        IF v_rule IS NULL AND v_tz IS NOT NULL THEN
            -- Quiet hours first: whatever the tier's verb, a message that arrives inside
            -- them waits until they end. Only a user with a time zone has them; P0
            -- (exempt) is never quieted.
            v_free_at := gov.quiet_until(p_user_id, v_now);
        END IF;
        IF v_rule IS NOT NULL THEN
            NULL;  -- opted out: decided above
        ELSIF v_free_at > v_now THEN
            v_rule := 'quiet_hours';
            v_scope := 'quiet_hours';
            v_action := 'defer';
        ELSE
            v_free_at := NULL;
            -- Does the user have caps of their own? Then each window's cap is the least of
            -- the default and theirs, and their cap over a window the segment's windows
            -- lack still holds on its own: segment windows never lift a user's own limit.
            -- (Read alone, not joined: the rule query then reads only policy tables, which on a
            -- Citus cluster are reference tables beside the user's shard.)
            SELECT jsonb_agg(jsonb_build_object('scope', uc.scope, 'window_ms', uc.window_ms, 'cap', uc.cap))
              INTO v_uc
              FROM gov.user_caps uc WHERE uc.user_id = p_user_id;
            v_own := v_uc IS NOT NULL;
            -- Two queries, one cursor: a plan is initialised whole on every execution,
            -- and the own-caps query's nodes (lateral, sorts, jsonb functions) were a fifth
            -- of a plain user's decision when both stood in one UNION ALL (docs/performance.md).
            IF v_own THEN
                OPEN c_rules FOR
                    SELECT r.seq, r.budget, r.scope, o.windows, o.caps
                      FROM gov.compiled_rules r
                     CROSS JOIN LATERAL (
                            SELECT array_agg(x.w ORDER BY x.w) AS windows, array_agg(x.c ORDER BY x.w) AS caps
                              FROM (SELECT d.w, least(d.c, uc.cap) AS c
                                      FROM unnest(r.windows, r.caps) AS d(w, c)
                                      LEFT JOIN jsonb_to_recordset(v_uc) AS uc(scope text, window_ms bigint, cap integer)
                                             ON uc.scope = r.scope AND uc.window_ms = d.w
                                    UNION ALL
                                    SELECT uo.window_ms, uo.cap
                                      FROM jsonb_to_recordset(v_uc) AS uo(scope text, window_ms bigint, cap integer)
                                     WHERE uo.scope = r.scope
                                       AND r.scope NOT IN ('topic', 'global')
                                       AND EXISTS (SELECT 1 FROM gov.segment_caps s
                                                    WHERE s.tier = r.scope AND s.segment = v_seg_key)
                                       AND NOT uo.window_ms = ANY (r.windows)
                                       -- only a cap with a default to lower, as the guard admits
                                       AND gov.user_cap_ceiling(uo.scope, uo.window_ms) IS NOT NULL) x
                           ) o
                     WHERE r.tier = p_tier AND r.topic = v_topic AND r.segment = v_seg_key
                     ORDER BY 1;
            ELSE
                OPEN c_rules FOR
                    SELECT r.seq, r.budget, r.scope, r.windows, r.caps
                      FROM gov.policy_rules(p_tier, v_topic, v_seg_key) r
                     ORDER BY r.seq;
            END IF;
            <<rules>>
            LOOP
                FETCH c_rules INTO r_rule;
                EXIT WHEN NOT FOUND;
                v_budget := CASE WHEN r_rule.scope = 'topic' THEN 'topic:' || p_topic ELSE r_rule.budget END;
                -- Every window of the budget (up to four) in one range scan over the longest.
                SELECT ARRAY[count(*) FILTER (WHERE s.sent_at > v_now - r_rule.windows[1] * interval '1 millisecond'),
                             count(*) FILTER (WHERE s.sent_at > v_now - r_rule.windows[2] * interval '1 millisecond'),
                             count(*) FILTER (WHERE s.sent_at > v_now - r_rule.windows[3] * interval '1 millisecond'),
                             count(*) FILTER (WHERE s.sent_at > v_now - r_rule.windows[4] * interval '1 millisecond')]
                  INTO v_counts
                  FROM gov.sends s
                 WHERE s.user_id = p_user_id AND s.budget = v_budget
                   AND s.sent_at > v_now - r_rule.windows[least(cardinality(r_rule.windows), 4)]
                                           * interval '1 millisecond';
                FOR i IN 1 .. cardinality(r_rule.windows) LOOP
                    v_window := r_rule.windows[i];
                    IF i <= 4 THEN
                        v_used := v_counts[i];
                    ELSE  -- a fifth window and beyond: a count of its own
                        SELECT count(*) INTO v_used
                          FROM gov.sends s
                         WHERE s.user_id = p_user_id AND s.budget = v_budget
                           AND s.sent_at > v_now - v_window * interval '1 millisecond';
                    END IF;
                    CONTINUE WHEN v_used < r_rule.caps[i];

                    -- Blocked. A slot frees when enough of the oldest rows leave the window
                    -- for the count to drop below the cap (more than one when a cap was lowered).
                    v_cap := r_rule.caps[i];
                    IF v_cap > 0 THEN  -- a cap of 0 never frees a slot
                        SELECT s.sent_at + v_window * interval '1 millisecond' INTO v_free_at
                          FROM gov.sends s
                         WHERE s.user_id = p_user_id AND s.budget = v_budget
                           AND s.sent_at > v_now - v_window * interval '1 millisecond'
                         ORDER BY s.sent_at
                        OFFSET v_used - v_cap LIMIT 1;
                    END IF;
                    v_rule := CASE r_rule.scope WHEN 'topic' THEN 'topic_cap_' WHEN 'global' THEN 'global_cap_'
                                                ELSE 'cap_' END || v_window || 'ms';
                    v_scope := r_rule.scope;
                    v_action := v_tier.on_exceed;
                    EXIT rules;
                END LOOP;
            END LOOP;
            CLOSE c_rules;
        END IF;

        IF v_rule IS NOT NULL THEN
            v_msg.retry_after_ms := CASE WHEN v_free_at IS NOT NULL
                                         THEN greatest(0, ceil(extract(epoch FROM v_free_at - v_now) * 1000))::bigint
                                    END;
            IF p_release THEN
                UPDATE gov.messages m
                   SET allowed = false, action = v_action, reason = v_rule, used = v_used, cap = v_cap,
                       retry_after_ms = v_msg.retry_after_ms, decided_at = v_now
                 WHERE m.user_id = p_user_id AND m.message_id = p_message_id;
            ELSE
                INSERT INTO gov.messages (user_id, message_id, tier, topic, campaign_id, allowed, action,
                                          reason, used, cap, retry_after_ms, decided_at)
                VALUES (p_user_id, p_message_id, p_tier, p_topic, p_campaign_id, false, v_action,
                        v_rule, v_used, v_cap, v_msg.retry_after_ms, v_now);
                INSERT INTO gov.push_suppressions (user_id, message_id, tier, blocked_by, action,
                                                   campaign_id, topic, blocked_scope, used, cap,
                                                   retry_after_ms, created_at, segment)
                VALUES (p_user_id, p_message_id, p_tier, v_rule, v_action, p_campaign_id, p_topic,
                        v_scope, v_used, v_cap, v_msg.retry_after_ms, v_now, v_segment);
            END IF;
            RETURN QUERY SELECT false, v_action, v_rule, v_used, v_cap, v_msg.retry_after_ms, false;
            RETURN;
        END IF;

        -- Every rule passed: spend one slot in each budget some cap reads (for a user of
        -- any segment, so a change of segment finds the history it needs).
        -- (Gathered first, then one row per insert: an insert that reads no policy table is
        -- one shard's on Citus, and a single-row VALUES is a statement Citus caches, where
        -- INSERT … SELECT FROM unnest() is planned and copied on every call.)
        v_spend := ARRAY(SELECT b FROM gov.policy_spend(p_tier, v_topic, p_topic) b);
        FOREACH v_budget IN ARRAY v_spend LOOP
            INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
            VALUES (p_user_id, v_budget, v_now, p_message_id);
        END LOOP;
    END IF;

    IF p_release THEN
        UPDATE gov.messages m
           SET allowed = true, action = NULL, reason = NULL, used = NULL, cap = NULL,
               retry_after_ms = NULL, decided_at = v_now
         WHERE m.user_id = p_user_id AND m.message_id = p_message_id;
    ELSE
        INSERT INTO gov.messages (user_id, message_id, tier, topic, campaign_id, allowed, decided_at)
        VALUES (p_user_id, p_message_id, p_tier, p_topic, p_campaign_id, true, v_now);
    END IF;

    RETURN QUERY SELECT true, NULL::text, NULL::text, NULL::integer, NULL::integer, NULL::bigint, false;
END;
$$;

-- Distribute the schema on a Citus cluster (called by `gov db upgrade` after the
-- migrations; it changes only what is not distributed yet, so it runs after every
-- upgrade). Returns what it did, one line per table or function. Does nothing on a
-- server without Citus.
CREATE OR REPLACE FUNCTION gov.distribute_v1() RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    v_name text;
    v_fn   regprocedure;
    v_arg  text;
    v_moved text[] := '{}';
    v_refs   text[];
    v_copies text[];
    v_bound  text;
BEGIN
    IF NOT gov.on_citus() THEN
        RETURN;
    END IF;
    -- the user tables carry triggers that write colocated rows (the accepted event, the
    -- user-cap ceiling); Citus runs them on the shards
    SET LOCAL citus.enable_unsafe_triggers = on;
    -- one connection per node for the whole call: a table distributed here over parallel
    -- connections (an upgrade adds one) would refuse the functions distributed after it
    SET LOCAL citus.multi_shard_modify_mode = 'sequential';
    FOREACH v_name IN ARRAY ARRAY['gov.tiers', 'gov.tier_consumes', 'gov.caps', 'gov.settings',
                                  'gov.segment_caps', 'gov.compiled_rules', 'gov.policy_versions',
                                  'gov.timing_curves'] LOOP
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
                                  'gov.push_events', 'gov.release_minutes'] LOOP
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
                             'send_many_v2', 'send_many_best_v1', 'send_batch_v1')
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
    -- The decision's policy reads, bound to the reference tables' local copies (see
    -- gov.bind_policy_reads), once every node holds a copy of each (Citus copies them to a
    -- node added later; replicate_reference_tables does it now). Bound again after every
    -- upgrade: a reference table made again has a new shard.
    v_refs := ARRAY['gov.tiers', 'gov.caps', 'gov.compiled_rules'];
    IF EXISTS (SELECT 1 FROM unnest(v_refs) t JOIN pg_dist_shard s ON s.logicalrelid = t::regclass
                CROSS JOIN pg_dist_node n
               WHERE n.isactive AND n.noderole = 'primary'
                 AND NOT EXISTS (SELECT 1 FROM pg_dist_placement pl
                                  WHERE pl.shardid = s.shardid AND pl.groupid = n.groupid)) THEN
        PERFORM replicate_reference_tables();
    END IF;
    SELECT array_agg(shard_name(s.logicalrelid, s.shardid) ORDER BY t.ord) INTO v_copies
      FROM unnest(v_refs) WITH ORDINALITY t(name, ord)
      JOIN pg_dist_shard s ON s.logicalrelid = t.name::regclass;
    -- (a coordinator outside Citus's node list holds no copies: its reads stay Citus's)
    IF NOT EXISTS (SELECT 1 FROM unnest(v_copies) c WHERE to_regclass(c) IS NULL) THEN
        v_bound := 'the local copies ' || array_to_string(v_copies, ', ');
        IF (SELECT p.prosrc FROM pg_proc p WHERE p.oid = 'gov.policy_tier(text)'::regprocedure)
           NOT LIKE '%' || v_copies[1] || ' %' THEN
            PERFORM gov.bind_policy_reads(v_copies[1], v_copies[2], v_copies[3]);
        ELSE
            v_bound := NULL;
        END IF;
    ELSIF (SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
            WHERE p.oid = 'gov.policy_tier(text)'::regprocedure) = 'sql' THEN
        v_bound := 'the reference tables, through Citus (no local copies here)';
        PERFORM gov.bind_policy_reads('gov.tiers', 'gov.caps', 'gov.compiled_rules', p_citus => true);
    END IF;
    IF v_bound IS NOT NULL THEN
        RETURN NEXT 'gov.policy_tier, policy_caps, policy_rules, policy_spend: ' || v_bound;
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
