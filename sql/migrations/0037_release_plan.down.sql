-- Migration 0037 undone: the settings read and the release's statements EXECUTEd on every
-- call, as migrations 0016, 0028, 0030 and 0035 made them.

CREATE OR REPLACE FUNCTION gov.release_contenders(p_deferred text, p_content text, p_user_id text, p_now timestamptz)
RETURNS SETOF gov.deferred
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY EXECUTE format($q$
        SELECT d.*
          FROM %1$s d
          LEFT JOIN %2$s c ON c.user_id = d.user_id AND c.message_id = d.message_id
         WHERE d.user_id = $1 AND d.state = 'waiting' AND (d.release_at <= $2 OR d.planned_at <= $2)
         ORDER BY least(c.expires_at, d.give_up_at) NULLS LAST, d.tier, d.enqueued_at, d.id
           FOR UPDATE OF d SKIP LOCKED
        $q$, p_deferred, p_content) USING p_user_id, p_now;
END;
$$;

CREATE OR REPLACE FUNCTION gov.release_jitter(p_user_id text, p_message_id text) RETURNS interval
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_jitter_ms bigint;
BEGIN
    -- gov.settings by its local relation, as in gov.user_cap_ceiling (a Citus worker may
    -- call this inside a shard's statement)
    EXECUTE format('SELECT s.jitter_ms FROM %s s', gov.shard_relation('gov.settings', NULL)) INTO v_jitter_ms;
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
    v_set     record;
    v_zone    text;
    v_segment text;
    v_last    timestamptz;
    v_slots   timestamptz[];
    v_draw    bigint;
BEGIN
    o_slot := p_first;
    EXECUTE format('SELECT s.timing_enabled, s.timing_p1_max_delay_ms, s.timing_explore, s.jitter_ms FROM %s s',
                   gov.shard_relation('gov.settings', NULL)) INTO v_set;
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
    -- gov.settings by its local relation, as in gov.release_jitter (a worker calls this)
    EXECUTE format('SELECT s.release_per_minute FROM %s s', gov.shard_relation('gov.settings', NULL)) INTO v_cap;
    IF v_cap IS NULL OR NOT gov.distributed() THEN
        RETURN v_cap;
    END IF;
    SELECT count(*) INTO v_shards FROM pg_dist_shard s WHERE s.logicalrelid = 'gov.users'::regclass;
    RETURN greatest(1, v_cap / greatest(v_shards, 1));
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

DROP FUNCTION gov.release_contenders_local(text, timestamptz);
DROP FUNCTION gov.release_waiting_local(text, timestamptz);
DROP FUNCTION gov.release_contenders_statement();
DROP FUNCTION gov.release_waiting_statement();
DROP FUNCTION gov.current_settings();
