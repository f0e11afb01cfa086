-- Migration 0030: the release capacity (issue 30, item 2): the policy's [release]
-- per_minute (gov.settings.release_per_minute, added by the revision itself), counted per
-- shard and minute in gov.release_minutes (created by the revision, distributed with the
-- users by gov.distribute_v1), taken by gov.release_due_v2 through gov.release_minute_cap
-- and gov.take_release_slot; as in sql/schema/ at this revision.

CREATE FUNCTION gov.release_minute_cap() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_cap    integer;
    v_shards integer;
BEGIN
    -- gov.settings by its local relation, as in gov.release_jitter (a worker calls this)
    EXECUTE format('SELECT s.release_per_minute FROM %s s', gov.shard_relation('gov.settings', NULL)) INTO v_cap;
    IF v_cap IS NULL OR NOT gov.distributed() THEN
        RETURN v_cap;
    END IF;
    SELECT count(*) INTO v_shards FROM pg_dist_shard s WHERE s.logicalrelid = 'gov.users'::regclass;
    RETURN greatest(1, v_cap / greatest(v_shards, 1));
END;
$$;

CREATE FUNCTION gov.take_release_slot(p_minutes text, p_key text, p_cap integer, p_now timestamptz)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_minute timestamptz := date_trunc('minute', p_now);
    v_new    boolean;
BEGIN
    EXECUTE format($q$
        INSERT INTO %s AS m (user_id, minute, used) VALUES ($1, $2, 1)
        ON CONFLICT (user_id, minute) DO UPDATE SET used = m.used + 1 WHERE m.used < $3
        RETURNING m.xmax = 0
        $q$, p_minutes) INTO v_new USING p_key, v_minute, p_cap;
    IF v_new IS NULL THEN
        RETURN false;
    END IF;
    IF v_new THEN
        EXECUTE format('DELETE FROM %s m WHERE m.user_id = $1 AND m.minute < $2', p_minutes)
            USING p_key, v_minute - interval '1 hour';
    END IF;
    RETURN true;
END;
$$;

CREATE OR REPLACE FUNCTION gov.release_due_v2(p_shard_key text, p_limit integer, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (user_id text, message_id text, state text, outcome text, outbox_ids bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_deferred text := gov.shard_relation('gov.deferred', p_shard_key);
    v_content  text := gov.shard_relation('gov.message_content', p_shard_key);
    v_cap     integer := gov.release_minute_cap();
    v_minutes text;
    v_key     text := coalesce(p_shard_key, '');
    v_used    integer;
    r_due     gov.deferred%ROWTYPE;
    r_row     gov.deferred%ROWTYPE;
    v_rows    gov.deferred[];
    v_waiting bigint;
    v_done    record;
    v_handled integer := 0;
BEGIN
    IF v_cap IS NOT NULL THEN
        v_minutes := gov.shard_relation('gov.release_minutes', p_shard_key);
    END IF;
    -- No LIMIT in the query: a busy row must not take the place of one that can go, so
    -- the loop counts what it handled and stops at p_limit (rows are locked as fetched).
    FOR r_due IN EXECUTE format($q$
        SELECT d.*
          FROM %s d
         WHERE d.state = 'waiting' AND d.release_at <= $1
         ORDER BY d.release_at, d.id
           FOR UPDATE SKIP LOCKED
        $q$, v_deferred) USING v_now
    LOOP
        EXIT WHEN v_handled >= p_limit;
        IF v_cap IS NOT NULL THEN
            -- the minute is full: the rest stays due for the next one (no row rewritten)
            EXECUTE format('SELECT m.used FROM %s m WHERE m.user_id = $1 AND m.minute = $2', v_minutes)
               INTO v_used USING v_key, date_trunc('minute', v_now);
            EXIT WHEN coalesce(v_used, 0) >= v_cap;
        END IF;
        IF NOT pg_try_advisory_xact_lock(hashtextextended(r_due.user_id, 0)) THEN
            RETURN QUERY SELECT r_due.user_id, r_due.message_id, 'busy'::text, NULL::text, '{}'::bigint[];
            CONTINUE;
        END IF;
        -- The slot this row waited for goes to the user's contender with the nearest
        -- deadline (gov.release_contenders' order): every waiting row of the user that is
        -- due, or whose slot has opened and only its jitter keeps it back (planned_at), is
        -- decided now, in that order, so the first takes the slot and the others wait for
        -- the next one. All of them or none: a contender another releaser holds (taken by
        -- its scan, which then found the user busy) makes the user busy here too, or the
        -- slot could go to a later deadline.
        EXECUTE format($q$
            SELECT count(*) FROM %s d
             WHERE d.user_id = $1 AND d.state = 'waiting' AND (d.release_at <= $2 OR d.planned_at <= $2)
            $q$, v_deferred) INTO v_waiting USING r_due.user_id, v_now;
        v_rows := ARRAY(SELECT r FROM gov.release_contenders(v_deferred, v_content, r_due.user_id, v_now) r);
        IF cardinality(v_rows) < v_waiting THEN
            RETURN QUERY SELECT r_due.user_id, r_due.message_id, 'busy'::text, NULL::text, '{}'::bigint[];
            CONTINUE;
        END IF;
        FOREACH r_row IN ARRAY v_rows LOOP
            v_handled := v_handled + 1;  -- a user's contenders go together, past p_limit if need be
            IF v_cap IS NOT NULL AND NOT gov.take_release_slot(v_minutes, v_key, v_cap, v_now) THEN
                UPDATE gov.deferred d
                   SET release_at = date_trunc('minute', v_now) + interval '1 minute'
                                    + (abs(hashtextextended(r_row.user_id, 30)) % 60000) * interval '1 millisecond'
                 WHERE d.user_id = r_row.user_id AND d.id = r_row.id;
                RETURN QUERY SELECT r_row.user_id, r_row.message_id, 'waiting'::text, 'minute_full'::text,
                                    '{}'::bigint[];
                CONTINUE;
            END IF;
            SELECT * INTO v_done FROM gov.release_row(r_row, v_now) r;
            IF v_cap IS NOT NULL AND v_done.o_state NOT IN ('released', 'collapsed') THEN
                -- nothing went out: the minute's release is given back
                EXECUTE format('UPDATE %s m SET used = m.used - 1 WHERE m.user_id = $1 AND m.minute = $2', v_minutes)
                  USING v_key, date_trunc('minute', v_now);
            END IF;
            RETURN QUERY SELECT r_row.user_id, r_row.message_id, v_done.o_state, v_done.o_outcome, v_done.o_outbox_ids;
        END LOOP;
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
