-- Migration 0028: the release order is earliest deadline first (issue 30, item 3). When a
-- slot opens for a user with several held rows, the one with the nearest deadline (its
-- TTL, or defer_max) goes first, then the higher tier, then the older: gov.release_due_v2
-- decides a due row's user's contenders together in that order (gov.release_contenders),
-- and gov.send_v1 lets held rows whose slot has opened and whose deadline is nearer go
-- before a fresh message of a holding tier (gov.release_owed). A re-held row's planned_at
-- now follows the slot it waits for. Each row's release in a subtransaction of its own:
-- gov.release_row. The index finds a user's waiting rows by planned_at.

CREATE INDEX deferred_waiting_user ON gov.deferred (user_id, planned_at) WHERE state = 'waiting';

CREATE OR REPLACE FUNCTION gov.release_row(
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

CREATE OR REPLACE FUNCTION gov.release_owed(
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
         WHERE d.user_id = p_user_id AND d.state = 'waiting' AND d.planned_at <= p_now
           AND NOT (d.kind = 'collapse' AND d.tier = p_tier AND d.collapse_key = coalesce(p_collapse_key, ''))
           AND (least(c.expires_at, d.give_up_at), d.tier) < (p_deadline, p_tier)
         ORDER BY least(c.expires_at, d.give_up_at), d.tier, d.enqueued_at, d.id
           FOR UPDATE OF d SKIP LOCKED
    LOOP
        PERFORM gov.release_row(r_row, p_now);
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION gov.release_one(
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

CREATE OR REPLACE FUNCTION gov.release_due_v2(p_shard_key text, p_limit integer, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (user_id text, message_id text, state text, outcome text, outbox_ids bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_deferred text := gov.shard_relation('gov.deferred', p_shard_key);
    v_content  text := gov.shard_relation('gov.message_content', p_shard_key);
    r_due     gov.deferred%ROWTYPE;
    r_row     gov.deferred%ROWTYPE;
    v_rows    gov.deferred[];
    v_waiting bigint;
    v_done    record;
    v_handled integer := 0;
BEGIN
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
            SELECT * INTO v_done FROM gov.release_row(r_row, v_now) r;
            RETURN QUERY SELECT r_row.user_id, r_row.message_id, v_done.o_state, v_done.o_outcome, v_done.o_outbox_ids;
        END LOOP;
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION gov.send_v1(
    p_user_id      text,
    p_message_id   text,
    p_tier         text,
    p_topic        text,
    p_campaign_id  text,
    p_content      jsonb,
    p_collapse_key text,
    p_ttl_s        integer,
    p_now          timestamptz DEFAULT NULL
) RETURNS TABLE (
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
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_verdict record;
    v_ttl_s   integer;
    v_verb    text;
    v_ids     bigint[];
    v_held    record;
BEGIN
    -- A TTL of 0 ("now or never") would be past its deadline before any runner could
    -- send it: refused, rather than allowed, counted and never delivered.
    IF p_ttl_s IS NOT NULL AND p_ttl_s < 1 THEN
        RAISE EXCEPTION 'ttl must be at least 1 second (message % of user %, ttl %)', p_message_id, p_user_id, p_ttl_s
            USING ERRCODE = 'GV001';
    END IF;
    SELECT coalesce(p_ttl_s, t.default_ttl_s), t.on_exceed INTO v_ttl_s, v_verb FROM gov.tiers t WHERE t.tier = p_tier;
    IF v_verb IN ('defer', 'collapse') THEN
        -- a slot that opened for held rows with a nearer deadline is theirs (earliest
        -- deadline first): they go before this message is decided
        PERFORM gov.release_owed(p_user_id, p_tier, p_collapse_key, v_now + v_ttl_s * interval '1 second', v_now);
    END IF;
    SELECT * INTO v_verdict
      FROM gov.decide_core(p_user_id, p_message_id, p_tier, p_topic, p_campaign_id, v_now, false) d;

    IF v_verdict.repeated THEN
        RETURN QUERY SELECT v_verdict.allowed, v_verdict.action, v_verdict.reason, v_verdict.used,
                            v_verdict.cap, v_verdict.retry_after_ms, true, '{}'::bigint[];
        RETURN;
    END IF;

    INSERT INTO gov.message_content (user_id, message_id, content, collapse_key, ttl_s, expires_at)
    VALUES (p_user_id, p_message_id, p_content, p_collapse_key, v_ttl_s, v_now + v_ttl_s * interval '1 second');

    IF v_verdict.allowed THEN
        IF v_verb = 'collapse' THEN  -- only a collapse tier has groups: no probe for the others
            PERFORM gov.absorb_group(p_user_id, p_message_id, p_tier, p_collapse_key, v_now);
        END IF;
        v_ids := gov.fan_out(p_user_id, p_message_id, v_now);
    ELSE
        SELECT * INTO v_held
          FROM gov.hold(p_user_id, p_message_id, p_tier, p_collapse_key, v_verdict.action, v_verdict.reason,
                        v_verdict.retry_after_ms, v_now + v_ttl_s * interval '1 second', v_now);
        IF v_held.o_action IS DISTINCT FROM v_verdict.action OR v_held.o_reason IS DISTINCT FROM v_verdict.reason THEN
            -- what really happens to it (a collapse without a key, or a wait too long, is a drop)
            UPDATE gov.messages m SET action = v_held.o_action, reason = v_held.o_reason
             WHERE m.user_id = p_user_id AND m.message_id = p_message_id;
            UPDATE gov.push_suppressions ps SET action = v_held.o_action
             WHERE ps.user_id = p_user_id AND ps.message_id = p_message_id;
            v_verdict.action := v_held.o_action;
            v_verdict.reason := v_held.o_reason;
        END IF;
    END IF;

    RETURN QUERY SELECT v_verdict.allowed, v_verdict.action, v_verdict.reason, v_verdict.used,
                        v_verdict.cap, v_verdict.retry_after_ms, false, coalesce(v_ids, '{}'::bigint[]);
END;
$$;
