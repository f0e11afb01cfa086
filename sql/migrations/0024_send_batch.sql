-- Migration 0024: gov.send_batch_v1, many unrelated messages sent in one call and one
-- transaction (gov serve groups the requests that arrive together), and gov.distribute_v1
-- delegating it by its shard key on a Citus cluster.

-- Send a batch of unrelated messages (any users, tiers, topics, content) in one call and
-- one transaction: what `gov serve` does with the requests that arrive together. Each
-- message goes through gov.send_v1, so each gets the verdict, rows and fan-out it would
-- get alone: no rule lives here. What the batch saves is the round trip and the durable
-- commit per message (the commit is most of an allowed decision's cost). Messages are
-- sent in user order, then in the order given (ordinal, from 1), so two batches lock
-- their users in the same order and never wait on each other in a cycle; a user's later
-- message in the batch sees the earlier one's spend, as it would one call later. An
-- error in any message (an unknown tier, say) fails the whole call and nothing is
-- written: the caller then sends each message alone, so the error stays with its
-- message (gov.aio.AsyncGovernor.send_batch). p_shard_key: on a Citus cluster, one
-- shard's messages decided on the worker that holds them (gov.shard_groups_v1); NULL on
-- one server.
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
LANGUAGE plpgsql AS $$
DECLARE
    v_n   integer := coalesce(cardinality(p_user_ids), 0);
    r_msg record;
BEGIN
    IF coalesce(cardinality(p_message_ids), 0) <> v_n OR coalesce(cardinality(p_tiers), 0) <> v_n
       OR coalesce(cardinality(p_topics), 0) <> v_n OR coalesce(cardinality(p_campaign_ids), 0) <> v_n
       OR coalesce(cardinality(p_contents), 0) <> v_n OR coalesce(cardinality(p_collapse_keys), 0) <> v_n
       OR coalesce(cardinality(p_ttls), 0) <> v_n THEN
        RAISE EXCEPTION 'a batch''s arrays must have one entry per message (% user ids)', v_n
            USING ERRCODE = 'GV003';
    END IF;
    PERFORM gov.require_one_shard(p_shard_key, p_user_ids);
    FOR r_msg IN
        SELECT x.n::integer AS n, x.u, x.m, x.t, x.tp, x.c, x.ct, x.ck, x.ttl
          FROM unnest(p_user_ids, p_message_ids, p_tiers, p_topics, p_campaign_ids, p_contents,
                      p_collapse_keys, p_ttls) WITH ORDINALITY AS x(u, m, t, tp, c, ct, ck, ttl, n)
         ORDER BY x.u, x.n
    LOOP
        RETURN QUERY
        SELECT r_msg.n, s.allowed, s.action, s.reason, s.used, s.cap, s.retry_after_ms, s.repeated, s.outbox_ids
          FROM gov.send_v1(r_msg.u, r_msg.m, r_msg.t, r_msg.tp, r_msg.c, r_msg.ct, r_msg.ck, r_msg.ttl, p_now) s;
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
