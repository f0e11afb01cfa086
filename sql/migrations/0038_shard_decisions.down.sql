-- Undo migration 0038: the decision through Citus's planner again. On a cluster the body
-- the dispatcher ran for Citus's path becomes gov.decide_core again, and the shards'
-- copies go; gov.distribute_v1 as migration 0034 made it.

DO $undo$
DECLARE
    v_fn regprocedure;
BEGIN
    IF to_regprocedure('gov.decide_core_citus(text,text,text,text,text,timestamptz,boolean)') IS NOT NULL THEN
        EXECUTE format('CREATE OR REPLACE FUNCTION gov.decide_core(%s) RETURNS %s LANGUAGE plpgsql AS %L',
                       pg_get_function_arguments(p.oid), pg_get_function_result(p.oid), p.prosrc)
           FROM pg_proc p
          WHERE p.oid = 'gov.decide_core_citus(text,text,text,text,text,timestamptz,boolean)'::regprocedure;
    END IF;
    FOR v_fn IN
        SELECT p.oid::regprocedure FROM pg_proc p
         WHERE p.pronamespace = 'gov'::regnamespace AND p.proname ~ '^decide_core_(citus|[0-9]+)$'
    LOOP
        EXECUTE format('DROP FUNCTION %s', v_fn);
    END LOOP;
END;
$undo$;

DROP FUNCTION gov.bind_shard_decisions();

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
