-- Migration 0037 (issue 31, the first run; issue 28, statements planned per call): the
-- hold's and the releaser's reads planned once per session on one server. The settings
-- row through gov.current_settings (a static read; its local copy by name on a Citus
-- cluster, as before), and a released user's contenders and their count from functions
-- made from the one text both forms share (gov.release_contenders_statement,
-- gov.release_waiting_statement), as migration 0036 did for the claim. Signatures
-- unchanged. As in sql/schema/ at this revision.

-- The settings row, as the hold and the releaser read it at every message: on one server
-- a static read of gov.settings, planned once per session; on a Citus cluster its local
-- copy by name (gov.shard_relation), as a worker may call this inside a shard's
-- statement, where Citus cannot route a read of its own. EXECUTE plans again on every
-- call: 0.12 ms a read against 0.04 ms static (docs/performance.md).
CREATE FUNCTION gov.current_settings() RETURNS gov.settings
LANGUAGE plpgsql STABLE AS $$
DECLARE
    r_set gov.settings;
BEGIN
    IF NOT gov.distributed() THEN
        SELECT * INTO r_set FROM gov.settings;
    ELSE
        EXECUTE format('SELECT * FROM %s', gov.shard_relation('gov.settings', NULL)) INTO r_set;
    END IF;
    RETURN r_set;
END;
$$;

-- The release order (issue 30, item 3): one user's waiting rows that compete for a slot
-- now (due, or planned for a moment already past), locked (SKIP LOCKED) and ordered
-- EARLIEST DEADLINE FIRST, then the higher tier (P1 before P2 before P3), then the older
-- hold. A row's deadline is the nearer of its content's expiry (the TTL) and its give-up
-- moment (defer_max). Over the tables %1$s (gov.deferred) and %2$s (gov.message_content),
-- with $1 the user and $2 the moment. The one text of both forms of
-- gov.release_contenders below.
CREATE FUNCTION gov.release_contenders_statement() RETURNS text
LANGUAGE sql IMMUTABLE AS $f$ SELECT $q$
        SELECT d.*
          FROM %1$s d
          LEFT JOIN %2$s c ON c.user_id = d.user_id AND c.message_id = d.message_id
         WHERE d.user_id = $1 AND d.state = 'waiting' AND (d.release_at <= $2 OR d.planned_at <= $2)
         ORDER BY least(c.expires_at, d.give_up_at) NULLS LAST, d.tier, d.enqueued_at, d.id
           FOR UPDATE OF d SKIP LOCKED
    $q$::text $f$;

-- How many of those rows there are, locked or not: $1 the user, $2 the moment, over %1$s
-- (gov.deferred). gov.release_due_v2 compares it with the rows it could lock.
CREATE FUNCTION gov.release_waiting_statement() RETURNS text
LANGUAGE sql IMMUTABLE AS $f$ SELECT $q$
        SELECT count(*) FROM %1$s d
         WHERE d.user_id = $1 AND d.state = 'waiting' AND (d.release_at <= $2 OR d.planned_at <= $2)
    $q$::text $f$;

-- Both statements over the tables themselves, in functions of their own, so PL/pgSQL
-- plans them once per session on one server (as gov.claim_local): EXECUTE, which a
-- shard's table names need on a Citus cluster, planned them again for every user
-- released (0.44 ms a call against 0.06 ms for the statement itself).
DO $do$
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION gov.release_contenders_local(text, timestamptz) RETURNS SETOF gov.deferred
        LANGUAGE plpgsql AS %L$f$,
        E'BEGIN\n    RETURN QUERY ' || format(gov.release_contenders_statement(), 'gov.deferred', 'gov.message_content')
        || E';\nEND;\n');
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION gov.release_waiting_local(text, timestamptz) RETURNS bigint
        LANGUAGE plpgsql AS %L$f$,
        E'BEGIN\n    RETURN (' || format(gov.release_waiting_statement(), 'gov.deferred') || E');\nEND;\n');
END;
$do$;

