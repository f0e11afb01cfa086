-- Undo migration 0024: no batch entry point; gov.distribute_v1 as migration 0021 left it.

DROP FUNCTION gov.send_batch_v1(text, text[], text[], text[], text[], text[], jsonb[], text[], integer[], timestamptz);

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
