-- gov: scale-out on a Citus cluster. The same schema runs on one PostgreSQL server and,
-- distributed by user_id, on Citus: every per-user table is hash-distributed on user_id
-- and colocated with gov.users (a user's rows all live in one shard group, on one
-- worker), the policy tables are reference tables (a copy on every node), and the
-- decision and send functions are delegated to the worker that holds the user, so a
-- decision runs there whole: lock, counts and inserts, with no round trip per statement.
--
-- Queues: Citus runs FOR UPDATE SKIP LOCKED only on single-shard queries, so the
-- releaser, the runner and campaigns work one shard at a time. Each of their functions
-- takes a shard key (any user id of that shard; gov.shard_keys_v1 lists one per shard),
-- is delegated to the worker holding it, and reads that shard's tables there
-- (gov.shard_relation). On one server there is one "shard": the key is NULL and the
-- tables are the tables. One code path for both.

-- ---------------------------------------------------------------- shards

-- True when the Citus extension is installed in this database: its catalog table
-- pg_dist_partition exists (created and dropped with the extension). A lone expression, so
-- PL/pgSQL evaluates it itself; the EXISTS over pg_extension it replaced (migration 0050)
-- made the caller's check a statement run through the executor on every call: about 75 µs,
-- twice in every batch gov serve decides (docs/performance.md, stop 50).
CREATE FUNCTION gov.on_citus() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL
$$;

-- True when the user tables are distributed (Citus, after gov.distribute_v1). Two steps:
-- pg_dist_partition exists only where Citus is installed.
CREATE FUNCTION gov.distributed() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT gov.on_citus() THEN
        RETURN false;
    END IF;
    RETURN EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = 'gov.users'::regclass);
END;
$$;

-- The relation that holds p_table's rows for the shard of p_shard_key, as text for a
-- dynamic statement: p_table itself on one server, the shard's own table on Citus. On a
-- cluster the call must run on the node that holds the shard (the functions that call
-- this are delegated there by their shard key); anywhere else it refuses, rather than
-- let a claim reach across nodes, where SKIP LOCKED does not hold.
CREATE FUNCTION gov.shard_relation(p_table regclass, p_shard_key text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_shard   text;
    v_shardid bigint;
BEGIN
    IF NOT gov.distributed() THEN
        RETURN p_table::text;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = p_table AND p.partmethod = 'n') THEN
        -- a reference table: every node has its one shard
        SELECT s.shardid INTO v_shardid FROM pg_dist_shard s WHERE s.logicalrelid = p_table;
    ELSE
        IF p_shard_key IS NULL THEN
            RAISE EXCEPTION 'on a Citus cluster % is read one shard at a time: give a shard key (gov.shard_keys_v1())',
                p_table USING ERRCODE = '22023';
        END IF;
        v_shardid := get_shard_id_for_distribution_column(p_table, p_shard_key);
    END IF;
    v_shard := shard_name(p_table, v_shardid);
    -- Citus's own lock against a move: a shard move switches placements under an exclusive
    -- lock on the shard's metadata (BlockWritesToShardList), so this share lock, held to
    -- the end of the transaction, keeps the placement read here the active one. Citus
    -- grants it to the tables' owner only: a role that is not (docs/scale-out.md) has the
    -- placement check below and no lock.
    BEGIN
        PERFORM lock_shard_metadata(5, ARRAY[v_shardid]);  -- 5: ShareLock
    EXCEPTION WHEN insufficient_privilege THEN
        NULL;
    END;
    -- The placement must be this node's in Citus's metadata: a table of the shard's name
    -- alone is not enough, since a moved shard's old table stays behind until Citus drops it.
    IF to_regclass(v_shard) IS NULL
       OR NOT EXISTS (SELECT 1 FROM pg_dist_placement pl
                       WHERE pl.shardid = v_shardid AND pl.groupid = (SELECT g.groupid FROM pg_dist_local_group g)) THEN
        RAISE EXCEPTION 'shard % of % is not on this node: call the function through the coordinator, '
                        'which delegates it to the worker that holds the shard', v_shard, p_table
            USING ERRCODE = '55000';
    END IF;
    RETURN v_shard;
END;
$$;

-- One shard key per shard of the user tables (one NULL on a single server): the keys the
-- releaser and the runner walk. A key is any text that hashes into its shard.
CREATE FUNCTION gov.shard_keys_v1() RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_shards integer;
    v_keys   text[] := '{}';
    v_seen   bigint[] := '{}';
    v_shard  bigint;
    i        integer := 0;
BEGIN
    IF NOT gov.distributed() THEN
        RETURN ARRAY[NULL::text];
    END IF;
    SELECT count(*) INTO v_shards FROM pg_dist_shard s WHERE s.logicalrelid = 'gov.users'::regclass;
    -- each try lands in a shard at random: about n·ln(n) tries cover n shards
    WHILE cardinality(v_seen) < v_shards LOOP
        i := i + 1;
        v_shard := get_shard_id_for_distribution_column('gov.users', 'shard-' || i);
        IF NOT v_shard = ANY (v_seen) THEN
            v_seen := v_seen || v_shard;
            v_keys := v_keys || ('shard-' || i);
        END IF;
    END LOOP;
    RETURN v_keys;
