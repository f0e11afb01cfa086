-- gov: a suppressed message that still has value is held in gov.deferred (its tier's
-- defer, quiet hours, or a collapse group), then released: gov.release_due_v2 decides each
-- due row again through gov.decide_core and sends, holds again, or ends it.

-- ---------------------------------------------------------------- holding

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

-- A bounded jitter, so held messages do not fire together; derived from the message
-- (not random()) so a simulation with a seed replays exactly.
CREATE FUNCTION gov.release_jitter(p_user_id text, p_message_id text) RETURNS interval
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

-- Copy the population's and each segment's reach by local hour (gov.hour_curves_v2, with
-- its defaults) into gov.timing_curves, the prior gov.best_slot reads at every hold. Run
-- it about once a day (cron: psql -c 'SELECT gov.refresh_timing_curves_v1()'): the
-- curves move slowly, and a hold must not scan every user's events. Returns the rows
-- written (24 per curve; none while nothing was delivered in the window). Migration 0053
-- moved it from the click rate by hour of display (gov.hour_curves_v1) to the reach:
-- docs/analysts.md, "The best hours, from reach".
CREATE FUNCTION gov.refresh_timing_curves_v1(p_since interval DEFAULT '56 days', p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := coalesce(p_now, clock_timestamp());
    v_rows integer;
BEGIN
    DELETE FROM gov.timing_curves;
    INSERT INTO gov.timing_curves (segment, hour, estimate, refreshed_at)
    SELECT coalesce(c.segment, ''), c.hour, c.estimate, v_now
      FROM gov.hour_curves_v2(p_since, v_now) c
     WHERE c.estimate IS NOT NULL;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows;
END;
$$;

-- The slot a held message is planned for (docs/analysts.md, "Timing"). p_first: the first
-- moment that passes every cap and quiet hours (a window freed then stays free until
-- another send takes it, and the release decides again in any case). [timing] off, or no
-- curve yet: p_first itself (o_timing NULL). On: the candidates are p_first and every
-- whole local hour after it that is not quiet, up to the deadline (p_deadline less the
-- jitter and a minute, so the jittered release still comes before it; for P1 also at most
-- the policy's timing_p1_max_delay past p_first); the slot is the candidate whose local
-- hour has the highest reach estimate of the user (their own deliveries of 56 days and
-- those displayed at once, smoothed over the neighbouring hours and shrunk toward their
-- segment's curve, else all users', gov.timing_curves, as gov.best_hours_v2 does with
-- its defaults), the earliest on a tie (o_timing 'best'). A share
-- timing_explore of the messages, drawn from p_seed (the message id: a retry draws the
-- same), goes at a candidate drawn from it instead (o_timing 'explore'), so the estimate
-- sees hours the timing would not choose. p_asked: the caller asked for the best slot
-- whatever [timing] says (a campaign sent with --at best, gov.send_many_best_v1).
CREATE FUNCTION gov.best_slot(
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
    v_cands   timestamptz[];
    v_slots   timestamptz[];
    v_t       timestamptz;
    v_open    integer := 0;
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
    -- the candidates, in time order: p_first, then each local hour's start. Whether one is
    -- quiet (gov.quiet_until, about 20 us a call) is asked only as far as the answer needs
    -- (migration 0055): a week's deadline has 168 candidates, and the best is nearly
    -- always among the first few asked.
    v_cands := ARRAY(
        SELECT c.t FROM (
            SELECT p_first AS t
            UNION
            SELECT ((date_trunc('hour', p_first AT TIME ZONE v_zone) + k * interval '1 hour') AT TIME ZONE v_zone)
              FROM generate_series(1, (extract(epoch FROM v_last - p_first) / 3600)::integer + 2) k
        ) c
         WHERE c.t >= p_first AND c.t <= v_last
         ORDER BY c.t);
    -- at most one candidate that is not quiet: nothing to choose
    FOREACH v_t IN ARRAY v_cands LOOP
        IF gov.quiet_until(p_user_id, v_t) = v_t THEN
            v_open := v_open + 1;
            EXIT WHEN v_open > 1;
        END IF;
    END LOOP;
    IF v_open <= 1 THEN
        RETURN;
    END IF;
    v_draw := abs(hashtextextended(p_seed, 30));
    IF (v_draw % 1000000) < v_set.timing_explore * 1000000 THEN
        v_slots := ARRAY(SELECT c.t FROM unnest(v_cands) c(t) WHERE gov.quiet_until(p_user_id, c.t) = c.t ORDER BY c.t);
        o_slot := v_slots[1 + (v_draw / 1000000) % cardinality(v_slots)];
        o_timing := 'explore';
        RETURN;
    END IF;
    -- the best estimate first (the earliest on a tie): the first of them that is not quiet
    FOR v_t IN
        SELECT s.t
          FROM unnest(v_cands) s(t)
          JOIN (SELECT p.hour,
                       (coalesce(o.k, 0) + 2 * coalesce(g.estimate, p.estimate)) / (coalesce(o.n, 0) + 2) AS est
                  FROM gov.timing_curves p
                  LEFT JOIN gov.timing_curves g ON g.segment = v_segment AND g.hour = p.hour
                  LEFT JOIN (SELECT (r.hour + w.shift + 24) % 24 AS hour,
                                    sum(w.weight * r.deliveries) AS n, sum(w.weight * r.prompt) AS k
                               FROM gov.reach_hours('56 days', p_now, '5 minutes', p_user_id) r
                              CROSS JOIN (VALUES (-1, 0.25::double precision), (0, 0.5::double precision),
                                                 (1, 0.25::double precision)) w(shift, weight)
                              GROUP BY 1) o ON o.hour = p.hour
                 WHERE p.segment = '') e ON e.hour = date_part('hour', s.t AT TIME ZONE v_zone)
         ORDER BY e.est DESC, s.t
    LOOP
        IF gov.quiet_until(p_user_id, v_t) = v_t THEN
            o_slot := v_t;
            o_timing := 'best';
            RETURN;
        END IF;
    END LOOP;
    -- no curve yet: the first slot
END;
$$;

-- Put a suppressed message in the queue (or refuse to, with the reason), from the
-- verdict just given. Returns the outcome: ('defer'|'collapse', reason, release_at)
-- when held, ('drop', reason, NULL) when it cannot be held.
--
-- What holds it: a tier whose verb is collapse collapses whatever blocked it (quiet
-- hours too), a message without a collapse key joining its user's keyless group of
-- that tier (key ''); quiet hours hold any other tier's message; else the tier's verb.
-- A collapse group (user, key) is kept alive by its newest member: the newcomer
-- becomes the group's one waiting row (its carrier, standing for every member), the
-- old carrier and all it stood for are collapsed into it at once, and the group waits
-- for the slot the newcomer's decision names. A newcomer whose own deadline passes
-- before that slot expires alone; the group keeps its carrier.
CREATE FUNCTION gov.hold(
    p_user_id      text,
    p_message_id   text,
    p_tier         text,
    p_collapse_key text,
    p_action       text,
    p_reason       text,
    p_retry_ms     bigint,
    p_expires_at   timestamptz,
    p_now          timestamptz,
    OUT o_action   text,
    OUT o_reason   text,
    OUT o_release  timestamptz
)
LANGUAGE plpgsql AS $$
DECLARE
    v_kind    text;
    v_key     text := p_collapse_key;
    v_tier    gov.tiers%ROWTYPE;
    v_planned timestamptz;
    v_give_up timestamptz;
    v_carrier gov.deferred%ROWTYPE;
    v_timing  text;
    v_first   timestamptz;
BEGIN
    SELECT * INTO v_tier FROM gov.tiers t WHERE t.tier = p_tier;
    IF p_action NOT IN ('defer', 'collapse') OR p_retry_ms IS NULL THEN
        o_action := 'drop';  -- the verb drops, or no slot ever frees (a cap of 0)
        o_reason := p_reason;
        RETURN;
    END IF;
    IF v_tier.on_exceed = 'collapse' THEN
        v_kind := 'collapse';
        v_key := coalesce(p_collapse_key, '');
    ELSIF p_reason = 'quiet_hours' THEN
        v_kind := 'quiet';
    ELSE
        v_kind := 'defer';
    END IF;

    -- The earliest moment that clears the blocking window and the user's quiet hours.
    v_planned := gov.quiet_until(p_user_id, p_now + p_retry_ms * interval '1 millisecond');
    IF v_kind = 'defer' THEN
        -- the policy stores defer_max for every defer tier; the code holds no caps of its own
        v_give_up := p_now + v_tier.defer_max_ms * interval '1 millisecond';
        IF v_planned > v_give_up THEN
            o_action := 'drop';
            o_reason := 'defer_expired';
        END IF;
    END IF;
    IF o_reason IS NULL AND v_planned >= p_expires_at THEN
        o_action := 'drop';  -- it would be dead on arrival
        o_reason := 'ttl_expired';
    END IF;
    IF o_reason IS NOT NULL THEN
        INSERT INTO gov.deferred (user_id, message_id, tier, kind, collapse_key, blocked_by, enqueued_at,
                                  planned_at, release_at, give_up_at, state, outcome, finished_at)
        VALUES (p_user_id, p_message_id, p_tier, v_kind, v_key, p_reason, p_now,
                v_planned, v_planned, v_give_up, 'expired', o_reason, p_now);
        RETURN;
    END IF;

    o_action := CASE WHEN v_kind = 'quiet' THEN 'defer' ELSE v_kind END;
    o_reason := p_reason;
    -- [timing]: the best slot of the user's estimate within the deadline, not the first
    -- (which stays in first_at: from then on the row contends for a slot a later deadline
    -- of its tier would take, gov.release_contenders_statement)
    v_first := v_planned;
    SELECT b.o_slot, b.o_timing INTO v_planned, v_timing
      FROM gov.best_slot(p_user_id, p_tier, p_message_id, v_planned, least(p_expires_at, v_give_up), p_now) b;
    -- jitter from the group (not the member), so a group's release time is stable
    o_release := v_planned + gov.release_jitter(p_user_id, CASE WHEN v_kind = 'collapse'
                                                                THEN '#collapse:' || v_key ELSE p_message_id END);
    IF v_kind = 'collapse' THEN
        SELECT * INTO v_carrier FROM gov.deferred d
         WHERE d.user_id = p_user_id AND d.collapse_key = v_key AND d.kind = 'collapse' AND d.state = 'waiting'
           FOR UPDATE;
        IF FOUND THEN
            -- the newcomer carries the group: the old carrier and everything it stood for
            -- are collapsed into the newcomer now (first, so one carrier waits at a time)
            UPDATE gov.deferred d SET collapsed_into = p_message_id
             WHERE d.user_id = p_user_id AND d.state = 'collapsed' AND d.outcome = 'collapsed'
               AND d.collapsed_into = v_carrier.message_id;
            UPDATE gov.deferred d
               SET state = 'collapsed', outcome = 'collapsed', collapsed_into = p_message_id, finished_at = p_now
             WHERE d.user_id = p_user_id AND d.id = v_carrier.id;
        END IF;
    END IF;
    INSERT INTO gov.deferred (user_id, message_id, tier, kind, collapse_key, blocked_by, enqueued_at,
                              planned_at, release_at, give_up_at, stands_for, timing, first_at)
    VALUES (p_user_id, p_message_id, p_tier, v_kind, v_key, p_reason, p_now,
            v_planned, o_release, v_give_up, coalesce(v_carrier.stands_for, 0) + 1, v_timing,
            CASE WHEN v_planned > v_first THEN v_first END);
END;
$$;

-- A collapse tier's message that is allowed while a group of its key waits carries
-- that group: it goes out as the summary (its own, newest, content with data.count),
-- and the waiting carrier and everything it stood for are collapsed into it. Without
-- this the newcomer would take the slot the group waits for, and the group, decided
-- again after it, would wait a whole window more. Called by gov.send_v1 (the caller
-- holds the user's lock; a releaser holding the carrier never waits for that lock).
CREATE FUNCTION gov.absorb_group(
    p_user_id      text,
    p_message_id   text,
    p_tier         text,
    p_collapse_key text,
    p_now          timestamptz
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_carrier gov.deferred%ROWTYPE;
BEGIN
    SELECT d.* INTO v_carrier
      FROM gov.deferred d
      JOIN gov.tiers t ON t.tier = p_tier AND t.on_exceed = 'collapse'
     WHERE d.user_id = p_user_id AND d.collapse_key = coalesce(p_collapse_key, '') AND d.kind = 'collapse'
       AND d.state = 'waiting'
       FOR UPDATE OF d;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE gov.deferred d SET collapsed_into = p_message_id
     WHERE d.user_id = p_user_id AND d.state = 'collapsed' AND d.outcome = 'collapsed'
       AND d.collapsed_into = v_carrier.message_id;
    UPDATE gov.deferred d
       SET state = 'collapsed', outcome = 'collapsed', collapsed_into = p_message_id, finished_at = p_now
     WHERE d.user_id = p_user_id AND d.id = v_carrier.id;
    UPDATE gov.message_content c SET content = c.content || jsonb_build_object('count', v_carrier.stands_for + 1)
     WHERE c.user_id = p_user_id AND c.message_id = p_message_id;
END;
$$;

-- ---------------------------------------------------------------- releasing

-- How many releases one shard's releasers may make in one minute: the policy's
-- [release] per_minute (gov.settings.release_per_minute; NULL: no limit). On a Citus
-- cluster each shard is counted on its own node (one counter row per shard and minute,
-- so no release waits for another node): each shard gets per_minute divided by the
-- number of shards, at least 1.
CREATE FUNCTION gov.release_minute_cap() RETURNS integer
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

-- Take one release of the minute of p_now from p_minutes (the shard's gov.release_minutes;
-- p_key: its shard key, '' on one server), if fewer than p_cap were taken: true when
-- taken. Exact under concurrent releasers: the minute's row is locked by the first that
-- counts in it, and a second re-reads the count its commit left before adding to it. A new
-- minute clears the shard's minutes of more than an hour ago (only the current one is read).
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

-- Release what is due in one shard: take up to p_limit waiting rows whose time has come
-- (SKIP LOCKED, so concurrent releasers never take one message twice) and decide each
-- again now through the same decision (gov.release_one). Returns one row per row taken.
-- p_shard_key: the shard to release from (NULL on one server; 70_scale_out.sql).
--
-- Locks: a releaser holds the rows it took and takes each user's decision lock with a
-- try (pg_try_advisory_xact_lock), never a wait. A sender holds the user's lock and may
-- then wait for a row a releaser holds (a newcomer to a collapse group), so a releaser
-- that waited for a user lock could close a cycle; one that never waits cannot. A row
-- whose user is busy is returned as 'busy' and left due for the next round.
--
-- Order: a due row's user's contenders are decided together, earliest deadline first
-- (gov.release_contenders), so the slot goes to the message that needs it soonest.
--
-- Capacity ([release] per_minute, gov.release_minute_cap): each release that goes out
-- takes one of the minute's releases (gov.take_release_slot) before it is decided, and
-- gives it back when the decision holds it again or ends it. Once the minute is full the
-- scan stops: what is still due stays due, in its release order, for the next minute. A
-- contender of a user being decided that finds the minute full waits for the next
-- minute, at a moment within it derived from its user (deterministic jitter), its
-- planned_at (the slot it waits for) unchanged, so it still contends first for its user.
-- Releases made by a send (gov.release_owed, a slot owed to a nearer deadline) ride with
-- that send: neither counted nor held back. No limit set: nothing is counted.
--
-- Failure stays with its row: each row is handled in its own subtransaction (gov.release_row); an error
-- (a tier the policy no longer defines, content that no longer fits, anything raised)
-- rolls back that row's work only, and the row ends 'failed' with the error text, with
-- the messages a collapse carrier stood for. The rest of the batch goes on.
CREATE FUNCTION gov.release_due_v2(p_shard_key text, p_limit integer, p_now timestamptz DEFAULT NULL)
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
            EXECUTE format(gov.release_waiting_statement(), v_deferred, v_content) INTO v_waiting
              USING r_due.user_id, v_now;
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

-- The release order (issue 30, item 3): one user's waiting rows that compete for a slot
-- now, locked (SKIP LOCKED) and ordered EARLIEST DEADLINE FIRST, then the higher tier (P1
-- before P2 before P3), then the older hold. A row's deadline is the nearer of its
-- content's expiry (the TTL) and its give-up moment (defer_max). Contenders: the rows due
-- or planned for a moment already past, and a row timing placed later than its first slot
-- (first_at, past) when a due row of its tier has a later deadline: that row would take
-- the slot the timed one needs (migration 0054). Over the tables %1$s (gov.deferred) and
-- %2$s (gov.message_content), with $1 the user and $2 the moment. The one text of both
-- forms of gov.release_contenders below.
CREATE FUNCTION gov.release_contenders_statement() RETURNS text
LANGUAGE sql IMMUTABLE AS $f$ SELECT $q$
        SELECT d.*
          FROM %1$s d
          LEFT JOIN %2$s c ON c.user_id = d.user_id AND c.message_id = d.message_id
         WHERE d.user_id = $1 AND d.state = 'waiting'
           AND (d.release_at <= $2 OR d.planned_at <= $2
                OR (d.first_at <= $2 AND EXISTS (
                        SELECT 1 FROM %1$s o LEFT JOIN %2$s oc ON oc.user_id = o.user_id AND oc.message_id = o.message_id
                         WHERE o.user_id = $1 AND o.state = 'waiting' AND o.tier = d.tier
                           AND (o.release_at <= $2 OR o.planned_at <= $2)
                           AND coalesce(least(oc.expires_at, o.give_up_at), 'infinity')
                               > least(c.expires_at, d.give_up_at))))
         ORDER BY least(c.expires_at, d.give_up_at) NULLS LAST, d.tier, d.enqueued_at, d.id
           FOR UPDATE OF d SKIP LOCKED
    $q$::text $f$;

-- How many of those rows there are, locked or not: $1 the user, $2 the moment, over %1$s
-- (gov.deferred) and %2$s (gov.message_content). gov.release_due_v2 compares it with the
-- rows it could lock.
CREATE FUNCTION gov.release_waiting_statement() RETURNS text
LANGUAGE sql IMMUTABLE AS $f$ SELECT $q$
        SELECT count(*) FROM %1$s d
          LEFT JOIN %2$s c ON c.user_id = d.user_id AND c.message_id = d.message_id
         WHERE d.user_id = $1 AND d.state = 'waiting'
           AND (d.release_at <= $2 OR d.planned_at <= $2
                OR (d.first_at <= $2 AND EXISTS (
                        SELECT 1 FROM %1$s o LEFT JOIN %2$s oc ON oc.user_id = o.user_id AND oc.message_id = o.message_id
                         WHERE o.user_id = $1 AND o.state = 'waiting' AND o.tier = d.tier
                           AND (o.release_at <= $2 OR o.planned_at <= $2)
                           AND coalesce(least(oc.expires_at, o.give_up_at), 'infinity')
                               > least(c.expires_at, d.give_up_at))))
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
        E'BEGIN\n    RETURN (' || format(gov.release_waiting_statement(), 'gov.deferred', 'gov.message_content')
        || E');\nEND;\n');
END;
$do$;

-- One user's contenders (gov.release_contenders_statement): p_deferred and p_content are
-- the relations to read (the user's shard's on a Citus cluster, gov.shard_relation;
-- colocated, so the join is one node's).
CREATE FUNCTION gov.release_contenders(p_deferred text, p_content text, p_user_id text, p_now timestamptz)
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

-- A fresh message of a tier that waits when blocked (defer, collapse) arrives after a
-- slot opened for the user's held rows but before the releaser's jitter let them go (or,
-- for a row of the newcomer's tier that timing placed later, after its first slot): the
-- held rows whose deadline is nearer than the newcomer's (p_deadline; on a tie, of a
-- higher tier) are released first, in the release order, so the newcomer cannot take the
-- slot from a message that needs it sooner. The newcomer's own collapse group is left to
-- it (it carries that group: gov.absorb_group). A tier that drops is never made to yield
-- (it would lose the message). Called by gov.send_v1 before the decision, under the
-- user's lock; a row a releaser holds is skipped (SKIP LOCKED: a sender never waits for
-- a releaser's rows here). What it releases is queued in the outbox like any release.
CREATE FUNCTION gov.release_owed(
    p_user_id      text,
    p_tier         text,
    p_collapse_key text,
    p_deadline     timestamptz,
    p_now          timestamptz
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r_row gov.deferred%ROWTYPE;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_user_id, 0));
    PERFORM gov.cluster_user_lock(p_user_id);
    FOR r_row IN
        SELECT d.*
          FROM gov.deferred d
          LEFT JOIN gov.message_content c ON c.user_id = d.user_id AND c.message_id = d.message_id
         WHERE d.user_id = p_user_id AND d.state = 'waiting'
           AND (d.planned_at <= p_now OR (d.first_at <= p_now AND d.tier = p_tier))
           AND NOT (d.kind = 'collapse' AND d.tier = p_tier AND d.collapse_key = coalesce(p_collapse_key, ''))
           AND (least(c.expires_at, d.give_up_at), d.tier) < (p_deadline, p_tier)
         ORDER BY least(c.expires_at, d.give_up_at), d.tier, d.enqueued_at, d.id
           FOR UPDATE OF d SKIP LOCKED
    LOOP
        PERFORM gov.release_row(r_row, p_now);
    END LOOP;
END;
$$;

-- One held row released (gov.release_one) in a subtransaction of its own. Failure stays
-- with its row: an error (a tier the policy no longer defines, content that no longer
-- fits, anything raised) rolls back that row's work only, and the row ends 'failed' with
-- the error text, with the messages a collapse carrier stood for.
CREATE FUNCTION gov.release_row(
    p_row        gov.deferred,
    p_now        timestamptz,
    OUT o_state      text,
    OUT o_outcome    text,
    OUT o_outbox_ids bigint[]
)
LANGUAGE plpgsql AS $$
DECLARE
    v_error text;
BEGIN
    BEGIN
        SELECT r.o_state, r.o_outcome, r.o_outbox_ids INTO o_state, o_outcome, o_outbox_ids
          FROM gov.release_one(p_row, p_now) r;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS v_error = MESSAGE_TEXT;
        v_error := left(v_error, 1000);
        UPDATE gov.deferred d SET state = 'failed', outcome = 'failed', error = v_error, finished_at = p_now
         WHERE d.user_id = p_row.user_id AND d.id = p_row.id;
        UPDATE gov.deferred d
           SET state = 'failed', outcome = 'failed', finished_at = p_now,
               error = format('collapsed into %s, which failed: %s', p_row.message_id, v_error)
         WHERE d.user_id = p_row.user_id AND d.state = 'collapsed' AND d.outcome = 'collapsed'
           AND d.collapsed_into = p_row.message_id;
        o_state := 'failed';
        o_outcome := 'failed';
        o_outbox_ids := '{}';
    END;
END;
$$;

-- One held row, decided again at p_now (the caller holds the row and the user's lock).
-- Past the message's deadline → expired (ttl_expired), not sent. Allowed → outbox: a
-- carrier that stands for several messages goes out as ONE summary, the newest
-- content with data.count = how many it stands for (its tag and Topic are the key's).
-- Still blocked → waits again for the new slot, unless the verb now drops it, or the
-- wait passes defer_max (defer_expired) or the deadline (ttl_expired). A carrier that
-- ends without being sent takes the messages it stood for with it, to the same state.
CREATE FUNCTION gov.release_one(
    p_row        gov.deferred,
    p_now        timestamptz,
    OUT o_state      text,
    OUT o_outcome    text,
    OUT o_outbox_ids bigint[]
)
LANGUAGE plpgsql AS $$
DECLARE
    v_msg     gov.messages%ROWTYPE;
    v_mc      gov.message_content%ROWTYPE;
    v_verdict record;
    v_next    timestamptz;
BEGIN
    o_outbox_ids := '{}';
    SELECT * INTO v_msg FROM gov.messages m WHERE m.user_id = p_row.user_id AND m.message_id = p_row.message_id;
    SELECT * INTO v_mc FROM gov.message_content c WHERE c.user_id = p_row.user_id AND c.message_id = p_row.message_id;
    IF v_msg.user_id IS NULL OR v_mc.user_id IS NULL THEN
        RAISE EXCEPTION 'held message % of user % has no decision or no content', p_row.message_id, p_row.user_id;
    END IF;

    IF v_mc.expires_at <= p_now THEN
        o_state := 'expired';
        o_outcome := 'ttl_expired';
    ELSE
        SELECT * INTO v_verdict
          FROM gov.decide_core(p_row.user_id, p_row.message_id, v_msg.tier, v_msg.topic, v_msg.campaign_id,
                               p_now, true) d;
        IF v_verdict.allowed THEN
            o_outbox_ids := gov.fan_out(p_row.user_id, p_row.message_id, p_now);
            IF p_row.stands_for > 1 THEN
                UPDATE gov.message_content c SET content = c.content || jsonb_build_object('count', p_row.stands_for)
                 WHERE c.user_id = p_row.user_id AND c.message_id = p_row.message_id;
                o_state := 'collapsed';
                o_outcome := 'summary';
            ELSE
                o_state := 'released';
                o_outcome := 'released';
            END IF;
            UPDATE gov.deferred d
               SET state = o_state, outcome = o_outcome, finished_at = p_now,
                   collapsed_into = CASE WHEN o_state = 'collapsed' THEN p_row.message_id END
             WHERE d.user_id = p_row.user_id AND d.id = p_row.id;
            RETURN;
        END IF;

        IF v_verdict.action = 'drop' OR v_verdict.retry_after_ms IS NULL THEN
            o_state := 'dropped';
            o_outcome := v_verdict.reason;
        ELSE
            v_next := gov.quiet_until(p_row.user_id, p_now + v_verdict.retry_after_ms * interval '1 millisecond');
            IF p_row.give_up_at IS NOT NULL AND v_next > p_row.give_up_at THEN
                o_state := 'expired';
                o_outcome := 'defer_expired';
            ELSIF v_next >= v_mc.expires_at THEN
                o_state := 'expired';
                o_outcome := 'ttl_expired';
            ELSE
                -- never due again in the same instant: every round moves a row forward
                -- planned_at: the slot it now waits for (the release order reads it), the
                -- jitter on top in release_at only
                UPDATE gov.deferred d
                   SET planned_at = v_next,
                       first_at = NULL,  -- held again at its first slot: no longer timed later
                       release_at = greatest(v_next + gov.release_jitter(p_row.user_id,
                                                                         p_row.message_id || '#' || v_next::text),
                                             p_now + interval '1 millisecond')
                 WHERE d.user_id = p_row.user_id AND d.id = p_row.id;
                o_state := 'waiting';
                o_outcome := v_verdict.reason;
                RETURN;
            END IF;
        END IF;
    END IF;

    UPDATE gov.deferred d SET state = o_state, outcome = o_outcome, finished_at = p_now
     WHERE d.user_id = p_row.user_id AND d.id = p_row.id;
    UPDATE gov.deferred d SET state = o_state, outcome = o_outcome, finished_at = p_now
     WHERE d.user_id = p_row.user_id AND d.state = 'collapsed' AND d.outcome = 'collapsed'
       AND d.collapsed_into = p_row.message_id;
END;
$$;

-- ---------------------------------------------------------------- released names, kept (invariant 16)

-- gov.release_due_v1 (migration 0004), replaced by gov.release_due_v2 (one shard per
-- call) in migration 0016: on one server, the one shard's due rows, as before. On a Citus
-- cluster a release must run on the worker that holds its shard (SKIP LOCKED holds within
-- a node only), and only a call delegated by its shard key gets there: this one refuses,
-- with what to call instead. v1 never ran on a cluster (Citus came with 0016).
CREATE FUNCTION gov.release_due_v1(p_limit integer, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (user_id text, message_id text, state text, outcome text, outbox_ids bigint[])
LANGUAGE plpgsql AS $$
BEGIN
    IF gov.distributed() THEN
        RAISE EXCEPTION 'gov.release_due_v1 releases on one server only: on a Citus cluster call '
                        'gov.release_due_v2 once per shard key of gov.shard_keys_v1()' USING ERRCODE = '0A000';
    END IF;
    RETURN QUERY SELECT * FROM gov.release_due_v2(NULL, p_limit, p_now);
END;
$$;