-- One user's contenders (gov.release_contenders_statement): p_deferred and p_content are
-- the relations to read (the user's shard's on a Citus cluster, gov.shard_relation;
-- colocated, so the join is one node's).
CREATE OR REPLACE FUNCTION gov.release_contenders(p_deferred text, p_content text, p_user_id text, p_now timestamptz)
RETURNS SETOF gov.deferred
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT gov.distributed() THEN
        RETURN QUERY SELECT * FROM gov.release_contenders_local(p_user_id, p_now);
        RETURN;
    END IF;
    RETURN QUERY EXECUTE format(gov.release_contenders_statement(), p_deferred, p_content) USING p_user_id, p_now;
END;
$$;

-- (the settings through gov.current_settings)
CREATE OR REPLACE FUNCTION gov.release_jitter(p_user_id text, p_message_id text) RETURNS interval
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_jitter_ms bigint;
BEGIN
    v_jitter_ms := (gov.current_settings()).jitter_ms;
    IF coalesce(v_jitter_ms, 0) <= 0 THEN
        RETURN interval '0';
    END IF;
    RETURN (abs(hashtextextended(p_user_id || E'\x1f' || p_message_id, 7)) % v_jitter_ms) * interval '1 millisecond';
END;
$$;

CREATE OR REPLACE FUNCTION gov.best_slot(
    p_user_id  text,
    p_tier     text,
    p_seed     text,
    p_first    timestamptz,
    p_deadline timestamptz,
    p_now      timestamptz,
    p_asked    boolean DEFAULT false,
    OUT o_slot   timestamptz,
    OUT o_timing text
)
LANGUAGE plpgsql AS $$
DECLARE
    v_set     gov.settings;
    v_zone    text;
    v_segment text;
    v_last    timestamptz;
    v_slots   timestamptz[];
    v_draw    bigint;
BEGIN
    o_slot := p_first;
    v_set := gov.current_settings();
    IF (v_set.timing_enabled IS NOT TRUE AND NOT p_asked) OR p_tier = 'P0' THEN
        RETURN;
    END IF;
    v_last := p_deadline - (v_set.jitter_ms + 60000) * interval '1 millisecond';
    IF p_tier = 'P1' THEN
        v_last := least(v_last, p_first + v_set.timing_p1_max_delay_ms * interval '1 millisecond');
    END IF;
    IF v_last <= p_first THEN
        RETURN;
    END IF;
    SELECT u.time_zone, u.segment INTO v_zone, v_segment FROM gov.users u WHERE u.user_id = p_user_id;
    v_zone := coalesce(v_zone, 'UTC');
    -- the candidates, in time order: p_first, then each local hour's start, not quiet
    v_slots := ARRAY(
        SELECT c.t FROM (
            SELECT p_first AS t
            UNION
            SELECT ((date_trunc('hour', p_first AT TIME ZONE v_zone) + k * interval '1 hour') AT TIME ZONE v_zone)
              FROM generate_series(1, (extract(epoch FROM v_last - p_first) / 3600)::integer + 2) k
        ) c
         WHERE c.t >= p_first AND c.t <= v_last AND gov.quiet_until(p_user_id, c.t) = c.t
         ORDER BY c.t);
    IF cardinality(v_slots) <= 1 THEN
        RETURN;
    END IF;
    v_draw := abs(hashtextextended(p_seed, 30));
    IF (v_draw % 1000000) < v_set.timing_explore * 1000000 THEN
        o_slot := v_slots[1 + (v_draw / 1000000) % cardinality(v_slots)];
        o_timing := 'explore';
        RETURN;
    END IF;
    SELECT s.t INTO o_slot
      FROM unnest(v_slots) s(t)
      JOIN (SELECT p.hour,
                   (coalesce(o.clicks, 0) + 20 * coalesce(g.estimate, p.estimate)) / (coalesce(o.displays, 0) + 20) AS est
              FROM gov.timing_curves p
              LEFT JOIN gov.timing_curves g ON g.segment = v_segment AND g.hour = p.hour
              LEFT JOIN gov.display_hours('56 days', p_now, p_user_id) o ON o.hour = p.hour
             WHERE p.segment = '') e ON e.hour = date_part('hour', s.t AT TIME ZONE v_zone)
     ORDER BY e.est DESC, s.t
     LIMIT 1;
    IF o_slot IS NULL THEN  -- no curve yet: the first slot
        o_slot := p_first;
        RETURN;
    END IF;
    o_timing := 'best';
END;
$$;

CREATE OR REPLACE FUNCTION gov.release_minute_cap() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_cap    integer;
    v_shards integer;
BEGIN
    v_cap := (gov.current_settings()).release_per_minute;
    IF v_cap IS NULL OR NOT gov.distributed() THEN
        RETURN v_cap;
    END IF;
    SELECT count(*) INTO v_shards FROM pg_dist_shard s WHERE s.logicalrelid = 'gov.users'::regclass;
    RETURN greatest(1, v_cap / greatest(v_shards, 1));
END;
$$;

-- (the count through gov.release_waiting_local on one server)
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
        IF NOT gov.distributed() THEN
            v_waiting := gov.release_waiting_local(r_due.user_id, v_now);
        ELSE
            EXECUTE format(gov.release_waiting_statement(), v_deferred) INTO v_waiting USING r_due.user_id, v_now;
        END IF;
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