END;
$$;

-- A campaign's audience in per-shard groups, each with its shard key (its first user),
-- so each group is decided on the worker that holds it. One group on a single server.
CREATE FUNCTION gov.shard_groups_v1(p_user_ids text[])
RETURNS TABLE (shard_key text, user_ids text[])
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT gov.distributed() THEN
        RETURN QUERY SELECT NULL::text, array_agg(DISTINCT u ORDER BY u) FROM unnest(p_user_ids) u HAVING count(*) > 0;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT min(u), array_agg(DISTINCT u ORDER BY u)
      FROM unnest(p_user_ids) u
     GROUP BY get_shard_id_for_distribution_column('gov.users', u)
     ORDER BY 1;
END;
$$;

-- On a Citus cluster, refuse a batch whose users are not all in p_shard_key's shard (a
-- campaign slice decided on one worker must be that worker's users).
CREATE FUNCTION gov.require_one_shard(p_shard_key text, p_user_ids text[]) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT gov.distributed() THEN
        RETURN;
    END IF;
    IF p_shard_key IS NULL THEN
        RAISE EXCEPTION 'on a Citus cluster a batch of users is decided one shard at a time: '
                        'give a shard key (gov.shard_groups_v1())' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_user_ids) u
                WHERE get_shard_id_for_distribution_column('gov.users', u)
                      <> get_shard_id_for_distribution_column('gov.users', p_shard_key)) THEN
        RAISE EXCEPTION 'the batch holds users of another shard than its key %', p_shard_key
            USING ERRCODE = '22023';
    END IF;
END;
$$;

-- ---------------------------------------------------------------- distributing

-- The decision on the user's own shard tables (issue 28, item 2; docs/scale-out.md, "The
-- decision on the user's shard"). On a worker, every statement of gov.decide_core that
-- names a Citus table goes through Citus's planner and executor, call after call: about
-- three quarters of a delegated decision's CPU. This makes, for each shard of gov.users,
-- a copy of gov.decide_core over that shard's colocated tables by name (and the reference
-- tables' local copies), which PostgreSQL plans once per session like the one-server
-- function, and puts in front of them a dispatcher, gov.decide_core, that runs the copy
-- when the user's shard is on this node, under Citus's own metadata lock against a move
-- and a placement check, and Citus's path (gov.decide_core_citus, the body as the
-- migrations wrote it) otherwise: on the coordinator inside an app's transaction, for a
-- role that does not own the tables (Citus grants its lock to the owner only), for a shard
-- made after the binding (a split; `gov db upgrade` binds again). The copies are made from
-- the body's own text, so there is no second implementation of any rule: a migration that
-- replaces gov.decide_core replaces the dispatcher, and gov.distribute_v1, which runs
-- after every upgrade, binds the new body again. Nothing on one server.
CREATE FUNCTION gov.bind_shard_decisions() RETURNS SETOF text
LANGUAGE plpgsql AS $bind$
DECLARE
    c_core   CONSTANT regprocedure := 'gov.decide_core(text,text,text,text,text,timestamptz,boolean)'::regprocedure;
    c_mark   CONSTANT text := '-- gov:shard-dispatch';
    c_lock   CONSTANT text := 'PERFORM gov.cluster_user_lock(p_user_id);';
    v_src    text;
    v_args   text;
    v_result text;
    v_call   text;
    v_body   text;
    v_owner  name;
    v_cases  text := '';
    v_users  text;
    v_seq    text;
    r_shard  record;
    r_table  record;
    v_n      integer := 0;
BEGIN
    IF NOT gov.distributed() THEN
        RETURN;
    END IF;
    SELECT p.prosrc, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid)
      INTO v_src, v_args, v_result
      FROM pg_proc p WHERE p.oid = c_core;
    IF position(c_mark IN v_src) > 0 THEN
        -- already the dispatcher: bind the body it dispatches to (shards may be new)
        SELECT p.prosrc INTO v_src FROM pg_proc p
         WHERE p.oid = 'gov.decide_core_citus(text,text,text,text,text,timestamptz,boolean)'::regprocedure;
    ELSE
        -- the body as the migrations wrote it, kept as Citus's path
        EXECUTE format('CREATE OR REPLACE FUNCTION gov.decide_core_citus(%s) RETURNS %s LANGUAGE plpgsql AS %L',
                       v_args, v_result, v_src);
    END IF;
    IF position(c_lock IN v_src) = 0 THEN
        RETURN NEXT 'gov.decide_core: not bound to the shards (its body takes the user''s lock differently)';
        RETURN;
    END IF;
    SELECT pg_get_userbyid(c.relowner) INTO v_owner FROM pg_class c WHERE c.oid = 'gov.users'::regclass;
    v_seq := pg_get_serial_sequence('gov.push_suppressions', 'id');
    v_call := '(p_user_id, p_message_id, p_tier, p_topic, p_campaign_id, p_now, p_release)';
    FOR r_shard IN
        SELECT s.shardid, s.shardminvalue FROM pg_dist_shard s
         WHERE s.logicalrelid = 'gov.users'::regclass ORDER BY s.shardid
    LOOP
        v_users := shard_name('gov.users'::regclass, r_shard.shardid);
        -- the user's lock: gov.cluster_user_lock's statements on the user's own row
        v_body := replace(v_src, c_lock, format(
            'INSERT INTO %1$s (user_id) VALUES (p_user_id) ON CONFLICT DO NOTHING; '
            'PERFORM 1 FROM %1$s u WHERE u.user_id = p_user_id FOR UPDATE;', v_users));
        -- a suppression's id from the identity's sequence, as Citus's own insert takes it
        -- (a shard's column has no default: Citus fills it in before routing)
        v_body := regexp_replace(v_body, 'INSERT INTO gov\.push_suppressions \(([^)]*)\)\s*VALUES \(',
                                 format('INSERT INTO gov.push_suppressions (id, \1) VALUES (nextval(%L::regclass), ',
                                        v_seq));
        -- every Citus table by its shard here: the user's shard of each colocated table,
        -- the single shard of each reference table
        FOR r_table IN
            SELECT p.logicalrelid::regclass::text AS name,
                   shard_name(p.logicalrelid, s.shardid) AS shard
              FROM pg_dist_partition p
              JOIN pg_dist_shard s ON s.logicalrelid = p.logicalrelid
             WHERE p.logicalrelid::regclass::text LIKE 'gov.%'
               AND (p.partmethod = 'n' OR s.shardminvalue = r_shard.shardminvalue)
             ORDER BY length(p.logicalrelid::regclass::text) DESC
        LOOP
            -- (a %ROWTYPE keeps the Citus table's name: the same columns, resolved where the
            -- function is made, on a node that may hold no shard)
            v_body := regexp_replace(v_body, replace(r_table.name, '.', '\.') || '\M(?!%ROWTYPE)', r_table.shard, 'g');
        END LOOP;
        -- (without the one-server body's force_generic_plan: the setting would hold for
        -- gov.quiet_until's statements too, whose generic plans Citus cannot route)
        EXECUTE format('CREATE OR REPLACE FUNCTION gov.decide_core_%s(%s) RETURNS %s LANGUAGE plpgsql AS %L',
                       r_shard.shardid, v_args, v_result, v_body);
        v_cases := v_cases || format(E'\n                WHEN %s THEN RETURN QUERY SELECT * FROM gov.decide_core_%s%s; RETURN;',
                                     r_shard.shardid, r_shard.shardid, v_call);
        v_n := v_n + 1;
    END LOOP;
    EXECUTE format($f$CREATE OR REPLACE FUNCTION gov.decide_core(%1$s) RETURNS %2$s LANGUAGE plpgsql AS $d$
%3$s (made by gov.bind_shard_decisions: the decision on the user's own shard tables)
DECLARE
    v_shard bigint;
BEGIN
    IF p_user_id IS NOT NULL AND p_user_id <> '' AND pg_has_role(%4$L, 'USAGE') THEN
        v_shard := get_shard_id_for_distribution_column('gov.users', p_user_id);
        -- Citus's lock against a move (a move switches placements under an exclusive lock
        -- on the shard group's metadata; this share lock only holds one back until the
        -- decision commits), then the placement, read under it
        PERFORM lock_shard_metadata(5, ARRAY[v_shard]);
        IF EXISTS (SELECT 1 FROM pg_dist_placement pl
                    WHERE pl.shardid = v_shard AND pl.groupid = (SELECT g.groupid FROM pg_dist_local_group g)) THEN
            CASE v_shard%5$s
            ELSE NULL;  -- a shard made after the binding: Citus's path
            END CASE;
        END IF;
    END IF;
    RETURN QUERY SELECT * FROM gov.decide_core_citus%6$s;
END;
$d$$f$, v_args, v_result, c_mark, v_owner, v_cases, v_call);
    RETURN NEXT format('gov.decide_core: on the user''s own shard tables (%s shards)', v_n);
END;
$bind$;

-- Distribute the schema on a Citus cluster (called by `gov db upgrade` after the
-- migrations; it changes only what is not distributed yet, so it runs after every
-- upgrade). Returns what it did, one line per table or function. Does nothing on a
-- server without Citus.
CREATE FUNCTION gov.distribute_v1() RETURNS SETOF text
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
    -- the decision on the user's own shard tables (gov.bind_shard_decisions), again after
    -- every upgrade: a migration may have replaced the body, a split made new shards
    RETURN QUERY SELECT * FROM gov.bind_shard_decisions();
END;
$$;
